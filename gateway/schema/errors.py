"""Stable error codes on every GraphQL error, and masking of the unexpected.

Expected failures (``GatewayError``) keep their message and get
``extensions.code``; GraphQL syntax and validation errors get the conventional
codes; anything else becomes "Internal server error" with the request ID, and
is logged with its stack trace under that ID.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from graphql.error import GraphQLError, GraphQLSyntaxError
from strawberry.extensions import SchemaExtension

from gateway.errors import GatewayError

log = logging.getLogger("gateway.errors")


def _coded(error: GraphQLError, code: str, extra: dict[str, object] | None = None) -> GraphQLError:
    extensions = dict(error.extensions or {})
    extensions["code"] = code
    if extra:
        extensions.update(extra)
    return GraphQLError(
        message=error.message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=None,
        extensions=extensions,
    )


class ErrorCodes(SchemaExtension):
    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        if result is None or not result.errors:
            return
        ctx = self.execution_context.context
        request_id = getattr(ctx, "request_id", None)
        result.errors = [self._code(e, request_id) for e in result.errors]

    @staticmethod
    def _code(error: GraphQLError, request_id: str | None) -> GraphQLError:
        original = error.original_error
        if isinstance(original, GatewayError):
            extra: dict[str, object] = {}
            field = getattr(original, "field", None)
            if field:
                extra["field"] = field
            return _coded(error, original.code, extra)
        if original is None:
            if isinstance(error, GraphQLSyntaxError):
                return _coded(error, "GRAPHQL_PARSE_FAILED")
            if error.path is None:
                return _coded(error, "GRAPHQL_VALIDATION_FAILED")
            return _coded(error, "BAD_USER_INPUT")
        log.error("request %s failed", request_id, exc_info=original)
        masked = GraphQLError(
            message="Internal server error",
            nodes=error.nodes,
            path=error.path,
            extensions={"code": "INTERNAL", "requestId": request_id},
        )
        return masked
