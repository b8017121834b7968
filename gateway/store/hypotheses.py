"""SQL of the hypothesis frontier: shared hypotheses related to a recall's answer.

One statement returns two ranked candidate lists and the details of every
hypothesis on either list, so the frontier costs one round trip whatever the
limits:

- **linked**: hypotheses whose ``hypothesis_evidence`` cites a returned shared
  evidence or whose ``hypothesis_relationships`` cites one of the answer's
  shared relationships. Ranked by reach (the smallest reach rank among the
  links, see :mod:`gateway.services.hypotheses`), then ID.
- **lexical**: hypotheses whose search document shares at least one lexeme
  with the query (``to_tsvector('english', query)``, the configuration of the
  documents; OR semantics, and no query syntax, so no input can raise).
  Ranked by the number of distinct query lexemes matched (more first), then ID.

Both lists keep only hypotheses that are, at ``t_sys``: in the shared space
and its current generation, recorded, and whose latest feedback status is
``proposed`` or ``confirmed``. Rejected and stale hypotheses are not shown:
a reviewer has said they are wrong or outdated, and a recall answer is not
the place to revive them (their history stays in ``hypothesis_feedback``).

The source links returned with each hypothesis are those readable at
``t_sys``: relationships recorded in the current generation, evidence
recorded in it whose evidence and source are active. They are provenance of
the hypothesis and are never treated as support.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from gateway.store.connection import Conn

__all__ = [
    "SHOWN_STATUSES",
    "HypothesisLists",
    "HypothesisQuery",
    "HypothesisRow",
    "parse",
    "related_hypotheses",
    "statement",
]

SHOWN_STATUSES: Final = ("proposed", "confirmed")


def _latest(table: str, fk: str, col: str, alias: str, ref: str) -> str:
    return (
        f"(SELECT {alias}.{col} FROM {table} {alias} "
        f"WHERE {alias}.team_id = $1 AND {alias}.{fk} = {ref} AND {alias}.recorded_at <= $4 "
        f"ORDER BY {alias}.recorded_at DESC, {alias}.seq DESC LIMIT 1)"
    )


# $1 team, $2 shared space, $3 its generation at t_sys, $4 t_sys,
# $5 evidence IDs, $6 their reach, $7 relationship IDs, $8 their reach,
# $9 query text (NULL: no lexical list), $10 candidates per list.
def _shown(alias: str) -> str:
    """A hypothesis of the view: current generation, recorded, status shown at t_sys."""
    return (
        f"{alias}.team_id = $1 AND {alias}.space_id = $2 AND {alias}.generation = $3 "
        f"AND {alias}.recorded_at <= $4 "
        f"AND {_latest('hypothesis_feedback', 'hypothesis_id', 'status', 'hf', alias + '.id')} "
        f"= ANY('{{{','.join(SHOWN_STATUSES)}}}'::text[])"
    )


_RELATED = f"""
-- Every lookup below is driven from the answer's IDs (and then from the listed
-- hypotheses) by an index, in a LATERAL subquery that OFFSET 0 keeps apart (never
-- pulled up into a join the planner may turn around): the recall's generic plan
-- estimates a space's hypotheses at a row or so, and as plain joins it read
-- every hypothesis of the space, checked its latest status, and compared it with
-- the links, once per hypothesis (docs/benchmarks.md, "Hypotheses, conflicts and
-- communities per recall"). Same rows: the same predicates on the same rows.
WITH links AS MATERIALIZED (
    SELECT he.hypothesis_id, a.reach
    FROM unnest($5::text[], $6::int[]) AS a (evidence_id, reach)
    CROSS JOIN LATERAL (
        SELECT he.hypothesis_id FROM hypothesis_evidence he
        WHERE he.team_id = $1 AND he.space_id = $2 AND he.evidence_id = a.evidence_id
        OFFSET 0
    ) he
    UNION ALL
    SELECT hr.hypothesis_id, a.reach
    FROM unnest($7::text[], $8::int[]) AS a (relationship_id, reach)
    CROSS JOIN LATERAL (
        SELECT hr.hypothesis_id FROM hypothesis_relationships hr
        WHERE hr.team_id = $1 AND hr.space_id = $2 AND hr.relationship_id = a.relationship_id
        OFFSET 0
    ) hr
),
linked AS MATERIALIZED (
    SELECT 'linked'::text AS list_name, h.id,
           row_number() OVER (ORDER BY min(l.reach), h.id COLLATE "C") AS rank
    FROM links l
    CROSS JOIN LATERAL (
        SELECT h.id FROM hypotheses h
        WHERE h.team_id = $1 AND h.space_id = $2 AND h.id = l.hypothesis_id AND {_shown("h")}
        OFFSET 0
    ) h
    GROUP BY h.id
    ORDER BY rank
    LIMIT $10
),
query_lexemes AS MATERIALIZED (
    SELECT coalesce(array_agg(u.lexeme), '{{}}') AS lexemes
    FROM unnest(to_tsvector('english'::regconfig, coalesce($9::text, ''))) AS u
),
lexical AS MATERIALIZED (
    SELECT 'lexical'::text AS list_name, m.id,
           row_number() OVER (ORDER BY m.matched DESC, m.id COLLATE "C") AS rank
    FROM (
        SELECT h.id,
               cardinality(ARRAY(
                   SELECT unnest(tsvector_to_array(h.search_document))
                   INTERSECT SELECT unnest(q.lexemes) FROM query_lexemes q)) AS matched
        FROM hypotheses h
        -- The query's lexemes as a value computed once (not a joined CTE), so that
        -- this cheap test filters the space's hypotheses before the latest status
        -- of each is looked up (the planner orders a scan's filters by cost).
        WHERE $9::text IS NOT NULL
          AND tsvector_to_array(h.search_document) && (SELECT q.lexemes FROM query_lexemes q)
          AND {_shown("h")}
    ) m
    ORDER BY rank
    LIMIT $10
),
listed AS (
    SELECT * FROM linked UNION ALL SELECT * FROM lexical
)
SELECT x.list_name, x.rank, h.id, h.statement, h.origin,
       {_latest("hypothesis_feedback", "hypothesis_id", "status", "hs", "h.id")} AS status,
       ARRAY(
           SELECT hr.relationship_id::text
           FROM hypothesis_relationships hr
           JOIN relationships r
             ON r.team_id = $1 AND r.space_id = $2 AND r.id = hr.relationship_id
            AND r.generation = $3 AND r.recorded_at <= $4
           WHERE hr.team_id = $1 AND hr.space_id = $2 AND hr.hypothesis_id = h.id
           ORDER BY hr.relationship_id COLLATE "C"
       ) AS relationship_ids,
       ARRAY(
           SELECT he.evidence_id::text
           FROM hypothesis_evidence he
           JOIN evidence e
             ON e.team_id = $1 AND e.space_id = $2 AND e.id = he.evidence_id
            AND e.generation = $3 AND e.recorded_at <= $4
           WHERE he.team_id = $1 AND he.space_id = $2 AND he.hypothesis_id = h.id
             AND {_latest("evidence_lifecycle_events", "evidence_id", "status", "le", "e.id")}
                 = 'active'
             AND {_latest("source_lifecycle_events", "source_id", "status", "ls", "e.source_id")}
                 = 'active'
           ORDER BY he.evidence_id COLLATE "C"
       ) AS evidence_ids
FROM listed x
CROSS JOIN LATERAL (
    SELECT h.id, h.statement, h.origin FROM hypotheses h
    WHERE h.team_id = $1 AND h.space_id = $2 AND h.id = x.id
    OFFSET 0
) h
ORDER BY x.list_name, x.rank
"""


@dataclass(frozen=True, slots=True)
class HypothesisRow:
    id: str
    statement: str
    origin: str
    status: str
    relationship_ids: tuple[str, ...]
    evidence_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HypothesisLists:
    """The two ranked lists (IDs, best first) and every listed hypothesis."""

    linked: tuple[str, ...]
    lexical: tuple[str, ...]
    rows: dict[str, HypothesisRow]


@dataclass(frozen=True, slots=True)
class HypothesisQuery:
    """Both lists of the shared space at ``t_sys``: linked to the answer's material
    (with its reach) and lexical for ``query`` (None: no lexical list)."""

    team: str
    shared_space: UUID
    generation: int
    t_sys: datetime
    evidence_reach: Mapping[str, int]
    relationship_reach: Mapping[str, int]
    query: str | None
    per_list: int


def statement(q: HypothesisQuery) -> tuple[str, list[Any]]:
    """The one statement and its parameters (also sent combined with others:
    gateway/store/round_trips.py)."""
    ev_ids, rel_ids = list(q.evidence_reach), list(q.relationship_reach)
    return _RELATED, [
        q.team,
        q.shared_space,
        q.generation,
        q.t_sys,
        ev_ids,
        [q.evidence_reach[e] for e in ev_ids],
        rel_ids,
        [q.relationship_reach[r] for r in rel_ids],
        q.query,
        q.per_list,
    ]


async def related_hypotheses(conn: Conn, q: HypothesisQuery) -> HypothesisLists:
    """Both candidate lists of the shared space at ``t_sys``, in one statement."""
    sql, args = statement(q)
    return parse(await conn.fetch(sql, *args))


def parse(rows: Sequence[Sequence[Any]]) -> HypothesisLists:
    """Rows ``(list_name, rank, id, statement, origin, status, relationship_ids,
    evidence_ids)`` by position, in list and rank order."""
    lists: dict[str, list[str]] = {"linked": [], "lexical": []}
    found: dict[str, HypothesisRow] = {}
    for r in sorted(rows, key=lambda r: (r[0], r[1])):
        lists[r[0]].append(r[2])
        found[r[2]] = HypothesisRow(
            id=r[2],
            statement=r[3],
            origin=r[4],
            status=r[5],
            relationship_ids=tuple(r[6]),
            evidence_ids=tuple(r[7]),
        )
    return HypothesisLists(tuple(lists["linked"]), tuple(lists["lexical"]), found)
