"""A space's two vector tables built at once (``load --index-after``'s end).

On the real PostgreSQL: when both graphs fit in half of the build memory, the
evidence and relationship tables of a space are built on two connections at
once, each with half of it; the space ends as after one build at a time (both
tables attached with their HNSW index, the deferral closed), and a pool without
room for a second connection builds them one after the other.
"""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.services import loader, vector_indexes
from gateway.services.writes import WriteService
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import unique
from .test_index_after import _parsed, _records, _space, _state


def _tables(rows: int, count: int = 2) -> list[vector_indexes.Deferred]:
    space = uuid4()
    parents = ["evidence_embeddings", "relationship_embeddings"][:count]
    return [vector_indexes.Deferred(p, f"{p}_{space.hex}", space, rows) for p in parents]


@pytest.mark.parametrize(
    ("rows", "count", "memory_mb", "expected"),
    [
        (1_000, 2, 1024, True),
        (131_072, 2, 1024, True),  # 4 KB each: exactly half of 1024 MB
        (131_073, 2, 1024, False),  # one more outgrows the half: one at a time
        (10, 2, 64, False),  # halves under 64 MB: one at a time
        (10, 1, 1024, False),  # a single table
    ],
)
def test_which_spaces_are_built_together(
    rows: int, count: int, memory_mb: int, expected: bool
) -> None:
    assert vector_indexes.together(_tables(rows, count), memory_mb) is expected


async def _deferred_load(writes: WriteService, model: str) -> str:
    team = unique("together")
    await loader.load(writes, _parsed(_records(team, model)), batch_size=20, index_after=True)
    return team


async def _finish(db: Database, space: UUID) -> vector_indexes.IndexReport:
    items = await vector_indexes.pending(db, [space])
    assert len(items) == 2
    return await vector_indexes.build_pending(db, items, maintenance_work_mem_mb=256, workers=0)


async def _assert_finished(conn: Conn, space: UUID) -> None:
    for _table, attached, methods in await _state(conn, space):
        assert attached is True
        assert "hnsw:True" in methods
    assert (
        await conn.fetchval("SELECT count(*) FROM vector_deferrals WHERE space_id = $1", space) == 0
    )


async def test_a_space_s_two_tables_are_built_at_once(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn
) -> None:
    team = await _deferred_load(writes, embedder.model)
    space = await _space(admin_conn, team)
    report = await _finish(writes.db, space)
    assert report.paired == 1 and report.tables == 2 and not report.failed
    await _assert_finished(admin_conn, space)


async def test_without_a_spare_connection_they_are_built_one_after_the_other(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn, dsn: str
) -> None:
    team = await _deferred_load(writes, embedder.model)
    space = await _space(admin_conn, team)
    small = await Database.open(dsn, min_size=1, max_size=2)
    try:
        report = await _finish(small, space)
    finally:
        await small.close()
    assert report.paired == 0 and report.tables == 2 and not report.failed
    await _assert_finished(admin_conn, space)
