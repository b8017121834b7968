"""The ``DateTime`` scalar, with input errors that are the caller's.

Strawberry's own ``DateTime`` refuses ``"yesterday"`` in a variable with an
uncoded error, and written inline graphql-core reports it as a validation
failure. Both are bad input: this scalar (same name, description, parser and
output, so the schema does not change) raises ``BAD_USER_INPUT`` either way;
``ErrorCodes`` then names the argument the value was given for.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import dateutil.parser
from graphql import GraphQLError, StringValueNode, ValueNode
from strawberry.types.scalar import ScalarDefinition

_EXAMPLE = "for example 2026-01-31T12:00:00Z"


def _refused(value: object, node: ValueNode | None = None) -> GraphQLError:
    shown = value if isinstance(value, str) else repr(value)
    return GraphQLError(
        f'"{shown}" is not a date-time ({_EXAMPLE})',
        node,
        extensions={"code": "BAD_USER_INPUT"},
    )


def parse_value(value: object) -> dt.datetime:
    """A variable's value: an ISO 8601 date-time string."""
    if not isinstance(value, str):
        raise _refused(value)
    try:
        parsed: dt.datetime = dateutil.parser.isoparse(value)
    except (ValueError, OverflowError):
        raise _refused(value) from None
    return parsed


def parse_literal(node: ValueNode, _variables: Any = None) -> dt.datetime:
    """A value written in the document."""
    if not isinstance(node, StringValueNode):
        raise _refused(getattr(node, "value", node.kind), node)
    try:
        parsed: dt.datetime = dateutil.parser.isoparse(node.value)
    except (ValueError, OverflowError):
        raise _refused(node.value, node) from None
    return parsed


DATETIME = ScalarDefinition(
    name="DateTime",
    description="Date with time (isoformat)",
    specified_by_url=None,
    serialize=dt.datetime.isoformat,
    parse_value=parse_value,
    parse_literal=parse_literal,
    origin=dt.datetime,
)
