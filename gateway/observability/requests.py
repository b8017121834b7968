"""Per request: one log line, the request metrics, the operation's span.

``RequestObserver`` (ASGI middleware) opens a ``RequestRecord`` in a context
variable for each HTTP request; the pieces that know more fill it in: the
``OperationObserver`` schema extension the operation's name, type and outcome,
the observed recall service the degradation codes, the statement counter the
SQL statements. When the response is done the middleware writes the one log
line (request ID, operation, status, duration, degradation codes, trace ID)
and the Prometheus samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from graphql import OperationDefinitionNode
from opentelemetry.trace import StatusCode, Tracer
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from strawberry.extensions import SchemaExtension

from gateway.observability import metrics
from gateway.observability.tracing import current_trace_id
from gateway.store.database import REQUEST_STATEMENTS, StatementTally

log = logging.getLogger("gateway.request")


@dataclass
class RequestRecord:
    """What one request did, filled in by whoever knows."""

    operation: str | None = None
    operation_type: str | None = None
    caller: bool = False  # the operation ran for an authenticated principal
    execution: Any = None  # strawberry's ExecutionContext, read when the request is done
    degradations: list[str] = field(default_factory=list)
    trace_id: str | None = None
    tally: StatementTally = field(default_factory=StatementTally)

    @property
    def statements(self) -> int:
        """asyncpg calls the statement counter with ``call_soon``: read this after the
        event loop has had a turn (``finish`` is awaited after one)."""
        return self.tally.count

    def outcome(self) -> str:
        """``ok``, or the first error's code. Read when the request is done: the schema's
        error-coding extension codes the errors after every other extension has run."""
        result = getattr(self.execution, "result", None)
        errors = list(getattr(result, "errors", None) or [])
        if not errors:
            errors = list(getattr(self.execution, "pre_execution_errors", None) or [])
        if not errors:
            return "ok"
        return str((errors[0].extensions or {}).get("code") or "INTERNAL")


CURRENT: ContextVar[RequestRecord | None] = ContextVar("recall_gateway_request", default=None)


def record() -> RequestRecord | None:
    return CURRENT.get()


@contextmanager
def observed() -> Iterator[RequestRecord]:
    """A request record (and statement tally) current for the block."""
    entry = RequestRecord(trace_id=current_trace_id())
    token = CURRENT.set(entry)
    tally_token = REQUEST_STATEMENTS.set(entry.tally)
    try:
        yield entry
    finally:
        CURRENT.reset(token)
        REQUEST_STATEMENTS.reset(tally_token)


async def finish(
    entry: RequestRecord,
    *,
    method: str,
    path: str,
    status: int | None,
    seconds: float,
    request_id: str | None,
    pool: Any = None,
    graphql: bool = True,
) -> None:
    """The request's metrics and its one log line."""
    # Let the statement counter's pending calls run; a cancellation arriving right
    # here (the client left) must not cost the request its line.
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)
    operation = metrics.OPERATION_LABELS(entry.operation, entry.operation_type, entry.caller)
    outcome = entry.outcome()
    if outcome == "ok" and status is not None and status >= 400:
        # refused before any operation ran (a body that is not JSON, 404, 413, 415)
        outcome = f"http_{status}"
    if graphql:
        metrics.REQUESTS.labels(operation, outcome).inc()
        metrics.REQUEST_SECONDS.labels(operation, outcome).observe(seconds)
        metrics.STATEMENTS.observe(entry.statements)
    if pool is not None:
        metrics.observe_pool(pool)
    log.info(
        "%s %s %s %s %s %.1fms",
        method,
        _printable(path),
        operation,
        outcome,
        status if status is not None else "-",
        seconds * 1000,
        extra={
            "request_id": request_id,
            "method": method,
            "path": path,
            "operation": entry.operation,
            "operation_type": entry.operation_type,
            "outcome": outcome,
            "status": status,
            "duration_ms": round(seconds * 1000, 2),
            "degradations": sorted(set(entry.degradations)),
            "statements": entry.statements,
            "trace_id": entry.trace_id,
        },
    )


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _printable(text: str) -> str:
    """``text`` with its control characters escaped: a path is the client's, and a
    line break in it (``%0A``, decoded) would forge a line of a text log."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class RequestObserver:
    """One log line and the request metrics per HTTP request (GraphQL ones get the
    operation's name and outcome; ``/metrics``, ``/healthz`` and the IDE's files are
    neither logged nor counted)."""

    QUIET = ("/metrics", "/healthz", "/readyz", "/graphiql/")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.QUIET):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            with observed() as entry:
                await self.app(scope, receive, send_status)
        finally:
            services = getattr(getattr(scope.get("app"), "state", None), "services", None)
            await finish(
                entry,
                method=scope["method"],
                path=scope["path"],
                status=status,
                seconds=time.perf_counter() - started,
                request_id=scope.get("state", {}).get("request_id"),
                pool=services.db.pool if services is not None else None,
                graphql=entry.operation_type is not None or scope["path"].endswith("/graphql"),
            )


def _caller(context: Any) -> bool:
    """Whether the operation ran for an authenticated principal (the request
    context of HTTP and MCP alike: gateway.schema.context)."""
    return getattr(context.context, "principal", None) is not None


def observer_extension(tracer: Tracer | None) -> type[SchemaExtension]:
    """A schema extension that names the request's operation and, with a tracer, wraps
    the operation in one span. It hooks the operation, never the fields."""

    class OperationObserver(SchemaExtension):
        def on_operation(self) -> Iterator[None]:
            entry = CURRENT.get()
            if tracer is None:
                yield
                self._finish(entry, None)
                return
            with tracer.start_as_current_span("graphql.operation") as span:
                if entry is not None:
                    entry.trace_id = current_trace_id()
                yield
                self._finish(entry, span)

        def _finish(self, entry: RequestRecord | None, span: Any) -> None:
            context = self.execution_context
            kind = None
            name = context.operation_name
            document = context.graphql_document
            if document is not None:
                for definition in document.definitions:
                    if isinstance(definition, OperationDefinitionNode) and (
                        name is None or (definition.name and definition.name.value == name)
                    ):
                        kind = definition.operation.value
                        name = name or (definition.name.value if definition.name else None)
                        break
            if entry is not None:
                entry.operation = name
                entry.operation_type = kind or "unknown"
                entry.execution = context
                entry.caller = _caller(context)
            if span is not None:
                errors = getattr(context.result, "errors", None) or context.pre_execution_errors
                # the metrics' label: a bounded name of no client-chosen characters
                label = metrics.OPERATION_LABELS(name, kind or "unknown", _caller(context))
                span.update_name(f"{kind or 'graphql'} {label}")
                span.set_attribute("graphql.operation.name", name or "")
                span.set_attribute("graphql.operation.type", kind or "unknown")
                span.set_attribute("graphql.errors", len(errors or ()))
                if errors:
                    span.set_status(StatusCode.ERROR)

    return OperationObserver
