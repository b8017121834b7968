"""The GraphQL schema. ``schema.graphql`` at the repository root is exported from here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import strawberry
from strawberry.extensions import SchemaExtension
from strawberry.schema.config import StrawberryConfig

from gateway.schema.errors import ErrorCodes
from gateway.schema.mutations import Mutation
from gateway.schema.query import Query
from gateway.schema.recall_types import EvidenceConflict, RelationshipConflict
from gateway.schema.scalars import DATETIME


class _Schema(strawberry.Schema):
    def process_errors(self, errors: Any, execution_context: Any = None) -> None:
        """Log nothing here: strawberry would log every refused document at ERROR
        level (a hostile client could flood the log); ``ErrorCodes`` logs the
        unexpected errors, with their request ID, and nothing else."""


def build_schema(
    *,
    extensions: Sequence[Callable[[], SchemaExtension]] = (),
    hide_suggestions: bool = False,
    config: StrawberryConfig | None = None,
) -> strawberry.Schema:
    """The schema; the HTTP layer adds its limits as ``extensions`` (factories, one
    instance per request) and its batching ``config``. ``ErrorCodes`` comes first so
    that it sees, and codes, the errors of every other extension."""
    return _Schema(
        query=Query,
        mutation=Mutation,
        types=[RelationshipConflict, EvidenceConflict],
        extensions=[lambda: ErrorCodes(hide_suggestions=hide_suggestions), *extensions],
        config=config,
        scalar_overrides={datetime: DATETIME},
    )


def export_sdl() -> str:
    return build_schema().as_str() + "\n"


__all__ = ["build_schema", "export_sdl"]
