"""Move a store's vectors to another embedding model while the gateway keeps serving.

Every evidence and relationship vector is embedded again with the target
provider, in batches of bounded size. Each batch is one short read, the model
run outside any transaction, and one short write of the new vectors into the
staging tables, so an interrupted run loses at most one batch and a new run
for the same model goes on where it stopped. The live vectors (and the store's
model name) change only in the final switch, one transaction, after which
gateways running with ``RECALL_EMBEDDING_MODEL=auto`` follow the store
(:func:`watch_store_model`). SQL lives in :mod:`gateway.store.reembed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from gateway.embeddings.base import EmbeddingProvider
from gateway.errors import EmbeddingMismatch, GatewayError, VectorIndexPending
from gateway.store import reembed as store
from gateway.store import vector_partitions
from gateway.store.database import Database, connect_once
from gateway.store.writes import store_embedding_model

log = logging.getLogger(__name__)

STORE_DIMENSIONS = 384
MAX_SWITCH_ATTEMPTS = 20

Progress = Callable[[int, int], None]
"""Called with (vectors done, vectors in the store) after every batch."""


class ReembedBusy(GatewayError):
    """Another ``reembed`` holds the store."""

    code = "REEMBED_RUNNING"


class ReembedOutpaced(GatewayError):
    """Writes kept adding old-model vectors faster than the switch caught up with
    them, ``MAX_SWITCH_ATTEMPTS`` times running. Expected under a heavy write load,
    not a bug: nothing live changed, and running reembed again resumes the run.
    Its own code, so that a script can tell it from an ``INTERNAL`` failure and
    retry (docs/errors.md)."""

    code = "REEMBED_OUTPACED"


@dataclass(frozen=True, slots=True)
class ReembedReport:
    from_model: str | None
    to_model: str
    embedded: int
    """Vectors embedded by this run (a resumed run does not count earlier ones)."""
    total: int
    resumed: bool
    switched: bool
    abandoned: str | None
    note: str


async def reembed(
    db: Database,
    target: EmbeddingProvider,
    *,
    batch_size: int = 64,
    progress: Progress | None = None,
) -> ReembedReport:
    """Re-embed the whole store with ``target`` and switch to it; resumable."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if target.dimensions != STORE_DIMENSIONS:
        raise EmbeddingMismatch(
            f"the store holds {STORE_DIMENSIONS}-dimension vectors; model '{target.model}' "
            f"makes {target.dimensions}"
        )
    async with db.acquire() as conn:
        if not await store.try_lock(conn):
            raise ReembedBusy("another reembed is running on this store")
        try:
            current = await store_embedding_model(conn)
            if current is None:
                return ReembedReport(
                    None,
                    target.model,
                    0,
                    0,
                    False,
                    False,
                    None,
                    "the store holds no vectors yet; nothing to re-embed",
                )
            if current[0] == target.model:
                return ReembedReport(
                    current[0],
                    target.model,
                    0,
                    0,
                    False,
                    False,
                    None,
                    f"the store already holds vectors of model '{target.model}'",
                )
            deferred = await vector_partitions.deferred_spaces(conn)
            if deferred:  # it would miss them, and its switch would relabel them
                raise VectorIndexPending(
                    f"not re-embedding: {vector_partitions.pending_message(deferred)}, then "
                    "run reembed"
                )
            async with conn.transaction():
                run = await store.start_run(conn, current[0], target.model)
            async with conn.transaction():
                await store.unbounded(conn)
                total, done = await store.counts(conn, run.id)
            embedded = 0
            if progress is not None:
                progress(done, total)
            for _ in range(MAX_SWITCH_ATTEMPTS):
                for relationships in (False, True):
                    while True:
                        fetch = (
                            store.pending_relationships if relationships else store.pending_evidence
                        )
                        batch = await fetch(conn, run.id, batch_size)
                        if not batch:
                            break
                        vectors = await target.embed([p.text for p in batch])
                        async with conn.transaction():
                            await store.stage(
                                conn, run.id, batch, vectors, relationships=relationships
                            )
                        embedded += len(batch)
                        done += len(batch)
                        total = max(total, done)
                        if progress is not None:
                            progress(done, total)
                async with conn.transaction():
                    await store.unbounded(conn)
                    missing = await store.switch(conn, run)
                if not missing:
                    return ReembedReport(
                        run.from_model,
                        run.to_model,
                        embedded,
                        total,
                        run.resumed,
                        True,
                        run.abandoned,
                        f"the store now holds vectors of model '{run.to_model}'",
                    )
                # Writes landed since the last batch: embed them too, then try again.
                total += missing
            raise ReembedOutpaced(
                f"writes kept adding vectors faster than the switch could catch up after "
                f"{MAX_SWITCH_ATTEMPTS} attempts; run reembed again (it resumes)"
            )
        finally:
            with contextlib.suppress(Exception):
                await store.unlock(conn)


async def count_vectors(db: Database) -> int:
    """Vectors a re-embed would embed (a progress bar's total)."""
    async with db.admin(readonly=True) as conn:
        await store.unbounded(conn)
        return await store.live_vectors(conn)


async def read_store_model(db: Database) -> str | None:
    """The model whose vectors the store holds, or None for a store without vectors."""
    async with db.admin(readonly=True) as conn:
        current = await store_embedding_model(conn)
    return current[0] if current is not None else None


async def watch_store_model(dsn: str, provider: object, interval_s: float) -> None:
    """Tell ``provider`` the store's model every ``interval_s`` (runs until cancelled).

    ``provider`` is anything with an ``observe(model)`` method: the process's
    :class:`gateway.embeddings.StoreModel` (which passes it on to a following
    provider, :class:`gateway.embeddings.FollowingProvider`), or such a provider.

    This is how a serving gateway notices the switch of a re-embed run: within
    one interval it embeds questions with the new model (``auto``) or refuses
    to embed with the old one (a model named explicitly). It reads on a
    connection of its own, outside the pool: it takes no request's place, and
    the pool's statement counts stay those of the requests.
    """
    observe = getattr(provider, "observe", None)  # a FollowingProvider, perhaps wrapped
    if not callable(observe):
        return
    conn: asyncpg.Connection | None = None
    try:
        while True:
            await asyncio.sleep(interval_s)
            try:
                if conn is None or conn.is_closed():
                    conn = await connect_once(dsn)
                current = await store_embedding_model(conn)
            except Exception as exc:  # the database away for a moment: keep the last answer
                log.debug("store model not read: %s", exc)
                if conn is not None:
                    conn.terminate()
                conn = None
                continue
            observe(current[0] if current is not None else None)
    finally:
        if conn is not None and not conn.is_closed():
            await conn.close()
