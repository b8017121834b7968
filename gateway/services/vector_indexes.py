"""Deferring and finishing a space's vector indexes (``load --index-after``).

A load into empty spaces may keep their vectors in detached, unindexed tables
(:mod:`gateway.store.vector_partitions`) and build each HNSW graph once at the
end, which costs a fraction of inserting the vectors into a growing graph one
by one. :class:`Deferral` is one load's side of it: it detaches a space before
the load's first batch that stores the space's vectors, in a short transaction
of its own, and holds the space (a shared advisory lock, on a connection of
its own) for as long as the load runs, so that no build attaches a space a
load is still filling. :func:`build_pending` does the end: for every detached
table it builds the index with the configured memory and parallel workers and
attaches the table again, each table in a transaction of its own, so that an
interrupted build leaves the table detached and a later run starts that table
again. Until then recall finds the space's new evidence by full text but not
by vector.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Self
from uuid import UUID

import asyncpg
import tenacity

from gateway.errors import DatabaseUnavailable, GatewayError, SpaceHasVectors, VectorIndexPending
from gateway.services import lock_waits
from gateway.services.reembed import ReembedBusy
from gateway.store import vector_partitions as store
from gateway.store.connection import Conn
from gateway.store.database import Database

Deferred = store.Deferred
DeferredSpace = store.DeferredSpace

# How often the build's progress is read from pg_stat_progress_create_index.
_POLL_S = 1.0

FINISH = store.FINISH


class VectorIndexBuildFailed(GatewayError):
    """A detached table could not be indexed and attached (see its message)."""

    code = "VECTOR_INDEX_BUILD_FAILED"


@dataclass
class IndexReport:
    """What :func:`build_pending` did: tables attached, vectors indexed, seconds;
    spaces skipped because a running load holds them; tables that failed."""

    tables: int = 0
    vectors: int = 0
    seconds: float = 0.0
    per_table: list[tuple[str, int, float]] = field(default_factory=list)
    busy: list[DeferredSpace] = field(default_factory=list)
    failed: list[tuple[str, DeferredSpace, str]] = field(default_factory=list)
    paired: int = 0
    """Spaces whose two tables were built at once (see :func:`together`)."""


async def deferred_spaces(db: Database) -> list[DeferredSpace]:
    """The spaces whose vectors wait in detached tables."""
    async with db.admin(readonly=True) as conn:
        return await store.deferred_spaces(conn)


async def pending(db: Database, spaces: Iterable[UUID] | None = None) -> list[Deferred]:
    """The detached vector tables waiting for their index (of ``spaces`` only, when
    given), with their row counts."""
    async with db.admin(readonly=True) as conn:
        return await store.deferred(conn, None if spaces is None else set(spaces))


async def build_pending(
    db: Database,
    items: Sequence[Deferred],
    *,
    maintenance_work_mem_mb: int,
    workers: int,
    progress: Callable[[int], None] | None = None,
) -> IndexReport:
    """Build and attach each of ``items`` (from :func:`pending`), space by space
    under the space's build lock. A space a running load holds is skipped and
    listed in ``busy``; a table that fails to attach (a schema that changed
    under it, say) is rolled back, listed in ``failed`` with the server's
    reason, and the others go on. ``progress`` gets the vectors put into the
    graph since its last call, while a build runs (as the server reports them)
    and at each table's end."""
    report = IndexReport()
    started = time.perf_counter()
    by_space: dict[UUID, list[Deferred]] = {}
    for item in items:
        by_space.setdefault(item.space, []).append(item)
    for space, tables in by_space.items():
        async with db.acquire() as conn:
            name = await _name(conn, space)
            if not await store.try_hold_building(conn, space):
                report.busy.append(name)
                continue
            try:
                if together(tables, maintenance_work_mem_mb):
                    async with store.spare_connection(db) as other:
                        if other is not None:
                            half = maintenance_work_mem_mb // 2
                            first, second = tables
                            # both end before either connection goes back to the pool
                            outcomes = await asyncio.gather(
                                _build_one(db, conn, first, name, report, progress, half, workers),
                                _build_one(
                                    db, other, second, name, report, progress, half, workers
                                ),
                                return_exceptions=True,
                            )
                            for outcome in outcomes:
                                if isinstance(outcome, BaseException):
                                    raise outcome
                            await store.close_deferral(conn, space)
                            report.paired += 1
                            continue
                for item in tables:
                    await _build_one(
                        db, conn, item, name, report, progress, maintenance_work_mem_mb, workers
                    )
            finally:
                await store.release_building(conn, space)
    report.seconds = time.perf_counter() - started
    return report


GRAPH_KB_PER_VECTOR = 4
"""What one vector's share of an HNSW graph under construction is taken to be
(about 2 KB for 384 dimensions, docs/loading.md: a margin of two)."""

MIN_BUILD_MEMORY_MB = 64


def together(tables: Sequence[Deferred], memory_mb: int) -> bool:
    """Whether a space's two tables (its evidence's and its relationships' vectors)
    are built at once, on two connections, each with half of ``memory_mb``: only
    when each graph fits in that half (:data:`GRAPH_KB_PER_VECTOR`), so that the
    two together never use more memory than one build alone would, and none
    outgrows its memory where one at a time it would not. On two cores the
    server then builds both graphs at once, where a build too small for
    PostgreSQL's parallel workers uses one core."""
    half = memory_mb // 2
    return (
        len(tables) == 2
        and half >= MIN_BUILD_MEMORY_MB
        and all(t.rows * GRAPH_KB_PER_VECTOR <= half * 1024 for t in tables)
    )


async def _name(conn: Conn, space: UUID) -> DeferredSpace:
    team, ref = await store.space_reference(conn, space)
    return DeferredSpace(team, space, ref)


async def _build_one(
    db: Database,
    conn: Conn,
    item: Deferred,
    name: DeferredSpace,
    report: IndexReport,
    progress: Callable[[int], None] | None,
    maintenance_work_mem_mb: int,
    workers: int,
) -> None:
    t0 = time.perf_counter()
    shown = [0]

    def advance(done: int) -> None:
        done = min(done, item.rows)
        if progress is not None and done > shown[0]:
            progress(done - shown[0])
            shown[0] = done

    watcher = asyncio.create_task(_watch(db, item.table, advance))
    try:
        async with conn.transaction():
            built = await store.build_and_attach(
                conn, item, maintenance_work_mem_mb=maintenance_work_mem_mb, workers=workers
            )
    except asyncpg.PostgresError as exc:
        report.failed.append((item.table, name, f"{type(exc).__name__}: {exc}"))
        return
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if not built:  # attached meanwhile by another build
        return
    advance(item.rows)
    report.tables += 1
    report.vectors += item.rows
    report.per_table.append((item.table, item.rows, time.perf_counter() - t0))


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


class Deferral:
    """The spaces one ``load --index-after`` fills, held for the load's lifetime.

    Use as ``async with Deferral(db) as deferral``: it keeps one connection of
    the pool, on which it holds each space's filling lock (shared: two loads may
    fill one space; a build cannot take the space meanwhile). :meth:`claim`
    detaches a space outside any batch. :attr:`spaces` lists what this load
    deferred, which is what its end-of-load build builds."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.spaces: list[UUID] = []
        # (team, space reference) -> space ID, looked up once per load by the
        # write service's look-ahead (a space's ID never changes).
        self.resolved: dict[tuple[str, str], UUID] = {}
        self._conn: Conn | None = None
        self._stack = contextlib.AsyncExitStack()
        # One statement at a time on the held connection: the batches of a
        # pipelined load (gateway/services/loader.py) claim and hold from two tasks.
        self._turn = asyncio.Lock()

    async def __aenter__(self) -> Self:
        self._conn = await self._stack.enter_async_context(self.db.acquire())
        if await store.reembed_running(self._conn):
            await self._stack.aclose()
            raise reembed_running()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()
        await self._stack.aclose()

    async def release(self) -> None:
        """Let builds take this load's spaces (the load is over)."""
        if self._conn is not None and not self._conn.is_closed():
            async with self._turn:
                for space in self.spaces:
                    with contextlib.suppress(Exception):
                        await store.release_filling(self._conn, space)

    async def hold(self, space: UUID) -> None:
        """Take the space's filling lock (once per space). Refused while a build
        of the space runs: its vectors are about to be attached."""
        if space in self.spaces:  # a batch in its transaction never waits for a claim
            return
        async with self._turn:
            await self._hold(space)

    async def _hold(self, space: UUID) -> None:
        if space in self.spaces:
            return
        assert self._conn is not None, "use Deferral as an async context manager"
        if not await store.try_hold_filling(self._conn, space):
            team, ref = await store.space_reference(self._conn, space)
            raise VectorIndexPending(
                f"space '{ref}' of team '{team}' is being indexed by '{FINISH}'; "
                "nothing was written: load again after it ends (without --index-after "
                "if the space then holds vectors)"
            )
        self.spaces.append(space)

    async def claim(self, team: str, space: UUID) -> bool:
        """Hold the space and detach its vector tables if they are attached and empty,
        in short transactions of their own that wait at most 100 ms for the parents'
        lock each time and back off between tries (:mod:`gateway.services.lock_waits`).
        Raises SpaceHasVectors when the space holds vectors readers find (then
        nothing changed). True when this call detached the space (False: it was
        detached already), so that a refused batch undoes only its own detaches."""
        async with self._turn:
            return await self._claim(team, space)

    async def _claim(self, team: str, space: UUID) -> bool:
        await self._hold(space)
        assert self._conn is not None
        conn = self._conn
        attached, full = await store.attached_state(conn, space)
        if not attached:
            return False
        if full:  # refuse without touching the parents' lock
            raise await _has_vectors(conn, space)
        outcome = store.Detach.DETACHED
        try:
            async for attempt in lock_waits.retrying():
                with attempt:
                    async with conn.transaction():
                        outcome = await store.detach(conn, team, space)
        except tenacity.RetryError:
            team_, ref = await store.space_reference(conn, space)
            raise DatabaseUnavailable(
                f"other sessions kept the vector tables busy: space '{ref}' of team '{team_}' "
                f"could not be detached after {lock_waits.ATTEMPTS} tries; nothing was "
                "written, and loading again is safe"
            ) from None
        if outcome is store.Detach.HAS_VECTORS:
            raise await _has_vectors(conn, space)
        if outcome is store.Detach.REEMBED_RUNNING:
            raise reembed_running()
        return True

    async def unclaim(self, space: UUID) -> bool:
        """Undo :meth:`claim` for a space whose batch was refused: attach its vector
        tables again while they are still empty, close its deferral and let go of
        it, so that a refusal leaves the space as it was (writable by plain loads
        and ``remember``, not waiting for a build). Best effort, in short
        transactions that give way to other sessions like :meth:`claim`: False, and
        the space stays deferred and held (the end of the load names it), when
        another load has filled it meanwhile or the tables stayed busy."""
        async with self._turn:
            return await self._unclaim(space)

    async def _unclaim(self, space: UUID) -> bool:
        assert self._conn is not None
        conn = self._conn
        undone = False
        try:
            async for attempt in lock_waits.retrying():
                with attempt:
                    async with conn.transaction():
                        undone = await store.reattach_if_empty(conn, space)
        except tenacity.RetryError:
            return False
        if undone:
            self.spaces.remove(space)
            await store.release_filling(conn, space)
        return undone


async def _has_vectors(conn: Conn, space: UUID) -> SpaceHasVectors:
    team, ref = await store.space_reference(conn, space)
    return SpaceHasVectors(
        f"space '{ref}' of team '{team}' already holds vectors that recall finds; "
        "--index-after loads only into spaces without vectors (load this file without it)"
    )


def reembed_running() -> ReembedBusy:
    return ReembedBusy(
        "a re-embed of the store is in progress, and it would miss vectors held in "
        "detached tables: finish it first ('recall-gateway reembed' resumes it), then "
        "load with --index-after"
    )
