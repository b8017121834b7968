"""The ``recallMemory`` field: arguments in, the service's outcome out."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import strawberry
from strawberry.types import Info

from gateway.schema import related
from gateway.schema.conflicts import conflicts_of
from gateway.schema.context import RequestContext
from gateway.schema.hypotheses import hypotheses_of
from gateway.schema.recall_types import (
    CandidateList,
    CandidateListState,
    Degradation,
    DegradationCode,
    EvidenceContext,
    Frontier,
    FrontierSearchState,
    ListStatus,
    RecallResult,
    SearchStates,
    SearchStatus,
    SuggestedAction,
    SuggestedActionKind,
)
from gateway.schema.types import SpaceKind
from gateway.services import recall_types as service
from gateway.services.loaders import ReadLoaders
from gateway.services.recall_input import LIMITS, validate


def _state(state: service.SearchState) -> FrontierSearchState:
    return FrontierSearchState(
        frontier=Frontier(state.frontier),
        status=SearchStatus(state.status),
        complete=state.complete,
        lists=[
            CandidateListState(
                space_kind=SpaceKind(s.branch),
                list=CandidateList(s.list),
                status=ListStatus(s.status),
                candidates=s.candidates,
            )
            for s in state.lists
        ],
    )


def to_result(outcome: service.RecallOutcome, view_key: str) -> RecallResult:
    return RecallResult(
        recall_id=strawberry.ID(outcome.recall_id),
        recall_event_id=strawberry.ID(outcome.recall_event_id) if outcome.recall_event_id else None,
        results=[
            EvidenceContext(
                evidence_id=strawberry.ID(r.evidence.id),
                rank=r.rank,
                context=r.context,
                context_truncated=r.context_truncated,
                space_kind=SpaceKind(r.space_kind),
                observed_at=r.evidence.observed_at,
                recorded_at=r.evidence.recorded_at,
                source_id=r.evidence.source_id,
                relationship_ids=r.evidence.relationship_ids,
                view_key=view_key,
            )
            for r in outcome.results
        ],
        related_relationships=related.handles(outcome.related_relationships, view_key),
        related_communities=related.communities(outcome.related_communities, view_key),
        related_hypotheses=hypotheses_of(outcome.hypotheses),
        conflicts=conflicts_of(outcome.conflicts, view_key),
        search_states=SearchStates(
            evidence=_state(outcome.search_states["evidence"]),
            relationships=_state(outcome.search_states["relationships"]),
            communities=_state(outcome.search_states["communities"]),
            hypotheses=_state(outcome.search_states["hypotheses"]),
        ),
        degradations=[
            Degradation(
                frontier=Frontier(d.frontier),
                code=DegradationCode(d.code),
                message=d.message,
                optional=d.optional,
            )
            for d in outcome.degradations
        ],
        suggested_actions=[
            SuggestedAction(
                kind=SuggestedActionKind(a.kind),
                description=a.description,
                recall_event_id=strawberry.ID(a.recall_event_id) if a.recall_event_id else None,
                hypothesis_ids=[strawberry.ID(h) for h in a.hypothesis_ids],
            )
            for a in outcome.suggested_actions
        ],
    )


def _doc(name: str, what: str) -> str:
    b = LIMITS[name]
    zero = ", 0 disables" if b.minimum == 0 else ""
    return f"{what} Default {b.default}, {b.minimum}..{b.maximum}{zero}."


async def recall_memory(
    info: Info[RequestContext, None],
    query: Annotated[
        str | None,
        strawberry.argument(
            description="What to recall, in natural language (at most 2000 characters)."
        ),
    ] = None,
    limit: Annotated[
        int | None, strawberry.argument(description=_doc("limit", "Evidence results."))
    ] = None,
    relationship_limit: Annotated[
        int | None,
        strawberry.argument(description=_doc("relationshipLimit", "Related relationships.")),
    ] = None,
    community_limit: Annotated[
        int | None,
        strawberry.argument(description=_doc("communityLimit", "Related communities.")),
    ] = None,
    community_relationship_limit: Annotated[
        int | None,
        strawberry.argument(
            description=_doc("communityRelationshipLimit", "Members per community.")
        ),
    ] = None,
    hypothesis_limit: Annotated[
        int | None,
        strawberry.argument(description=_doc("hypothesisLimit", "Related hypotheses.")),
    ] = None,
    valid_at: Annotated[
        datetime | None,
        strawberry.argument(description="Real-world time: what was true then. With a time zone."),
    ] = None,
    known_at: Annotated[
        datetime | None,
        strawberry.argument(description="System time: what memory knew then. With a time zone."),
    ] = None,
    known_evidence_ids: Annotated[
        list[strawberry.ID] | None,
        strawberry.argument(description="Evidence the caller already has: never returned."),
    ] = None,
    known_relationship_ids: Annotated[
        list[strawberry.ID] | None,
        strawberry.argument(description="Relationships the caller already has."),
    ] = None,
    expand_from_entity_ids: Annotated[
        list[strawberry.ID] | None,
        strawberry.argument(description="Entities whose evidence to include (direct, bounded)."),
    ] = None,
) -> RecallResult:
    principal = info.context.require_principal()
    request = validate(
        query=query,
        limit=limit,
        relationship_limit=relationship_limit,
        community_limit=community_limit,
        community_relationship_limit=community_relationship_limit,
        hypothesis_limit=hypothesis_limit,
        valid_at=valid_at,
        known_at=known_at,
        known_evidence_ids=[str(i) for i in known_evidence_ids or []],
        known_relationship_ids=[str(i) for i in known_relationship_ids or []],
        expand_from_entity_ids=[str(i) for i in expand_from_entity_ids or []],
    )
    services = info.context.services
    outcome = await services.recall.recall(principal, request)
    view_key = outcome.recall_id
    info.context.loaders[view_key] = ReadLoaders(services.db, outcome.view, outcome.nested)
    return to_result(outcome, view_key)
