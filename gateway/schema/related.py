"""GraphQL shapes of the related-relationship and community frontiers (thin)."""

from __future__ import annotations

from collections.abc import Sequence

import strawberry

from gateway.schema.recall_types import Community, Relationship, RelationshipHandle
from gateway.services.recall_types import CommunityHit, Handle


def handle(h: Handle, view_key: str) -> RelationshipHandle:
    """Both frontiers read the shared space only: every handle is SHARED."""
    return RelationshipHandle(
        representative_id=strawberry.ID(h.representative.id),
        equivalent_ids=[strawberry.ID(i) for i in h.equivalent_ids],
        semantic_group=h.group,
        representative=Relationship.of(h.representative, "shared", view_key),
    )


def handles(hs: Sequence[Handle], view_key: str) -> list[RelationshipHandle]:
    return [handle(h, view_key) for h in hs]


def communities(cs: Sequence[CommunityHit], view_key: str) -> list[Community]:
    return [
        Community(
            id=strawberry.ID(c.id),
            summary=c.summary,
            top_entities=list(c.top_entities),
            top_predicates=list(c.top_predicates),
            relationship_count=c.relationship_count,
            members=handles(c.members, view_key),
            members_truncated=c.members_truncated,
        )
        for c in cs
    ]
