"""The recall service and the embedding provider, observed at their boundary.

Spans and metrics wrap the calls that app.py makes: a span for each recall
(with its result and degradation counts) and for each embedding call, the
embedding latency histogram and the degradations counter. Inside a traced
recall the stages that the pipeline marks with :func:`gateway.stages.stage`
become its child spans.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry.trace import Tracer

from gateway.embeddings import EmbeddingProvider, embed_queries
from gateway.embeddings.base import Vectors
from gateway.observability import metrics
from gateway.observability.requests import record
from gateway.services.auth import Principal
from gateway.services.recall import RecallService
from gateway.services.recall_types import RecallOutcome
from gateway.stages import stage_tracer


class ObservedEmbedder:
    """An embedding provider whose calls are timed (and traced when a tracer is given)."""

    def __init__(self, inner: EmbeddingProvider, tracer: Tracer | None) -> None:
        self.inner = inner
        self.tracer = tracer

    # Asked of the inner provider each time: a provider that follows the store
    # changes its model when the store moves to another one (reembed).
    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def dimensions(self) -> int:
        return self.inner.dimensions

    def __getattr__(self, name: str) -> Any:  # load(), observe(), next_model and the like
        return getattr(self.inner, name)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await self._timed(texts, self.inner.embed)

    async def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """Recall's side of an asymmetric model, timed like every embedding."""
        return await self._timed(texts, lambda t: embed_queries(self.inner, t))

    async def _timed(
        self, texts: Sequence[str], run: Callable[[Sequence[str]], Awaitable[Vectors]]
    ) -> Vectors:
        started = time.perf_counter()
        try:
            if self.tracer is None:
                return await run(texts)
            with self.tracer.start_as_current_span("embed") as span:
                span.set_attribute("embedding.texts", len(texts))
                span.set_attribute("embedding.model", self.model)
                return await run(texts)
        finally:
            metrics.EMBEDDING_SECONDS.observe(time.perf_counter() - started)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ObservedRecall(RecallService):
    """The recall service with a span per recall and its degradations counted."""

    def __init__(self, *args: Any, tracer: Tracer | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tracer = tracer

    async def recall(self, principal: Principal, request: Any) -> RecallOutcome:
        if self.tracer is None:
            outcome = await super().recall(principal, request)
        else:
            with self.tracer.start_as_current_span("recall") as span, stage_tracer(self.tracer):
                outcome = await super().recall(principal, request)
                span.set_attribute("recall.results", len(outcome.results))
                span.set_attribute("recall.degradations", len(outcome.degradations))
        entry = record()
        metrics.observe_side(self.db.side)
        for replica in self.reads.replicas:
            metrics.observe_side(replica.db.side)
        for degradation in outcome.degradations:
            metrics.DEGRADATIONS.labels(degradation.frontier, degradation.code).inc()
            if entry is not None:
                entry.degradations.append(degradation.code)
        return outcome
