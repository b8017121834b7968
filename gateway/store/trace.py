"""SQL of traceMemory: one relationship, its supports, history, group, conflicts
and lineage, all as known at one system time.

Every statement names the team, the root relationship's space and that space's
generation at the view's time ``t_sys``, besides running under row-level
security. Only the root lookup sees more than one space (the caller's readable
spaces, to find where the relationship lives); every later statement is
confined to the root's own space, so graph expansion never joins the shared
and the private branches. The state of anything at ``t_sys`` is its latest
event with ``recorded_at <= t_sys`` (ties: highest ``seq``), the rule the
write path keeps, so later writes cannot change an earlier view.

Cost: a fixed number of statements for the root and its parts, plus one per
breadth-first level of the lineage (and one probe past the last level), never
one per node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from gateway.store.connection import Conn
from gateway.store.recall import RelationshipRow


def _latest(table: str, fk: str, col: str, ref: str, t_sys: str) -> str:
    """The value of ``col`` in the latest event of ``ref`` at ``t_sys``."""
    return (
        f"(SELECT x.{col} FROM {table} x "
        f"WHERE x.team_id = $1 AND x.{fk} = {ref} AND x.recorded_at <= {t_sys} "
        f"ORDER BY x.recorded_at DESC, x.seq DESC LIMIT 1)"
    )


_REL_COLUMNS = """o.id, o.space_id, o.subject_entity_id, o.predicate, o.object_entity_id,
       o.object_value, o.object_unit, o.polarity, o.valid_from, o.valid_to,
       o.owner_principal_id, o.semantic_group_key, o.statement, o.recorded_at"""

_REL_FIELDS = (
    "id",
    "space_id",
    "subject_entity_id",
    "predicate",
    "object_entity_id",
    "object_value",
    "object_unit",
    "polarity",
    "valid_from",
    "valid_to",
    "owner_principal_id",
    "semantic_group_key",
    "statement",
    "recorded_at",
    "status",
)


def _relationship(row: Any) -> RelationshipRow:
    return RelationshipRow(**{k: row[k] for k in _REL_FIELDS})


# --- the root ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Root:
    now: datetime
    relationship: RelationshipRow
    space_kind: str
    generation: int


# One statement, whatever the ID: a missing ID, another team's, and one in a
# space the caller may not read all give no row, after the same work.
_ROOT_AT = "coalesce($4::timestamptz, now())"
_ROOT_STATUS = _latest("relationship_status_events", "relationship_id", "status", "o.id", _ROOT_AT)
_ROOT = f"""
SELECT now() AS now, s.kind AS space_kind, o.generation, {_REL_COLUMNS},
       {_ROOT_STATUS} AS status
FROM relationships o
JOIN memory_spaces s ON s.team_id = $1 AND s.id = o.space_id
WHERE o.team_id = $1 AND o.id = $2 AND o.space_id = ANY($3::uuid[])
  AND o.recorded_at <= coalesce($4::timestamptz, now())
  AND o.generation = (
      SELECT max(g.generation) FROM space_generations g
      WHERE g.team_id = $1 AND g.space_id = o.space_id
        AND g.recorded_at <= coalesce($4::timestamptz, now()))
"""


async def find_root(
    conn: Conn,
    team: str,
    relationship_id: str,
    space_ids: Sequence[UUID],
    known_at: datetime | None,
) -> Root | None:
    """The relationship as known at ``known_at`` (now when None), if the caller may
    read it and it is in its space's generation of that time; else None."""
    row = await conn.fetchrow(_ROOT, team, relationship_id, list(space_ids), known_at)
    if row is None:
        return None
    return Root(row["now"], _relationship(row), row["space_kind"], row["generation"])


# --- supporting evidence ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SupportRow:
    support_id: str
    evidence_id: str
    source_id: str
    occurrence_id: str | None
    quote: str | None
    span_start: int | None
    span_end: int | None
    support_recorded_at: datetime
    decision: str
    decided_at: datetime
    evidence_status: str
    source_status: str
    content: str | None
    content_length: int
    observed_at: datetime | None
    evidence_recorded_at: datetime


@dataclass(frozen=True, slots=True)
class Page:
    """Rows of a bounded list and how many there were in all."""

    rows: list[Any]
    total: int

    @property
    def truncated(self) -> bool:
        return self.total > len(self.rows)


# $1 team, $2 space, $3 generation, $4 t_sys, $5 relationship, $6 with content,
# $7 limit. Content is read only when asked for (it can be 20,000 characters).
_SUPPORTS = f"""
WITH page AS MATERIALIZED (
    SELECT s.id, count(*) OVER () AS total
    FROM supports s
    JOIN evidence e ON e.team_id = $1 AND e.space_id = s.space_id AND e.id = s.evidence_id
    WHERE s.team_id = $1 AND s.space_id = $2 AND s.relationship_id = $5 AND s.recorded_at <= $4
      AND e.recorded_at <= $4 AND e.generation = $3
    ORDER BY s.recorded_at, s.id COLLATE "C"
    LIMIT $7
)
SELECT s.id AS support_id, s.evidence_id, e.source_id, s.occurrence_id, s.quote,
       s.span_start, s.span_end, s.recorded_at AS support_recorded_at,
       d.decision, d.recorded_at AS decided_at,
       {_latest("evidence_lifecycle_events", "evidence_id", "status", "e.id", "$4")}
           AS evidence_status,
       {_latest("source_lifecycle_events", "source_id", "status", "e.source_id", "$4")}
           AS source_status,
       CASE WHEN $6::boolean THEN left(e.content, $8) END AS content,
       length(e.content) AS content_length, e.observed_at,
       e.recorded_at AS evidence_recorded_at,
       page.total
FROM page
JOIN supports s ON s.team_id = $1 AND s.space_id = $2 AND s.id = page.id
JOIN evidence e ON e.team_id = $1 AND e.space_id = s.space_id AND e.id = s.evidence_id
CROSS JOIN LATERAL (
    SELECT sd.decision, sd.recorded_at FROM support_decisions sd
    WHERE sd.team_id = $1 AND sd.support_id = s.id AND sd.recorded_at <= $4
    ORDER BY sd.recorded_at DESC, sd.seq DESC LIMIT 1
) d
ORDER BY s.recorded_at, s.id COLLATE "C"
"""


async def supports(
    conn: Conn,
    team: str,
    space: UUID,
    generation: int,
    t_sys: datetime,
    relationship_id: str,
    *,
    with_content: bool,
    content_chars: int,
    limit: int,
) -> Page:
    """The root's supports (oldest first) with each evidence's state at ``t_sys``."""
    rows = await conn.fetch(
        _SUPPORTS,
        team,
        space,
        generation,
        t_sys,
        relationship_id,
        with_content,
        limit,
        content_chars,
    )
    total = rows[0]["total"] if rows else 0
    out = [SupportRow(**{k: v for k, v in r.items() if k != "total"}) for r in rows]
    return Page(out, total)


# --- equivalents (same semantic group, same space) -------------------------------------

_EQUIVALENTS = f"""
WITH page AS MATERIALIZED (
    SELECT o.id, count(*) OVER () AS total
    FROM relationships o
    WHERE o.team_id = $1 AND o.space_id = $2 AND o.generation = $3 AND o.recorded_at <= $4
      AND o.semantic_group_key = $5 AND o.id <> $6
    ORDER BY o.id COLLATE "C"
    LIMIT $7
)
SELECT {_REL_COLUMNS},
       {_latest("relationship_status_events", "relationship_id", "status", "o.id", "$4")}
           AS status,
       page.total
FROM page
JOIN relationships o ON o.team_id = $1 AND o.space_id = $2 AND o.id = page.id
ORDER BY o.id COLLATE "C"
"""


async def equivalents(
    conn: Conn,
    team: str,
    space: UUID,
    generation: int,
    t_sys: datetime,
    group_key: str,
    relationship_id: str,
    *,
    limit: int,
) -> Page:
    rows = await conn.fetch(
        _EQUIVALENTS, team, space, generation, t_sys, group_key, relationship_id, limit
    )
    return Page([_relationship(r) for r in rows], rows[0]["total"] if rows else 0)


# --- conflict cases involving the root ------------------------------------------------


@dataclass(frozen=True, slots=True)
class PositionRow:
    id: str
    label: str
    relationship_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CaseRow:
    id: str
    question: str
    event: str  # the latest case event at t_sys: open | resolve | reopen
    preferred_position_id: str | None
    positions: tuple[PositionRow, ...]


@dataclass(frozen=True, slots=True)
class SupporterRow:
    position_id: str
    evidence_id: str
    source_id: str
    authority: str


# The cases (of the root's space and generation) in which the root stands, each
# with its state at t_sys, then their positions: one statement.
_CASES = """
WITH cases AS MATERIALIZED (
    SELECT cc.id, cc.question, last.event, last.preferred_position_id,
           count(*) OVER () AS total
    FROM conflict_position_relationships mine
    JOIN conflict_cases cc
      ON cc.team_id = $1 AND cc.space_id = $2 AND cc.id = mine.case_id
    CROSS JOIN LATERAL (
        SELECT ce.event, ce.preferred_position_id FROM conflict_case_events ce
        WHERE ce.team_id = $1 AND ce.case_id = cc.id AND ce.recorded_at <= $4
        ORDER BY ce.recorded_at DESC, ce.seq DESC LIMIT 1
    ) last
    WHERE mine.team_id = $1 AND mine.space_id = $2 AND mine.relationship_id = $5
      AND cc.generation = $3 AND cc.recorded_at <= $4
    ORDER BY cc.id COLLATE "C"
    LIMIT $6
)
SELECT cases.id, cases.question, cases.event, cases.preferred_position_id, cases.total,
       p.id AS position_id, p.label,
       array_agg(cpr.relationship_id ORDER BY cpr.relationship_id COLLATE "C")
           AS relationship_ids
FROM cases
JOIN conflict_positions p ON p.team_id = $1 AND p.space_id = $2 AND p.case_id = cases.id
JOIN conflict_position_relationships cpr
  ON cpr.team_id = $1 AND cpr.space_id = $2 AND cpr.position_id = p.id
GROUP BY cases.id, cases.question, cases.event, cases.preferred_position_id, cases.total,
         p.id, p.label
ORDER BY cases.id COLLATE "C", p.id COLLATE "C"
"""

# Evidence with an active support path to a position's relationships at t_sys:
# support granted or reinstated, evidence and source active, same generation.
_SUPPORTERS = f"""
SELECT cpr.position_id, s.evidence_id, e.source_id, src.authority
FROM conflict_position_relationships cpr
JOIN supports s ON s.team_id = $1 AND s.space_id = $2 AND s.relationship_id = cpr.relationship_id
JOIN evidence e ON e.team_id = $1 AND e.space_id = $2 AND e.id = s.evidence_id
JOIN sources src ON src.team_id = $1 AND src.space_id = $2 AND src.id = e.source_id
WHERE cpr.team_id = $1 AND cpr.space_id = $2 AND cpr.position_id = ANY($5::text[])
  AND s.recorded_at <= $4 AND e.recorded_at <= $4 AND e.generation = $3
  AND {_latest("support_decisions", "support_id", "decision", "s.id", "$4")}
      IN ('grant', 'reinstate')
  AND {_latest("evidence_lifecycle_events", "evidence_id", "status", "e.id", "$4")} = 'active'
  AND {_latest("source_lifecycle_events", "source_id", "status", "e.source_id", "$4")}
      = 'active'
GROUP BY cpr.position_id, s.evidence_id, e.source_id, src.authority
"""


async def conflict_cases(
    conn: Conn,
    team: str,
    space: UUID,
    generation: int,
    t_sys: datetime,
    relationship_id: str,
    *,
    limit: int,
) -> Page:
    rows = await conn.fetch(_CASES, team, space, generation, t_sys, relationship_id, limit)
    cases: dict[str, tuple[Any, list[PositionRow]]] = {}
    total = 0
    for r in rows:
        total = r["total"]
        entry = cases.setdefault(r["id"], (r, []))
        entry[1].append(PositionRow(r["position_id"], r["label"], tuple(r["relationship_ids"])))
    out = [
        CaseRow(
            id=head["id"],
            question=head["question"],
            event=head["event"],
            preferred_position_id=head["preferred_position_id"],
            positions=tuple(positions),
        )
        for head, positions in cases.values()
    ]
    return Page(out, total)


async def supporters(
    conn: Conn,
    team: str,
    space: UUID,
    generation: int,
    t_sys: datetime,
    position_ids: Sequence[str],
) -> list[SupporterRow]:
    if not position_ids:
        return []
    rows = await conn.fetch(_SUPPORTERS, team, space, generation, t_sys, list(position_ids))
    return [SupporterRow(**dict(r)) for r in rows]


# --- the root's history ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventRow:
    kind: str  # status_transition | support_decision | conflict_event
    recorded_at: datetime
    seq: int
    relationship_id: str
    support_id: str | None
    case_id: str | None
    value: str
    superseded_by: str | None
    preferred_position_id: str | None
    reason: str | None


# Newest first, so that a cut keeps the events nearest the view's time (the ones
# that explain its state); the service returns them oldest first. Within one
# transaction a status change comes before the decisions and case events made
# with it, as the writer inserts them.
_EVENTS = """
SELECT ev.*, count(*) OVER () AS total FROM (
    SELECT 'status_transition' AS kind, 0 AS kind_order, x.recorded_at, x.seq,
           x.relationship_id::text AS relationship_id, NULL::text AS support_id, NULL::text AS case_id,
           x.status AS value, x.superseded_by::text AS superseded_by,
           NULL::text AS preferred_position_id, x.reason
    FROM relationship_status_events x
    WHERE x.team_id = $1 AND x.space_id = $2 AND x.relationship_id = $4::text AND x.recorded_at <= $3
    UNION ALL
    SELECT 'support_decision', 1, x.recorded_at, x.seq, $4::text, x.support_id::text, NULL,
           x.decision, NULL, NULL, x.reason
    FROM support_decisions x
    WHERE x.team_id = $1 AND x.space_id = $2 AND x.support_id = ANY($5::text[])
      AND x.recorded_at <= $3
    UNION ALL
    SELECT 'conflict_event', 2, x.recorded_at, x.seq, $4::text, NULL, x.case_id::text,
           x.event, NULL, x.preferred_position_id::text, x.reason
    FROM conflict_case_events x
    WHERE x.team_id = $1 AND x.space_id = $2 AND x.case_id = ANY($6::text[])
      AND x.recorded_at <= $3
) ev
ORDER BY ev.recorded_at DESC, ev.kind_order DESC, ev.seq DESC
LIMIT $7
"""


async def root_events(
    conn: Conn,
    team: str,
    space: UUID,
    t_sys: datetime,
    relationship_id: str,
    support_ids: Sequence[str],
    case_ids: Sequence[str],
    *,
    limit: int,
) -> Page:
    """The latest ``limit`` events of the root at ``t_sys``, newest first."""
    rows = await conn.fetch(
        _EVENTS, team, space, t_sys, relationship_id, list(support_ids), list(case_ids), limit
    )
    out = [
        EventRow(**{k: v for k, v in r.items() if k not in ("total", "kind_order")}) for r in rows
    ]
    return Page(out, rows[0]["total"] if rows else 0)


# --- lineage: one breadth-first level per statement --------------------------------------
#
# The bounded lists here (and supports and equivalents above) take their page of
# IDs first, in a materialised CTE, and compute per-row state (latest events)
# for that page only: an entity shared by thousands of relationships costs an
# index scan and a sort of IDs, not thousands of history lookups.


@dataclass(frozen=True, slots=True)
class NeighbourRow:
    relationship: RelationshipRow
    events: tuple[EventRow, ...]  # its status transitions at t_sys, oldest first


# Relationships of the root's space and generation, known at t_sys, that have one
# of the frontier's entities as subject or object and were not visited yet; each
# with its status transitions at t_sys. Ordered by ID so that a cut is stable.
_LEVEL = f"""
WITH page AS MATERIALIZED (
    SELECT o.id
    FROM relationships o
    WHERE o.team_id = $1 AND o.space_id = $2 AND o.generation = $3 AND o.recorded_at <= $4
      AND (o.subject_entity_id = ANY($5::text[]) OR o.object_entity_id = ANY($5::text[]))
      AND NOT (o.id = ANY($6::text[]))
    ORDER BY o.id COLLATE "C"
    LIMIT $7
)
SELECT {_REL_COLUMNS},
       {_latest("relationship_status_events", "relationship_id", "status", "o.id", "$4")}
           AS status,
       ev.recorded_ats, ev.seqs, ev.statuses, ev.superseded_bys, ev.reasons
FROM page
JOIN relationships o ON o.team_id = $1 AND o.space_id = $2 AND o.id = page.id
CROSS JOIN LATERAL (
    SELECT array_agg(x.recorded_at ORDER BY x.recorded_at, x.seq) AS recorded_ats,
           array_agg(x.seq ORDER BY x.recorded_at, x.seq) AS seqs,
           array_agg(x.status ORDER BY x.recorded_at, x.seq) AS statuses,
           array_agg(x.superseded_by::text ORDER BY x.recorded_at, x.seq) AS superseded_bys,
           array_agg(x.reason ORDER BY x.recorded_at, x.seq) AS reasons
    FROM relationship_status_events x
    WHERE x.team_id = $1 AND x.space_id = $2 AND x.relationship_id = o.id
      AND x.recorded_at <= $4
) ev
ORDER BY o.id COLLATE "C"
"""

# Whether any unvisited relationship lies beyond the last level expanded.
_BEYOND = """
SELECT EXISTS (
    SELECT 1 FROM relationships o
    WHERE o.team_id = $1 AND o.space_id = $2 AND o.generation = $3 AND o.recorded_at <= $4
      AND (o.subject_entity_id = ANY($5::text[]) OR o.object_entity_id = ANY($5::text[]))
      AND NOT (o.id = ANY($6::text[]))
)
"""


async def lineage_level(
    conn: Conn,
    team: str,
    space: UUID,
    generation: int,
    t_sys: datetime,
    entity_ids: Sequence[str],
    visited: Sequence[str],
    *,
    limit: int,
) -> list[NeighbourRow]:
    rows = await conn.fetch(
        _LEVEL, team, space, generation, t_sys, list(entity_ids), list(visited), limit
    )
    out = []
    for r in rows:
        rel = _relationship(r)
        events = tuple(
            EventRow(
                kind="status_transition",
                recorded_at=at,
                seq=seq,
                relationship_id=rel.id,
                support_id=None,
                case_id=None,
                value=status,
                superseded_by=sup,
                preferred_position_id=None,
                reason=reason,
            )
            for at, seq, status, sup, reason in zip(
                r["recorded_ats"] or (),
                r["seqs"] or (),
                r["statuses"] or (),
                r["superseded_bys"] or (),
                r["reasons"] or (),
                strict=True,
            )
        )
        out.append(NeighbourRow(rel, events))
    return out


async def anything_beyond(
    conn: Conn,
    team: str,
    space: UUID,
    generation: int,
    t_sys: datetime,
    entity_ids: Sequence[str],
    visited: Sequence[str],
) -> bool:
    if not entity_ids:
        return False
    found = await conn.fetchval(
        _BEYOND, team, space, generation, t_sys, list(entity_ids), list(visited)
    )
    return bool(found)
