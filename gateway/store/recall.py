"""SQL of the read path: the view's spaces, canonical hydration, and batch loads.

Every statement takes the view's system time ``t_sys`` explicitly (the caller
resolves it once per request from the database clock), so that the several
statements of one recall see one consistent instant even though each runs in
its own short transaction. State at ``t_sys`` is the latest event with
``recorded_at <= t_sys`` (ties: highest ``seq``), the rule the write path keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from uuid import UUID

from gateway.store.connection import Conn


@dataclass(frozen=True, slots=True)
class SpaceView:
    space_id: UUID
    kind: str
    generation: int | None  # None: the space did not exist at the view's time
    # Its vectors wait in detached tables for an unfinished `load --index-after`
    # (db/0083): its vector lists are empty meanwhile, which recall must say.
    vectors_pending: bool = False


VIEW_SQL = """
SELECT now() AS now, s.id, s.kind,
       (SELECT max(g.generation) FROM space_generations g
         WHERE g.team_id = s.team_id AND g.space_id = s.id
           AND g.recorded_at <= coalesce($3::timestamptz, now())) AS generation,
       EXISTS (SELECT 1 FROM vector_deferrals d
                WHERE d.team_id = s.team_id AND d.space_id = s.id) AS vectors_pending
FROM memory_spaces s
WHERE s.team_id = $1 AND s.id = ANY($2::uuid[])
"""


async def resolve_view(
    conn: Conn, team: str, space_ids: Sequence[UUID], known_at: datetime | None
) -> tuple[datetime, list[SpaceView]]:
    """The database's current time and each space's generation at the view's time."""
    rows = await conn.fetch(VIEW_SQL, team, list(space_ids), known_at)
    if not rows:
        now = await conn.fetchval("SELECT now()")
        return now, []
    return rows[0]["now"], parse_view(rows)


def parse_view(rows: Sequence[Sequence[Any]]) -> list[SpaceView]:
    """Rows of :data:`VIEW_SQL` by position (plain rows or the records of the
    combined scope round, gateway/store/round_trips.py)."""
    return [SpaceView(r[1], r[2], r[3], r[4]) for r in rows]


def _latest(table: str, fk: str, col: str, alias: str, ref: str) -> str:
    return (
        f"(SELECT {alias}.{col} FROM {table} {alias} "
        f"WHERE {alias}.team_id = $1 AND {alias}.{fk} = {ref} AND {alias}.recorded_at <= $4 "
        f"ORDER BY {alias}.recorded_at DESC, {alias}.seq DESC LIMIT 1)"
    )


# Eligible evidence: visible in its space's generation at t_sys, evidence and
# source active at t_sys, and at least one eligible support path: a support
# granted (or reinstated) at t_sys to a relationship that is active at t_sys,
# valid at t_valid, of the same generation, and not on the losing side of a
# conflict case resolved at t_sys. Hypotheses never count: they are not supports.
#
# Three shapes chosen for the generic plan a recall's connection keeps
# (docs/benchmarks.md, "What a recall costs the server"):
# - each candidate is looked up by its primary key in a LATERAL subquery (a
#   nested loop on ``evidence_pkey`` whatever the estimates): written as
#   ``e.id = ANY (...)`` beside the space's predicates, the generic plan of a
#   store of 1,000 evidence per space read the whole space through
#   ``evidence_space`` and compared every row's ID with every candidate's (880
#   rows filtered out for 120 candidates);
# - ``paths`` walks from each candidate to its supports, then to their
#   relationships by primary key (LATERAL again: with another estimate of
#   ``ev``, a generic plan of the demo data joined every relationship of the
#   space with every candidate before looking at supports), and carries its
#   evidence's columns, so the answer is one grouping of ``paths``: joined
#   back to ``ev``, both CTEs estimated at one row, the plan was a nested loop
#   rescanning ``paths`` once per candidate (14,280 text comparisons for 120
#   candidates);
# - a candidate's source is checked once per source (``active_sources``), not
#   once per candidate: a source holds many evidence (every candidate of a
#   benchmark team shares one), and its latest lifecycle event is the same
#   lookup whichever candidate asks (docs/benchmarks.md, "The scope round's
#   evidence parts at 100k"). Same rows: a candidate is kept when its source's
#   latest status is active, as before.
ELIGIBLE_SQL = f"""
WITH gen AS MATERIALIZED (
    SELECT g.space_id, max(g.generation) AS generation
    FROM space_generations g
    WHERE g.team_id = $1 AND g.space_id = ANY($3::uuid[]) AND g.recorded_at <= $4
    GROUP BY g.space_id
),
ev_any_source AS MATERIALIZED (
    SELECT e.id, e.space_id, e.source_id, e.content, e.observed_at, e.recorded_at
    FROM (SELECT DISTINCT w.id FROM unnest($2::text[]) AS w (id)) want
    CROSS JOIN LATERAL (
        SELECT e.id, e.space_id, e.generation, e.source_id, e.content, e.observed_at,
               e.recorded_at
        FROM evidence e
        WHERE e.team_id = $1 AND e.id = want.id AND e.space_id = ANY($3::uuid[])
          AND e.recorded_at <= $4
          AND {_latest("evidence_lifecycle_events", "evidence_id", "status", "le", "e.id")} = 'active'
        OFFSET 0
    ) e
    JOIN gen ON gen.space_id = e.space_id AND gen.generation = e.generation
),
active_sources AS MATERIALIZED (
    SELECT o.source_id::text AS source_id
    FROM (SELECT DISTINCT a.source_id FROM ev_any_source a) o
    WHERE {_latest("source_lifecycle_events", "source_id", "status", "ls", "o.source_id")} = 'active'
),
ev AS MATERIALIZED (
    SELECT a.* FROM ev_any_source a
    WHERE a.source_id::text = ANY (ARRAY(SELECT o.source_id FROM active_sources o))
),
paths AS MATERIALIZED (
    SELECT ev.id, ev.space_id, ev.source_id, ev.content, ev.observed_at, ev.recorded_at,
           r.id AS relationship_id
    FROM ev
    CROSS JOIN LATERAL (
        SELECT s.space_id, s.relationship_id
        FROM supports s
        WHERE s.team_id = $1 AND s.space_id = ev.space_id AND s.evidence_id = ev.id
          AND s.recorded_at <= $4
          AND {_latest("support_decisions", "support_id", "decision", "sd", "s.id")}
              IN ('grant', 'reinstate')
        OFFSET 0
    ) s
    CROSS JOIN LATERAL (
        SELECT r.id, r.space_id, r.generation
        FROM relationships r
        WHERE r.team_id = $1 AND r.space_id = s.space_id AND r.id = s.relationship_id
          AND r.recorded_at <= $4
          AND {_latest("relationship_status_events", "relationship_id", "status", "rs", "r.id")}
              = 'active'
          AND (r.valid_from IS NULL OR r.valid_from <= $5)
          AND (r.valid_to IS NULL OR $5 < r.valid_to)
          -- Not on a losing side: a scalar subquery rather than NOT EXISTS, see
          -- eligible_relationship (gateway/store/related.py) for why.
          AND (
              SELECT 1
              FROM conflict_position_relationships cpr
              JOIN conflict_cases cc ON cc.team_id = $1 AND cc.id = cpr.case_id
              JOIN gen cg ON cg.space_id = cc.space_id AND cg.generation = cc.generation
              CROSS JOIN LATERAL (
                  SELECT ce.event, ce.preferred_position_id FROM conflict_case_events ce
                  WHERE ce.team_id = $1 AND ce.case_id = cc.id AND ce.recorded_at <= $4
                  ORDER BY ce.recorded_at DESC, ce.seq DESC LIMIT 1
              ) last
              WHERE cpr.team_id = $1 AND cpr.relationship_id = r.id AND cc.recorded_at <= $4
                AND last.event = 'resolve' AND last.preferred_position_id <> cpr.position_id
              LIMIT 1
          ) IS NULL
        OFFSET 0
    ) r
    JOIN gen ON gen.space_id = r.space_id AND gen.generation = r.generation
)
SELECT p.id, p.space_id, p.source_id, p.content, p.observed_at, p.recorded_at,
       -- text[], not an array of the client_id domain: inside the records of a
       -- combined statement the driver knows the domain, not its array type.
       array_agg(DISTINCT p.relationship_id::text ORDER BY p.relationship_id::text)
           AS relationship_ids
FROM paths p
GROUP BY p.id, p.space_id, p.source_id, p.content, p.observed_at, p.recorded_at
"""


@dataclass(frozen=True, slots=True)
class EligibleEvidence:
    id: str
    space_id: UUID
    source_id: str
    content: str
    observed_at: datetime | None
    recorded_at: datetime
    relationship_ids: tuple[str, ...]


async def eligible_evidence(
    conn: Conn,
    team: str,
    evidence_ids: Sequence[str],
    space_ids: Sequence[UUID],
    t_sys: datetime,
    t_valid: datetime,
) -> dict[str, EligibleEvidence]:
    """The candidates that pass canonical eligibility for the view; others are absent."""
    if not evidence_ids:
        return {}
    rows = await conn.fetch(ELIGIBLE_SQL, team, list(evidence_ids), list(space_ids), t_sys, t_valid)
    return parse_eligible(rows)


def _slot_setters(cls: type, names: Sequence[str]) -> tuple[Callable[[Any, Any], None], ...]:
    return tuple(getattr(cls, name).__set__ for name in names)


_ELIGIBLE_FIELDS = (
    "id",
    "space_id",
    "source_id",
    "content",
    "observed_at",
    "recorded_at",
    "relationship_ids",
)
# parse_eligible sets exactly these slots: a field added to EligibleEvidence
# without a setter below would stay unset, so the module refuses to load instead.
if tuple(f.name for f in fields(EligibleEvidence)) != _ELIGIBLE_FIELDS:
    raise RuntimeError("parse_eligible must set every field of EligibleEvidence")
_NEW = object.__new__
(_SET_ID, _SET_SPACE, _SET_SOURCE, _SET_CONTENT, _SET_OBSERVED, _SET_RECORDED, _SET_RELS) = (
    _slot_setters(EligibleEvidence, _ELIGIBLE_FIELDS)
)


def parse_eligible(rows: Sequence[Sequence[Any]]) -> dict[str, EligibleEvidence]:
    """Rows of :data:`ELIGIBLE_SQL` by position (plain rows or the records of a
    combined statement alike).

    The frozen dataclass's generated ``__init__`` sets each field through
    ``object.__setattr__`` by name, about 3.5 us a row on a loaded machine and
    a recall hydrates up to 120; its slots are set here directly, the same
    objects (equal, hashable, frozen) in about half the time
    (docs/benchmarks.md, "Worker CPU per recall at 100k")."""
    found: dict[str, EligibleEvidence] = {}
    for r in rows:
        e = _NEW(EligibleEvidence)
        _SET_ID(e, r[0])
        _SET_SPACE(e, r[1])
        _SET_SOURCE(e, r[2])
        _SET_CONTENT(e, r[3])
        _SET_OBSERVED(e, r[4])
        _SET_RECORDED(e, r[5])
        _SET_RELS(e, tuple(r[6]))
        found[r[0]] = e
    return found


# --- batch loads for the GraphQL layer's DataLoaders ---------------------------


@dataclass(frozen=True, slots=True)
class SourceRow:
    id: str
    space_id: UUID
    kind: str
    title: str
    uri: str | None
    authority: str
    created_at: datetime | None
    status: str


_SOURCES = f"""
SELECT o.id, o.space_id, o.kind, o.title, o.uri, o.authority, o.created_at,
       {_latest("source_lifecycle_events", "source_id", "status", "ls", "o.id")} AS status
FROM sources o
WHERE o.team_id = $1 AND o.id = ANY($2::text[]) AND o.space_id = ANY($3::uuid[])
  AND o.recorded_at <= $4
"""


async def sources(
    conn: Conn, team: str, ids: Sequence[str], space_ids: Sequence[UUID], t_sys: datetime
) -> dict[str, SourceRow]:
    rows = await conn.fetch(_SOURCES, team, list(ids), list(space_ids), t_sys)
    return {r["id"]: SourceRow(**dict(r)) for r in rows}


@dataclass(frozen=True, slots=True)
class RelationshipRow:
    id: str
    space_id: UUID
    subject_entity_id: str
    predicate: str
    object_entity_id: str | None
    object_value: str | None
    object_unit: str | None
    polarity: str
    valid_from: datetime | None
    valid_to: datetime | None
    owner_principal_id: str
    semantic_group_key: str
    statement: str
    recorded_at: datetime
    status: str


_RELATIONSHIPS = f"""
SELECT o.id, o.space_id, o.subject_entity_id, o.predicate, o.object_entity_id, o.object_value,
       o.object_unit, o.polarity, o.valid_from, o.valid_to, o.owner_principal_id,
       o.semantic_group_key, o.statement, o.recorded_at,
       {_latest("relationship_status_events", "relationship_id", "status", "rs", "o.id")} AS status
FROM relationships o
WHERE o.team_id = $1 AND o.id = ANY($2::text[]) AND o.space_id = ANY($3::uuid[])
  AND o.recorded_at <= $4
"""


async def relationships(
    conn: Conn, team: str, ids: Sequence[str], space_ids: Sequence[UUID], t_sys: datetime
) -> dict[str, RelationshipRow]:
    rows = await conn.fetch(_RELATIONSHIPS, team, list(ids), list(space_ids), t_sys)
    return {r["id"]: RelationshipRow(**dict(r)) for r in rows}


@dataclass(frozen=True, slots=True)
class EntityRow:
    id: str
    space_id: UUID
    name: str
    kind: str
    aliases: tuple[str, ...]


_ENTITIES = """
SELECT o.id, o.space_id, o.name, o.kind, o.aliases
FROM entities o
WHERE o.team_id = $1 AND o.id = ANY($2::text[]) AND o.space_id = ANY($3::uuid[])
  AND o.recorded_at <= $4
"""


async def entities(
    conn: Conn, team: str, ids: Sequence[str], space_ids: Sequence[UUID], t_sys: datetime
) -> dict[str, EntityRow]:
    rows = await conn.fetch(_ENTITIES, team, list(ids), list(space_ids), t_sys)
    return {
        r["id"]: EntityRow(r["id"], r["space_id"], r["name"], r["kind"], tuple(r["aliases"]))
        for r in rows
    }


# --- the nested rows of one answer, in one statement ---------------------------

# The three CTEs and the selection of :func:`nested_rows`, apart, so that
# gateway/store/round_trips.py can lead with the recall event's CTEs.
# $1 team, $2 source IDs, $3 spaces, $4 t_sys, $5 relationship IDs, $6 entity IDs.
NESTED_CTES = f"""src AS ({_SOURCES}),
rel AS ({_RELATIONSHIPS.replace("$2::text[]", "$5::text[]")}),
ent AS ({
    _ENTITIES.replace(
        "$2::text[]",
        "ARRAY(SELECT subject_entity_id FROM rel "
        "UNION SELECT object_entity_id FROM rel UNION SELECT unnest($6::text[]))",
    )
})"""

NESTED_SELECT = """(SELECT array_agg(ROW(src.*)) FROM src) AS sources,
       (SELECT array_agg(ROW(rel.*)) FROM rel) AS relationships,
       (SELECT array_agg(ROW(ent.*)) FROM ent) AS entities"""

_NESTED = f"WITH {NESTED_CTES}\nSELECT {NESTED_SELECT}\n"


@dataclass(frozen=True, slots=True)
class NestedRows:
    """Sources, relationships and entities an answer's nested fields will ask for,
    read with the answer (so the request's loaders start primed)."""

    sources: dict[str, SourceRow]
    relationships: dict[str, RelationshipRow]
    entities: dict[str, EntityRow]


@dataclass(frozen=True, slots=True)
class NestedQuery:
    """Which nested rows to read: the sources and relationships asked for, and the
    entities of those relationships plus ``entity_ids``."""

    team: str
    source_ids: Sequence[str]
    relationship_ids: Sequence[str]
    entity_ids: Sequence[str]
    space_ids: Sequence[UUID]
    t_sys: datetime


def nested_args(q: NestedQuery) -> list[Any]:
    return [
        q.team,
        list(q.source_ids),
        list(q.space_ids),
        q.t_sys,
        list(q.relationship_ids),
        list(q.entity_ids),
    ]


async def nested_rows(conn: Conn, q: NestedQuery) -> NestedRows:
    """The same rows, under the same rules, as :func:`sources`,
    :func:`relationships` and :func:`entities`, in one statement."""
    row = await conn.fetchrow(_NESTED, *nested_args(q))
    assert row is not None
    return parse_nested(row["sources"], row["relationships"], row["entities"])


def parse_nested(
    sources: Sequence[Sequence[Any]] | None,
    relationships: Sequence[Sequence[Any]] | None,
    entities: Sequence[Sequence[Any]] | None,
) -> NestedRows:
    return NestedRows(
        sources={r[0]: SourceRow(*r) for r in sources or ()},
        relationships={r[0]: RelationshipRow(*r) for r in relationships or ()},
        entities={r[0]: EntityRow(r[0], r[1], r[2], r[3], tuple(r[4])) for r in entities or ()},
    )
