"""SQL of the conflict frontier: relationship conflict cases and evidence conflicts
reachable from a recall's answer, as they stood at the view's system time.

Two statements, whatever the number of results: one for relationship cases
(with their state, positions, position relationships and bounded supporter
summaries), one for evidence conflicts (with each readable position's exact
occurrence citation). Each statement names the team and the readable spaces
in every table it reads; row-level security is the second wall.

**Reach.** The caller passes the answer's evidence IDs and relationship IDs,
each with a *reach* rank (smaller is nearer the top of the answer). A case is
reachable when one of its positions holds a given relationship; an evidence
conflict when one of its positions cites a given evidence. Its reach is the
smallest reach among those, and each statement returns at most ``cap``
conflicts in (reach, ID) order, so a relationship that stands in very many
cases cannot make the answer unbounded.

**Time.** Everything is read as known at ``t_sys``: a case (and its
positions) exists once recorded, its state is its latest event at or before
``t_sys`` (ties: highest ``seq``), so a resolution recorded later never shows
in an earlier view. Rows of an older space generation are invisible.

**Supporters** of a position: the distinct evidence that supports one of the
position's relationships through a support recorded by ``t_sys`` whose latest
decision is ``grant`` or ``reinstate``, the evidence and its source being
active at ``t_sys`` in the space's current generation. The case's own
disposition is deliberately *not* applied here (a dispreferred position keeps
its supporters: that is what the reader weighs), nor the relationship's
status or validity. The summary lists the strongest supporters first
(authority, highest first; then evidence ID), cut at ``supporter_cap``.

**Readable citations.** An evidence-conflict position is shown only when the
evidence it cites is readable in the view: in one of the caller's spaces and
its current generation, recorded by ``t_sys``, the evidence and its source
active at ``t_sys``. Other positions are omitted, and a conflict with fewer
than two readable positions is not returned at all, so that no unreadable
evidence, not even its ID, reaches the caller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from gateway.store.connection import Conn

__all__ = [
    "AUTHORITY_ORDER",
    "CaseRow",
    "CitationRow",
    "ConflictQuery",
    "EvidenceConflictRow",
    "PositionRow",
    "SupporterRow",
    "cases_statement",
    "evidence_conflicts",
    "evidence_statement",
    "parse_cases",
    "parse_evidence_conflicts",
    "relationship_cases",
]

# Lowest first, as the sources table's check constraint lists them.
AUTHORITY_ORDER: Final = ("unverified", "low", "medium", "high", "authoritative")

_AUTHORITY_RANK = (
    "CASE {col} " + " ".join(f"WHEN '{a}' THEN {i}" for i, a in enumerate(AUTHORITY_ORDER)) + " END"
)


def _latest(table: str, fk: str, col: str, alias: str, ref: str) -> str:
    """The state column of the latest event of ``ref`` at ``$5`` (t_sys)."""
    return (
        f"(SELECT {alias}.{col} FROM {table} {alias} "
        f"WHERE {alias}.team_id = $1 AND {alias}.{fk} = {ref} AND {alias}.recorded_at <= $5 "
        f"ORDER BY {alias}.recorded_at DESC, {alias}.seq DESC LIMIT 1)"
    )


# $1 team, $2 readable spaces, $3 relationship IDs, $4 their reach, $5 t_sys,
# $6 cap of cases, $7 cap of supporters per position.
_ASKED_CASES = "SELECT a.relationship_id, a.reach FROM unnest($3::text[], $4::int[]) AS a (relationship_id, reach)"
_GEN = """
gen AS MATERIALIZED (
    SELECT g.space_id, max(g.generation) AS generation
    FROM space_generations g
    WHERE g.team_id = $1 AND g.space_id = ANY($2::uuid[]) AND g.recorded_at <= $5
    GROUP BY g.space_id
)"""

_CASES = f"""
WITH {_GEN},
asked AS (
    {_ASKED_CASES}
),
-- Driven from the asked relationships: each is looked up by the positions'
-- relationship index, and each case found by its key, in subqueries that
-- OFFSET 0 keeps apart (never pulled up into a join the planner may turn
-- around), so that the cost follows the answer's relationships, not the number
-- of cases in the space. As a plain join, the recall's generic plan (a space's
-- cases estimated at a row or so) read every case of the space and each case's
-- positions, then compared them with every asked ID.
cases AS MATERIALIZED (
    SELECT cc.id, cc.space_id, cc.question, min(a.reach) AS reach
    FROM asked a
    CROSS JOIN LATERAL (
        SELECT cpr.case_id
        FROM conflict_position_relationships cpr
        WHERE cpr.team_id = $1 AND cpr.space_id = ANY($2::uuid[])
          AND cpr.relationship_id = a.relationship_id
        OFFSET 0
    ) cpr
    CROSS JOIN LATERAL (
        SELECT cc.id, cc.space_id, cc.question, cc.generation
        FROM conflict_cases cc
        WHERE cc.team_id = $1 AND cc.space_id = ANY($2::uuid[]) AND cc.id = cpr.case_id
          AND cc.recorded_at <= $5
        OFFSET 0
    ) cc
    JOIN gen ON gen.space_id = cc.space_id AND gen.generation = cc.generation
    GROUP BY cc.id, cc.space_id, cc.question
),
stated AS MATERIALIZED (
    SELECT c.id, c.space_id, c.question, c.reach, last.event, last.preferred_position_id,
           last.recorded_at AS state_at
    FROM cases c
    CROSS JOIN LATERAL (
        SELECT ce.event, ce.preferred_position_id, ce.recorded_at
        FROM conflict_case_events ce
        WHERE ce.team_id = $1 AND ce.space_id = c.space_id AND ce.case_id = c.id
          AND ce.recorded_at <= $5
        ORDER BY ce.recorded_at DESC, ce.seq DESC
        LIMIT 1
    ) last
    ORDER BY c.reach, c.id COLLATE "C"
    LIMIT $6
),
members AS MATERIALIZED (
    SELECT s.id AS case_id, p.id AS position_id, p.label, cpr.relationship_id
    FROM stated s
    JOIN conflict_positions p
      ON p.team_id = $1 AND p.space_id = s.space_id AND p.case_id = s.id AND p.recorded_at <= $5
    JOIN conflict_position_relationships cpr
      ON cpr.team_id = $1 AND cpr.case_id = s.id AND cpr.position_id = p.id
    JOIN relationships r
      ON r.team_id = $1 AND r.space_id = s.space_id AND r.id = cpr.relationship_id
     AND r.recorded_at <= $5
),
-- Driven from the members' supports (index on the relationship), so that the
-- cost follows the cases shown, not the size of the space.
member_supports AS MATERIALIZED (
    SELECT m.case_id, m.position_id, sp.space_id, sp.id AS support_id, sp.evidence_id
    FROM members m
    JOIN stated s ON s.id = m.case_id
    JOIN supports sp
      ON sp.team_id = $1 AND sp.relationship_id = m.relationship_id AND sp.space_id = s.space_id
     AND sp.recorded_at <= $5
    WHERE {_latest("support_decisions", "support_id", "decision", "sd", "sp.id")}
          IN ('grant', 'reinstate')
),
supporters AS MATERIALIZED (
    SELECT DISTINCT ms.case_id, ms.position_id, e.id AS evidence_id, e.source_id, o.authority
    FROM member_supports ms
    JOIN evidence e
      ON e.team_id = $1 AND e.id = ms.evidence_id AND e.space_id = ms.space_id
     AND e.recorded_at <= $5
    JOIN gen ON gen.space_id = e.space_id AND gen.generation = e.generation
    JOIN sources o ON o.team_id = $1 AND o.id = e.source_id AND o.space_id = e.space_id
    WHERE {_latest("evidence_lifecycle_events", "evidence_id", "status", "le", "e.id")} = 'active'
      AND {_latest("source_lifecycle_events", "source_id", "status", "ls", "o.id")} = 'active'
),
ranked AS (
    SELECT x.*,
           count(*) OVER (PARTITION BY x.case_id, x.position_id) AS total,
           row_number() OVER (
               PARTITION BY x.case_id, x.position_id
               ORDER BY {_AUTHORITY_RANK.format(col="x.authority")} DESC, x.evidence_id COLLATE "C"
           ) AS n
    FROM supporters x
),
positions AS (
    SELECT m.case_id, m.position_id, min(m.label) AS label,
           array_agg(DISTINCT m.relationship_id::text) AS relationship_ids
    FROM members m
    GROUP BY m.case_id, m.position_id
)
SELECT s.id, s.question, s.reach, s.event, s.preferred_position_id, s.state_at,
       p.position_id, p.label, p.relationship_ids,
       coalesce(sup.total, 0) AS supporter_count,
       coalesce(sup.top, '[]') AS supporters
FROM stated s
JOIN positions p ON p.case_id = s.id
LEFT JOIN LATERAL (
    SELECT max(r.total) AS total,
           json_agg(json_build_object('evidence_id', r.evidence_id, 'source_id', r.source_id,
                                      'authority', r.authority) ORDER BY r.n)::text AS top
    FROM ranked r
    WHERE r.case_id = s.id AND r.position_id = p.position_id AND r.n <= $7
) sup ON true
ORDER BY s.reach, s.id COLLATE "C", p.position_id COLLATE "C"
"""


@dataclass(frozen=True, slots=True)
class SupporterRow:
    evidence_id: str
    source_id: str
    authority: str


@dataclass(frozen=True, slots=True)
class PositionRow:
    id: str
    label: str
    relationship_ids: tuple[str, ...]  # code-point order
    supporter_count: int
    supporters: tuple[SupporterRow, ...]  # strongest first, at most the cap


@dataclass(frozen=True, slots=True)
class CaseRow:
    id: str
    question: str
    reach: int
    event: str  # the latest event at t_sys: open | resolve | reopen
    preferred_position_id: str | None  # set only when that event is a resolution
    state_at: datetime
    positions: tuple[PositionRow, ...]  # position-ID order


def _order_ids(ids: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(ids))


@dataclass(frozen=True, slots=True)
class ConflictQuery:
    """The answer's material with its reach, as seen at ``t_sys`` in ``space_ids``."""

    team: str
    space_ids: Sequence[UUID]
    evidence_reach: Mapping[str, int]
    relationship_reach: Mapping[str, int]
    t_sys: datetime
    cap: int
    supporter_cap: int


def cases_statement(q: ConflictQuery, more: str | None = None) -> tuple[str, list[Any]] | None:
    """The relationship cases' statement and parameters; None when nothing can reach one.

    ``more``: the name of a relation of an enclosing statement, with columns
    ``relationship_id`` and ``reach``: relationships that reach as given besides
    ``q.relationship_reach`` (the related frontiers' handles, read in the same
    statement: gateway/store/round_trips.py). A relationship in both reaches at
    the smaller rank, as :func:`gateway.services.recall_types.answer_reach` ranks it.
    """
    if q.cap <= 0 or (not q.relationship_reach and more is None):
        return None
    sql = _CASES
    if more is not None:
        sql = sql.replace(
            _ASKED_CASES,
            f"{_ASKED_CASES}\n    UNION ALL\n    SELECT m.relationship_id, m.reach FROM {more} m",
        )
    rel_ids = list(q.relationship_reach)
    return sql, [
        q.team,
        list(q.space_ids),
        rel_ids,
        [q.relationship_reach[r] for r in rel_ids],
        q.t_sys,
        q.cap,
        q.supporter_cap,
    ]


async def relationship_cases(
    conn: Conn,
    team: str,
    space_ids: Sequence[UUID],
    relationship_reach: Mapping[str, int],
    t_sys: datetime,
    *,
    cap: int,
    supporter_cap: int,
) -> list[CaseRow]:
    """Cases reachable from ``relationship_reach``'s relationships, nearest first."""
    q = ConflictQuery(team, space_ids, {}, relationship_reach, t_sys, cap, supporter_cap)
    statement = cases_statement(q)
    if statement is None:
        return []
    return parse_cases(await conn.fetch(statement[0], *statement[1]))


def parse_cases(rows: Sequence[Sequence[Any]]) -> list[CaseRow]:
    """Rows of the cases' statement by position, nearest case first, positions in ID order."""
    cases: dict[str, CaseRow] = {}
    positions: dict[str, list[PositionRow]] = {}
    for r in sorted(rows, key=lambda r: (r[2], r[0], r[6])):
        case_id = r[0]
        if case_id not in cases:
            resolved = r[3] == "resolve"
            cases[case_id] = CaseRow(
                id=case_id,
                question=r[1],
                reach=r[2],
                event=r[3],
                preferred_position_id=r[4] if resolved else None,
                state_at=r[5],
                positions=(),
            )
            positions[case_id] = []
        positions[case_id].append(
            PositionRow(
                id=r[6],
                label=r[7],
                relationship_ids=_order_ids(r[8]),
                supporter_count=r[9],
                supporters=tuple(SupporterRow(**s) for s in json.loads(r[10])),
            )
        )
    return [
        CaseRow(
            id=c.id,
            question=c.question,
            reach=c.reach,
            event=c.event,
            preferred_position_id=c.preferred_position_id,
            state_at=c.state_at,
            positions=tuple(positions[c.id]),
        )
        for c in cases.values()
    ]


# $1 team, $2 readable spaces, $3 evidence IDs, $4 their reach, $5 t_sys, $6 cap.
_EVIDENCE_CONFLICTS = f"""
WITH {_GEN},
asked AS (
    SELECT a.evidence_id, a.reach FROM unnest($3::text[], $4::int[]) AS a (evidence_id, reach)
),
-- Driven from the asked evidence by the positions' evidence index, each conflict
-- found by its key, in subqueries kept apart by OFFSET 0 (as for the cases above).
reached AS MATERIALIZED (
    SELECT ec.id, ec.space_id, ec.question, min(a.reach) AS reach
    FROM asked a
    CROSS JOIN LATERAL (
        SELECT p.space_id, p.conflict_id
        FROM evidence_conflict_positions p
        WHERE p.team_id = $1 AND p.space_id = ANY($2::uuid[]) AND p.evidence_id = a.evidence_id
          AND p.recorded_at <= $5
        OFFSET 0
    ) p
    CROSS JOIN LATERAL (
        SELECT ec.id, ec.space_id, ec.question, ec.generation
        FROM evidence_conflicts ec
        WHERE ec.team_id = $1 AND ec.space_id = p.space_id AND ec.id = p.conflict_id
          AND ec.recorded_at <= $5
        OFFSET 0
    ) ec
    JOIN gen ON gen.space_id = ec.space_id AND gen.generation = ec.generation
    GROUP BY ec.id, ec.space_id, ec.question
),
-- Driven from the reached conflicts' positions, so that the cost follows the
-- conflicts, not the size of the space.
cited AS MATERIALIZED (
    SELECT c.id AS conflict_id, p.space_id, p.id AS position_id, p.label, p.evidence_id,
           p.occurrence_id
    FROM reached c
    JOIN evidence_conflict_positions p
      ON p.team_id = $1 AND p.space_id = c.space_id AND p.conflict_id = c.id
     AND p.recorded_at <= $5
),
readable AS MATERIALIZED (
    SELECT x.conflict_id, x.position_id, x.label, x.evidence_id, x.occurrence_id,
           oc.quote, oc.span_start, oc.span_end, o.authority
    FROM cited x
    JOIN evidence e
      ON e.team_id = $1 AND e.id = x.evidence_id AND e.space_id = x.space_id
     AND e.space_id = ANY($2::uuid[]) AND e.recorded_at <= $5
    JOIN gen ON gen.space_id = e.space_id AND gen.generation = e.generation
    JOIN evidence_occurrences oc
      ON oc.team_id = $1 AND oc.evidence_id = e.id AND oc.id = x.occurrence_id
     AND oc.space_id = e.space_id
    JOIN sources o ON o.team_id = $1 AND o.id = e.source_id AND o.space_id = e.space_id
    WHERE {_latest("evidence_lifecycle_events", "evidence_id", "status", "le", "e.id")} = 'active'
      AND {_latest("source_lifecycle_events", "source_id", "status", "ls", "o.id")} = 'active'
),
shown AS MATERIALIZED (
    SELECT c.id, c.question, c.reach
    FROM reached c
    WHERE (SELECT count(*) FROM readable x WHERE x.conflict_id = c.id) >= 2
    ORDER BY c.reach, c.id COLLATE "C"
    LIMIT $6
)
SELECT s.id, s.question, s.reach, x.position_id, x.label, x.evidence_id, x.occurrence_id,
       x.quote, x.span_start, x.span_end, x.authority
FROM shown s
JOIN readable x ON x.conflict_id = s.id
ORDER BY s.reach, s.id COLLATE "C", x.position_id COLLATE "C"
"""


@dataclass(frozen=True, slots=True)
class CitationRow:
    position_id: str
    label: str
    evidence_id: str
    occurrence_id: str
    quote: str
    span_start: int
    span_end: int
    authority: str


@dataclass(frozen=True, slots=True)
class EvidenceConflictRow:
    id: str
    question: str
    reach: int
    positions: tuple[CitationRow, ...]  # readable positions only, position-ID order


def evidence_statement(q: ConflictQuery) -> tuple[str, list[Any]] | None:
    """The evidence conflicts' statement and parameters; None when nothing can reach one."""
    if not q.evidence_reach or q.cap <= 0:
        return None
    ev_ids = list(q.evidence_reach)
    return _EVIDENCE_CONFLICTS, [
        q.team,
        list(q.space_ids),
        ev_ids,
        [q.evidence_reach[e] for e in ev_ids],
        q.t_sys,
        q.cap,
    ]


async def evidence_conflicts(
    conn: Conn,
    team: str,
    space_ids: Sequence[UUID],
    evidence_reach: Mapping[str, int],
    t_sys: datetime,
    *,
    cap: int,
) -> list[EvidenceConflictRow]:
    """Evidence conflicts reachable from ``evidence_reach``'s evidence, nearest first."""
    q = ConflictQuery(team, space_ids, evidence_reach, {}, t_sys, cap, 0)
    statement = evidence_statement(q)
    if statement is None:
        return []
    return parse_evidence_conflicts(await conn.fetch(statement[0], *statement[1]))


def parse_evidence_conflicts(rows: Sequence[Sequence[Any]]) -> list[EvidenceConflictRow]:
    """Rows of the evidence conflicts' statement by position, nearest first."""
    out: dict[str, tuple[str, int, list[CitationRow]]] = {}
    for r in sorted(rows, key=lambda r: (r[2], r[0], r[3])):
        entry = out.setdefault(r[0], (r[1], r[2], []))
        entry[2].append(
            CitationRow(
                position_id=r[3],
                label=r[4],
                evidence_id=r[5],
                occurrence_id=r[6],
                quote=r[7],
                span_start=r[8],
                span_end=r[9],
                authority=r[10],
            )
        )
    return [
        EvidenceConflictRow(id=k, question=q, reach=reach, positions=tuple(ps))
        for k, (q, reach, ps) in out.items()
    ]
