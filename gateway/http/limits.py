"""Hostile-query limits: what a document and a request may weigh, per profile.

Every limit is rejected before execution with a stable ``extensions.code``.
The development and production profiles differ only in their defaults; each
limit can be set on its own (``RECALL_MAX_DEPTH`` and so on, see the README and
docs/security.md). Tokens use strawberry's own limiter (the parser stops
there); every other bound is checked in time linear in the text before
graphql-core's rules run (``gateway.http.validation``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graphql.validation import NoSchemaIntrospectionCustomRule
from strawberry.extensions import MaxTokensLimiter, SchemaExtension

from gateway.http.documents import Documents
from gateway.http.shape import ShapeLimits
from gateway.http.validation import CachedParse, DocumentValidation, Rules, Validator
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class Limits:
    """The resolved limits of one process."""

    production: bool
    introspection: bool
    graphiql: bool
    max_depth: int
    max_aliases: int
    max_tokens: int
    max_directives: int
    max_selections: int
    max_repeats: int
    max_cost: int
    max_body_bytes: int
    batching: bool
    max_batch_size: int
    request_timeout_ms: int


# Defaults per profile. Production's are strict but let one recallMemory with
# every field and every limit at its maximum through (cost 6,396, depth 5), and
# not two of them, and a traceMemory with every field at its default bounds
# (cost 9,640); tests/test_limits.py checks it.
PROFILES: dict[str, dict[str, int]] = {
    "development": {
        "max_depth": 15,
        "max_aliases": 30,
        "max_tokens": 5000,
        "max_directives": 50,
        "max_selections": 2000,
        "max_repeats": 100,
        "max_cost": 50_000,
        "max_body_bytes": 1_048_576,
        "request_timeout_ms": 15_000,
    },
    "production": {
        "max_depth": 10,
        "max_aliases": 10,
        "max_tokens": 2000,
        "max_directives": 10,
        "max_selections": 1000,
        "max_repeats": 50,
        "max_cost": 12_000,
        "max_body_bytes": 262_144,
        "request_timeout_ms": 10_000,
    },
}


def resolve(settings: Settings) -> Limits:
    """The limits in force: each explicit setting, else the profile's default."""
    production = settings.env == "production"
    profile = PROFILES[settings.env]

    def pick(name: str) -> int:
        value = getattr(settings, name)
        return profile[name] if value is None else int(value)

    return Limits(
        production=production,
        introspection=(not production)
        if settings.introspection is None
        else settings.introspection,
        graphiql=(not production) if settings.graphiql is None else settings.graphiql,
        max_depth=pick("max_depth"),
        max_aliases=pick("max_aliases"),
        max_tokens=pick("max_tokens"),
        max_directives=pick("max_directives"),
        max_selections=pick("max_selections"),
        max_repeats=pick("max_repeats"),
        max_cost=pick("max_cost"),
        max_body_bytes=pick("max_body_bytes"),
        batching=settings.batching,
        max_batch_size=settings.max_batch_size,
        request_timeout_ms=pick("request_timeout_ms"),
    )


def validator(limits: Limits) -> Validator:
    """The process's validator under ``limits``."""
    return Validator(
        Rules(
            shape=ShapeLimits(
                max_depth=limits.max_depth,
                max_aliases=limits.max_aliases,
                max_selections=limits.max_selections,
                max_repeats=limits.max_repeats,
                max_directives=limits.max_directives,
            ),
            max_cost=limits.max_cost,
            extra=() if limits.introspection else (NoSchemaIntrospectionCustomRule,),
        )
    )


def validation_extensions(
    limits: Limits, documents: Documents
) -> Sequence[Callable[[], SchemaExtension]]:
    """Schema extension factories (a fresh instance per request, never a shared one;
    the validator and ``documents``, the app's cache of parsed documents and their
    validation answers, hold no request's state). The token limit is set when the
    operation starts, before the (cached) parse, and is part of the cache's key,
    as are the validator's rules (the other limits): an answer kept under one
    profile's limits is never served under another's.
    Clients send the same few documents with different variables; parsing the
    benchmark's full recall document took about 0.26 ms per request and its
    answers document 0.8 ms (docs/benchmarks.md)."""
    shared = validator(limits)
    return [
        lambda: MaxTokensLimiter(max_token_count=limits.max_tokens),
        lambda: CachedParse(documents, shared),
        lambda: DocumentValidation(shared, documents),
    ]
