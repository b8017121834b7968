"""Prometheus metrics (prometheus-client), safe with several uvicorn workers.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``serve --workers N`` sets it to a fresh
folder when it is not), each worker writes its samples to files there and
``GET /metrics`` aggregates every worker's through prometheus-client's
``MultiProcessCollector``; otherwise the process's own registry is served.
Gauges of the pool are read when scraped (one process) or kept as live sums
of the living workers (multiprocess).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import weakref
from typing import Any, Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from starlette.requests import Request
from starlette.responses import Response

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter(
    "recall_gateway_requests",
    "GraphQL requests by operation name and outcome (ok, or the first error code).",
    ["operation", "outcome"],
)
REQUEST_SECONDS = Histogram(
    "recall_gateway_request_duration_seconds",
    "GraphQL request latency by operation name and outcome.",
    ["operation", "outcome"],
    buckets=_LATENCY_BUCKETS,
)
DEGRADATIONS = Counter(
    "recall_gateway_degradations",
    "Recall degradations by frontier and code.",
    ["frontier", "code"],
)
EMBEDDING_SECONDS = Histogram(
    "recall_gateway_embedding_duration_seconds",
    "Latency of one embedding call (queries and writes).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
STATEMENTS = Histogram(
    "recall_gateway_statements_per_request",
    "SQL statements sent for one GraphQL request.",
    buckets=(1, 2, 5, 10, 20, 30, 40, 50, 75, 100, 200),
)
SIDE_DISCOVERIES = Counter(
    "recall_gateway_side_discoveries",
    "Full recalls' relationship discovery on a side connection (docs/recall.md, Cost): "
    "taken (a side connection was free), refused (none was: discovered on the recall's own "
    "connection), used (its answer went into the recall's; taken but not used: it failed or "
    "read another view, and discovery ran on the recall's own connection).",
    ["outcome"],
)
POOL = Gauge(
    "recall_gateway_pool_connections",
    "asyncpg pool connections: in_use, idle, waiting (requests queued for one), max.",
    ["state"],
    multiprocess_mode="livesum",
)


log = logging.getLogger(__name__)

OPERATION_LABELS_MAX: Final = 200
_GRAPHQL_NAME = re.compile(r"[_A-Za-z][_0-9A-Za-z]{0,99}")


class OperationLabels:
    """The ``operation`` label of the request metrics (and the request log line's
    and span's name), bounded.

    The name is the client's: unbounded, a label would let any client grow every
    worker's label set (and the scrape) at will, put text of its choosing (line
    breaks too) into every scrape and log line, and show one team's operation
    names to whoever reads ``/metrics``. So a request without an authenticated
    caller is ``(unauthenticated)`` whatever it names (also when the database
    could not say who it is); a request whose document did not parse, or names
    no definition the document has, or is not a GraphQL name of at most 100
    characters, is ``(invalid)`` and takes no slot; past ``limit`` distinct
    names in this process (each worker counts its own), a new one is
    ``(other)``, with one warning (the names seen first keep their label)."""

    def __init__(self, limit: int = OPERATION_LABELS_MAX) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._full = False
        self._lock = threading.Lock()  # finish() runs on the loop; the MCP stdio app too

    def __call__(self, name: str | None, operation_type: str | None, caller: bool) -> str:
        if operation_type is None:
            return "(none)"  # the request never reached an operation
        if not caller:
            return "(unauthenticated)"
        if operation_type == "unknown" or (
            name is not None and _GRAPHQL_NAME.fullmatch(name) is None
        ):
            return "(invalid)"
        if name is None:
            return "(anonymous)"
        with self._lock:
            if name in self._seen:
                return name
            if len(self._seen) >= self.limit:
                if not self._full:
                    self._full = True
                    log.warning(
                        "%d distinct operation names labelled in this process; later new "
                        "names are counted as (other) (docs/observability.md)",
                        self.limit,
                    )
                return "(other)"
            self._seen.add(name)
            return name


OPERATION_LABELS = OperationLabels()


_SIDE_SEEN: weakref.WeakKeyDictionary[Any, tuple[int, int, int]] = weakref.WeakKeyDictionary()


def observe_side(side: Any) -> None:
    """Add to :data:`SIDE_DISCOVERIES` what a pool's side connections counted since
    the last call (``gateway.store.database.SideConnections``; None: no side
    connections)."""
    if side is None:
        return
    now = (side.taken, side.refused, side.used)
    before = _SIDE_SEEN.get(side, (0, 0, 0))
    for outcome, n, seen in zip(("taken", "refused", "used"), now, before, strict=True):
        if n > seen:
            SIDE_DISCOVERIES.labels(outcome).inc(n - seen)
    _SIDE_SEEN[side] = now


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def observe_pool(pool: Any) -> None:
    """Set the pool gauges from the pool's own counts. asyncpg does not publish how
    many acquirers wait; its queue's waiters are read when present (else 0)."""
    size, idle = pool.get_size(), pool.get_idle_size()
    queue = getattr(pool, "_queue", None)
    waiting = len(getattr(queue, "_getters", ()) or ())
    POOL.labels("in_use").set(size - idle)
    POOL.labels("idle").set(idle)
    POOL.labels("waiting").set(waiting)
    POOL.labels("max").set(pool.get_max_size())


def render(request: Request) -> Response:
    """The exposition of this process, or of every worker in multiprocess mode."""
    services = getattr(request.app.state, "services", None)
    if services is not None:
        observe_pool(services.db.pool)
    if multiprocess_dir():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        data = generate_latest(registry)
    else:
        data = generate_latest(REGISTRY)
    return Response(data, media_type=CONTENT_TYPE_LATEST)
