"""``load --index-after`` next to everything else: recalls of other teams, other
loads, ``build-vector-indexes``, ``reembed`` and migrations, on the real PostgreSQL.

The detach of a space's vector tables takes ACCESS EXCLUSIVE on the parents that
every recall reads, so it runs outside the loader's batches, briefly, and gives
way to readers; a space a running load fills is held against builds; a re-embed
and a migration refuse while vectors wait in detached tables (they would miss
them). No assertion here depends on timing: blocked readers are detected by a
lock timeout far longer than the detach ever waits.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest
import pytest_asyncio

from gateway.embeddings import EmbeddingProvider
from gateway.errors import MigrationError, VectorIndexPending
from gateway.services import loader, lock_waits, vector_indexes
from gateway.services.reembed import ReembedBusy, reembed
from gateway.services.writes import WriteService
from gateway.store import migrations, vector_partitions
from gateway.store import reembed as reembed_store
from gateway.store.connection import Conn
from gateway.store.database import Database
from gateway.store.vector_partitions import VECTOR_TABLES

from .conftest import unique
from .factories import jsonl
from .held_loads import (
    LONG_READ,
    OTHER_READ,
    StopAfter,
    Stopped,
    holding,
    served,
    until_queued,
)
from .test_index_after import _build, _parsed, _records, _space, _state
from .test_reembed import Double


async def _interrupted(writes: WriteService, team: str, model: str) -> UUID:
    """An ``index_after`` load stopped after its first batch of vectors: the
    team's shared space is left detached, recorded, and held by nobody."""
    # the team and principal go in a batch of their own, before any vector
    with pytest.raises(Stopped):
        await loader.load(
            writes,
            _parsed(_records(team, model, docs=10)),
            batch_size=8,
            index_after=True,
            progress=StopAfter(batches=2),
        )
    async with writes.db.admin(readonly=True) as conn:
        return await _space(conn, team)


def _setup_only(team: str, model: str) -> list[dict[str, Any]]:
    """The team's records without evidence: its spaces exist, attached and empty."""
    return _records(team, model, docs=0)


def _evidence_only(team: str, model: str, docs: int = 10) -> list[dict[str, Any]]:
    return [
        r for r in _records(team, model, docs=docs) if r["kind"] in {"evidence", "embedding_model"}
    ]


@pytest_asyncio.fixture(loop_scope="session")
async def fresh(fresh_dsn: str, embedder: EmbeddingProvider) -> AsyncIterator[WriteService]:
    db = await Database.open(fresh_dsn, min_size=1, max_size=6)
    try:
        yield WriteService(db, embedder)
    finally:
        await db.close()


# --- finding 1: reembed and --index-after exclude each other --------------------------


async def test_reembed_refuses_while_vectors_are_detached_and_relabels_nothing(
    fresh: WriteService, embedder: EmbeddingProvider
) -> None:
    team = unique("ixre")
    space = await _interrupted(fresh, team, embedder.model)
    table = vector_partitions.partition_name("evidence_embeddings", space)
    with pytest.raises(VectorIndexPending) as caught:
        await reembed(fresh.db, Double())
    message = caught.value.message
    assert f"space 'shared' of team '{team}'" in message
    assert "recall-gateway build-vector-indexes" in message
    async with fresh.db.admin(readonly=True) as conn:
        models = await conn.fetch(f'SELECT DISTINCT model FROM "{table}"')
        assert [r["model"] for r in models] == [embedder.model]
        assert await conn.fetchval("SELECT name FROM embedding_models") == embedder.model
        assert not await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM reembed_runs WHERE status = 'running')"
        )


async def test_the_reembed_switch_checks_again_under_its_lock(
    fresh: WriteService, embedder: EmbeddingProvider
) -> None:
    """The race the start's check cannot see: a run that checked for deferrals
    just before a detach committed, and started its run just after. Its switch
    is refused, before the rename that would relabel the detached vectors."""
    team = unique("ixsw")
    await _interrupted(fresh, team, embedder.model)
    async with fresh.db.acquire() as conn:
        async with conn.transaction():
            run = await reembed_store.start_run(conn, embedder.model, "test-double-v1")
        with pytest.raises(VectorIndexPending, match="build-vector-indexes") as caught:
            async with conn.transaction():
                await reembed_store.switch(conn, run)
        assert f"space 'shared' of team '{team}'" in caught.value.message
        assert await conn.fetchval("SELECT name FROM embedding_models") == embedder.model


async def test_an_index_after_load_refuses_while_a_reembed_is_under_way(
    fresh: WriteService, embedder: EmbeddingProvider
) -> None:
    await loader.load(
        fresh, _parsed(_records(unique("ixrr0"), embedder.model, docs=2)), batch_size=50
    )
    async with fresh.db.acquire() as conn:
        async with conn.transaction():
            await reembed_store.start_run(conn, embedder.model, "test-double-v1")
    team = unique("ixrr")
    with pytest.raises(ReembedBusy) as caught:
        await loader.load(
            fresh, _parsed(_records(team, embedder.model, docs=3)), batch_size=50, index_after=True
        )
    assert caught.value.code == "REEMBED_RUNNING"
    assert "recall-gateway reembed" in caught.value.message
    assert await vector_indexes.deferred_spaces(fresh.db) == []


# --- finding 2: the detach gives way to readers ---------------------------------------


async def test_other_teams_read_the_parents_while_a_detach_waits_for_a_long_reader(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn
) -> None:
    team = unique("ixlock")
    await loader.load(writes, _parsed(_setup_only(team, embedder.model)), batch_size=50)
    space = await _space(admin_conn, team)
    async with holding(writes.db, LONG_READ):
        load = asyncio.create_task(
            loader.load(
                writes,
                _parsed(_evidence_only(team, embedder.model)),
                batch_size=50,
                index_after=True,
            )
        )
        # wait until the load is trying to detach (its lock request comes and goes)
        if not await until_queued(admin_conn, "AccessExclusiveLock", VECTOR_TABLES):
            pytest.fail("the load never asked for the parents' lock")
        for _ in range(3):
            assert await served(writes.db, OTHER_READ), "a reader queued behind the detach"
        assert not load.done()
    report = await load
    assert report.created["evidence"] == 10 and report.deferred == [space]
    await _build(writes.db)
    for _table, attached, methods in await _state(admin_conn, space):
        assert attached is True and "hnsw:True" in methods


async def test_a_space_with_vectors_is_refused_without_waiting_for_the_parents(
    writes: WriteService, embedder: EmbeddingProvider
) -> None:
    team = unique("ixfull2")
    await loader.load(writes, _parsed(_records(team, embedder.model, docs=3)), batch_size=50)
    with pytest.raises(loader.LoadError) as caught:
        async with holding(writes.db, LONG_READ):
            await loader.load(
                writes,
                _parsed(_records(team, embedder.model, docs=3, start=3)),
                batch_size=50,
                index_after=True,
            )
    assert caught.value.errors[0].code == "SPACE_HAS_VECTORS"
    assert caught.value.deferred == []


async def test_a_detach_that_never_gets_the_lock_gives_up_cleanly(
    writes: WriteService,
    embedder: EmbeddingProvider,
    admin_conn: Conn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lock_waits, "ATTEMPTS", 3)
    team = unique("ixgive")
    await loader.load(writes, _parsed(_setup_only(team, embedder.model)), batch_size=50)
    with pytest.raises(loader.LoadError) as caught:
        async with holding(writes.db, LONG_READ):
            await loader.load(
                writes,
                _parsed(_evidence_only(team, embedder.model)),
                batch_size=50,
                index_after=True,
            )
    assert caught.value.errors[0].code == "DATABASE_UNAVAILABLE"
    assert "nothing was written" in caught.value.errors[0].message
    space = await _space(admin_conn, team)
    for _table, attached, _methods in await _state(admin_conn, space):
        assert attached is True
    assert await admin_conn.fetchval("SELECT count(*) FROM evidence WHERE team_id = $1", team) == 0


# --- findings 3 and 6: loads and builds next to each other ----------------------------


async def test_a_load_builds_only_its_spaces_and_nobody_attaches_a_space_still_filled(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn
) -> None:
    x, y = unique("ixconx"), unique("ixcony")
    x_lines = _records(x, embedder.model, docs=20)
    async with vector_indexes.Deferral(writes.db) as running:
        first = await loader.load(writes, _parsed(x_lines[:25]), batch_size=8, deferral=running)
        x_space = await _space(admin_conn, x)
        assert first.deferred == [x_space]

        # Y's whole load, then its end-of-load build: Y's tables only.
        other = await loader.load(
            writes, _parsed(_records(y, embedder.model, docs=5)), batch_size=50, index_after=True
        )
        y_space = await _space(admin_conn, y)
        assert other.deferred == [y_space]
        mine = await vector_indexes.pending(writes.db, other.deferred)
        assert {i.space for i in mine} == {y_space}
        # build-vector-indexes meanwhile (every pending space): X is skipped and said so.
        report = await _build(writes.db)
        assert [s.space for s in report.busy] == [x_space]
        assert str(report.busy[0]) == f"space 'shared' of team '{x}'"
        for _table, attached, _methods in await _state(admin_conn, x_space):
            assert attached is False
        for _table, attached, methods in await _state(admin_conn, y_space):
            assert attached is True and "hnsw:True" in methods

        rest = await loader.load(writes, _parsed(x_lines), batch_size=8, deferral=running)
        assert rest.created["evidence"] == 20 - first.created["evidence"]
    report = await _build(writes.db)
    assert report.busy == [] and report.failed == []
    for _table, attached, methods in await _state(admin_conn, x_space):
        assert attached is True and "hnsw:True" in methods


async def test_two_claims_of_one_space_at_once_detach_it_once(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn, db: Database
) -> None:
    team = unique("ixrace")
    await loader.load(writes, _parsed(_setup_only(team, embedder.model)), batch_size=50)
    space = await _space(admin_conn, team)
    async with db.pool.acquire() as first:
        tx = first.transaction()
        await tx.start()
        assert (
            await vector_partitions.detach(first, team, space) is vector_partitions.Detach.DETACHED
        )
        async with vector_indexes.Deferral(db) as second:
            claim = asyncio.create_task(second.claim(team, space))
            await asyncio.sleep(0.3)  # the claim waits for the first detach's commit
            await tx.commit()
            await claim  # no "is not a partition" error: it found the work done
            assert second.spaces == [space]
    assert await vector_indexes.pending(db, [space]) != []
    await _build(db)
    for _table, attached, _methods in await _state(admin_conn, space):
        assert attached is True


# --- finding 4: migrations and failed attaches ----------------------------------------


async def test_migrate_refuses_while_vectors_are_detached(
    fresh: WriteService, embedder: EmbeddingProvider, tmp_path: Path
) -> None:
    team = unique("ixmig")
    await _interrupted(fresh, team, embedder.model)
    folder = tmp_path / "db"
    shutil.copytree(migrations.migrations_dir(), folder)
    (folder / "9999_probe.sql").write_text(
        "ALTER TABLE evidence_embeddings ADD COLUMN probe_note text;"
    )
    async with fresh.db.acquire() as conn:
        assert [m.name for m in await migrations.pending(conn, folder)] == ["probe"]
        with pytest.raises(MigrationError) as caught:
            await migrations.migrate(conn, folder)
        assert caught.value.code == "MIGRATION_ERROR"
        assert f"space 'shared' of team '{team}'" in caught.value.message
        assert "recall-gateway build-vector-indexes" in caught.value.message
        assert [m.name for m in await migrations.pending(conn, folder)] == ["probe"]
        assert await migrations.migrate(conn) == []  # nothing pending: no refusal
    await _build(fresh.db)
    async with fresh.db.acquire() as conn:
        assert [m.name for m in await migrations.migrate(conn, folder)] == ["probe"]


def test_a_table_that_cannot_attach_is_reported_with_a_code_and_the_others_go_on(
    fresh_dsn: str, embedder: EmbeddingProvider
) -> None:
    from .test_cli import run

    async def prepare() -> UUID:
        db = await Database.open(fresh_dsn, min_size=1, max_size=4)
        try:
            space = await _interrupted(WriteService(db, embedder), unique("ixfail"), embedder.model)
            async with db.admin() as conn:  # a column added behind the loader's back
                await conn.execute("ALTER TABLE evidence_embeddings ADD COLUMN probe_note text")
            return space
        finally:
            await db.close()

    async def states(space: UUID) -> list[bool]:
        conn = await asyncpg.connect(fresh_dsn)
        try:
            return [attached for _t, attached, _m in await _state(conn, space)]
        finally:
            await conn.close()

    space = asyncio.run(prepare())
    result = run(["build-vector-indexes"], fresh_dsn)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "error VECTOR_INDEX_BUILD_FAILED: the vector index of space 'shared'" in result.stderr
    assert "probe_note" in result.stderr
    assert asyncio.run(states(space)) == [False, True]  # the relationship table attached


# --- findings 7, 8 and 10: the build itself -------------------------------------------


async def test_only_tables_the_store_detached_are_built(
    writes: WriteService, admin_conn: Conn
) -> None:
    stranger = vector_partitions.partition_name("evidence_embeddings", UUID(int=0xABC))
    await admin_conn.execute(
        f'CREATE TABLE "{stranger}" AS SELECT * FROM evidence_embeddings LIMIT 0'
    )
    try:
        assert all(i.table != stranger for i in await vector_indexes.pending(writes.db))
    finally:
        await admin_conn.execute(f'DROP TABLE "{stranger}"')


async def test_the_build_makes_the_index_itself_and_stops_when_its_client_goes(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn, db: Database
) -> None:
    """The index is the build's own (its name and parameters), not one ATTACH
    would have built under its lock with the server's default memory; and the
    build's transaction asks the server to notice a vanished client."""
    team = unique("ixown")
    space = await _interrupted(writes, team, embedder.model)
    items = await vector_indexes.pending(db, [space])
    parent_hnsw = {
        r["relname"]: r["reloptions"]
        for r in await admin_conn.fetch(
            "SELECT c.relname, c.reloptions FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = 'evidence_embeddings'::regclass "
            "AND a.amname = 'hnsw'"
        )
    }
    item = next(i for i in items if i.parent == "evidence_embeddings")
    async with db.pool.acquire() as conn:
        async with conn.transaction():
            assert await vector_partitions.build_and_attach(
                conn, item, maintenance_work_mem_mb=64, workers=1
            )
            assert await conn.fetchval("SHOW client_connection_check_interval") == "1s"
            assert await conn.fetchval("SHOW maintenance_work_mem") == "64MB"
    own = await admin_conn.fetch(
        "SELECT c.relname, c.reloptions FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = to_regclass($1) AND a.amname = 'hnsw'",
        item.table,
    )
    expected = {
        f"{item.table}_{name.removeprefix('evidence_embeddings_')}"[:63]: opts
        for name, opts in parent_hnsw.items()
    }
    assert {r["relname"]: r["reloptions"] for r in own} == expected
    await _build(db)


def test_a_refused_load_does_not_say_vectors_wait_when_none_do(
    dsn: str, embedder: EmbeddingProvider, tmp_path: Path
) -> None:
    from .test_cli import run

    team = unique("ixmsg")
    first = tmp_path / "first.jsonl"
    first.write_text(jsonl(_records(team, embedder.model, docs=2)))
    assert run(["load", str(first)], dsn).returncode == 0
    more = tmp_path / "more.jsonl"
    more.write_text(jsonl(_records(team, embedder.model, docs=2, start=2)))
    result = run(["load", "--index-after", str(more)], dsn)
    assert result.returncode == 1
    assert "SPACE_HAS_VECTORS" in result.stderr or "already holds vectors" in result.stderr
    assert "not yet indexed" not in result.stderr


# --- finding 5: recall says so -------------------------------------------------------

_RECALL = """
query Recall($q: String) {
  recallMemory(query: $q, communityLimit: 0) {
    results { evidenceId }
    degradations { frontier code optional }
    searchStates { evidence { status complete } relationships { status complete } }
  }
}
"""


async def _recall(dsn: str, tok: str) -> dict[str, Any]:
    import httpx

    from .conftest import app_for

    app = app_for(dsn)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            r = await c.post(
                "/graphql",
                json={"query": _RECALL, "variables": {"q": "Engine note: the pump runs"}},
                headers={"Authorization": f"Bearer {tok}"},
            )
    body = r.json()
    assert "errors" not in body, body
    result: dict[str, Any] = body["data"]["recallMemory"]
    return result


async def test_recall_says_the_vector_list_of_a_deferred_space_waits_for_its_index(
    writes: WriteService, embedder: EmbeddingProvider, dsn: str, db: Database
) -> None:
    from .test_recall import token

    team = unique("ixrecall")
    await _interrupted(writes, team, embedder.model)
    tok = await token(writes, team, "ann")
    during = await _recall(dsn, tok)
    codes = {(d["frontier"], d["code"]) for d in during["degradations"]}
    assert ("EVIDENCE", "vector_index_pending") in codes
    assert ("RELATIONSHIPS", "vector_index_pending") in codes
    assert during["searchStates"]["evidence"]["complete"] is False
    assert during["results"], "full text still answers"

    # another team, whose spaces are indexed, is told nothing of it
    other = unique("ixrecall-other")
    await loader.load(writes, _parsed(_records(other, embedder.model, docs=2)), batch_size=50)
    theirs = await _recall(dsn, await token(writes, other, "ann"))
    assert all(d["code"] != "vector_index_pending" for d in theirs["degradations"])
    await _build(db)
    after = await _recall(dsn, tok)
    assert all(d["code"] != "vector_index_pending" for d in after["degradations"])
    assert after["searchStates"]["evidence"]["complete"] is True


# --- review of the space batches, H1: a refused batch detaches nothing -----------------


def _one_unknown_source(team: str, model: str) -> list[dict[str, Any]]:
    """Three good evidence records and a fourth whose source does not exist: the
    database refuses the batch only after its spaces were looked at."""
    lines = _evidence_only(team, model, docs=3)
    bad = dict(lines[-1], id="evbad", source="nope")
    return [*lines, bad]


async def _deferrals(conn: Conn, team: str) -> int:
    return int(
        await conn.fetchval("SELECT count(*) FROM vector_deferrals WHERE team_id = $1", team)
    )


@pytest.mark.parametrize("new_team", [False, True], ids=["existing-space", "new-team"])
async def test_a_refused_index_after_batch_leaves_its_spaces_attached_and_writable(
    writes: WriteService,
    embedder: EmbeddingProvider,
    admin_conn: Conn,
    new_team: bool,
) -> None:
    team = unique("ixrefuse")
    lines = _one_unknown_source(team, embedder.model)
    if new_team:  # the team (and so its spaces) and the refused memory in one file
        lines = [*_setup_only(team, embedder.model), *lines[1:]]
    else:
        await loader.load(writes, _parsed(_setup_only(team, embedder.model)), batch_size=50)
    with pytest.raises(loader.LoadError) as caught:
        await loader.load(writes, _parsed(lines), batch_size=50, index_after=True)
    assert caught.value.errors[0].field == "source"
    assert caught.value.deferred == []  # the CLI says no vectors wait
    assert await _deferrals(admin_conn, team) == 0
    space = await _space(admin_conn, team)
    for _table, attached, methods in await _state(admin_conn, space):
        assert attached is True and "hnsw:True" in methods
    # A plain load (and so `remember`) into the space is not told to wait for an index.
    report = await loader.load(
        writes, _parsed(_records(team, embedder.model, docs=1)), batch_size=50
    )
    assert report.created["evidence"] == 1
