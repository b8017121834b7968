"""The two vector lists' HNSW walks (db/0190) against the real database: the
walked rows are checked against the view in one statement, not looked up one
by one; a walked row outside the view hands the answer to the filtered walk of
before; and the walk's plan is the index's, whatever the planner would rather
do with an unfiltered ``ORDER BY distance LIMIT ef``.

Each space is small (310 vectors) and searched with an exact-search bound
under its size, so that the function takes its HNSW path, as a space of
10,000 vectors or more does. On a space this small the planner prefers a
sequential scan and a top-N sort of every vector for an unfiltered walk (an
exact list, where the walk's is approximate); nothing here disables it from
outside: the function must walk the index on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import numpy as np

from gateway.embeddings import EmbeddingProvider
from gateway.services.writes import WriteService
from gateway.store.connection import Conn
from gateway.store.database import APP_ROLE, Database

from .conftest import analyze, load_jsonl, register_vector, unique
from .factories import jsonl
from .test_relationship_vectors import _relationships, _team, _vectors
from .test_search import _branch, _insert_direct, _near, index_rows_fetched
from .test_search import _team as _evidence_team

DIMS = 384
HNSW_FROM = 100  # passed as p_exact_below: the walk from this many rows on
EARLY = 300  # rows before the view's instant, angles 0.02 to 0.9 from the query
LATE = 10  # rows after it, nearer to the query than any early row
EF = 150  # the walk's width for a list of 10 on a space this size (db/0110)


@dataclass(frozen=True)
class Walked:
    team: str
    space: UUID
    generation: int
    projection: int | None  # relationships only
    query: np.ndarray
    t_early: datetime  # after the early rows, before the late ones
    ids: list[str]  # early, then late
    vectors: np.ndarray


def _unit(v: np.ndarray) -> np.ndarray:
    unit: np.ndarray = (v / np.linalg.norm(v)).astype(np.float32)
    return unit


def _vectors_of(rng: np.random.Generator, query: np.ndarray) -> np.ndarray:
    """Early vectors at evenly spaced angles (shuffled: no near ties), then late
    ones nearer than any of them."""
    angles = np.concatenate(
        [rng.permutation(np.linspace(0.02, 0.9, EARLY)), np.linspace(0.004, 0.013, LATE)]
    )
    return _near(query, angles, rng)


def _ids() -> list[str]:
    return [f"v-{i:03d}" for i in range(EARLY)] + [f"late-{i}" for i in range(LATE)]


def _exact(
    w: Walked, limit: int, *, late: bool = True, exclude: frozenset[str] = frozenset()
) -> list[str]:
    """The exact top ``limit`` (late rows included or not, known IDs left out)."""
    distances = 1.0 - w.vectors.astype(np.float64) @ w.query.astype(np.float64)
    order = [w.ids[i] for i in np.argsort(distances, kind="stable")]
    return [i for i in order if (late or not i.startswith("late-")) and i not in exclude][:limit]


async def _lookups(conn: Conn, table: str) -> int:
    """Index scans of ``table`` in this backend not yet flushed (see index_rows_fetched)."""
    got = await conn.fetchval(
        "SELECT idx_scan FROM pg_stat_xact_user_tables WHERE relname = $1", table
    )
    return int(got or 0)


async def _evidence_space(db: Database, writes: WriteService, model: str) -> Walked:
    team = unique("walk-ev")
    await load_jsonl(writes, jsonl(_evidence_team(team)))
    rng = np.random.default_rng(190)
    query = _unit(rng.standard_normal(DIMS))
    vectors, ids = _vectors_of(rng, query), _ids()
    async with db.pool.acquire() as conn:
        await register_vector(conn)
        branch = await _branch(conn, team)
        async with conn.transaction():
            await _insert_direct(
                conn,
                team,
                branch.space_id,
                branch.generation,
                "src",
                ids[:EARLY],
                vectors[:EARLY],
                model,
            )
        t_early = await conn.fetchval("SELECT now()")
        async with conn.transaction():
            await _insert_direct(
                conn,
                team,
                branch.space_id,
                branch.generation,
                "src",
                ids[EARLY:],
                vectors[EARLY:],
                model,
            )
        await analyze(conn, "evidence", "evidence_embeddings")
    return Walked(team, branch.space_id, branch.generation, None, query, t_early, ids, vectors)


async def _evidence_walk(
    db: Database, w: Walked, known_at: datetime | None, exclude: list[str]
) -> tuple[list[str], int, int]:
    """The function's list of 10 in a recall's own transaction (tenant role,
    row-level security, nothing disabled), the rows the partition handed over
    by index scans, and the index scans of ``evidence``."""
    partition = f"evidence_embeddings_{w.space.hex}"
    async with db.unit(w.team, [w.space]) as unit, unit.step() as conn:
        assert await conn.fetchval("SELECT current_user") == APP_ROLE
        fetched, looked_up = (
            await index_rows_fetched(conn, partition),
            await _lookups(conn, "evidence"),
        )
        got = [
            r["evidence_id"]
            for r in await conn.fetch(
                "SELECT evidence_id FROM evidence_vector_candidates("
                "$1, $2, $3, $4, 10, $5, $6, $7)",
                w.team,
                w.space,
                w.generation,
                w.query,
                known_at,
                exclude,
                HNSW_FROM,
            )
        ]
        fetched = await index_rows_fetched(conn, partition) - fetched
        looked_up = await _lookups(conn, "evidence") - looked_up
    return got, fetched, looked_up


async def test_the_evidence_walk_checks_its_rows_in_one_statement(
    db: Database, writes: WriteService, admin_conn: Conn, embedder: EmbeddingProvider
) -> None:
    """db/0190: the walk hands over its ef rows (the index's plan, though the
    planner would sort every vector of a space this small) and the function checks
    them with a handful of index scans of ``evidence``, not one lookup per walked
    row (150 before). A walked row outside the view (recorded after the view's
    instant) sends the answer to the filtered walk of db/0076: the exact top of
    the rows in the view. Known IDs stay filtered in the walk itself."""
    await admin_conn.execute(
        "INSERT INTO embedding_models (name, dimensions) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        embedder.model,
        DIMS,
    )
    w = await _evidence_space(db, writes, embedder.model)

    got, fetched, looked_up = await _evidence_walk(db, w, None, [])
    assert got == _exact(w, 10)
    assert fetched == EF  # the walk, not a sort of the partition
    assert looked_up <= 5, looked_up

    # The late rows are the nearest, and outside a view of the instant before them.
    got, fetched, _ = await _evidence_walk(db, w, w.t_early, [])
    assert got == _exact(w, 10, late=False)
    assert fetched == EF + EF + LATE  # the unfiltered walk, then the filtered one

    known = _exact(w, 2)
    got, fetched, looked_up = await _evidence_walk(db, w, None, known)
    assert got == _exact(w, 10, exclude=frozenset(known))
    # two known IDs among the walked: the walk reads on past them
    assert fetched == EF + len(known) and looked_up <= 5, (fetched, looked_up)


async def _relationship_space(writes: WriteService, conn: Conn) -> Walked:
    team, space, generation, projection, model = await _team(writes, conn, "walk-rel")
    rng = np.random.default_rng(1900)
    query = _unit(rng.standard_normal(DIMS))
    vectors, ids = _vectors_of(rng, query), _ids()
    for part in (slice(0, EARLY), slice(EARLY, None)):
        async with conn.transaction():
            await conn.execute("SET LOCAL statement_timeout = 0")
            await _relationships(conn, team, space, generation, ids[part])
            await _vectors(
                conn,
                [
                    (team, space, i, projection, model, v)
                    for i, v in zip(ids[part], vectors[part], strict=True)
                ],
            )
        if part.start == 0:
            t_early = await conn.fetchval("SELECT now()")
    await analyze(conn, "relationships", "relationship_embeddings")
    # r-first (written by the loader, with a vector of its own) is part of the space.
    first = await conn.fetchval(
        "SELECT embedding::real[] FROM relationship_embeddings "
        "WHERE team_id = $1 AND relationship_id = 'r-first'",
        team,
    )
    return Walked(
        team,
        space,
        generation,
        projection,
        query,
        t_early,
        [*ids, "r-first"],
        np.vstack([vectors, np.asarray(first, dtype=np.float32)]),
    )


async def _relationship_walk(
    db: Database, w: Walked, known_at: datetime
) -> tuple[list[str], int, int]:
    partition = f"relationship_embeddings_{w.space.hex}"
    async with db.unit(w.team, [w.space]) as unit, unit.step() as conn:
        assert await conn.fetchval("SELECT current_user") == APP_ROLE
        fetched, looked_up = (
            await index_rows_fetched(conn, partition),
            await _lookups(conn, "relationships"),
        )
        got = [
            r["relationship_id"]
            for r in await conn.fetch(
                "SELECT relationship_id FROM relationship_vector_candidates("
                "$1, $2, $3, $4, $5, 10, $6, $7)",
                w.team,
                w.space,
                w.generation,
                w.projection,
                w.query,
                known_at,
                HNSW_FROM,
            )
        ]
        fetched = await index_rows_fetched(conn, partition) - fetched
        looked_up = await _lookups(conn, "relationships") - looked_up
    return got, fetched, looked_up


async def test_the_relationship_walk_checks_its_rows_in_one_statement(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """db/0190, discovery's list: as the evidence walk above. Before, the walk
    looked each of its 150 walked rows up in ``relationships``."""
    await register_vector(admin_conn)
    w = await _relationship_space(writes, admin_conn)
    now = await admin_conn.fetchval("SELECT now()")

    got, fetched, looked_up = await _relationship_walk(db, w, now)
    assert got == _exact(w, 10)
    assert fetched == EF
    assert looked_up <= 5, looked_up

    got, fetched, _ = await _relationship_walk(db, w, w.t_early)
    assert got == _exact(w, 10, late=False)
    assert fetched == EF + EF + LATE
