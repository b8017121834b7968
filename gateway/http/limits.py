"""Hostile-query limits: what a document and a request may weigh, per profile.

Every limit is rejected before execution with a stable ``extensions.code``.
The development and production profiles differ only in their defaults; each
limit can be set on its own (``RECALL_MAX_DEPTH`` and so on, see the README and
docs/security.md). Depth, aliases and tokens use strawberry's own limiters;
directives and cost are graphql-core validation rules of ours.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from graphql import (
    ASTValidationRule,
    DirectiveNode,
    GraphQLError,
    ValidationContext,
    ValidationRule,
)
from graphql.validation import NoSchemaIntrospectionCustomRule
from strawberry.extensions import (
    AddValidationRules,
    MaxAliasesLimiter,
    MaxTokensLimiter,
    QueryDepthLimiter,
    SchemaExtension,
    ValidationCache,
)

from gateway.http.cost import cost_rule
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
        "max_cost": 50_000,
        "max_body_bytes": 1_048_576,
        "request_timeout_ms": 15_000,
    },
    "production": {
        "max_depth": 10,
        "max_aliases": 10,
        "max_tokens": 2000,
        "max_directives": 10,
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
        max_cost=pick("max_cost"),
        max_body_bytes=pick("max_body_bytes"),
        batching=settings.batching,
        max_batch_size=settings.max_batch_size,
        request_timeout_ms=pick("request_timeout_ms"),
    )


def directive_rule(max_directives: int) -> type[ValidationRule]:
    """Refuse documents with more than ``max_directives`` directives (``@skip`` storms)."""

    class MaxDirectivesRule(ValidationRule):
        count = 0

        def enter_directive(self, node: DirectiveNode, *_args: Any) -> None:
            self.count += 1
            if self.count == max_directives + 1:
                self.report_error(
                    GraphQLError(
                        f"The document has more than {max_directives} directives.",
                        node,
                        extensions={"code": "TOO_MANY_DIRECTIVES", "maxDirectives": max_directives},
                    )
                )

    return MaxDirectivesRule


_CACHE_SIZE = 256


def depth_rule(max_depth: int) -> type[ASTValidationRule]:
    """Strawberry's depth rule, guarded: on a document with an empty selection set
    (which graphql-core 3.3 parses) its depth walk raises ``ValueError`` from
    ``max()`` in its constructor, which would surface as an uncoded error with
    Python's message. Such a document is refused as invalid instead."""
    base = QueryDepthLimiter(max_depth=max_depth).validation_rules[0]

    class GuardedDepthRule(base):  # type: ignore[misc, valid-type]
        def __init__(self, context: ValidationContext) -> None:
            try:
                super().__init__(context)
            except ValueError:
                ValidationRule.__init__(self, context)
                context.report_error(
                    GraphQLError(
                        "A selection set is empty.",
                        extensions={"code": "GRAPHQL_VALIDATION_FAILED"},
                    )
                )

    return GuardedDepthRule


def validation_extensions(limits: Limits) -> Sequence[Callable[[], SchemaExtension]]:
    """Schema extension factories (a fresh instance per request, never a shared one)."""
    rules: list[type[ASTValidationRule]] = [
        depth_rule(limits.max_depth),
        directive_rule(limits.max_directives),
        cost_rule(limits.max_cost),
    ]
    if not limits.introspection:
        rules.append(NoSchemaIntrospectionCustomRule)
    return [
        lambda: MaxTokensLimiter(max_token_count=limits.max_tokens),
        lambda: MaxAliasesLimiter(max_alias_count=limits.max_aliases),
        lambda: AddValidationRules(rules),
        # Validation dominates small requests; the cache is a bounded LRU keyed by
        # the document and the rule classes, which are built once per process
        # here, so a cached answer never depends on a request. (strawberry's
        # ParserCache is left out: a syntax error raised from it escapes the
        # extensions and would be masked as INTERNAL instead of coded.)
        lambda: ValidationCache(maxsize=_CACHE_SIZE),
    ]
