"""Retrying a short transaction that takes the vector tables' strongest lock.

Creating a space's vector partitions (``CREATE TABLE ... PARTITION OF``) and
detaching them (``load --index-after``) take ACCESS EXCLUSIVE on
``evidence_embeddings`` and ``relationship_embeddings``, which every recall of
every team reads. A request waiting for that lock queues every new reader
behind it, so such a transaction waits at most 100 ms for it
(:data:`gateway.store.vector_partitions.DETACH_LOCK_TIMEOUT`), gives up, lets
the queued readers through, and is tried again: up to :data:`ATTEMPTS` times,
backing off from 50 ms to 2 s with jitter (each wait drawn between half and
all of the current step), about a minute in all. The policy is tenacity's;
this module only names it once for every caller.
"""

from __future__ import annotations

import asyncpg
import tenacity

# Tries of a lock-taking transaction before the caller gives up (DATABASE_UNAVAILABLE).
ATTEMPTS = 40
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 2.0

# What a short lock wait raises: the lock timeout, or a deadlock it broke.
BUSY = (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError)


def retrying() -> tenacity.AsyncRetrying:
    """``async for attempt in retrying(): with attempt: ...`` runs the block until
    it does not raise :data:`BUSY`; after :data:`ATTEMPTS` busy tries it raises
    :class:`tenacity.RetryError`. A wait is uniform in [step/2, step], the step
    doubling from :data:`BACKOFF_FIRST_S` to :data:`BACKOFF_MAX_S`: tenacity's
    exponential wait of half the step plus its random one of the other half."""
    half_first, half_max = BACKOFF_FIRST_S / 2, BACKOFF_MAX_S / 2
    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(ATTEMPTS),
        wait=tenacity.wait_exponential(multiplier=half_first, max=half_max)
        + tenacity.wait_random_exponential(multiplier=half_first, max=half_max),
        retry=tenacity.retry_if_exception_type(BUSY),
        reraise=False,
    )
