"""Stable error codes on every GraphQL error, and masking of the unexpected.

Expected failures (``GatewayError``) keep their message and get
``extensions.code``; GraphQL syntax and validation errors get the conventional
codes; anything else becomes "Internal server error" with the request ID, and
is logged with its stack trace under that ID.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator

from graphql import (
    ArgumentNode,
    DocumentNode,
    ListValueNode,
    ObjectValueNode,
    ValueNode,
    VariableNode,
    visit,
)
from graphql.error import GraphQLError, GraphQLSyntaxError
from graphql.language import Visitor
from strawberry.extensions import SchemaExtension

from gateway.errors import GatewayError

log = logging.getLogger("gateway.errors")

# Errors that graphql-core and strawberry's limiters raise without a code, told
# apart by their (library-owned) messages; tests/test_limits.py pins each one.
_LIBRARY_CODES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Document contains more than \d+ tokens"), "TOO_MANY_TOKENS"),
    (re.compile(r"^GraphQL introspection has been disabled"), "INTROSPECTION_DISABLED"),
    (
        re.compile(
            r"^Variable '\$[^']+' (has invalid value|got invalid value|of required type|of non-null type)"
        ),
        "BAD_USER_INPUT",
    ),
)
_SUGGESTION = re.compile(r"\s*Did you mean .*$", re.DOTALL)


def _coded(
    error: GraphQLError,
    code: str,
    extra: dict[str, object] | None = None,
    *,
    hide_suggestions: bool = False,
) -> GraphQLError:
    extensions = dict(error.extensions or {})
    extensions["code"] = code
    if extra:
        extensions.update(extra)
    message = error.message
    if hide_suggestions:
        # With introspection off, "Did you mean ...?" would hand out the schema.
        message = _SUGGESTION.sub("", message)
    return GraphQLError(
        message=message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=None,
        extensions=extensions,
    )


_VARIABLE = re.compile(r"^Variable '\$([_A-Za-z][_0-9A-Za-z]*)'")


class _Arguments(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[ArgumentNode] = []

    def enter_argument(self, node: ArgumentNode, *_args: object) -> None:
        self.found.append(node)


def argument_of(document: DocumentNode, wanted: Callable[[ValueNode], bool]) -> str | None:
    """The argument (and the path inside it) whose value holds a node ``wanted``
    accepts: ``validAt``, ``input.evidence[0].observedAt``."""
    arguments = _Arguments()
    visit(document, arguments)
    for argument in arguments.found:
        pending: list[tuple[ValueNode, str]] = [(argument.value, argument.name.value)]
        while pending:
            value, path = pending.pop()
            if wanted(value):
                return path
            if isinstance(value, ObjectValueNode):
                pending.extend((f.value, f"{path}.{f.name.value}") for f in value.fields)
            elif isinstance(value, ListValueNode):
                pending.extend((v, f"{path}[{i}]") for i, v in enumerate(value.values))
    return None


def _named(coded: GraphQLError, raw: GraphQLError, document: DocumentNode | None) -> GraphQLError:
    """A bad input refused before execution, with ``extensions.field`` naming the
    argument it was given for, as the resolvers' own input errors do: a bad
    variable names the argument the variable feeds, a bad literal its own."""
    extensions = coded.extensions or {}
    if document is None or extensions.get("code") != "BAD_USER_INPUT" or "field" in extensions:
        return coded
    if raw.path is not None:
        return coded
    variable = _VARIABLE.match(raw.message)
    if variable is not None:
        name = variable[1]
        field = argument_of(
            document, lambda v: isinstance(v, VariableNode) and v.name.value == name
        )
    elif raw.nodes:
        target = raw.nodes[0]
        field = argument_of(document, lambda v: v is target)
    else:
        field = None
    if field is None:
        return coded
    coded.extensions = {**extensions, "field": field}
    return coded


class ErrorCodes(SchemaExtension):
    """Give every error its code; ``hide_suggestions`` drops "Did you mean" hints."""

    def __init__(self, *, hide_suggestions: bool = False) -> None:
        self.hide_suggestions = hide_suggestions

    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        if result is None or not result.errors:
            return
        ctx = self.execution_context.context
        request_id = getattr(ctx, "request_id", None)
        document = self.execution_context.graphql_document
        result.errors = [
            _named(self._code(e, request_id, self.hide_suggestions), e, document)
            for e in result.errors
        ]

    @staticmethod
    def _code(
        error: GraphQLError, request_id: str | None, hide_suggestions: bool = False
    ) -> GraphQLError:
        original = error.original_error
        if isinstance(original, GatewayError):
            extra: dict[str, object] = {}
            field = getattr(original, "field", None)
            if field:
                extra["field"] = field
            return _coded(error, original.code, extra)
        # Without a path, an error comes before execution: the document or the
        # variables (a scalar's parser refusing a variable is wrapped with its
        # original error). Those are the caller's input, never a server fault.
        if original is None or error.path is None:
            hide = hide_suggestions
            given = (error.extensions or {}).get("code")
            if isinstance(given, str):
                return _coded(error, given, hide_suggestions=hide)  # our own rules
            for pattern, code in _LIBRARY_CODES:
                if pattern.search(error.message):
                    return _coded(error, code, hide_suggestions=hide)
            if isinstance(error, GraphQLSyntaxError):
                return _coded(error, "GRAPHQL_PARSE_FAILED", hide_suggestions=hide)
            if error.path is None:
                return _coded(error, "GRAPHQL_VALIDATION_FAILED", hide_suggestions=hide)
            return _coded(error, "BAD_USER_INPUT", hide_suggestions=hide)
        log.error("request %s failed", request_id, exc_info=original)
        masked = GraphQLError(
            message="Internal server error",
            nodes=error.nodes,
            path=error.path,
            extensions={"code": "INTERNAL", "requestId": request_id},
        )
        return masked
