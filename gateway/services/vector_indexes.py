"""Finishing a load that deferred its spaces' vector indexes (``load --index-after``).

A load into empty spaces may keep their vectors in detached, unindexed tables
(:mod:`gateway.store.vector_partitions`) and build each HNSW graph once at the
end, which costs a fraction of inserting the vectors into a growing graph one
by one. This module does the end: for every detached table it builds the index
with the configured memory and parallel workers and attaches the table again,
each table in a transaction of its own, so that an interrupted build leaves the
table detached and a later run starts that table again. Until then recall finds
the space's new evidence by full text but not by vector.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.store import vector_partitions as store
from gateway.store.database import Database

Deferred = store.Deferred

# How often the build's progress is read from pg_stat_progress_create_index.
_POLL_S = 1.0


@dataclass
class IndexReport:
    """What :func:`build_pending` did: tables attached, vectors indexed, seconds."""

    tables: int = 0
    vectors: int = 0
    seconds: float = 0.0
    per_table: list[tuple[str, int, float]] = field(default_factory=list)


async def pending(db: Database) -> list[Deferred]:
    """The detached vector tables waiting for their index, with their row counts."""
    async with db.admin(readonly=True) as conn:
        return await store.deferred(conn)


async def build_pending(
    db: Database,
    items: Sequence[Deferred],
    *,
    maintenance_work_mem_mb: int,
    workers: int,
    progress: Callable[[int], None] | None = None,
) -> IndexReport:
    """Build and attach each of ``items`` (from :func:`pending`). ``progress`` gets
    the vectors put into the graph since its last call, while a build runs (as
    the server reports them) and at each table's end."""
    report = IndexReport()
    started = time.perf_counter()
    for item in items:
        t0 = time.perf_counter()
        shown = [0]

        def advance(done: int, shown: list[int] = shown, rows: int = item.rows) -> None:
            done = min(done, rows)
            if progress is not None and done > shown[0]:
                progress(done - shown[0])
                shown[0] = done

        watcher = asyncio.create_task(_watch(db, item.table, advance))
        try:
            async with db.admin() as conn:
                await store.build_and_attach(
                    conn,
                    item,
                    maintenance_work_mem_mb=maintenance_work_mem_mb,
                    workers=workers,
                )
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        advance(item.rows)
        report.tables += 1
        report.vectors += item.rows
        report.per_table.append((item.table, item.rows, time.perf_counter() - t0))
    report.seconds = time.perf_counter() - started
    return report


async def _watch(db: Database, table: str, advance: Callable[[int], None]) -> None:
    """Read the running build's progress on a connection of its own. Best effort:
    a pool without a spare connection, or a server that says nothing, shows
    progress only when each table is done."""
    with contextlib.suppress(Exception):
        async with db.acquire() as conn:
            while True:
                await asyncio.sleep(_POLL_S)
                done = await store.index_build_progress(conn, table)
                if done is not None:
                    advance(done)
