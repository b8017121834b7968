"""The vector walk functions leave the caller's settings as they found them.

``evidence_vector_candidates`` and ``relationship_vector_candidates`` (db/0190)
change settings inside: ``set_config(..., true)`` of ``plan_cache_mode`` (a
generic plan for the space's size and the check, a custom one for the walks and
the exact scan), ``enable_sort`` (off around each walk, so that the HNSW index's
ordered scan is the only plan, then on again), ``hnsw.ef_search`` and
``hnsw.max_scan_tuples`` (from the space's size). A transaction-local
``set_config`` would outlive the call and change every later statement of the
caller's transaction (a recall's other lists, which rely on their own plans),
but for one rule: a setting named in the function's own ``SET`` clause is put
back when the function exits, whatever the function set inside. So every
setting the function changes must be in its ``SET`` clause.

These tests set the caller's values apart from anything the function sets, call
each function down each of its paths (the unfiltered walk with every walked row
in the view; the same with walked rows outside the view, so the filtered walk
and the exact scan after it; a reset space's filtered walk; the exact scan of a
small space) and read the settings back. The last test shows that the check
sees a leak: a copy of each function without one of its ``SET`` clauses fails it.

An error inside a walk needs no test of its own: it aborts the caller's
transaction, or the savepoint around the call, and that abort undoes every
``set_config`` made in it, whatever the function's ``SET`` clause (a copy
without its clauses passes such a check as well as the real function does, so
the check could not fail).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import pytest
import pytest_asyncio

from gateway.services.writes import WriteService
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import fetch_one, load_jsonl, unique
from .factories import jsonl
from .test_related import rel
from .test_search import _ev, _spaces, _team

# The caller's values: none of them is one the functions set, in their SET clause
# or inside.
CALLER = {
    "enable_sort": "off",
    "enable_incremental_sort": "on",
    "plan_cache_mode": "auto",
    "hnsw.ef_search": "33",
    "hnsw.max_scan_tuples": "12345",
    "hnsw.iterative_scan": "off",
}

# The settings each function changes with set_config inside its body.
CHANGED_INSIDE = ("plan_cache_mode", "enable_sort", "hnsw.ef_search", "hnsw.max_scan_tuples")

EVIDENCE = (
    "SELECT count(*) FROM {fn}($1::text, $2::uuid, $3::integer, $4::vector, 5, $5::timestamptz,"
    " '{}'::text[], $6::bigint)"
)
RELATIONSHIPS = (
    "SELECT count(*) FROM {fn}($1::text, $2::uuid, $3::integer, $7::integer, $4::vector, 5,"
    " $5::timestamptz, $6::bigint)"
)
FUNCTIONS = {
    "evidence_vector_candidates": EVIDENCE,
    "relationship_vector_candidates": RELATIONSHIPS,
}


class Store:
    def __init__(
        self, team: str, space: UUID, before: datetime, vector: Any, projection: int
    ) -> None:
        self.team = team
        self.space = space
        self.before = before  # an instant before every row of the space
        self.vector = vector  # a stored vector, of the store's dimensions
        self.projection = projection


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def store(writes: WriteService, db: Database) -> Store:
    team = unique("walkset")
    async with db.pool.acquire() as conn:
        before = await conn.fetchval("SELECT clock_timestamp()")
        records = _team(team, "alice") + [
            {"kind": "entity", "team": team, "id": "a", "name": "A", "type": "thing"}
        ]
        records += [_ev(team, f"ev-{i}", f"Note {i} about kafka lag") for i in range(8)]
        records += [rel(team, f"r-{i}", "a", "weighs", value=str(i)) for i in range(8)]
        await load_jsonl(writes, jsonl(records))
        space = (await _spaces(conn, team))[None]
        vector, projection = await fetch_one(
            conn,
            "SELECT re.embedding, re.projection_generation FROM relationship_embeddings re "
            "WHERE re.team_id = $1 LIMIT 1",
            team,
        )
        evidence_vector = await conn.fetchval(
            "SELECT embedding FROM evidence_embeddings WHERE team_id = $1 LIMIT 1", team
        )
        # one query vector serves both functions
        assert evidence_vector.to_numpy().shape == vector.to_numpy().shape
    return Store(team, space, before, vector.to_numpy(), projection)


# name -> (generation, instant of the view, exact-search bound)
PATHS: dict[str, tuple[int, str, int]] = {
    # a space never reset, every walked row in the view: the unfiltered walk and the check
    "walk": (1, "now", 0),
    # walked rows outside the view: the check, the filtered walk, then the exact scan
    "walk, rows outside the view": (1, "before", 0),
    # a reset space (a later generation): the filtered walk directly, then the exact scan
    "reset space": (2, "now", 0),
    # below the exact-search bound: the exact scan only
    "exact scan": (1, "now", 1_000_000),
}


async def _settings_after(
    conn: Conn, store: Store, function: str, call: str, path: str
) -> dict[str, str]:
    """The caller's settings after ``function`` was called down ``path`` in a
    transaction that set :data:`CALLER` first (only those that differ from it)."""
    generation, instant, exact_below = PATHS[path]
    async with conn.transaction():
        for name, value in CALLER.items():
            await conn.execute("SELECT set_config($1, $2, true)", name, value)
        at = store.before if instant == "before" else await conn.fetchval("SELECT now()")
        await conn.fetchval(
            call.replace("{fn}", function),
            store.team,
            store.space,
            generation,
            store.vector,
            at,
            exact_below,
            *([store.projection] if function.startswith("relationship") else []),
        )
        now = {name: await conn.fetchval("SELECT current_setting($1)", name) for name in CALLER}
    return {name: value for name, value in now.items() if value != CALLER[name]}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("function", sorted(FUNCTIONS))
async def test_a_walk_leaves_the_callers_settings(
    admin_conn: Conn, store: Store, function: str, path: str
) -> None:
    leaked = await _settings_after(admin_conn, store, function, FUNCTIONS[function], path)
    assert leaked == {}, (function, path)


@pytest.mark.parametrize("setting", CHANGED_INSIDE)
@pytest.mark.parametrize("function", sorted(FUNCTIONS))
async def test_a_function_without_its_set_clause_is_caught(
    admin_conn: Conn, store: Store, function: str, setting: str
) -> None:
    """The check above fails for a copy of the function whose ``SET`` clause lacks
    one of the settings its body changes: the setting leaks into the caller's
    transaction (on the walk's path, which changes all four)."""
    definition = await admin_conn.fetchval(f"SELECT pg_get_functiondef('{function}'::regproc)")
    clause = next(
        line
        for line in definition.splitlines()
        if line.strip().replace('"', "").startswith(f"SET {setting} TO")
    )
    name = f"leaky_{unique('f').replace('-', '_')}"
    leaky = definition.replace(clause + "\n", "").replace(
        f"CREATE OR REPLACE FUNCTION public.{function}", f"CREATE FUNCTION pg_temp.{name}"
    )
    assert leaky.count("CREATE FUNCTION pg_temp.") == 1 and clause not in leaky
    await admin_conn.execute(leaky)
    try:
        call = FUNCTIONS[function].replace("{fn}", f"pg_temp.{name}")
        leaked = await _settings_after(admin_conn, store, function, call, "walk")
    finally:
        await admin_conn.execute(f"DROP FUNCTION pg_temp.{name}")
    assert setting in leaked, (function, setting, leaked)
