"""The Mutation root: thin resolvers over the one write path (docs/writes.md).

Each resolver turns its input into plain data and hands it to
``MutationService`` (the loader's records, applied by ``WriteService`` as the
caller) or to ``FeedbackService``; no rule about writes lives here.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

import strawberry
from strawberry.types import Info

from gateway.schema.context import RequestContext
from gateway.schema.recall_types import HypothesisStatus
from gateway.schema.write_types import (
    DreamFeedbackResult,
    EvidenceLifecycleInput,
    GrantSupportInput,
    OpenConflictCaseInput,
    OpenEvidenceConflictInput,
    ProposeHypothesisInput,
    RecallSessionFeedbackInput,
    RecallSessionFeedbackResult,
    RelationshipTransitionInput,
    RememberInput,
    RememberResult,
    ReopenConflictCaseInput,
    ResetSpaceInput,
    ResolveConflictCaseInput,
    ResolveDreamFeedbackInput,
    SourceLifecycleInput,
    SupportDecisionInput,
    WriteReceipt,
)
from gateway.services import feedback as fb
from gateway.services.mutations import Item, remember_items, space_ref
from gateway.services.writes import HYPOTHESIS_STATUS, Receipt

_Info = Info[RequestContext, None]


def _plain(value: Any) -> Any:
    """A strawberry input as plain data: dicts with the Python field names, enum values."""
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _receipt(r: Receipt) -> WriteReceipt:
    return WriteReceipt(
        kind=r.kind, id=strawberry.ID(r.id), created=r.created, recorded_at=r.recorded_at
    )


async def _one(info: _Info, kind: str, data: dict[str, Any], **names: str) -> WriteReceipt:
    principal = info.context.require_principal()
    if "space" in data:
        data["space"] = space_ref(principal, data["space"])
    receipts = await info.context.services.mutations.apply(
        principal, [Item(kind, data, names=names)]
    )
    return _receipt(receipts[0])


async def _lifecycle(info: _Info, kind: str, target: str, given: Any, status: str) -> WriteReceipt:
    # the status is the mutation itself: a refused transition points at the target
    return await _one(info, kind, {**_plain(given), "status": status}, status=target)


async def _decision(info: _Info, given: SupportDecisionInput, decision: str) -> WriteReceipt:
    return await _one(
        info, "support_decision", {**_plain(given), "decision": decision}, decision="support"
    )


@strawberry.type(description="Writes. Each is authorised, one transaction, idempotent by `id`.")
class Mutation:
    @strawberry.mutation(
        description="Write a source, entities, evidence (with occurrences and mentions) and "
        "relationships with their supports, in one transaction; embeddings are computed "
        "before it returns."
    )
    async def remember(self, info: _Info, input: RememberInput) -> RememberResult:
        principal = info.context.require_principal()
        items = remember_items(principal, _plain(input))
        receipts = await info.context.services.mutations.apply(principal, items)
        return RememberResult(receipts=[_receipt(r) for r in receipts])

    @strawberry.mutation(description="Withdraw a source: its evidence is no longer recalled.")
    async def withdraw_source(self, info: _Info, input: SourceLifecycleInput) -> WriteReceipt:
        return await _lifecycle(info, "source_lifecycle", "source", input, "withdrawn")

    @strawberry.mutation(description="Restore a withdrawn source.")
    async def restore_source(self, info: _Info, input: SourceLifecycleInput) -> WriteReceipt:
        return await _lifecycle(info, "source_lifecycle", "source", input, "active")

    @strawberry.mutation(description="Withdraw evidence: it is no longer recalled.")
    async def withdraw_evidence(self, info: _Info, input: EvidenceLifecycleInput) -> WriteReceipt:
        return await _lifecycle(info, "evidence_lifecycle", "evidence", input, "withdrawn")

    @strawberry.mutation(description="Quarantine evidence: kept, not recalled, until restored.")
    async def quarantine_evidence(self, info: _Info, input: EvidenceLifecycleInput) -> WriteReceipt:
        return await _lifecycle(info, "evidence_lifecycle", "evidence", input, "quarantined")

    @strawberry.mutation(description="Restore withdrawn or quarantined evidence.")
    async def restore_evidence(self, info: _Info, input: EvidenceLifecycleInput) -> WriteReceipt:
        return await _lifecycle(info, "evidence_lifecycle", "evidence", input, "active")

    @strawberry.mutation(description="Add a support (evidence -> relationship), granted.")
    async def grant_support(self, info: _Info, input: GrantSupportInput) -> WriteReceipt:
        return await _one(info, "support", _plain(input))

    @strawberry.mutation(description="Revoke a granted support.")
    async def revoke_support(self, info: _Info, input: SupportDecisionInput) -> WriteReceipt:
        return await _decision(info, input, "revoke")

    @strawberry.mutation(description="Reinstate a revoked support.")
    async def reinstate_support(self, info: _Info, input: SupportDecisionInput) -> WriteReceipt:
        return await _decision(info, input, "reinstate")

    @strawberry.mutation(description="Change a relationship's status (active, superseded, ...).")
    async def transition_relationship(
        self, info: _Info, input: RelationshipTransitionInput
    ) -> WriteReceipt:
        return await _one(info, "relationship_transition", _plain(input))

    @strawberry.mutation(description="Open a relationship conflict case with its positions.")
    async def open_conflict_case(self, info: _Info, input: OpenConflictCaseInput) -> WriteReceipt:
        return await _one(info, "conflict_case", _plain(input))

    @strawberry.mutation(description="Resolve an open (or reopened) case to a position.")
    async def resolve_conflict_case(
        self, info: _Info, input: ResolveConflictCaseInput
    ) -> WriteReceipt:
        return await _one(info, "conflict_resolution", _plain(input))

    @strawberry.mutation(description="Reopen a resolved case.")
    async def reopen_conflict_case(
        self, info: _Info, input: ReopenConflictCaseInput
    ) -> WriteReceipt:
        return await _one(info, "conflict_reopening", _plain(input))

    @strawberry.mutation(description="Open an evidence conflict between exact occurrences.")
    async def open_evidence_conflict(
        self, info: _Info, input: OpenEvidenceConflictInput
    ) -> WriteReceipt:
        return await _one(info, "evidence_conflict", _plain(input))

    @strawberry.mutation(
        description="Start a new generation of a space: everything in it is hidden from now "
        "on (earlier knownAt views still see it)."
    )
    async def reset_space(self, info: _Info, input: ResetSpaceInput) -> WriteReceipt:
        return await _one(info, "space_reset", _plain(input))

    @strawberry.mutation(description="Propose a hypothesis in the shared space. Never support.")
    async def propose_hypothesis(self, info: _Info, input: ProposeHypothesisInput) -> WriteReceipt:
        return await _one(info, "hypothesis", _plain(input))

    @strawberry.mutation(
        description="Record a review decision on a shared hypothesis and set its status."
    )
    async def resolve_dream_feedback(
        self, info: _Info, input: ResolveDreamFeedbackInput
    ) -> DreamFeedbackResult:
        data = _plain(input)
        receipt = await _one(
            info,
            "hypothesis_feedback",
            {
                "id": data["feedback_id"],
                "hypothesis": data["hypothesis_id"],
                "decision": data["decision"],
                "note": data["note"],
            },
            id="feedbackId",
            hypothesis="hypothesisId",
        )
        return DreamFeedbackResult(
            receipt=receipt,
            hypothesis_id=input.hypothesis_id,
            status=HypothesisStatus(HYPOTHESIS_STATUS[data["decision"]]),
        )

    @strawberry.mutation(
        description="Say how a recall served you; cites only what that recall returned to "
        "you. Records use; never changes ranking or lifecycle."
    )
    async def submit_recall_session_feedback(
        self, info: _Info, input: RecallSessionFeedbackInput
    ) -> RecallSessionFeedbackResult:
        principal = info.context.require_principal()
        submission = fb.SessionFeedback(
            feedback_id=str(input.feedback_id),
            recall_event_id=str(input.recall_event_id),
            used=input.used,
            supported_answer=input.supported_answer,
            rating=input.rating,
            missing_context=input.missing_context,
            irrelevant_results=tuple(
                fb.ResultReference(r.frontier.value, str(r.id)) for r in input.irrelevant_results
            ),
            hypotheses=tuple(
                fb.HypothesisJudgement(str(h.hypothesis_id), h.judgement.value, h.note)
                for h in input.hypotheses
            ),
        )
        receipt = await info.context.services.feedback.submit(principal, submission)
        return RecallSessionFeedbackResult(
            feedback_id=strawberry.ID(receipt.feedback_id),
            recall_event_id=strawberry.ID(receipt.recall_event_id),
            created=receipt.created,
            recorded_at=receipt.recorded_at,
        )
