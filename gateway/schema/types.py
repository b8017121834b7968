"""GraphQL types: thin views of service objects, no logic of their own."""

from __future__ import annotations

from enum import Enum

import strawberry


@strawberry.enum(description="Which memory space a piece of memory comes from.")
class SpaceKind(Enum):
    SHARED = "shared"
    PRIVATE = "private"


@strawberry.enum(
    description="What a token may read: the team's shared space, and the "
    "principal's private space when private-bound."
)
class TokenBinding(Enum):
    PRIVATE = "private"
    SHARED_ONLY = "shared_only"


@strawberry.enum
class PrincipalKind(Enum):
    PERSON = "person"
    AGENT = "agent"


@strawberry.type(description="A tenant. Nothing crosses teams.")
class Team:
    id: strawberry.ID
    name: str


@strawberry.type(description="The authenticated caller.")
class Viewer:
    principal_id: strawberry.ID
    display_name: str
    kind: PrincipalKind
    team: Team
    token_binding: TokenBinding
    readable_spaces: list[SpaceKind] = strawberry.field(
        description="The space kinds this token may read, shared first."
    )
