"""Recall events and recall-session feedback (SPEC section 3 step 9, docs/feedback.md).

Why a recall is persisted: feedback must refer to what a recall really returned
to its caller, so each recall (when feedback is enabled) writes a snapshot of
its returned IDs per frontier with their ranks; a later submission may cite only
those. The snapshot is optional to the answer: if it cannot be written, the
recall still answers, without the feedback suggestion, and says so with the
degradation ``recall_feedback_snapshot_unavailable``.

Feedback records use. It never changes ranking or lifecycle: nothing on the
read path reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from uuid import UUID

from gateway.errors import IdempotencyConflict, InvalidInput, NotFound
from gateway.services.auth import Principal
from gateway.services.recall_input import ID_FORM, WELL_FORMED_ID, RecallRequest
from gateway.services.recall_types import Degradation, RecallOutcome, SuggestedAction
from gateway.stages import stage
from gateway.store import feedback as store
from gateway.store.database import STORE_FAILURES, Database, Unit

log = logging.getLogger("gateway.feedback")


SNAPSHOT_UNAVAILABLE = "recall_feedback_snapshot_unavailable"

# Frontier names as stored in recall_event_items (singular, one per item kind).
FRONTIERS = ("evidence", "relationship", "community", "hypothesis", "conflict")
JUDGEMENTS = ("useful", "not_useful", "wrong")

MAX_MISSING_CONTEXT = 4000
MAX_NOTE = 2000
MAX_IRRELEVANT = 200
MAX_HYPOTHESES = 50


def returned_items(outcome: RecallOutcome) -> list[tuple[str, str, int]]:
    """(frontier, ID, rank) of everything the recall returned, so that feedback
    can cite exactly that and nothing else.

    A related-relationship handle counts with its representative and its
    equivalent IDs (all at the handle's rank); community members count as
    relationships ranked after the related ones; conflicts of both kinds share
    the ``conflict`` frontier. An ID is recorded once per frontier, at its
    first (best) rank.
    """
    items: list[tuple[str, str, int]] = []
    seen: set[tuple[str, str]] = set()

    def add(frontier: str, item_id: str, rank: int) -> None:
        if (frontier, item_id) not in seen:
            seen.add((frontier, item_id))
            items.append((frontier, item_id, rank))

    for r in outcome.results:
        add("evidence", r.evidence.id, r.rank)
    handles = [
        *outcome.related_relationships,
        *(m for c in outcome.related_communities for m in c.members),
    ]
    for rank, handle in enumerate(handles, start=1):
        for rid in (handle.representative.id, *handle.equivalent_ids):
            add("relationship", rid, rank)
    for rank, community in enumerate(outcome.related_communities, start=1):
        add("community", community.id, rank)
    for rank, hypothesis_id in enumerate(outcome.hypothesis_ids, start=1):
        add("hypothesis", hypothesis_id, rank)
    for rank, conflict in enumerate(outcome.conflicts, start=1):
        add("conflict", conflict.id, rank)
    return items


class FeedbackService:
    """Writes recall snapshots and accepts recall-session feedback."""

    def __init__(self, db: Database, *, enabled: bool = True) -> None:
        self.db = db
        self.enabled = enabled

    # --- the snapshot, at the end of every recall ------------------------------------

    @stage("feedback")
    async def attach(
        self,
        principal: Principal,
        request: RecallRequest,
        outcome: RecallOutcome,
        unit: Unit | None = None,
    ) -> None:
        """Persist the recall as an event and add the suggestions that refer to it;
        on failure add the degradation instead. Never raises for a store failure.

        ``unit``: the recall's own unit of work (read-write), so that the snapshot
        costs one statement; without it, a transaction of its own."""
        if not self.enabled:
            return
        if unit is None:
            try:
                async with self.db.unit(
                    principal.team_id, principal.readable_space_ids, readonly=False
                ) as own:
                    await self.attach(principal, request, outcome, own)
            except STORE_FAILURES as exc:  # the commit itself
                self.lost(outcome, exc)
            return
        event = self.event(principal, request, outcome)
        try:
            async with unit.step() as conn:
                await store.insert_recall_event(conn, event)
        except STORE_FAILURES as exc:
            self.lost(outcome, exc)
            return
        self.recorded(outcome)

    @staticmethod
    def event(
        principal: Principal, request: RecallRequest, outcome: RecallOutcome
    ) -> store.NewRecallEvent:
        """The recall event of this answer (written by :meth:`attach`, or by the
        recall together with its nested rows: gateway/store/round_trips.py)."""
        return store.NewRecallEvent(
            team=principal.team_id,
            id=UUID(outcome.recall_id),
            principal=principal.principal_id,
            token=principal.token_id,
            query_sha256=(
                hashlib.sha256(request.query.encode()).digest()
                if request.query is not None
                else None
            ),
            space_kinds=sorted(set(outcome.view.space_kinds.values())),
            valid_at=outcome.view.t_valid,
            known_at=outcome.view.t_sys,
            items=returned_items(outcome),
        )

    @staticmethod
    def recorded(outcome: RecallOutcome) -> None:
        """The event is written: the answer refers to it and suggests feedback."""
        outcome.recall_event_id = outcome.recall_id
        outcome.suggested_actions.append(
            SuggestedAction(
                kind="submit_recall_session_feedback",
                description="Say whether this recall was used and supported the answer: "
                "submitRecallSessionFeedback with this recallEventId.",
                recall_event_id=outcome.recall_id,
            )
        )
        if outcome.hypothesis_ids:
            outcome.suggested_actions.append(
                SuggestedAction(
                    kind="resolve_dream_feedback",
                    description="Review the returned hypotheses (confirm, reject, mark_stale): "
                    "resolveDreamFeedback with a hypothesisId.",
                    recall_event_id=outcome.recall_id,
                    hypothesis_ids=tuple(outcome.hypothesis_ids),
                )
            )

    @staticmethod
    def lost(outcome: RecallOutcome, exc: BaseException) -> None:
        log.warning("recall feedback snapshot lost: %s", exc)
        outcome.degradations.append(
            Degradation(
                "feedback",
                SNAPSHOT_UNAVAILABLE,
                "this recall could not be recorded for feedback; the answer is complete, "
                "but submitRecallSessionFeedback cannot refer to it",
            )
        )
        outcome.recall_event_id = None
        outcome.suggested_actions.clear()

    # --- submitRecallSessionFeedback ---------------------------------------------------

    async def submit(self, principal: Principal, fb: SessionFeedback) -> FeedbackReceipt:
        """Record feedback on the caller's own recall event (made by this token, or
        by one that read no space this token cannot); idempotent by feedback ID."""
        event_id = fb.validated_event_id()
        items = fb.validated_items()
        digest = fb.payload_sha256(principal)
        async with self.db.tenant(
            principal.team_id, principal.readable_space_ids, readonly=False
        ) as conn:
            earlier = await store.find_feedback(conn, principal.team_id, fb.feedback_id)
            if earlier is not None and earlier.principal != principal.principal_id:
                raise _conflict(fb)  # another principal's key, whatever the content
            if earlier is not None and principal.private_space_id is not None:
                # a private-bound token may cite every event of its principal
                return _replay(fb, earlier, digest)
            returned = await store.event_items(
                conn,
                principal.team_id,
                event_id,
                principal.principal_id,
                principal.token_id,
                principal.space_kinds,
            )
            # Also before the principal's own replay or conflict: either would tell
            # a guess of what was cited from a wrong one, which a token that may not
            # cite the event must not learn (a shared_only token of the principal
            # whose private-bound token made the event).
            if returned is None:
                raise NotFound(f"no recall event '{fb.recall_event_id}'")
            if earlier is not None:
                return _replay(fb, earlier, digest)
            for path, frontier, item_id in fb.references():
                if (frontier, item_id) not in returned:
                    raise InvalidInput(
                        f"recall event '{fb.recall_event_id}' did not return "
                        f"{frontier} '{item_id}'",
                        field=path,
                    )
            recorded = await store.insert_feedback(
                conn,
                store.NewFeedback(
                    team=principal.team_id,
                    id=fb.feedback_id,
                    recall_event_id=event_id,
                    principal=principal.principal_id,
                    used=fb.used,
                    supported_answer=fb.supported_answer,
                    rating=fb.rating,
                    missing_context=fb.missing_context,
                    payload_sha256=digest,
                    items=items,
                ),
            )
            if recorded is None:  # a concurrent submission with this ID won
                earlier = await store.find_feedback(conn, principal.team_id, fb.feedback_id)
                assert earlier is not None
                return _replay(fb, earlier, digest)
        return FeedbackReceipt(fb.feedback_id, fb.recall_event_id, True, recorded)


def _conflict(fb: SessionFeedback) -> IdempotencyConflict:
    return IdempotencyConflict(
        f"feedback '{fb.feedback_id}' was submitted before with different content"
    )


def _replay(fb: SessionFeedback, earlier: store.StoredFeedback, digest: bytes) -> FeedbackReceipt:
    if earlier.payload_sha256 != digest:
        raise _conflict(fb)
    return FeedbackReceipt(fb.feedback_id, str(earlier.recall_event_id), False, earlier.recorded_at)


@dataclass(frozen=True, slots=True)
class FeedbackReceipt:
    feedback_id: str
    recall_event_id: str
    created: bool
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class HypothesisJudgement:
    hypothesis_id: str
    judgement: str  # useful | not_useful | wrong
    note: str | None = None


@dataclass(frozen=True, slots=True)
class ResultReference:
    frontier: str  # one of FRONTIERS
    id: str


@dataclass(frozen=True, slots=True)
class SessionFeedback:
    """One submission of submitRecallSessionFeedback, as the caller gave it."""

    feedback_id: str
    recall_event_id: str
    used: bool
    supported_answer: bool | None = None
    rating: int | None = None
    missing_context: str | None = None
    irrelevant_results: tuple[ResultReference, ...] = ()
    hypotheses: tuple[HypothesisJudgement, ...] = ()

    def validated_event_id(self) -> UUID:
        if not WELL_FORMED_ID.fullmatch(self.feedback_id):
            raise InvalidInput(
                f"feedbackId is not a well-formed ID ({ID_FORM})", field="feedbackId"
            )
        try:
            return UUID(self.recall_event_id)
        except ValueError:
            raise InvalidInput(
                "recallEventId is not a recall event ID (a UUID from suggestedActions)",
                field="recallEventId",
            ) from None

    def references(self) -> list[tuple[str, str, str]]:
        """(input path, frontier, ID) of every item this submission cites."""
        refs = [
            (f"irrelevantResults[{i}]", r.frontier, r.id)
            for i, r in enumerate(self.irrelevant_results)
        ]
        refs += [
            (f"hypotheses[{i}].hypothesisId", "hypothesis", h.hypothesis_id)
            for i, h in enumerate(self.hypotheses)
        ]
        return refs

    def validated_items(self) -> list[tuple[str, str, str, str | None]]:
        """Check every bound and reference shape; returns the rows to store."""
        if self.rating is not None and not 1 <= self.rating <= 5:
            raise InvalidInput(f"rating must be between 1 and 5; got {self.rating}", field="rating")
        if self.missing_context is not None and len(self.missing_context) > MAX_MISSING_CONTEXT:
            raise InvalidInput(
                f"missingContext takes at most {MAX_MISSING_CONTEXT} characters",
                field="missingContext",
            )
        if len(self.irrelevant_results) > MAX_IRRELEVANT:
            raise InvalidInput(
                f"irrelevantResults takes at most {MAX_IRRELEVANT} references",
                field="irrelevantResults",
            )
        if len(self.hypotheses) > MAX_HYPOTHESES:
            raise InvalidInput(
                f"hypotheses takes at most {MAX_HYPOTHESES} judgements", field="hypotheses"
            )
        seen: set[tuple[str, str]] = set()
        for path, frontier, item_id in self.references():
            if frontier not in FRONTIERS:
                raise InvalidInput(f"unknown frontier '{frontier}'", field=path)
            if not WELL_FORMED_ID.fullmatch(item_id):
                raise InvalidInput(f"'{item_id}' is not a well-formed ID ({ID_FORM})", field=path)
            if (frontier, item_id) in seen:
                raise InvalidInput(f"{frontier} '{item_id}' is cited twice", field=path)
            seen.add((frontier, item_id))
        for i, h in enumerate(self.hypotheses):
            if h.judgement not in JUDGEMENTS:
                raise InvalidInput(
                    f"unknown judgement '{h.judgement}'", field=f"hypotheses[{i}].judgement"
                )
            if h.note is not None and len(h.note) > MAX_NOTE:
                raise InvalidInput(
                    f"a note takes at most {MAX_NOTE} characters", field=f"hypotheses[{i}].note"
                )
        rows: list[tuple[str, str, str, str | None]] = [
            (r.frontier, r.id, "irrelevant", None) for r in self.irrelevant_results
        ]
        rows += [("hypothesis", h.hypothesis_id, h.judgement, h.note) for h in self.hypotheses]
        return rows

    def payload_sha256(self, principal: Principal) -> bytes:
        """What idempotency compares: the submission and who made it."""
        body = asdict(self)
        # the event ID as a UUID, so that another spelling of it is the same content
        body["recall_event_id"] = str(self.validated_event_id())
        body["principal"] = [principal.team_id, principal.principal_id]
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).digest()
