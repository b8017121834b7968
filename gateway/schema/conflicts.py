"""The conflict frontier's public shape: service views in, GraphQL types out."""

from __future__ import annotations

import strawberry

from gateway.schema.recall_types import (
    Conflict,
    ConflictPosition,
    ConflictState,
    Disposition,
    EvidenceConflict,
    EvidenceConflictPosition,
    OccurrenceCitation,
    RelationshipConflict,
    SourceAuthority,
    SupporterSummary,
)
from gateway.services import recall_types as service


def _relationship_conflict(c: service.RelationshipConflictView, view_key: str) -> Conflict:
    return RelationshipConflict(
        id=strawberry.ID(c.id),
        question=c.question,
        state=ConflictState(c.state),
        preferred_position_id=(
            strawberry.ID(c.preferred_position_id) if c.preferred_position_id else None
        ),
        state_changed_at=c.state_changed_at,
        positions=[
            ConflictPosition(
                id=strawberry.ID(p.id),
                label=p.label,
                disposition=Disposition(p.disposition),
                relationship_ids=[strawberry.ID(r) for r in p.relationship_ids],
                supporter_count=p.supporter_count,
                supporters=[
                    SupporterSummary(
                        evidence_id=strawberry.ID(s.evidence_id),
                        source_id=strawberry.ID(s.source_id),
                        authority=SourceAuthority(s.authority),
                    )
                    for s in p.supporters
                ],
                supporters_truncated=p.supporters_truncated,
                view_key=view_key,
            )
            for p in c.positions
        ],
    )


def _evidence_conflict(c: service.EvidenceConflictView) -> Conflict:
    return EvidenceConflict(
        id=strawberry.ID(c.id),
        question=c.question,
        positions=[
            EvidenceConflictPosition(
                id=strawberry.ID(p.position_id),
                label=p.label,
                citation=OccurrenceCitation(
                    evidence_id=strawberry.ID(p.evidence_id),
                    occurrence_id=strawberry.ID(p.occurrence_id),
                    quote=p.quote,
                    span_start=p.span_start,
                    span_end=p.span_end,
                    authority=SourceAuthority(p.authority),
                ),
            )
            for p in c.positions
        ],
    )


def conflicts_of(found: list[service.ConflictView], view_key: str) -> list[Conflict]:
    """The answer's conflicts in the service's order (rank)."""
    return [
        _relationship_conflict(c, view_key)
        if isinstance(c, service.RelationshipConflictView)
        else _evidence_conflict(c)
        for c in found
    ]
