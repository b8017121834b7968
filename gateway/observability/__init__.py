"""Observability with the standard libraries (docs/observability.md).

``tracing`` (OpenTelemetry, configured by ``OTEL_*``, off without an
exporter), ``metrics`` (prometheus-client, ``GET /metrics``, multiprocess-safe),
``logs`` (one line per request, JSON with ``RECALL_LOG_FORMAT=json``),
``requests`` (the per-request record, its middleware and the operation
extension) and ``services`` (recall and embedding observed at their
boundary). ``Observability`` is what app.py wires in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import Tracer
from starlette.applications import Starlette
from starlette.routing import Route
from strawberry.extensions import SchemaExtension

from gateway.observability import logs, metrics
from gateway.observability.requests import RequestObserver, observer_extension
from gateway.observability.services import ObservedEmbedder, ObservedRecall
from gateway.observability.tracing import (
    TRACER_NAME,
    instrument_asyncpg,
    provider_from_environment,
    redact_query_string,
)


class Observability:
    """The process's tracing and metrics choices, and the pieces they add. The request
    log line and the metrics' samples are always kept (a few counter increments per
    request); ``metrics_enabled`` serves ``/metrics``; tracing needs an exporter."""

    def __init__(self, *, metrics_enabled: bool, provider: TracerProvider | None = None) -> None:
        self.metrics_enabled = metrics_enabled
        self.provider = provider
        self.tracer: Tracer | None = provider.get_tracer(TRACER_NAME) if provider else None

    @classmethod
    def from_environment(
        cls, *, metrics_enabled: bool, extra_processor: SpanProcessor | None = None
    ) -> Observability:
        return cls(
            metrics_enabled=metrics_enabled,
            provider=provider_from_environment(extra_processor),
        )

    def extensions(self) -> list[Callable[[], SchemaExtension]]:
        return [observer_extension(self.tracer)]

    def routes(self) -> list[Route]:
        return [Route("/metrics", metrics.render)] if self.metrics_enabled else []

    def install(self, app: Starlette) -> None:
        """Add the middleware (call after the other middleware, before the request ID's);
        and, with tracing, the ASGI span around everything and asyncpg's spans."""
        app.add_middleware(RequestObserver)
        if self.provider is not None:
            instrument_asyncpg(self.provider)

    def wrap_outermost(self, app: Starlette) -> None:
        if self.provider is not None:
            from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

            app.add_middleware(
                OpenTelemetryMiddleware,
                tracer_provider=self.provider,
                server_request_hook=redact_query_string,
            )

    def embedder(self, inner: Any) -> Any:
        return ObservedEmbedder(inner, self.tracer)

    def recall_service(self, *args: Any, **kwargs: Any) -> ObservedRecall:
        return ObservedRecall(*args, tracer=self.tracer, **kwargs)

    async def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


__all__ = ["Observability", "logs", "metrics"]
