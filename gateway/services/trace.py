"""traceMemory: why one relationship is believed, as known at one time.

For a relationship the caller may read: its supporting evidence (each with its
current support decision), its history (status transitions, support decisions,
events of the conflict cases it stands in), its equivalents (same semantic
group), those conflict cases with their positions, and a breadth-first lineage
of neighbouring relationships through shared entities.

Everything is bounded, and a cut is reported, never silent: ``maxEdges`` bounds
each list (supports, equivalents, conflict cases, lineage relationships),
``maxEvents`` is one budget of history events for the whole trace (the root's
events first, then each lineage relationship's, level by level), ``maxDepth``
bounds the lineage's hops. Out-of-range bounds are refused, not clamped.

The space is the relationship's own: its ID is looked up only in the caller's
readable spaces, and everything after that reads that one space (the lineage
never crosses from shared to private or back). A missing ID, another team's
and one in an unreadable space take the same statements and raise the same
NotFound.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway.errors import DatabaseUnavailable, InvalidInput, NotFound
from gateway.services.auth import Principal
from gateway.services.recall_input import ID_FORM, WELL_FORMED_ID, Bound
from gateway.services.recall_types import MAX_CONTEXT_CHARS, ReadView
from gateway.store import recall as read_store
from gateway.store import trace as store
from gateway.store.connection import Conn
from gateway.store.database import STORE_FAILURES, Database
from gateway.store.recall import EntityRow, RelationshipRow, SourceRow
from gateway.store.replicas import ReadRouter

# (default, minimum, maximum). Maxima keep one trace to a few hundred rows.
TRACE_BOUNDS: dict[str, Bound] = {
    "maxDepth": Bound(2, 0, 4),
    "maxEdges": Bound(25, 1, 200),
    "maxEvents": Bound(100, 1, 1000),
}

# Supporters listed per conflict position (the count is always complete).
MAX_SUPPORTERS = 5
_AUTHORITY_RANK = {"unverified": 0, "low": 1, "medium": 2, "high": 3, "authoritative": 4}

# Stop reasons, in the order they are listed.
MAX_DEPTH, MAX_EDGES, MAX_EVENTS = "max_depth", "max_edges", "max_events"
_REASON_ORDER = (MAX_DEPTH, MAX_EDGES, MAX_EVENTS)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    relationship_id: str
    max_depth: int
    max_edges: int
    max_events: int
    include_evidence_content: bool
    valid_at: datetime | None
    known_at: datetime | None


def _bounded(name: str, value: int | None) -> int:
    bound = TRACE_BOUNDS[name]
    if value is None:
        return bound.default
    if not bound.minimum <= value <= bound.maximum:
        raise InvalidInput(
            f"{name} must be between {bound.minimum} and {bound.maximum}; got {value}",
            field=name,
        )
    return value


def _instant(name: str, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(
            f"{name} needs a time zone (for example 2026-01-31T12:00:00Z)", field=name
        )
    return value.astimezone(UTC)


def validate(
    *,
    relationship_id: str,
    max_depth: int | None = None,
    max_edges: int | None = None,
    max_events: int | None = None,
    include_evidence_content: bool | None = None,
    valid_at: datetime | None = None,
    known_at: datetime | None = None,
    now: datetime | None = None,
) -> TraceRequest:
    """The checked request. A malformed ID cannot name anything, so refusing it
    as bad input reveals nothing about what exists."""
    if not WELL_FORMED_ID.fullmatch(relationship_id):
        raise InvalidInput(
            f"relationshipId is not a well-formed ID ({ID_FORM})", field="relationshipId"
        )
    known = _instant("knownAt", known_at)
    if known is not None and known > (now or datetime.now(UTC)):
        raise InvalidInput(
            "knownAt is in the future: the system cannot know it yet", field="knownAt"
        )
    return TraceRequest(
        relationship_id=relationship_id,
        max_depth=_bounded("maxDepth", max_depth),
        max_edges=_bounded("maxEdges", max_edges),
        max_events=_bounded("maxEvents", max_events),
        include_evidence_content=bool(include_evidence_content),
        valid_at=_instant("validAt", valid_at),
        known_at=known,
    )


# --- the outcome -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TracedSupport:
    row: store.SupportRow
    content_truncated: bool

    @property
    def supports_at_view(self) -> bool:
        """The support path counts at the view's system time: decision granted or
        reinstated, evidence and its source active."""
        r = self.row
        return (
            r.decision in ("grant", "reinstate")
            and r.evidence_status == "active"
            and r.source_status == "active"
        )


@dataclass(frozen=True, slots=True)
class TracedPosition:
    id: str
    label: str
    disposition: str  # contested | preferred | dispreferred
    relationship_ids: tuple[str, ...]
    supporter_count: int
    supporters: tuple[store.SupporterRow, ...]


@dataclass(frozen=True, slots=True)
class TracedCase:
    id: str
    question: str
    state: str  # open | resolved | reopened
    preferred_position_id: str | None
    positions: tuple[TracedPosition, ...]


@dataclass(frozen=True, slots=True)
class LineageNode:
    depth: int
    relationship: RelationshipRow
    via_entity_id: str
    from_relationship_id: str
    events: tuple[store.EventRow, ...]


@dataclass
class TraceOutcome:
    view: ReadView
    root: RelationshipRow
    space_kind: str
    supports: list[TracedSupport]
    supports_total: int
    events: list[store.EventRow]  # oldest first
    events_total: int
    equivalents: list[RelationshipRow]
    equivalents_total: int
    conflicts: list[TracedCase]
    conflicts_total: int
    lineage: list[LineageNode]
    depth_reached: int
    visited_relationship_ids: list[str]
    visited_entity_ids: list[str]
    # Every source and entity the answer can name, read in the trace's own
    # transaction, so nested fields need no further round trips.
    sources: dict[str, SourceRow] = field(default_factory=dict)
    entities: dict[str, EntityRow] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    lineage_stop: str | None = None

    @property
    def stopped_reasons(self) -> list[str]:
        return [r for r in _REASON_ORDER if r in self.stopped]

    @property
    def stopped_reason(self) -> str | None:
        """The bound that stopped the lineage, else the first other bound that cut."""
        if self.lineage_stop is not None:
            return self.lineage_stop
        reasons = self.stopped_reasons
        return reasons[0] if reasons else None

    @property
    def truncated(self) -> bool:
        return bool(self.stopped)

    def valid_at_view(self, row: RelationshipRow) -> bool:
        t = self.view.t_valid
        return (row.valid_from is None or row.valid_from <= t) and (
            row.valid_to is None or t < row.valid_to
        )


def _entities(row: RelationshipRow) -> list[str]:
    return [e for e in (row.subject_entity_id, row.object_entity_id) if e is not None]


def _state(event: str) -> str:
    return {"open": "open", "resolve": "resolved", "reopen": "reopened"}[event]


class TraceService:
    def __init__(self, db: Database, reads: ReadRouter | None = None) -> None:
        self.db = db
        # Which pool a trace reads from (gateway/store/replicas.py); without
        # replicas, always ``db``.
        self.reads = reads or ReadRouter(db)

    @asynccontextmanager
    async def _tenant(self, team: str, spaces: Sequence[uuid.UUID]) -> AsyncIterator[Conn]:
        """A tenant transaction whose database failures surface as DATABASE_UNAVAILABLE."""
        try:
            async with self.db.tenant(team, spaces) as conn:
                yield conn
        except STORE_FAILURES as exc:
            raise DatabaseUnavailable("the trace could not be loaded") from exc

    async def trace(self, principal: Principal, request: TraceRequest) -> TraceOutcome:
        """The trace, on a replica that has replayed what it needs, else the primary."""

        async def read(db: Database, primary: bool) -> TraceOutcome:
            return await TraceService(db)._trace(principal, request)

        return await self.reads.run(read, known_at=request.known_at)

    async def _trace(self, principal: Principal, request: TraceRequest) -> TraceOutcome:
        team = principal.team_id
        async with self._tenant(team, principal.readable_space_ids) as conn:
            root = await store.find_root(
                conn, team, request.relationship_id, principal.readable_space_ids, request.known_at
            )
        if root is None:
            # The same words for missing, another team's and unreadable.
            raise NotFound(f"relationship '{request.relationship_id}' was not found")
        rel = root.relationship
        t_sys = request.known_at or root.now
        view = ReadView(
            team_id=team,
            space_kinds={rel.space_id: root.space_kind},
            t_sys=t_sys,
            t_valid=request.valid_at or t_sys,
        )
        space, gen, edges = rel.space_id, root.generation, request.max_edges
        stopped: set[str] = set()
        # Only the root's space from here on: row-level security confines the
        # rest of the trace to it, besides the predicates.
        async with self._tenant(team, [space]) as conn:
            sup = await store.supports(
                conn,
                team,
                space,
                gen,
                t_sys,
                rel.id,
                with_content=request.include_evidence_content,
                content_chars=MAX_CONTEXT_CHARS,
                limit=edges,
            )
            eq = await store.equivalents(
                conn, team, space, gen, t_sys, rel.semantic_group_key, rel.id, limit=edges
            )
            cases = await store.conflict_cases(conn, team, space, gen, t_sys, rel.id, limit=edges)
            positions = [p.id for c in cases.rows for p in c.positions]
            backers = await store.supporters(conn, team, space, gen, t_sys, positions)
            support_ids = [s.support_id for s in sup.rows]
            case_ids = [c.id for c in cases.rows]
            events = await store.root_events(
                conn, team, space, t_sys, rel.id, support_ids, case_ids, limit=request.max_events
            )
            for page in (sup, eq, cases):
                if page.truncated:
                    stopped.add(MAX_EDGES)
            budget = request.max_events - len(events.rows)
            if events.truncated:
                stopped.add(MAX_EVENTS)
            lineage, depth_reached, lineage_stop, seen_rels, seen_ents = await self._lineage(
                conn, team, space, gen, t_sys, rel, request, budget, events.truncated
            )
            entity_ids = list(dict.fromkeys(seen_ents + [e for r in eq.rows for e in _entities(r)]))
            entities = await read_store.entities(conn, team, entity_ids, [space], t_sys)
            source_ids = list(dict.fromkeys(s.source_id for s in sup.rows))
            sources = await read_store.sources(conn, team, source_ids, [space], t_sys)
        if lineage_stop is not None:
            stopped.add(lineage_stop)
        supporters_of: dict[str, list[store.SupporterRow]] = {}
        for b in backers:
            supporters_of.setdefault(b.position_id, []).append(b)
        return TraceOutcome(
            view=view,
            root=rel,
            space_kind=root.space_kind,
            supports=[
                TracedSupport(s, s.content is not None and s.content_length > len(s.content))
                for s in sup.rows
            ],
            supports_total=sup.total,
            events=list(reversed(events.rows)),
            events_total=events.total,
            equivalents=list(eq.rows),
            equivalents_total=eq.total,
            conflicts=[self._case(c, supporters_of) for c in cases.rows],
            conflicts_total=cases.total,
            lineage=lineage,
            depth_reached=depth_reached,
            visited_relationship_ids=seen_rels,
            visited_entity_ids=seen_ents,
            sources=sources,
            entities=entities,
            stopped=stopped,
            lineage_stop=lineage_stop,
        )

    @staticmethod
    def _case(
        case: store.CaseRow, supporters_of: dict[str, list[store.SupporterRow]]
    ) -> TracedCase:
        resolved = case.event == "resolve"
        positions = []
        for p in case.positions:
            if not resolved:
                disposition = "contested"
            elif p.id == case.preferred_position_id:
                disposition = "preferred"
            else:
                disposition = "dispreferred"
            backers = sorted(
                supporters_of.get(p.id, []),
                key=lambda b: (-_AUTHORITY_RANK.get(b.authority, 0), b.evidence_id),
            )
            positions.append(
                TracedPosition(
                    id=p.id,
                    label=p.label,
                    disposition=disposition,
                    relationship_ids=p.relationship_ids,
                    supporter_count=len(backers),
                    supporters=tuple(backers[:MAX_SUPPORTERS]),
                )
            )
        return TracedCase(
            id=case.id,
            question=case.question,
            state=_state(case.event),
            preferred_position_id=case.preferred_position_id if resolved else None,
            positions=tuple(positions),
        )

    @staticmethod
    async def _lineage(
        conn: Conn,
        team: str,
        space: uuid.UUID,
        gen: int,
        t_sys: datetime,
        root: RelationshipRow,
        request: TraceRequest,
        budget: int,
        out_of_events: bool,
    ) -> tuple[list[LineageNode], int, str | None, list[str], list[str]]:
        """Breadth-first from the root through shared entities: one statement per
        level, each level limited to what is left of the edge budget (plus one row
        to see whether it was cut), each node admitted only with all its events."""
        seen_rels: list[str] = [root.id]
        seen_ents: list[str] = list(dict.fromkeys(_entities(root)))
        frontier: list[RelationshipRow] = [root]
        frontier_ents = list(seen_ents)
        nodes: list[LineageNode] = []
        depth = 0
        if out_of_events and request.max_depth > 0:
            # The root's own history already used the whole event budget.
            beyond = await store.anything_beyond(
                conn, team, space, gen, t_sys, frontier_ents, seen_rels
            )
            return nodes, 0, MAX_EVENTS if beyond else None, seen_rels, seen_ents
        while frontier_ents:
            if depth == request.max_depth:
                beyond = await store.anything_beyond(
                    conn, team, space, gen, t_sys, frontier_ents, seen_rels
                )
                return nodes, depth, MAX_DEPTH if beyond else None, seen_rels, seen_ents
            room = request.max_edges - len(nodes)
            level = await store.lineage_level(
                conn, team, space, gen, t_sys, frontier_ents, seen_rels, limit=room + 1
            )
            if not level:
                break
            depth += 1
            # The first frontier relationship (in BFS order) holding an entity is
            # the parent of what is reached through it.
            parent_of: dict[str, str] = {}
            for f in frontier:
                for e in _entities(f):
                    if e in frontier_ents:
                        parent_of.setdefault(e, f.id)
            admitted: list[RelationshipRow] = []
            stop: str | None = None
            for i, n in enumerate(level):
                if i == room:
                    stop = MAX_EDGES
                    break
                if len(n.events) > budget:
                    stop = MAX_EVENTS
                    break
                via = next(
                    e
                    for e in (n.relationship.subject_entity_id, n.relationship.object_entity_id)
                    if e is not None and e in parent_of
                )
                budget -= len(n.events)
                nodes.append(LineageNode(depth, n.relationship, via, parent_of[via], n.events))
                seen_rels.append(n.relationship.id)
                admitted.append(n.relationship)
            new_ents = [e for r in admitted for e in _entities(r) if e not in seen_ents]
            new_ents = list(dict.fromkeys(new_ents))
            seen_ents += new_ents
            if stop is not None:
                return nodes, depth, stop, seen_rels, seen_ents
            frontier, frontier_ents = admitted, new_ents
        return nodes, depth, None, seen_rels, seen_ents


def new_view_key() -> str:
    return "trace-" + uuid.uuid4().hex
