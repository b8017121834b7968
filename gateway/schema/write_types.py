"""Input and result types of the mutations (docs/writes.md, docs/feedback.md).

Inputs mirror the loader's records (docs/loading.md) field by field, in
camelCase, so one document describes both; the differences are that a space is
named by kind (``SHARED``/``PRIVATE``: always the caller's own) and that there
is no ``team``, ``owner`` or ``proposedBy``: those are the caller.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum

import strawberry

from gateway.schema.recall_types import (
    HypothesisStatus,
    Polarity,
    RelationshipStatus,
    SourceAuthority,
    SourceKind,
)
from gateway.schema.types import SpaceKind

# --- shared pieces ---------------------------------------------------------------


@strawberry.type(description="The outcome of one write: made now, or an earlier identical one.")
class WriteReceipt:
    kind: str = strawberry.field(description="The loader record kind, e.g. `evidence`.")
    id: strawberry.ID
    created: bool = strawberry.field(
        description="False when the same write (same ID, same content, same writer) was "
        "made before: nothing was written again."
    )
    recorded_at: datetime = strawberry.field(
        description="System time of the write; a `knownAt` at or after it sees it."
    )


# --- remember ----------------------------------------------------------------------------


@strawberry.input(description="A new source, in the remember call's space.")
class SourceInput:
    id: strawberry.ID
    type: SourceKind
    title: str
    uri: str | None = None
    authority: SourceAuthority = SourceAuthority.MEDIUM
    created_at: datetime | None = None


@strawberry.input(description="A new entity, in the remember call's space.")
class EntityInput:
    id: strawberry.ID
    name: str
    type: str = "thing"
    aliases: list[str] = strawberry.field(default_factory=list)


@strawberry.input(description="A quoted span [start, end) of the evidence text (characters).")
class OccurrenceInput:
    id: strawberry.ID
    start: int
    end: int
    quote: str | None = None


@strawberry.input(description="An entity the evidence mentions, optionally at an occurrence.")
class MentionInput:
    entity: strawberry.ID
    occurrence: strawberry.ID | None = None


@strawberry.input(description="A new evidence text of the remember call's source.")
class EvidenceInput:
    id: strawberry.ID
    content: str
    observed_at: datetime | None = None
    occurrences: list[OccurrenceInput] = strawberry.field(default_factory=list)
    mentions: list[MentionInput] = strawberry.field(default_factory=list)


@strawberry.input(description="Evidence that supports a relationship, optionally a cited span.")
class SupportInput:
    id: strawberry.ID
    evidence: strawberry.ID
    occurrence: strawberry.ID | None = None
    quote: str | None = None
    start: int | None = None
    end: int | None = None


@strawberry.input(description="A new relationship authored by the caller, with its supports.")
class RelationshipInput:
    id: strawberry.ID
    subject: strawberry.ID
    predicate: str
    object: strawberry.ID | None = strawberry.field(
        default=None, description="An entity; or give objectValue."
    )
    object_value: str | None = None
    object_unit: str | None = None
    polarity: Polarity = Polarity.POSITIVE
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    semantic_group: str | None = None
    supports: list[SupportInput] = strawberry.field(default_factory=list)


@strawberry.input(
    description="Memory to write in one transaction: a source (new, or sourceId), entities, "
    "evidence and relationships. Embeddings are computed before the call returns."
)
class RememberInput:
    space: SpaceKind = SpaceKind.SHARED
    source: SourceInput | None = None
    source_id: strawberry.ID | None = strawberry.field(
        default=None, description="An existing source, instead of `source`."
    )
    entities: list[EntityInput] = strawberry.field(default_factory=list)
    evidence: list[EvidenceInput] = strawberry.field(default_factory=list)
    relationships: list[RelationshipInput] = strawberry.field(default_factory=list)


@strawberry.type
class RememberResult:
    receipts: list[WriteReceipt] = strawberry.field(
        description="One per record, in the order source, entities, evidence, relationships."
    )


# --- lifecycle -----------------------------------------------------------------------------


@strawberry.input(description="Withdraw or restore a source: `id` names this change.")
class SourceLifecycleInput:
    id: strawberry.ID
    source: strawberry.ID
    reason: str | None = None


@strawberry.input(description="Withdraw, quarantine or restore evidence: `id` names this change.")
class EvidenceLifecycleInput:
    id: strawberry.ID
    evidence: strawberry.ID
    reason: str | None = None


@strawberry.input(description="A new support of an existing relationship.")
class GrantSupportInput:
    id: strawberry.ID
    relationship: strawberry.ID
    evidence: strawberry.ID
    occurrence: strawberry.ID | None = None
    quote: str | None = None
    start: int | None = None
    end: int | None = None


@strawberry.input(description="Revoke or reinstate a support: `id` names this decision.")
class SupportDecisionInput:
    id: strawberry.ID
    support: strawberry.ID
    reason: str | None = None


@strawberry.input
class RelationshipTransitionInput:
    id: strawberry.ID
    relationship: strawberry.ID
    status: RelationshipStatus
    superseded_by: strawberry.ID | None = None
    reason: str | None = None


# --- conflicts -----------------------------------------------------------------------------


@strawberry.input
class ConflictPositionInput:
    id: strawberry.ID
    label: str
    relationships: list[strawberry.ID]


@strawberry.input
class OpenConflictCaseInput:
    id: strawberry.ID
    space: SpaceKind = SpaceKind.SHARED
    question: str
    positions: list[ConflictPositionInput]
    reason: str | None = None


@strawberry.input
class ResolveConflictCaseInput:
    id: strawberry.ID
    case: strawberry.ID
    preferred_position: strawberry.ID
    reason: str | None = None


@strawberry.input
class ReopenConflictCaseInput:
    id: strawberry.ID
    case: strawberry.ID
    reason: str | None = None


@strawberry.input
class EvidenceConflictPositionInput:
    id: strawberry.ID
    label: str
    evidence: strawberry.ID
    occurrence: strawberry.ID


@strawberry.input
class OpenEvidenceConflictInput:
    id: strawberry.ID
    space: SpaceKind = SpaceKind.SHARED
    question: str
    positions: list[EvidenceConflictPositionInput]


# --- spaces and hypotheses --------------------------------------------------------------------


@strawberry.input(description="Start a new generation of a space: what it held is hidden.")
class ResetSpaceInput:
    id: strawberry.ID
    space: SpaceKind
    reason: str | None = None


@strawberry.input(description="A hypothesis in the shared space, proposed by the caller.")
class ProposeHypothesisInput:
    id: strawberry.ID
    statement: str
    origin: str = "dreaming"
    relationships: list[strawberry.ID] = strawberry.field(default_factory=list)
    evidence: list[strawberry.ID] = strawberry.field(default_factory=list)


# --- the two feedback operations ----------------------------------------------------------------


@strawberry.enum(description="A review decision on a hypothesis.")
class HypothesisDecision(Enum):
    CONFIRM = "confirm"
    REJECT = "reject"
    MARK_STALE = "mark_stale"
    REOPEN = "reopen"


@strawberry.input
class ResolveDreamFeedbackInput:
    feedback_id: strawberry.ID = strawberry.field(description="Client-supplied; idempotency key.")
    hypothesis_id: strawberry.ID
    decision: HypothesisDecision
    note: str | None = None


@strawberry.type
class DreamFeedbackResult:
    receipt: WriteReceipt
    hypothesis_id: strawberry.ID
    status: HypothesisStatus = strawberry.field(description="The status the decision set.")


@strawberry.enum(description="Which frontier of a recall a reference points into.")
class RecallItemFrontier(Enum):
    EVIDENCE = "evidence"
    RELATIONSHIP = "relationship"
    COMMUNITY = "community"
    HYPOTHESIS = "hypothesis"
    CONFLICT = "conflict"


@strawberry.input(description="An item that the named recall event returned.")
class RecallItemReference:
    frontier: RecallItemFrontier
    id: strawberry.ID


@strawberry.enum
class HypothesisJudgement(Enum):
    USEFUL = "useful"
    NOT_USEFUL = "not_useful"
    WRONG = "wrong"


@strawberry.input(description="Feedback on one hypothesis the recall returned.")
class HypothesisJudgementInput:
    hypothesis_id: strawberry.ID
    judgement: HypothesisJudgement
    note: str | None = None


@strawberry.input(description="How one recall served its caller. Records use; changes nothing.")
class RecallSessionFeedbackInput:
    feedback_id: strawberry.ID = strawberry.field(description="Client-supplied; idempotency key.")
    recall_event_id: strawberry.ID
    used: bool = strawberry.field(description="Was the recall used at all?")
    supported_answer: bool | None = strawberry.field(
        default=None, description="Did it support the answer given?"
    )
    rating: int | None = strawberry.field(default=None, description="Quality, 1 (bad) to 5.")
    missing_context: str | None = strawberry.field(
        default=None, description="What was missing, at most 4000 characters."
    )
    irrelevant_results: list[RecallItemReference] = strawberry.field(default_factory=list)
    hypotheses: list[HypothesisJudgementInput] = strawberry.field(default_factory=list)


@strawberry.type
class RecallSessionFeedbackResult:
    feedback_id: strawberry.ID
    recall_event_id: strawberry.ID
    created: bool = strawberry.field(description="False when this is a replay of the same.")
    recorded_at: datetime
