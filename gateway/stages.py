"""Named stages of a request, traced as child spans when tracing is on.

The recall pipeline marks its step boundaries (query embedding, candidate
search, hydration, each frontier) with :func:`stage`, a decorator: one line
per step, so the pipeline can be reshaped without touching tracing, and the
services need no import of OpenTelemetry's SDK or of the observability layer
above them. The tracer is a context variable that the observed recall service
sets for the duration of a recall when tracing is on (tasks started inside
inherit it); off, a stage costs one context-variable read and one extra
coroutine frame, well under a microsecond.

Spans carry only their name: never query text nor returned or stored text
(untrusted and private). The statements' own spans (asyncpg instrumentation)
nest under the stage that sent them.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from opentelemetry.trace import Tracer

__all__ = ["STAGE_PREFIX", "stage", "stage_tracer"]

STAGE_PREFIX = "recall."
"""Every stage span's name starts with it: ``recall.candidates`` and so on."""

_tracer: ContextVar[Tracer | None] = ContextVar("recall_gateway_stage_tracer", default=None)

P = ParamSpec("P")
T = TypeVar("T")


@contextmanager
def stage_tracer(tracer: Tracer | None) -> Iterator[None]:
    """Stages run in this block (and in tasks it starts) are traced with ``tracer``."""
    token = _tracer.set(tracer)
    try:
        yield
    finally:
        _tracer.reset(token)


def stage(
    name: str,
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """Mark an async function as the stage ``recall.<name>``: a child span of the
    current one while a stage tracer is set, nothing otherwise."""
    span_name = STAGE_PREFIX + name

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            tracer = _tracer.get()
            if tracer is None:
                return await fn(*args, **kwargs)
            with tracer.start_as_current_span(span_name):
                return await fn(*args, **kwargs)

        return run

    return decorate
