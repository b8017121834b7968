"""Loads held open or stopped, and sessions that hold a lock, for the tests of what
a load costs other sessions (test_load_space_locks, test_index_after and
test_index_after_safety).

Nothing here waits by sleeping for something to have happened: a batch is held
by an embedding provider that waits for the test (:class:`Barrier`), a load is
stopped by its progress callback (:class:`StopAfter`), a lock request is seen in
``pg_locks`` (:func:`until_queued`), and whether another session is served is
decided by a lock timeout far longer than the waits under test (:func:`served`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.embeddings.base import Vectors
from gateway.services import loader
from gateway.services.writes import WriteService
from gateway.store.connection import Conn
from gateway.store.database import Database

LONG_READ = "SELECT count(*) FROM evidence_embeddings WHERE team_id = 'nobody'"
"""A read of the evidence vectors' parent (ACCESS SHARE on it and its partitions),
as a slow recall or a pg_dump holds it while its transaction lasts."""

OTHER_READ = "SELECT count(*) FROM evidence_embeddings WHERE team_id = 'other-team'"
"""Another team's read of the evidence vectors' parent."""

WRITE_EVIDENCE = "LOCK TABLE evidence IN ROW EXCLUSIVE MODE"
"""What a transaction that writes evidence holds (a slow ``remember``, another
load): a space batch's cloned foreign keys wait for it."""


class Barrier:
    """An embedding provider that, at its first call, says so and waits for the
    test before answering: the loader's batch stays open (its transaction holds
    whatever it has taken) for as long as the test wants."""

    def __init__(self, inner: EmbeddingProvider) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def dimensions(self) -> int:
        return self.inner.dimensions

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.entered.set()
        await self.release.wait()
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        return None


@contextlib.asynccontextmanager
async def batch_held_open(
    writes: WriteService,
    barrier: Barrier,
    records: list[tuple[int, Any]],
    *,
    index_after: bool,
) -> AsyncIterator[asyncio.Task[loader.LoadReport]]:
    """A load of ``records`` (parsed) whose first batch that embeds waits at the
    barrier, inside its transaction; released (and the load awaited) when the
    block ends."""
    held = WriteService(writes.db, barrier)
    task = asyncio.create_task(loader.load(held, records, batch_size=50, index_after=index_after))
    entered = asyncio.create_task(barrier.entered.wait())
    try:
        await asyncio.wait({task, entered}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # raises what the load raised
            pytest.fail("the load never embedded")
        yield task
    finally:
        barrier.release.set()
        entered.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await entered


class Stopped(Exception):
    """Raised by :class:`StopAfter`: the load stopped between two batches."""


class StopAfter:
    """A load's progress callback that stops the load once ``batches`` batches are
    committed (the loader reports each batch after its commit), as a crash
    between two batches would. ``counts`` holds the records of each batch."""

    def __init__(self, batches: int) -> None:
        self.batches = batches
        self.counts: list[int] = []

    def __call__(self, records: int) -> None:
        self.counts.append(records)
        if len(self.counts) == self.batches:
            raise Stopped


@contextlib.asynccontextmanager
async def holding(db: Database, statement: str) -> AsyncIterator[None]:
    """A session that ran ``statement`` in a transaction it keeps open until the
    block ends, holding what it locked: a slow recall's read of a table, a slow
    ``remember``'s write, a ``LOCK TABLE``."""
    async with db.pool.acquire() as conn, conn.transaction():
        await conn.execute(statement)
        yield


async def served(db: Database, statement: str) -> bool:
    """Whether another session's ``statement`` gets its locks within 3 s (the
    sessions under test wait at most 100 ms at a time): False when it was queued
    longer, behind a lock request that waits itself."""
    async with db.pool.acquire() as conn:
        try:
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '3s'")
                await conn.execute(statement)
        except asyncpg.LockNotAvailableError:
            return False
    return True


async def until_queued(
    conn: Conn,
    mode: str,
    relations: Sequence[str],
    *,
    unless: asyncio.Task[Any] | None = None,
    tries: int = 500,
) -> bool:
    """Wait (polling ``pg_locks`` every 10 ms, at most ``tries`` times) until some
    session asks for a ``mode`` lock on one of ``relations`` and waits for it.
    False if it never did, or ``unless`` ended first."""
    for _ in range(tries):
        if unless is not None and unless.done():
            return False
        if await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = $1 "
            "AND relation = ANY($2::regclass[])",
            mode,
            list(relations),
        ):
            return True
        await asyncio.sleep(0.01)
    return False
