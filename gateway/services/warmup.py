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
it runs, ``/readyz`` answers 503 with how far it got; requests are served
meanwhile, slowly: the warm-up reads on a connection of its own, not the
request pool's. A login that may not read the server's files (an external
server's ordinary role) skips it, logged once. docs/deploy.md, "Warm-up".
"""

from __future__ import annotations

import logging
import time
from typing import Literal

from gateway.store import warmup as store
from gateway.store.connection import Conn
from gateway.store.database import STORE_FAILURES

__all__ = ["CHUNK_BYTES", "WarmUp", "budget_mb"]

log = logging.getLogger("gateway.warmup")

CHUNK_BYTES = 16 * 2**20
"""Bytes per read statement: small enough for the statement timeout on a slow
disk and for the server's memory, large enough that statements cost nothing."""

State = Literal["pending", "running", "done", "skipped", "failed"]


def budget_mb(setting: int | None, *, embedded: bool) -> int | None:
    """The warm-up's budget from ``RECALL_WARM_UP_MB`` (None: unset): unset means
    the server's effective_cache_size (None) for the embedded server, and no
    warm-up (0) for an external one, whose host's page cache and start-up health
    checks are not the gateway's to spend."""
    if setting is None and not embedded:
        return 0
    return setting


class WarmUp:
    """One warm-up of a store, and where it is (for ``/readyz``)."""

    def __init__(self, dsn: str, budget_mb: int | None, statement_timeout_ms: int = 5000) -> None:
        """``budget_mb``: at most this much is read; None: the server's
        effective_cache_size; 0: nothing (the state is ``skipped`` at once).
        The reads run on a connection of their own to ``dsn`` (not the request
        pool's), each statement bounded by ``statement_timeout_ms``."""
        self.dsn = dsn
        self.statement_timeout_ms = statement_timeout_ms
        self.budget_mb = budget_mb
        self.state: State = "pending" if budget_mb != 0 else "skipped"
        self.planned = 0
        self.read = 0

    @property
    def warming(self) -> bool:
        return self.state in ("pending", "running")

    def progress(self) -> str:
        if self.planned == 0:
            return "warming up"
        return (
            f"warming up: {self.read / 2**20:.0f} of {self.planned / 2**20:.0f} MB of the "
            "store's files read (vector indexes first)"
        )

    async def run(self) -> None:
        """Never raises (but for cancellation): a warm-up that fails leaves the
        gateway serving, cold, with a warning in the log."""
        if self.state != "pending":
            return
        self.state = "running"
        started = time.monotonic()
        try:
            conn = await store.connect(self.dsn, self.statement_timeout_ms)
            try:
                # the lock is the session's: closing the connection releases it
                if not await store.lock(conn):
                    log.info("warm-up: another process of this store did it")
                    self.state = "done"
                    return
                await self._read(conn)
            finally:
                await store.close(conn)
        except store.WarmUpRefused as exc:
            log.info("warm-up skipped: this login may not read the server's files (%s)", exc)
            self.state = "skipped"
            return
        except STORE_FAILURES as exc:
            log.warning(
                "warm-up failed after %.1f s, serving cold: %s", time.monotonic() - started, exc
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
            time.monotonic() - started,
        )
        self.state = "done"

    async def _read(self, conn: Conn) -> None:
        relations = await store.relations(conn)
        if self.budget_mb is None:
            budget = await store.effective_cache_bytes(conn)
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
        for relation, take in plan:
            offset = 0
            while offset < take:
                number, within = divmod(offset, segment)
                path = relation.path if number == 0 else f"{relation.path}.{number}"
                length = min(CHUNK_BYTES, segment - within, take - offset)
                got = await store.read_chunk(conn, path, within, length)
                self.read += got
                if got < length:
                    break  # the relation shrank or went since it was listed
                offset += length
