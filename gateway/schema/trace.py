"""The ``traceMemory`` field: arguments in, the service's outcome out."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import strawberry
from strawberry.types import Info

from gateway.schema.context import RequestContext
from gateway.schema.recall_types import (
    ConflictPosition,
    ConflictState,
    Disposition,
    LifecycleStatus,
    Relationship,
    RelationshipConflict,
    RelationshipStatus,
    SourceAuthority,
    SupporterSummary,
)
from gateway.schema.trace_types import (
    ConflictEventKind,
    MemoryTrace,
    SupportDecision,
    TraceEvent,
    TraceEventKind,
    TraceEvidence,
    TraceLineageNode,
    TraceStopReason,
    TraceVisited,
)
from gateway.services import trace as service
from gateway.services.loaders import ReadLoaders
from gateway.store.trace import EventRow


def _id(value: str | None) -> strawberry.ID | None:
    return None if value is None else strawberry.ID(value)


def _event(e: EventRow) -> TraceEvent:
    kind = TraceEventKind(e.kind)
    return TraceEvent(
        kind=kind,
        recorded_at=e.recorded_at,
        relationship_id=strawberry.ID(e.relationship_id),
        support_id=_id(e.support_id),
        case_id=_id(e.case_id),
        status=RelationshipStatus(e.value) if kind is TraceEventKind.STATUS_TRANSITION else None,
        superseded_by_id=_id(e.superseded_by),
        decision=SupportDecision(e.value) if kind is TraceEventKind.SUPPORT_DECISION else None,
        conflict_event=(
            ConflictEventKind(e.value) if kind is TraceEventKind.CONFLICT_EVENT else None
        ),
        preferred_position_id=_id(e.preferred_position_id),
        reason=e.reason,
    )


def _conflict(case: service.TracedCase, view_key: str) -> RelationshipConflict:
    return RelationshipConflict(
        id=strawberry.ID(case.id),
        question=case.question,
        state=ConflictState(case.state),
        preferred_position_id=_id(case.preferred_position_id),
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
                supporters_truncated=p.supporter_count > len(p.supporters),
                view_key=view_key,
            )
            for p in case.positions
        ],
    )


def to_trace(outcome: service.TraceOutcome, view_key: str) -> MemoryTrace:
    kind = outcome.space_kind
    root = outcome.root
    return MemoryTrace(
        relationship=Relationship.of(root, kind, view_key),
        valid_at_view=outcome.valid_at_view(root),
        known_at=outcome.view.t_sys,
        valid_at=outcome.view.t_valid,
        semantic_group=root.semantic_group_key,
        evidence=[
            TraceEvidence(
                support_id=strawberry.ID(s.row.support_id),
                evidence_id=strawberry.ID(s.row.evidence_id),
                decision=SupportDecision(s.row.decision),
                decided_at=s.row.decided_at,
                supports_at_view=s.supports_at_view,
                evidence_status=LifecycleStatus(s.row.evidence_status),
                occurrence_id=_id(s.row.occurrence_id),
                quote=s.row.quote,
                span_start=s.row.span_start,
                span_end=s.row.span_end,
                content=s.row.content,
                content_truncated=s.content_truncated,
                observed_at=s.row.observed_at,
                recorded_at=s.row.evidence_recorded_at,
                support_recorded_at=s.row.support_recorded_at,
                source_id=s.row.source_id,
                view_key=view_key,
            )
            for s in outcome.supports
        ],
        evidence_total=outcome.supports_total,
        events=[_event(e) for e in outcome.events],
        events_total=outcome.events_total,
        equivalents=[Relationship.of(r, kind, view_key) for r in outcome.equivalents],
        equivalents_total=outcome.equivalents_total,
        conflicts=[_conflict(c, view_key) for c in outcome.conflicts],
        conflicts_total=outcome.conflicts_total,
        lineage=[
            TraceLineageNode(
                depth=n.depth,
                relationship=Relationship.of(n.relationship, kind, view_key),
                from_relationship_id=strawberry.ID(n.from_relationship_id),
                via_entity_id=strawberry.ID(n.via_entity_id),
                valid_at_view=outcome.valid_at_view(n.relationship),
                events=[_event(e) for e in n.events],
                view_key=view_key,
            )
            for n in outcome.lineage
        ],
        visited=TraceVisited(
            relationship_ids=[strawberry.ID(i) for i in outcome.visited_relationship_ids],
            entity_ids=[strawberry.ID(i) for i in outcome.visited_entity_ids],
            relationship_count=len(outcome.visited_relationship_ids),
            entity_count=len(outcome.visited_entity_ids),
            depth_reached=outcome.depth_reached,
        ),
        truncated=outcome.truncated,
        stopped_reason=(
            TraceStopReason(outcome.stopped_reason) if outcome.stopped_reason else None
        ),
        stopped_reasons=[TraceStopReason(r) for r in outcome.stopped_reasons],
    )


def _doc(name: str, what: str) -> str:
    b = service.TRACE_BOUNDS[name]
    return f"{what} Default {b.default}, {b.minimum}..{b.maximum}."


async def trace_memory(
    info: Info[RequestContext, None],
    relationship_id: Annotated[
        strawberry.ID,
        strawberry.argument(description="The relationship to trace; its space is its own."),
    ],
    max_depth: Annotated[
        int | None,
        strawberry.argument(description=_doc("maxDepth", "Lineage hops (0: no lineage).")),
    ] = None,
    max_edges: Annotated[
        int | None,
        strawberry.argument(
            description=_doc(
                "maxEdges",
                "Bound of each list: supports, equivalents, conflict cases, lineage relationships.",
            )
        ),
    ] = None,
    max_events: Annotated[
        int | None,
        strawberry.argument(
            description=_doc(
                "maxEvents", "History events in the whole trace, the relationship's first."
            )
        ),
    ] = None,
    include_evidence_content: Annotated[
        bool | None,
        strawberry.argument(description="Return evidence text (default false)."),
    ] = None,
    valid_at: Annotated[
        datetime | None,
        strawberry.argument(description="Real-world time: what was true then. With a time zone."),
    ] = None,
    known_at: Annotated[
        datetime | None,
        strawberry.argument(description="System time: what memory knew then. With a time zone."),
    ] = None,
) -> MemoryTrace:
    principal = info.context.require_principal()
    request = service.validate(
        relationship_id=str(relationship_id),
        max_depth=max_depth,
        max_edges=max_edges,
        max_events=max_events,
        include_evidence_content=include_evidence_content,
        valid_at=valid_at,
        known_at=known_at,
    )
    services = info.context.services
    # Stateless over the shared pools: made per call; the read router chooses
    # the pool (a replica or the primary).
    outcome = await service.TraceService(services.db, services.reads).trace(principal, request)
    view_key = service.new_view_key()
    loaders = ReadLoaders(services.db, outcome.view)
    # The trace read these already: nested fields are answered from them.
    loaders.sources.prime_rows(outcome.sources)
    loaders.entities.prime_rows(outcome.entities)
    info.context.loaders[view_key] = loaders
    return to_trace(outcome, view_key)
