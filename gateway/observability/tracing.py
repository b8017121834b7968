"""OpenTelemetry tracing, configured by the standard ``OTEL_*`` variables.

Tracing is on only when an exporter is configured: ``OTEL_TRACES_EXPORTER``
(``otlp``, ``console``, comma-separated; ``none`` is off) or an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
which imply ``otlp``), and not ``OTEL_SDK_DISABLED=true``. Off, nothing is
installed: no ASGI middleware, no asyncpg hooks, no operation extension, so
it costs nothing. On, the spans are: the HTTP request (asgi instrumentation),
one span per GraphQL operation (never per field: field hooks cost 6-9x on
large responses), the recall and embedding calls at the service boundary, and
each asyncpg statement. The exporter reads its own ``OTEL_EXPORTER_OTLP_*``
settings, the resource ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import Span

log = logging.getLogger("gateway.observability")

TRACER_NAME = "recall_gateway"


def exporters(env: Mapping[str, str] | None = None) -> list[str]:
    """The configured trace exporters; empty means tracing is off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    if named:
        return [e for e in named if e != "none"]
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return ["otlp"]
    return []


def _processor(name: str) -> SpanProcessor:
    if name == "console":
        return BatchSpanProcessor(ConsoleSpanExporter())
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return BatchSpanProcessor(OTLPSpanExporter())
    raise ValueError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} (otlp, console, none)")


def provider_from_environment(
    extra: SpanProcessor | None = None,
) -> TracerProvider | None:
    """A tracer provider for the configured exporters (plus ``extra``, for tests), or
    ``None`` when tracing is off."""
    names = exporters()
    if not names and extra is None:
        return None
    service = os.environ.get("OTEL_SERVICE_NAME") or "recall-gateway"
    resource = Resource.create({"service.name": service})
    provider = TracerProvider(resource=resource)
    for name in names:
        provider.add_span_processor(_processor(name))
    if extra is not None:
        provider.add_span_processor(extra)
    return provider


def instrument_asyncpg(provider: TracerProvider) -> None:
    """A span per asyncpg statement (opentelemetry-instrumentation-asyncpg); it patches
    asyncpg's classes, so once per process."""
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    instrumentor = AsyncPGInstrumentor()  # type: ignore[no-untyped-call]
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=provider)


def uninstrument_asyncpg() -> None:
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    instrumentor = AsyncPGInstrumentor()  # type: ignore[no-untyped-call]
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


_URL_ATTRIBUTES = ("http.url", "url.full", "http.target")


def redact_query_string(span: Span, scope: Mapping[str, Any]) -> None:
    """The ASGI instrumentation's request hook: a GET's query string holds the GraphQL
    document and its variables (a recall's question), private text that a span must
    not carry; the URL attributes keep the path only."""
    if not scope.get("query_string") or not span.is_recording():
        return
    attributes: Mapping[str, Any] = getattr(span, "attributes", None) or {}
    for key in _URL_ATTRIBUTES:
        value = attributes.get(key)
        if isinstance(value, str) and "?" in value:
            span.set_attribute(key, value.split("?", 1)[0])
    if "url.query" in attributes:
        span.set_attribute("url.query", "(redacted)")


def current_trace_id() -> str | None:
    """The current span's trace ID (32 hex digits), for log lines; ``None`` outside one."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
