"""The hypothesis frontier's public shape: store rows in, GraphQL types out."""

from __future__ import annotations

from collections.abc import Iterable

import strawberry

from gateway.schema.recall_types import Hypothesis, HypothesisStatus
from gateway.store.hypotheses import HypothesisRow


def hypotheses_of(rows: Iterable[HypothesisRow]) -> list[Hypothesis]:
    """The answer's hypotheses in rank order. Typed as hypotheses, never as support."""
    return [
        Hypothesis(
            id=strawberry.ID(h.id),
            statement=h.statement,
            status=HypothesisStatus(h.status),
            origin=h.origin,
            source_relationship_ids=[strawberry.ID(i) for i in h.relationship_ids],
            source_evidence_ids=[strawberry.ID(i) for i in h.evidence_ids],
        )
        for h in rows
    ]
