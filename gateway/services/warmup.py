"""The start-up warm-up: the store's files read into the page cache.

A store whose files are not in the operating system's page cache (after a
reboot, or a store larger than memory) answers its first recalls from random
disk reads: at 1,000,000 evidence (100,000 vectors a space) the first recalls
took seconds each, past the request deadline on a loaded machine, and reading
the vector files alone did not cure it, because the recall's hydration reads
the evidence, relationship and support tables at random too
(docs/benchmarks.md, "Cold start"). So at start the gateway reads the store's
relations in order, at the disk's sequential speed (gateway/store/warmup.py:
the HNSW indexes of the vector partitions, then the partitions' rows, then
every other table and index smallest first), up to a budget:
``RECALL_WARM_UP_MB``, by default (embedded server only) the server's
effective_cache_size (what the planner already assumes is cached; 0 turns the
warm-up off). Against an external server (DATABASE_URL) it is off unless
``RECALL_WARM_UP_MB`` is set: there it would evict the database host's page
cache at every gateway start and hold a container's health check at 503. While
it runs, ``/readyz`` answers 503 with what it is doing (waiting for another
process's warm-up, or how far it got) and the log says the same every
``PROGRESS_LOG_S``; requests are served meanwhile, slowly: the warm-up reads on
a connection of its own, not the request pool's. A login that may not read the
server's files (an external server's ordinary role) skips it, logged once.
docs/deploy.md, "Warm-up".
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

from gateway.errors import ConfigurationError
from gateway.store import warmup as store
from gateway.store.connection import Conn
from gateway.store.database import STORE_FAILURES

__all__ = ["CHUNK_BYTES", "PROGRESS_LOG_S", "WarmUp", "budget_mb", "check_budget"]

log = logging.getLogger("gateway.warmup")

CHUNK_BYTES = 16 * 2**20
"""Bytes per read statement: small enough for the statement timeout on a slow
disk and for the server's memory, large enough that statements cost nothing."""

PROGRESS_LOG_S = 10.0
"""Seconds between the log's progress lines while the warm-up reads (and while
it waits for another process's): a warm-up of a large store takes minutes."""

State = Literal["pending", "waiting", "running", "done", "skipped", "failed", "cancelled"]


def budget_mb(setting: int | None, *, embedded: bool) -> int | None:
    """The warm-up's budget from ``RECALL_WARM_UP_MB`` (None: unset): unset means
    the server's effective_cache_size (None) for the embedded server, and no
    warm-up (0) for an external one, whose host's page cache and start-up health
    checks are not the gateway's to spend."""
    if setting is None and not embedded:
        return 0
    return setting


def check_budget(setting: int | None, machine_mb: int) -> None:
    """Refuse, at start, a ``RECALL_WARM_UP_MB`` for the embedded server that is not
    below the machine's memory (``machine_mb``, its cgroup's limit if lower): the
    page cache cannot hold more than memory, so the reads past it would evict the
    vector indexes read first and leave /readyz at 503 for nothing. (An external
    server's memory is its own host's, unknown here: not checked.)"""
    if setting is not None and setting >= machine_mb:
        raise ConfigurationError(
            f"RECALL_WARM_UP_MB of {setting} is not less than this machine's memory (or its "
            f"cgroup's limit), {machine_mb} MB: the page cache cannot hold it, and the reads "
            "past memory would evict the vector indexes read first; set it lower, or unset "
            "it to read up to the embedded server's effective_cache_size (by default half "
            "the memory)"
        )


class WarmUp:
    """One warm-up of a store, and where it is (for ``/readyz``)."""

    def __init__(
        self,
        dsn: str,
        budget_mb: int | None,
        statement_timeout_ms: int = 5000,
        machine_mb: int | None = None,
    ) -> None:
        """``budget_mb``: at most this much is read; None: the server's
        effective_cache_size, but no more than ``machine_mb`` (the machine's
        memory, given for the embedded server, whose machine this is) less
        shared_buffers, since the page cache cannot hold more; 0: nothing (the
        state is ``skipped`` at once). The reads run on a connection of their
        own to ``dsn`` (not the request pool's), each statement bounded by
        ``statement_timeout_ms``."""
        self.dsn = dsn
        self.machine_mb = machine_mb
        self.statement_timeout_ms = statement_timeout_ms
        self.budget_mb = budget_mb
        self.state: State = "pending" if budget_mb != 0 else "skipped"
        self.planned = 0
        self.read = 0
        self.progress_log_s = PROGRESS_LOG_S
        self._started = 0.0
        self._logged = 0.0

    @property
    def warming(self) -> bool:
        return self.state in ("pending", "waiting", "running")

    def progress(self) -> str:
        """What /readyz says while it warms (and the log's progress lines)."""
        if self.state == "waiting":
            return (
                "warming up: waiting for another process of this store to finish its "
                "warm-up (it holds the warm-up lock)"
            )
        if self.planned == 0:
            return "warming up: listing the store's files"
        return (
            f"warming up: {self.read / 2**20:.0f} of {self.planned / 2**20:.0f} MB of the "
            "store's files read (vector indexes first)"
        )

    def _log_progress(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._logged >= self.progress_log_s:
            self._logged = now
            log.info("%s, %.1f s after its start", self.progress(), now - self._started)

    async def run(self) -> None:
        """Never raises (but for cancellation): a warm-up that fails leaves the
        gateway serving, cold, with a warning in the log."""
        if self.state != "pending":
            return
        self.state = "running"
        self._started = self._logged = time.monotonic()
        try:
            conn = await store.connect(self.dsn, self.statement_timeout_ms)
            try:
                # the lock is the session's: closing the connection releases it
                if not await store.lock(conn, self._waiting):
                    # It finished, or its process died halfway (the lock goes with
                    # its connection): the lock cannot tell, so read too; whatever
                    # it read is in the page cache and costs memory copies now.
                    log.info(
                        "warm-up: another process of this store held the warm-up lock "
                        "for %.1f s; reading the files too (cached by now as far as it got)",
                        time.monotonic() - self._started,
                    )
                self.state = "running"
                await self._read(conn)
            finally:
                await store.close(conn)
        except asyncio.CancelledError:
            # shutting down (SIGTERM) mid-way: the connection is closed (above), and
            # the state says so rather than "running"
            log.info("warm-up cancelled (shutting down); %s", self.progress())
            self.state = "cancelled"
            raise
        except store.WarmUpRefused as exc:
            log.info("warm-up skipped: this login may not read the server's files (%s)", exc)
            self.state = "skipped"
            return
        except STORE_FAILURES as exc:
            log.warning(
                "warm-up failed after %.1f s, serving cold: %s",
                time.monotonic() - self._started,
                exc,
            )
            self.state = "failed"
            return
        except Exception:
            # a bug must not hold /readyz at 503 for the life of the process
            log.exception("warm-up failed, serving cold")
            self.state = "failed"
            return
        log.info(
            "warm-up: read %.0f MB of the store's files in %.1f s",
            self.read / 2**20,
            time.monotonic() - self._started,
        )
        self.state = "done"

    def _waiting(self) -> None:
        """Called when another process holds the lock: /readyz and the log say so."""
        self.state = "waiting"
        self._log_progress(force=True)

    async def _derived_budget(self, conn: Conn) -> int:
        """effective_cache_size, capped by what the page cache can hold: an
        operator's RECALL_PG_EFFECTIVE_CACHE_SIZE_MB may exceed the machine's
        memory (the planner takes it as a hint), and reads past the page cache
        would evict the vector indexes read first."""
        budget = await store.effective_cache_bytes(conn)
        if self.machine_mb is None:
            return budget
        buffers = await store.shared_buffers_bytes(conn)
        room = max(self.machine_mb * 2**20 - buffers, 0)
        if budget > room:
            log.warning(
                "warm-up: effective_cache_size (%.0f MB) is more than the page cache can "
                "hold (this machine's %d MB less shared_buffers' %.0f MB); reading at most "
                "%.0f MB",
                budget / 2**20,
                self.machine_mb,
                buffers / 2**20,
                room / 2**20,
            )
            return room
        return budget

    async def _read(self, conn: Conn) -> None:
        relations = await store.relations(conn)
        if self.budget_mb is None:
            budget = await self._derived_budget(conn)
        else:
            budget = self.budget_mb * 2**20
        segment = await store.segment_bytes(conn)
        plan: list[tuple[store.RelationFile, int]] = []
        for relation in relations:
            take = min(relation.size, budget - self.planned)
            if take <= 0:
                break
            plan.append((relation, take))
            self.planned += take
        log.info(
            "warm-up: reading %.0f MB of the store's files (%d of %d relations, %.0f MB in "
            "all; budget %.0f MB, %s)",
            self.planned / 2**20,
            len(plan),
            len(relations),
            sum(r.size for r in relations) / 2**20,
            budget / 2**20,
            "RECALL_WARM_UP_MB"
            if self.budget_mb is not None
            else "the server's effective_cache_size",
        )
        for relation, take in plan:
            offset = 0
            while offset < take:
                number, within = divmod(offset, segment)
                path = relation.path if number == 0 else f"{relation.path}.{number}"
                length = min(CHUNK_BYTES, segment - within, take - offset)
                got = await store.read_chunk(conn, path, within, length)
                self.read += got
                self._log_progress()
                if got < length:
                    break  # the relation shrank or went since it was listed
                offset += length
