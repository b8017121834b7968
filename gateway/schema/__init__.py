"""The GraphQL schema. ``schema.graphql`` at the repository root is exported from here."""

from __future__ import annotations

import strawberry

from gateway.schema.errors import ErrorCodes
from gateway.schema.mutations import Mutation
from gateway.schema.query import Query
from gateway.schema.recall_types import EvidenceConflict, RelationshipConflict


def build_schema() -> strawberry.Schema:
    return strawberry.Schema(
        query=Query,
        mutation=Mutation,
        types=[RelationshipConflict, EvidenceConflict],
        extensions=[ErrorCodes],
    )


def export_sdl() -> str:
    return build_schema().as_str() + "\n"


__all__ = ["build_schema", "export_sdl"]
