"""The per-request deadline, visible to every layer below the HTTP view.

The view sets it when a request starts (``RECALL_REQUEST_TIMEOUT_MS``) and
cancels the request's work when it passes; the store reads what is left of it
to bound waiting for a pooled connection and, through ``statement_timeout``,
every statement of the request's transactions, so that PostgreSQL stops
working on a request that nobody waits for any more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_deadline: ContextVar[float | None] = ContextVar("recall_deadline", default=None)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Work in this block (and in tasks it starts) must end within ``seconds``."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def remaining() -> float | None:
    """Seconds left before the current deadline (at least 0), or None without one."""
    at = _deadline.get()
    if at is None:
        return None
    return max(0.0, at - time.monotonic())


def remaining_ms(default: int) -> int:
    """Milliseconds left, at least 1 and at most ``default``: a statement budget."""
    left = remaining()
    if left is None:
        return default
    return max(1, min(default, int(left * 1000)))
