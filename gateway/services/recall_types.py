"""The values that recallMemory's stages pass to each other.

Why a module of its own: every frontier (evidence, related relationships and
communities, hypotheses, conflicts) and the feedback snapshot reads or
produces some of these, and the orchestrator (:mod:`gateway.services.recall`)
wires the frontiers together. With the types here, each frontier depends only
on this module and the store, the orchestrator depends on the frontiers, and
there is no import circle. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final
from uuid import UUID

from gateway.store.conflicts import CitationRow, SupporterRow
from gateway.store.hypotheses import HypothesisRow
from gateway.store.recall import EligibleEvidence, NestedRows, RelationshipRow

__all__ = [
    "MAX_CONTEXT_CHARS",
    "OVERFETCH_EXTRA",
    "OVERFETCH_FACTOR",
    "CommunityHit",
    "ConflictView",
    "Degradation",
    "EvidenceConflictView",
    "EvidenceResult",
    "Handle",
    "ListState",
    "PositionView",
    "Reach",
    "ReadView",
    "RecallOutcome",
    "RelationshipConflictView",
    "SearchState",
    "SuggestedAction",
    "answer_reach",
    "overfetch",
]

# Candidates per list per branch: enough that hits discarded by hydration do not
# starve the result, bounded so that one recall stays cheap.
OVERFETCH_FACTOR: Final = 4
OVERFETCH_EXTRA: Final = 20
MAX_CONTEXT_CHARS: Final = 2000


def overfetch(limit: int) -> int:
    return limit * OVERFETCH_FACTOR + OVERFETCH_EXTRA


@dataclass(frozen=True, slots=True)
class Degradation:
    frontier: str
    code: str
    message: str
    optional: bool = True


@dataclass(frozen=True, slots=True)
class ListState:
    branch: str
    list: str
    status: str  # complete | failed | skipped
    candidates: int


@dataclass(frozen=True, slots=True)
class SearchState:
    frontier: str
    status: str  # complete | partial | skipped | disabled
    lists: tuple[ListState, ...] = ()

    @property
    def complete(self) -> bool:
        return self.status == "complete"


@dataclass(frozen=True, slots=True)
class ReadView:
    """What the request may read and at which instants; loaders read through it."""

    team_id: str
    space_kinds: dict[UUID, str]
    t_sys: datetime
    t_valid: datetime
    # Spaces whose vectors wait for an unfinished `load --index-after` (empty
    # vector lists meanwhile: the degradation VECTOR_INDEX_PENDING says so).
    vectors_pending: frozenset[UUID] = frozenset()

    @property
    def space_ids(self) -> tuple[UUID, ...]:
        return tuple(self.space_kinds)


@dataclass(frozen=True, slots=True)
class EvidenceResult:
    rank: int
    space_kind: str
    evidence: EligibleEvidence

    @property
    def context(self) -> str:
        return self.evidence.content[:MAX_CONTEXT_CHARS]

    @property
    def context_truncated(self) -> bool:
        return len(self.evidence.content) > MAX_CONTEXT_CHARS


# --- related relationships and communities ---------------------------------------


@dataclass(frozen=True, slots=True)
class Handle:
    """Equivalent relationships of one semantic group, collapsed."""

    group: str
    representative: RelationshipRow
    equivalent_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CommunityHit:
    id: str
    summary: str
    top_entities: tuple[str, ...]
    top_predicates: tuple[str, ...]
    relationship_count: int
    members: tuple[Handle, ...]
    members_truncated: bool


# --- conflicts -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reach:
    """How near the top of the answer each returned evidence and relationship is."""

    evidence: dict[str, int]
    relationships: dict[str, int]


def answer_reach(
    results: Sequence[EvidenceResult], more_relationship_ids: Iterable[str] = ()
) -> Reach:
    """Reach ranks of the answer's material.

    An evidence reaches at its rank; a relationship at the rank of the first
    result it supports. ``more_relationship_ids`` (relationships returned by
    other frontiers, in their order) reach after every evidence result.
    """
    evidence: dict[str, int] = {}
    relationships: dict[str, int] = {}
    for r in results:
        evidence.setdefault(r.evidence.id, r.rank)
        for rel in r.evidence.relationship_ids:
            relationships.setdefault(rel, r.rank)
    after = max((r.rank for r in results), default=0)
    for i, rel in enumerate(more_relationship_ids, start=after + 1):
        relationships.setdefault(rel, i)
    return Reach(evidence, relationships)


@dataclass(frozen=True, slots=True)
class PositionView:
    id: str
    label: str
    disposition: str  # contested | preferred | dispreferred
    relationship_ids: tuple[str, ...]
    supporter_count: int
    supporters: tuple[SupporterRow, ...]
    supporters_truncated: bool


@dataclass(frozen=True, slots=True)
class RelationshipConflictView:
    id: str
    question: str
    state: str  # open | resolved | reopened
    preferred_position_id: str | None
    state_changed_at: datetime
    positions: tuple[PositionView, ...]
    reach: int


@dataclass(frozen=True, slots=True)
class EvidenceConflictView:
    id: str
    question: str
    positions: tuple[CitationRow, ...]
    reach: int


ConflictView = RelationshipConflictView | EvidenceConflictView


# --- feedback suggestions and the whole answer ------------------------------------------


@dataclass(frozen=True, slots=True)
class SuggestedAction:
    kind: str  # submit_recall_session_feedback | resolve_dream_feedback
    description: str
    recall_event_id: str | None
    hypothesis_ids: tuple[str, ...] = ()


@dataclass
class RecallOutcome:
    recall_id: str
    view: ReadView
    results: list[EvidenceResult]
    degradations: list[Degradation] = field(default_factory=list)
    search_states: dict[str, SearchState] = field(default_factory=dict)
    related_relationships: list[Handle] = field(default_factory=list)
    related_communities: list[CommunityHit] = field(default_factory=list)
    hypotheses: tuple[HypothesisRow, ...] = ()
    conflicts: list[ConflictView] = field(default_factory=list)
    # Returned hypotheses in rank order (filled by the hypotheses frontier).
    hypothesis_ids: list[str] = field(default_factory=list)
    # Set when the recall was persisted for feedback (gateway/services/feedback.py).
    recall_event_id: str | None = None
    suggested_actions: list[SuggestedAction] = field(default_factory=list)
    # Rows the nested fields will ask for, read with the answer (None: not read;
    # the request's loaders then read them on demand).
    nested: NestedRows | None = None
