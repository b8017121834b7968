"""Validation of a document: linear bounds first, graphql-core's rules after.

graphql-core runs every rule in one pass, so a cheap rule that refuses a
document cannot spare it the expensive ones. Here the bounds of
``gateway.http.shape`` and ``gateway.http.cost`` run first, each in time linear
in the text; only a document within all of them meets graphql-core's rules
(``OverlappingFieldsCanBeMerged`` above all), whose work those bounds keep
small. Documents big enough that the rules could take noticeable time are
validated in a worker thread, so that the event loop keeps answering other
requests (and ``/healthz``) meanwhile. Answers are kept with their parsed
documents, in one cache bounded in bytes (``gateway.http.documents``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from graphql import (
    ASTValidationRule,
    DocumentNode,
    GraphQLError,
    GraphQLSchema,
    OperationDefinitionNode,
)
from strawberry.extensions import SchemaExtension
from strawberry.schema.schema import validate_document

from gateway.http import cost, shape
from gateway.http.documents import Documents

THREAD_ABOVE_SELECTIONS = 200
"""Documents expanding to more selections than this validate off the event loop
(smaller ones take well under a millisecond, less than a thread hand-off)."""


@dataclass(frozen=True, slots=True)
class Rules:
    """Everything a document is checked against, fixed per process."""

    shape: shape.ShapeLimits
    max_cost: int
    extra: tuple[type[ASTValidationRule], ...] = ()
    """graphql-core rules added to the specified ones (introspection off, say)."""


class Validator:
    """Validates documents under ``rules``, fixed per process; an answer depends on
    nothing but the document and the rules, so it is kept with the parsed
    document (:class:`DocumentValidation`)."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.threaded = 0
        """Documents validated off the loop (for tests and curiosity)."""

    def precheck(
        self, schema: GraphQLSchema, document: DocumentNode
    ) -> tuple[list[GraphQLError], int]:
        """The linear bounds: shape (depth, aliases, selections, repeats,
        directives), then argument bounds and cost; and the expanded size."""
        report = shape.check(document, self.rules.shape)
        if report.errors:
            return report.errors, report.selections
        return cost.check(schema, document, self.rules.max_cost), report.selections

    async def validate(
        self,
        schema: GraphQLSchema,
        document: DocumentNode,
        specified: Sequence[type[ASTValidationRule]],
    ) -> list[GraphQLError]:
        errors, selections = self.precheck(schema, document)
        if not errors:
            rules = (*specified, *self.rules.extra)
            if selections > THREAD_ABOVE_SELECTIONS:
                self.threaded += 1
                errors = await asyncio.to_thread(validate_document, schema, document, rules)
            else:
                errors = validate_document(schema, document, rules)
        return errors


class DocumentValidation(SchemaExtension):
    """Runs the process's ``Validator`` in strawberry's validation step, and keeps
    its answer with the parsed document in ``documents`` (the answer of a
    document kept there is not computed again)."""

    def __init__(self, validator: Validator, documents: Documents) -> None:
        super().__init__()
        self.validator = validator
        self.documents = documents

    async def on_validate(self) -> AsyncIterator[None]:
        ctx = self.execution_context
        assert ctx.graphql_document is not None
        operations = sum(
            isinstance(d, OperationDefinitionNode) for d in ctx.graphql_document.definitions
        )
        if ctx._provided_operation_name is None and operations > 1:
            # strawberry would run the first; the specification says to refuse
            ctx.pre_execution_errors = [
                GraphQLError(
                    f"The document has {operations} operations: name the one to run "
                    "in operationName.",
                    extensions={"code": "BAD_REQUEST"},
                )
            ]
        else:
            document = ctx.graphql_document
            key = self.documents.key(ctx.query or "", dict(ctx.parse_options), self.validator.rules)
            errors = self.documents.errors(key, document)
            if errors is None:
                errors = await self.validator.validate(
                    ctx.schema._schema, document, ctx.validation_rules
                )
                self.documents.keep_errors(key, document, errors)
            ctx.pre_execution_errors = errors
        yield


class CachedParse(SchemaExtension):
    """Strawberry's parsing step from ``documents`` (parsed once per process).

    Strawberry parses only when no extension has set the document. A document
    that does not parse is left to that parse, which raises the same error where
    strawberry turns it into a coded GraphQL error (raised from this hook, it
    would be an internal error); strawberry's own ``ParserCache`` raises here."""

    def __init__(self, documents: Documents, validator: Validator) -> None:
        super().__init__()
        self.documents = documents
        self.rules = validator.rules
        """Part of the entry's key: the validator's answer is kept in it."""

    def on_parse(self) -> Iterator[None]:
        ctx = self.execution_context
        if ctx.query and ctx.graphql_document is None:
            options: dict[str, Any] = dict(ctx.parse_options)
            try:
                ctx.graphql_document = self.documents.parse(ctx.query, self.rules, **options)
            except GraphQLError:
                pass
        yield
