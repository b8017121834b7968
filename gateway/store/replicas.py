"""Read replicas: the one place that decides which pool a read runs on.

With ``RECALL_READ_DATABASE_URLS`` set, recall and trace read from a
PostgreSQL streaming replica when it has replayed everything the read needs;
writes, recall-event snapshots and feedback always go to the primary. A read
needs a *position* in the primary's write-ahead log (an LSN):

- the position the client passes back (``X-Recall-Min-Position``: what a write
  answered with, or the largest it has seen), for read-your-writes without a
  round trip to the primary;
- otherwise, for a current view, the primary's position now (its WAL *flush*
  position, one trivial statement), so a read without a header still sees
  every write committed before it started;
- for a ``knownAt`` instant that has not settled yet, the larger of the header
  and the primary's position now: the header alone would let a replica that
  lacks another client's write (made before the instant) answer, and the same
  request would answer differently once the instant settled;
- for a ``knownAt`` instant that has settled (older than the longest a write
  transaction may stay open, by the *database's* clock, which stamps
  ``recordedAt``), the primary's position sampled just after it: any replica
  past that point holds everything known at that instant, so historical views
  never wait and need no round trip.

Why the flush position (``pg_current_wal_flush_lsn()``): it is the end of the
WAL a walsender may stream, so a replica can always reach it (the insert
position may point past the next page's header, which no replica ever reports
as replayed on a quiet primary); and with ``synchronous_commit`` not ``off``
a COMMIT returns only after its record is flushed, so it is at or past every
committed write. ``synchronous_commit = off`` would break that, so the
gateway's own connections turn it back on (``local``) when replicas are set.

Why LSNs and not replay timestamps (measured, docs/deploy.md): a replica's
``pg_last_xact_replay_timestamp()`` is the commit time of the last transaction
it replayed, so on a quiet primary it falls behind the clock while the replica
is fully caught up (it would be taken for lagging), and it cannot be compared
with ``recordedAt``, which is a transaction's *start* time (a transaction that
started earlier may commit later). Positions are exact and only grow.

A monitor task samples the primary's position and every replica's replay
position a few times a second. A replica that does not answer, is not in
recovery, or is behind a position the primary had longer ago than
``RECALL_REPLICA_MAX_LAG_MS`` leaves the rotation, without an error to any
caller; it comes back at the first sample that finds it caught up again. A
read whose replica fails under it (a connection error, even one an optional
part of the answer degraded on) is run again on the primary, so a replica that
stops mid-run fails no request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from gateway import deadline
from gateway.errors import DatabaseUnavailable, GatewayError
from gateway.store.database import STORE_FAILURES, Database, connect_once

log = logging.getLogger("gateway.replicas")

T = TypeVar("T")

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
# The database's clock with the position: knownAt instants are the database's times.
_PRIMARY_POSITION = "SELECT clock_timestamp(), pg_current_wal_flush_lsn()::text"
_REPLICA_STATE = "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text"
_FAILURES: tuple[type[BaseException], ...] = (DatabaseUnavailable, *STORE_FAILURES)
# A replica that does not answer the monitor within this is out of rotation.
_PROBE_TIMEOUT_S = 1.0
# Between two looks at a replica that is behind a read's position.
_WAIT_POLL_S = 0.002
# A read on a replica may use at most this share of what is left of the request's
# deadline (and at most _REPLICA_ATTEMPT_MAX_S without one): a replica that stops
# answering without dropping its connections (a paused VM, a blackholed network)
# leaves the rest for the same read on the primary.
_REPLICA_SHARE = 0.5
_REPLICA_ATTEMPT_MAX_S = 5.0


class InvalidPosition(GatewayError):
    """``X-Recall-Min-Position`` is not a position (``X/Y``, hexadecimal)."""

    code = "INVALID_READ_POSITION"


class ReplicaClosed(Exception):
    """A look at a replica whose router has closed (it opens no connection)."""


_LOOK_FAILURES: tuple[type[BaseException], ...] = (ReplicaClosed, *_FAILURES)


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` -> an integer that orders like the log."""
    match = _LSN.match(text.strip())
    if match is None:
        raise InvalidPosition(f"'{text[:40]}' is not a log position like 0/1A2B3C4D")
    return (int(match[1], 16) << 32) + int(match[2], 16)


def _state(row: object) -> tuple[bool, str | None]:
    """(in recovery, replay position) of a replica's answer to _REPLICA_STATE."""
    if not isinstance(row, asyncpg.Record):
        return False, None
    text: str | None = row[1]
    return bool(row[0]), text


async def commit_settings(dsn: str) -> dict[str, str]:
    """Connection settings the primary's pool needs for positions to mean what the
    router takes them to: with ``synchronous_commit = off`` (server, database or
    role default) a COMMIT returns before its record is flushed, before the
    primary's flush position and before any replica can have it; ``local`` still
    flushes locally (and does not wait for synchronous standbys, as ``off`` did
    not). Any other value already flushes before returning, and is kept."""
    conn = await connect_once(dsn)
    try:
        value = await conn.fetchval("SHOW synchronous_commit")
    finally:
        await conn.close()
    return {"synchronous_commit": "local"} if value == "off" else {}


def _forget(task: asyncio.Task[Any]) -> None:
    """Collect an abandoned replica read's outcome (it no longer has a caller)."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("abandoned replica read ended with %r", task.exception())


def format_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@dataclass
class ReadChoice:
    """Where one request's read ran and why: the response's ``consistency`` extension."""

    served_by: str = "primary"  # or "replica"
    replica: str | None = None
    reason: str = "no_replicas"
    waited_ms: float = 0.0
    required: int | None = None

    def extension(self) -> dict[str, object]:
        out: dict[str, object] = {"servedBy": self.served_by, "reason": self.reason}
        if self.replica is not None:
            out["replica"] = self.replica
        if self.waited_ms:
            out["waitedMs"] = round(self.waited_ms, 2)
        if self.required is not None:
            out["requiredPosition"] = format_lsn(self.required)
        return out


MIN_POSITION: ContextVar[int | None] = ContextVar("recall_min_position", default=None)
"""What the client has seen (``X-Recall-Min-Position``), set by the HTTP edge."""

CHOICES: ContextVar[list[ReadChoice] | None] = ContextVar("recall_read_choices", default=None)
"""The choices of this request's reads, collected by the HTTP edge for its answer."""


@contextmanager
def read_scope(header: str | None) -> Iterator[None]:
    """One request's reads: the position its client has seen (``X-Recall-Min-Position``,
    checked even without replicas) and the list their choices are collected in."""
    position = parse_lsn(header) if header is not None and header.strip() else None
    seen = MIN_POSITION.set(position)
    collected = CHOICES.set([])
    try:
        yield
    finally:
        CHOICES.reset(collected)
        MIN_POSITION.reset(seen)


@dataclass
class Replica:
    """One read replica: its pool and what the monitor last saw of it."""

    name: str
    url: str
    db: Database
    in_rotation: bool = False
    replay: int = 0
    state: str = "not checked yet"
    # The monitor's own connection: a pool busy with reads must not look like a
    # replica that does not answer.
    probe: asyncpg.Connection | None = None
    # One look at a time: the monitor and a caller's ``check()`` may overlap (the
    # gateway's only caller is the monitor; tests call ``check()`` beside it), and
    # two queries at once on the probe failed the second ("another operation is
    # in progress"), whose clean-up then closed the probe under the first: a
    # healthy replica left the rotation for a tick, and the first look raised
    # AttributeError on the probe the second had cleared.
    _looking: asyncio.Lock = field(
        default_factory=asyncio.Lock, init=False, repr=False, compare=False
    )
    # Set by ``close_probe``: a look still connecting then closes what it opens, and
    # no later look opens a probe.
    closed: bool = field(default=False, init=False, compare=False)

    async def look(self) -> tuple[bool, str | None]:
        """(in recovery, replay position), on the monitor's connection, one look at
        a time."""
        async with self._looking:
            probe = self.probe
            if probe is None or probe.is_closed():
                if self.closed:
                    raise ReplicaClosed(f"{self.name} is closed")
                probe = await asyncpg.connect(self.url, timeout=_PROBE_TIMEOUT_S)
                if self.closed:  # closed while this look was connecting
                    probe.terminate()
                    raise ReplicaClosed(f"{self.name} is closed")
                self.probe = probe
            try:
                return _state(await probe.fetchrow(_REPLICA_STATE, timeout=_PROBE_TIMEOUT_S))
            except BaseException:
                probe.terminate()
                self.probe = None
                raise

    def close_probe(self) -> None:
        """Take the replica out of rotation and close the monitor's connection for
        good. It does not take the look's lock (nor await anything): a close called
        while a look holds it (from inside the look's task, or with the look stuck
        connecting) must neither wait for that look nor leave it a connection: a
        look still connecting closes the one it gets (``closed``), a look on the
        probe fails on the terminated probe, and a look answered just before does
        not put the replica back (``ReadRouter._check_replica``)."""
        self.closed = True
        self.in_rotation, self.state = False, "closed"
        probe, self.probe = self.probe, None
        if probe is not None:
            probe.terminate()


@dataclass(frozen=True)
class _Sample:
    # The primary's clock (seconds since the epoch) when it had ``position``:
    # knownAt instants are compared with recordedAt, stamped by the database, so
    # the gateway's own clock (which may be ahead) must not decide what settled.
    at: float
    position: int
    # The gateway's monotonic clock at the sample, for the lag bound only.
    seen: float = 0.0


@dataclass
class ReadRouter:
    """The pool chooser. Without replicas every read runs on the primary, with no
    statement added (a single-machine set-up pays nothing)."""

    primary: Database
    replicas: Sequence[Replica] = ()
    max_lag_s: float = 5.0
    wait_s: float = 0.02
    interval_s: float = 0.25
    # A knownAt instant older than this has settled: every write transaction that
    # started before it has committed (mutations are bounded by the request deadline).
    settle_s: float = 15.0
    _samples: deque[_Sample] = field(default_factory=deque)
    _turn: itertools.count[int] = field(default_factory=itertools.count)
    _monitor: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        # Enough history for the lag bound and for settled knownAt instants (an
        # older instant is served by the oldest sample: any replica past it has it).
        keep = int(2 * (self.max_lag_s + self.settle_s) / self.interval_s) + 8
        self._samples = deque(self._samples, maxlen=keep)

    @property
    def enabled(self) -> bool:
        return bool(self.replicas)

    # --- lifecycle --------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        primary: Database,
        urls: Sequence[str],
        *,
        max_size: int = 10,
        statement_timeout_ms: int = 5000,
        side_connections: int = 0,
        side_plan_cache_mode: str | None = None,
        max_lag_s: float = 5.0,
        wait_s: float = 0.02,
        interval_s: float = 0.25,
        settle_s: float = 15.0,
    ) -> ReadRouter:
        """Open a pool per replica (one that cannot be reached yet starts out of
        rotation and is tried again by the monitor) and start the monitor."""
        replicas: list[Replica] = []
        for i, url in enumerate(urls, 1):
            db = await Database.open(
                url,
                min_size=0,
                max_size=max_size,
                statement_timeout_ms=statement_timeout_ms,
                side_connections=side_connections,
                side_plan_cache_mode=side_plan_cache_mode,
            )
            replicas.append(Replica(f"replica-{i}", url, db))
        router = cls(
            primary,
            replicas,
            max_lag_s=max_lag_s,
            wait_s=wait_s,
            interval_s=interval_s,
            settle_s=settle_s,
        )
        if replicas:
            await router.check()
            router._monitor = asyncio.create_task(router._watch(), name="replica-monitor")
        return router

    async def close(self, wait_s: float | None = None) -> None:
        """Stop the monitor, then close each replica's probe (without waiting for a
        look in flight: see ``Replica.close_probe``) and its pool."""
        if self._monitor is not None:
            self._monitor.cancel()
            try:
                await self._monitor
            except asyncio.CancelledError:
                pass
        for replica in self.replicas:
            replica.close_probe()
            await replica.db.close(wait_s)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception:  # the monitor must outlive any one failure
                log.warning("replica check failed", exc_info=True)

    # --- positions --------------------------------------------------------------------------

    async def position(self) -> int:
        """The primary's current log position: everything committed so far is before it."""
        return (await self._sample()).position

    async def _sample(self) -> _Sample:
        async with self.primary.acquire() as conn:
            row = await conn.fetchrow(_PRIMARY_POSITION)
        assert row is not None
        clock: datetime = row[0]
        return _Sample(clock.timestamp(), parse_lsn(row[1]), time.monotonic())

    async def check(self) -> None:
        """Sample the primary's position, then each replica's state, and set the rotation."""
        try:
            sample = await self._sample()
        except _FAILURES as exc:
            log.warning("primary position unavailable: %s", exc)
            return
        self._samples.append(sample)
        await asyncio.gather(*(self._check_replica(r) for r in self.replicas))

    async def _check_replica(self, replica: Replica) -> None:
        try:
            recovering, text = await replica.look()
        except _LOOK_FAILURES as exc:
            # a look the router's close() cut short is no sign of a dead replica
            state = "closed" if replica.closed else f"unreachable: {type(exc).__name__}"
            self._set(replica, False, state)
            return
        if replica.closed:  # closed after the look's answer came, before it resumed
            self._set(replica, False, "closed")
            return
        if not recovering or text is None:
            self._set(replica, False, "not a replica (not in recovery)")
            return
        replica.replay = max(replica.replay, parse_lsn(text))
        lag = self.lag_s(replica.replay)
        if lag > self.max_lag_s:
            self._set(replica, False, f"lagging {lag:.1f} s")
        else:
            self._set(replica, True, "in rotation")

    def _set(self, replica: Replica, in_rotation: bool, state: str) -> None:
        if in_rotation != replica.in_rotation:
            if in_rotation:
                log.info("%s in rotation", replica.name)
            else:
                log.warning("%s out of rotation: %s", replica.name, state)
        replica.in_rotation = in_rotation
        replica.state = state

    def lag_s(self, replay: int) -> float:
        """How long ago the primary first had a position this replica has not replayed
        (0 when it has replayed the newest sample)."""
        behind = next((s for s in self._samples if s.position > replay), None)
        return 0.0 if behind is None else max(0.0, time.monotonic() - behind.seen)

    def _settled_position(self, known_at: datetime) -> int | None:
        """The primary's position sampled at least ``settle_s`` after ``known_at`` (by
        the primary's clock), or None when that moment has not come yet."""
        t = known_at.timestamp() + self.settle_s
        if not self._samples or self._samples[-1].at < t:
            return None
        if self._samples[0].at >= t:
            return self._samples[0].position
        return next(s.position for s in self._samples if s.at >= t)

    async def consistency(self) -> dict[str, object]:
        """The ``consistency`` extension of an answer: where its reads ran, and a
        position at or past everything it reflects, for the client to send back as
        ``X-Recall-Min-Position`` (read-your-writes on any replica). A read served
        by a replica answers the position it was required to have; anything else
        (a write, a read on the primary) the primary's position now."""
        choices = CHOICES.get() or []
        taken = list(choices)
        choices.clear()
        out: dict[str, object] = {}
        if taken:
            out["reads"] = [c.extension() for c in taken]
        required = [c.required for c in taken if c.required is not None]
        if taken and all(c.served_by == "replica" for c in taken) and required:
            out["position"] = format_lsn(max(required))
            return out
        try:
            out["position"] = format_lsn(await self.position())
        except _FAILURES as exc:
            log.warning("no position for the answer: %s", exc)
        return out

    # --- choosing ---------------------------------------------------------------------------

    async def run(
        self,
        work: Callable[[Database, bool], Awaitable[T]],
        *,
        known_at: datetime | None = None,
    ) -> T:
        """Run a read: ``work(db, on_primary)`` on a replica that has replayed what the
        read needs, else on the primary. A replica that fails under it is taken out
        of rotation and the read runs again on the primary."""
        choice = ReadChoice()
        choices = CHOICES.get()
        if choices is not None:
            choices.append(choice)
        if not self.replicas:
            return await work(self.primary, True)
        replica = await self._choose(choice, known_at)
        if replica is None:
            return await work(self.primary, True)
        before = replica.db.server_failures
        remaining = deadline.remaining()
        budget = _REPLICA_ATTEMPT_MAX_S if remaining is None else remaining * _REPLICA_SHARE
        # A task of its own, abandoned (cancelled, never awaited) past its budget: a
        # cancelled read still rolls back on its hung connection, and the caller
        # must not wait for that.
        attempt = asyncio.ensure_future(work(replica.db, False))
        try:
            await asyncio.wait((attempt,), timeout=budget)
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        if not attempt.done():
            attempt.cancel()
            attempt.add_done_callback(_forget)
            self._set(replica, False, "did not answer in time")
            choice.served_by, choice.replica, choice.reason = "primary", None, "replica_timeout"
            return await work(self.primary, True)
        try:
            result = attempt.result()
        except Exception as exc:
            if replica.db.server_failures == before and not isinstance(exc, DatabaseUnavailable):
                raise
            failure: BaseException | None = exc
        else:
            if replica.db.server_failures == before:
                return result
            failure = None
        self._set(
            replica,
            False,
            f"failed during a read: {type(failure).__name__ if failure else 'connection lost'}",
        )
        choice.served_by, choice.replica, choice.reason = "primary", None, "replica_failed"
        return await work(self.primary, True)

    async def _choose(self, choice: ReadChoice, known_at: datetime | None) -> Replica | None:
        live = [r for r in self.replicas if r.in_rotation]
        if not live:
            choice.reason = "no_replica_in_rotation"
            return None
        header = MIN_POSITION.get()
        settled = None if known_at is None else self._settled_position(known_at)
        if settled is not None:
            # everything known at the instant is before ``settled``
            need = settled if header is None else max(header, settled)
        elif known_at is None and header is not None:
            # a current view: the client's own writes (read-your-writes)
            need = header
        else:
            # an instant that has not settled may still gain writes committed before
            # now by anyone: the header alone would let a replica that lacks them
            # answer, and the view would move once the instant settled
            now = await self.position()
            need = now if header is None else max(header, now)
        choice.required = need
        start = len(live)
        turn = next(self._turn)
        ordered = [live[(turn + i) % start] for i in range(start)]
        for replica in ordered:
            if replica.replay >= need:
                choice.served_by, choice.replica, choice.reason = (
                    "replica",
                    replica.name,
                    "caught_up",
                )
                return replica
        # Behind as far as the monitor knows: look again, briefly, at the one furthest on.
        replica = max(ordered, key=lambda r: r.replay)
        started = time.monotonic()
        while True:
            try:
                async with replica.db.pool.acquire(timeout=self.wait_s or 0.01) as conn:
                    recovering, text = _state(await conn.fetchrow(_REPLICA_STATE, timeout=1.0))
            except TimeoutError:
                # its pool is busy (or it is slow): the primary now; the monitor
                # decides whether it stays in rotation
                choice.reason = "replica_busy"
                choice.waited_ms = (time.monotonic() - started) * 1000
                return None
            except _FAILURES:
                self._set(replica, False, "unreachable")
                choice.reason = "replica_unreachable"
                return None
            if recovering and text is not None:
                replica.replay = max(replica.replay, parse_lsn(text))
            waited = time.monotonic() - started
            if replica.replay >= need:
                choice.served_by, choice.replica = "replica", replica.name
                choice.reason, choice.waited_ms = "waited", waited * 1000
                return replica
            if waited >= self.wait_s:
                choice.reason, choice.waited_ms = "replica_behind", waited * 1000
                return None
            await asyncio.sleep(_WAIT_POLL_S)
