"""SQL of relationship discovery: candidate lists, coverage, and handles.

Relationship discovery (SPEC section 3, step 4) searches the **shared space
only**. One statement returns, for one recall:

* the *fulltext* list: BM25 (k1 0.9, b 0.4, the evidence constants) over the
  postings of relationship statements (``relationship_terms``, statistics in
  ``relationship_search_stats``, db/0003), OR semantics over the query's
  lexemes, exactly like the evidence full-text list, because hybrid fusion
  only helps when the lexical list ranks like BM25 (docs/data-model.md), and
  scoring only the hits that can reach the list (gateway/store/bm25.py);
* the *vector* list: nearest relationship vectors of the team's **active**
  projection generation (``relationship_vector_candidates``, db/0003); with no
  active generation the list is empty and the caller says why;
* the state of the team's projection (``active``, ``building``, ``failed`` or
  none), so the caller can degrade without another round trip;
* the semantic groups already *covered* for this answer: those of the
  relationships the returned evidence supports, of the relationships the
  caller's known evidence supports (support granted at the view's time), and
  of the caller's known relationship IDs, in any space the caller may read.

Each list fetches ``per_list`` candidates that exist in the view (space
generation, system time); only candidates that are **eligible** are returned,
with their semantic group: active at ``t_sys``, valid at ``t_valid``, not on the
losing side of a resolved conflict case, and with at least one eligible
support path (a support granted or reinstated at ``t_sys`` from evidence that
is itself visible and active, with an active source). That is the rule of
evidence hydration (gateway/store/recall.py) seen from the relationship's side.
Ranks are those of the lists before the eligibility filter, like evidence
candidates before hydration.

Every predicate names the team and the space; row-level security is the
second wall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from uuid import UUID

import numpy as np

from gateway.store import bm25
from gateway.store.bm25 import top_k
from gateway.store.connection import Conn
from gateway.store.params import Params
from gateway.store.recall import RelationshipRow
from gateway.store.search import DIMENSIONS

__all__ = [
    "EXACT_SEARCH_BELOW",
    "Discovery",
    "DiscoveryQuery",
    "build_discovery",
    "check",
    "discover",
    "eligible_group_members",
    "members_statement",
    "parse_discovery",
    "parse_members",
    "visible_relationship",
    "wanted_lists",
]

# Below this many relationships in the space the vector list is an exact scan
# (the evidence threshold; relationship vectors have the same size).
EXACT_SEARCH_BELOW: int = 10_000
MAX_PER_LIST: Final = 500


def _latest(table: str, fk: str, col: str, alias: str, ref: str, team: str, t: str) -> str:
    return (
        f"(SELECT {alias}.{col} FROM {table} {alias} "
        f"WHERE {alias}.team_id = {team} AND {alias}.{fk} = {ref} AND {alias}.recorded_at <= {t} "
        f"ORDER BY {alias}.recorded_at DESC, {alias}.seq DESC LIMIT 1)"
    )


def visible_relationship(r: str, team: str, space: str, gen: str, t: str) -> str:
    """SQL predicate: relationship ``r`` exists in the view: the team's, of
    ``space`` in the view's generation ``gen``, recorded at or before ``t``.

    Eligibility starts with it; ``relationship_fulltext_top_k`` (db/0085) spells
    the same filter in each of its lookups, and tests/test_fulltext_visibility.py
    checks every one of those copies against this rule.
    """
    return (
        f"{r}.team_id = {team} AND {r}.space_id = {space} AND {r}.generation = {gen}\n"
        f"    AND {r}.recorded_at <= {t}"
    )


def eligible_relationship(r: str, team: str, space: str, gen: str, t: str, tv: str) -> str:
    """SQL predicate: relationship ``r`` (of ``space``) is eligible for the view.

    Visible (:func:`visible_relationship`), active at ``t``, valid at ``tv``, not
    in a losing position of a case resolved at ``t``, with an eligible support
    path.
    """
    status = _latest(
        "relationship_status_events", "relationship_id", "status", "rs", f"{r}.id", team, t
    )
    decision = _latest("support_decisions", "support_id", "decision", "sd", "s.id", team, t)
    ev_status = _latest("evidence_lifecycle_events", "evidence_id", "status", "le", "e.id", team, t)
    src_status = _latest(
        "source_lifecycle_events", "source_id", "status", "ls", "e.source_id", team, t
    )
    return f"""(
    {visible_relationship(r, team, space, gen, t)}
    AND {status} = 'active'
    AND ({r}.valid_from IS NULL OR {r}.valid_from <= {tv})
    AND ({r}.valid_to IS NULL OR {tv} < {r}.valid_to)
    -- NOT EXISTS written as a scalar subquery that must find nothing. As NOT
    -- EXISTS, the planner pulled it up into an anti-join that scanned every
    -- conflict case of the space (and each case's events) once per candidate
    -- relationship: 16 of the 27 ms of discovery and 20 of the 25 ms of
    -- hydration at 11 cases per space (EXPLAIN ANALYZE, recall benchmark). A
    -- scalar subquery is never pulled up: it runs per relationship, driven by
    -- the relationship's index on conflict_position_relationships (usually no
    -- row at all). Same answer.
    AND (
        SELECT 1
        FROM conflict_position_relationships cpr
        JOIN conflict_cases cc ON cc.team_id = {team} AND cc.id = cpr.case_id
        CROSS JOIN LATERAL (
            SELECT ce.event, ce.preferred_position_id FROM conflict_case_events ce
            WHERE ce.team_id = {team} AND ce.case_id = cc.id AND ce.recorded_at <= {t}
            ORDER BY ce.recorded_at DESC, ce.seq DESC LIMIT 1
        ) last
        WHERE cpr.team_id = {team} AND cpr.relationship_id = {r}.id
          AND cc.space_id = {space} AND cc.generation = {gen} AND cc.recorded_at <= {t}
          AND last.event = 'resolve' AND last.preferred_position_id <> cpr.position_id
        LIMIT 1
    ) IS NULL
    -- EXISTS likewise as a scalar subquery, for the same reason: pulled up into a
    -- semi-join, the support paths of every evidence of the space were built
    -- before the group members (1,000 paths for 20 relationships: 15 of the 21
    -- ms of the handles statement).
    AND (
        SELECT 1
        FROM supports s
        JOIN evidence e ON e.team_id = {team} AND e.space_id = {space} AND e.id = s.evidence_id
        WHERE s.team_id = {team} AND s.space_id = {space} AND s.relationship_id = {r}.id
          AND s.recorded_at <= {t}
          AND e.generation = {gen} AND e.recorded_at <= {t}
          AND {decision} IN ('grant', 'reinstate')
          AND {ev_status} = 'active'
          AND {src_status} = 'active'
        LIMIT 1
    ) IS NOT NULL
)"""


@dataclass(frozen=True, slots=True)
class DiscoveryQuery:
    team_id: str
    space_id: UUID  # the shared space
    generation: int  # its generation in the view
    readable_space_ids: Sequence[UUID]  # for coverage: every space the caller reads
    t_sys: datetime
    t_valid: datetime
    text: str | None
    vector: np.ndarray | None
    per_list: int
    returned_relationship_ids: Sequence[str]
    known_evidence_ids: Sequence[str]
    known_relationship_ids: Sequence[str]
    # A knownAt view's instant: BM25 statistics of then and exact vector scans,
    # as for evidence (gateway/store/search.py). None: the current view.
    as_of: datetime | None = None


@dataclass(frozen=True, slots=True)
class Discovery:
    # list name -> [(relationship ID, semantic group)] in list rank order, eligible only
    lists: dict[str, list[tuple[str, str]]]
    covered_groups: frozenset[str]
    # The team's newest projection status: "active", "building", "failed", "retired" or None
    projection_status: str | None


def _fulltext(p: Params) -> str:
    """BM25 top ``per_list`` of the space's relationships in the view, scoring only
    those whose bound can reach it (gateway/store/bm25.py)."""
    top = top_k(
        "relationship_fulltext_top_k",
        lexemes="query_idf",
        team=p["team"],
        space=p["space"],
        generation=p["generation"],
        view=[p["t_sys"]],
        limit=p["per_list"],
        prune_from=p["prune_from"],
    )
    return f"""
SELECT 'fulltext'::text AS list_name, s.rank, s.doc_id AS relationship_id
FROM ({top}
) s"""


def _vector(p: Params, *, as_of: bool) -> str:
    """Nearest relationship vectors of the active projection
    (``relationship_vector_candidates``, db/0003 and db/0061); a knownAt view:
    db/0042, the exact top-N of the relationships visible at its instant."""
    projection = f"""(SELECT pr.generation FROM relationship_projections pr
      WHERE pr.team_id = {p["team"]} AND pr.status = 'active')"""
    args = f"""{p["team"]}, {p["space"]}, {p["generation"]},
    {projection},
    {p["vector"]}, {p["per_list"]}, {p["t_sys"]}"""
    call = (
        f"relationship_vector_candidates_as_of(\n    {args}\n)"
        if as_of
        else f"relationship_vector_candidates(\n    {args}, {p['exact_below']}\n)"
    )
    return f"""
SELECT 'vector'::text AS list_name,
       row_number() OVER (ORDER BY v.distance, v.relationship_id COLLATE "C") AS rank,
       v.relationship_id
FROM {call} v"""


def _query_idf(p: Params) -> str:
    """The query's lexemes in the space with their IDF, from the present statistics:
    N and the total length from ``relationship_search_stats``, df and the largest
    tf from ``relationship_lexeme_stats`` (db/0106: the write path's sharded
    running totals over every posting of the space, summed here)."""
    team, space = p["team"], p["space"]
    return f"""query_idf AS MATERIALIZED (
    SELECT ql.lexeme, ln(1 + (st.n - d.df + 0.5) / (d.df + 0.5)) AS idf, st.avgdl,
           d.df, d.max_tf
    FROM query_lexemes ql
    CROSS JOIN (
        SELECT sum(x.doc_count)::double precision AS n,
               sum(x.total_length)::double precision / nullif(sum(x.doc_count), 0) AS avgdl
        FROM relationship_search_stats x
        WHERE x.team_id = {team} AND x.space_id = {space}
    ) st
    CROSS JOIN LATERAL (
        SELECT sum(c.df)::double precision AS df, max(c.max_tf) AS max_tf
        FROM relationship_lexeme_stats c
        WHERE c.team_id = {team} AND c.space_id = {space} AND c.lexeme = ql.lexeme
    ) d
    WHERE d.df > 0 AND st.avgdl > 0
)"""


def _query_idf_as_of(p: Params, as_of: datetime) -> str:
    """:func:`_query_idf` with the statistics of the instant ``as_of``: N and the
    average length over the relationships recorded by then (index-only:
    ``relationships_search_filter``), df over their postings (which carry
    ``recorded_at``, db/0040)."""
    p.bind("as_of", as_of, "timestamptz")
    team, space, at = p["team"], p["space"], p["as_of"]
    return f"""query_idf AS MATERIALIZED (
    SELECT ql.lexeme, ln(1 + (st.n - d.df + 0.5) / (d.df + 0.5)) AS idf, st.avgdl,
           d.df, d.max_tf
    FROM query_lexemes ql
    CROSS JOIN (
        SELECT count(*)::double precision AS n,
               sum(x.doc_length)::double precision / nullif(count(*), 0) AS avgdl
        FROM relationships x
        WHERE x.team_id = {team} AND x.space_id = {space} AND x.recorded_at <= {at}
    ) st
    CROSS JOIN LATERAL (
        SELECT count(*)::double precision AS df, max(c.tf) AS max_tf
        FROM relationship_terms c
        WHERE c.team_id = {team} AND c.space_id = {space} AND c.lexeme = ql.lexeme
          AND c.recorded_at <= {at}
    ) d
    WHERE d.df > 0 AND st.avgdl > 0
)"""


def build_discovery(
    q: DiscoveryQuery, *, numbers: dict[str, int] | None = None
) -> tuple[str, list[Any]]:
    """The one discovery statement and its parameters (public for tests and plans).
    ``numbers`` (if given) receives each named parameter's number, as for
    :func:`gateway.store.search.build_statement`."""
    p = Params()
    p.bind("team", q.team_id, "text")
    p.bind("space", q.space_id, "uuid")
    p.bind("generation", q.generation, "integer")
    p.bind("readable", list(q.readable_space_ids), "uuid[]")
    p.bind("t_sys", q.t_sys, "timestamptz")
    p.bind("t_valid", q.t_valid, "timestamptz")
    p.bind("per_list", q.per_list, "integer")
    p.bind("returned", list(q.returned_relationship_ids), "text[]")
    p.bind("known_ev", list(q.known_evidence_ids), "text[]")
    p.bind("known_rel", list(q.known_relationship_ids), "text[]")
    ctes = []
    parts = []
    if q.text is not None and q.text.strip():
        p.bind("text", q.text.replace("\x00", " ").encode("utf-8", "replace").decode(), "text")
        p.bind("prune_from", bm25.PRUNE_FROM_POSTINGS, "bigint")
        ctes.append(
            "query_lexemes AS MATERIALIZED (SELECT u.lexeme FROM "
            f"unnest(to_tsvector('english'::regconfig, {p['text']})) AS u)"
        )
        ctes.append(_query_idf(p) if q.as_of is None else _query_idf_as_of(p, q.as_of))
        parts.append(_fulltext(p))
    if q.vector is not None:
        p.bind("vector", np.asarray(q.vector, dtype=np.float32), "vector")
        if q.as_of is None:
            p.bind("exact_below", EXACT_SEARCH_BELOW, "bigint")
        parts.append(_vector(p, as_of=q.as_of is not None))
    team, space, gen, t, tv = p["team"], p["space"], p["generation"], p["t_sys"], p["t_valid"]
    if not parts:
        raise ValueError("discovery needs a query text or a query vector")
    union = "\nUNION ALL\n".join(f"({part}\n)" for part in parts)
    ctes.append(f"cand AS MATERIALIZED (\n{union}\n)")
    ctes.append(
        f"""eligible AS MATERIALIZED (
    SELECT r.id::text AS id, r.semantic_group_key
    FROM relationships r
    WHERE r.team_id = {team} AND r.space_id = {space}
      -- An array, not IN (SELECT ...): the candidates drive the primary key. With
      -- IN, the planner took the vector function's default estimate (1,000 rows)
      -- against a far smaller one for the space's relationships (team and space
      -- selectivities multiplied, as if independent) and scanned the whole space,
      -- testing every relationship's eligibility before the semi-join.
      AND r.id = ANY (ARRAY(SELECT DISTINCT cand.relationship_id FROM cand))
      AND {eligible_relationship("r", team, space, gen, t, tv)}
)"""
    )
    decision = _latest("support_decisions", "support_id", "decision", "sd", "s.id", team, t)
    ctes.append(
        f"""covered AS (
    SELECT DISTINCT r.semantic_group_key
    FROM relationships r
    WHERE r.team_id = {team} AND r.space_id = ANY ({p["readable"]}) AND r.recorded_at <= {t}
      -- One IN over the union of the three ID sources, not three OR-ed tests:
      -- an OR of them cannot use the primary key, so every relationship of the
      -- readable spaces was read and tested (the whole space, for a handful of IDs).
      AND r.id IN (
          SELECT x.id FROM unnest({p["returned"]}) AS x (id)
          UNION ALL
          SELECT x.id FROM unnest({p["known_rel"]}) AS x (id)
          UNION ALL
          SELECT s.relationship_id::text FROM supports s
          WHERE s.team_id = {team} AND s.space_id = ANY ({p["readable"]})
            AND s.evidence_id = ANY ({p["known_ev"]}) AND s.recorded_at <= {t}
            AND {decision} IN ('grant', 'reinstate'))
)"""
    )
    sql = (
        "WITH "
        + ",\n".join(ctes)
        + f"""
SELECT c.list_name, c.rank, c.relationship_id, e.semantic_group_key AS group_key
FROM cand c JOIN eligible e ON e.id = c.relationship_id
UNION ALL
SELECT 'covered', 0, NULL, cv.semantic_group_key FROM covered cv
UNION ALL
SELECT 'projection', 0, NULL,
       (SELECT pr.status FROM relationship_projections pr WHERE pr.team_id = {team}
         ORDER BY (pr.status = 'active') DESC, pr.generation DESC LIMIT 1)
"""
    )
    if numbers is not None:
        numbers.update(p.numbers())
    return sql, p.values


def check(q: DiscoveryQuery) -> None:
    """Refuse a query the statement would misread (a programming error, not user input)."""
    if not 1 <= q.per_list <= MAX_PER_LIST:
        raise ValueError(f"per_list must be between 1 and {MAX_PER_LIST}, not {q.per_list}")
    if q.vector is not None and np.shape(q.vector) != (DIMENSIONS,):
        raise ValueError(f"the query vector must have shape ({DIMENSIONS},)")


def wanted_lists(q: DiscoveryQuery) -> list[str]:
    """The lists ``q`` asks for; none (entity expansion only): nothing to discover."""
    wanted = []
    if q.text is not None and q.text.strip():
        wanted.append("fulltext")
    if q.vector is not None:
        wanted.append("vector")
    return wanted


async def discover(conn: Conn, q: DiscoveryQuery) -> Discovery:
    """Eligible candidates of each requested list, covered groups, projection state."""
    check(q)
    wanted = wanted_lists(q)
    if not wanted:  # entity expansion only: nothing to discover, nothing to anchor
        return Discovery({}, frozenset(), None)
    sql, args = build_discovery(q)
    return parse_discovery(wanted, await conn.fetch(sql, *args))


def parse_discovery(wanted: Sequence[str], rows: Sequence[Sequence[Any]]) -> Discovery:
    """The statement's rows ``(list_name, rank, relationship_id, group_key)`` by
    position (plain rows or the records of a combined statement alike)."""
    ranked: dict[str, list[tuple[int, str, str]]] = {name: [] for name in wanted}
    covered: set[str] = set()
    projection: str | None = None
    for row in rows:
        name = row[0]
        if name == "covered":
            covered.add(row[3])
        elif name == "projection":
            projection = row[3]
        else:
            ranked[name].append((row[1], row[2], row[3]))
    lists = {
        name: [(rid, group) for _, rid, group in sorted(hits)] for name, hits in ranked.items()
    }
    return Discovery(lists, frozenset(covered), projection)


_MEMBERS = """
SELECT o.id, o.space_id, o.subject_entity_id, o.predicate, o.object_entity_id, o.object_value,
       o.object_unit, o.polarity, o.valid_from, o.valid_to, o.owner_principal_id,
       o.semantic_group_key, o.statement, o.recorded_at, 'active'::text AS status
FROM relationships o
WHERE o.team_id = $1::text AND o.space_id = $2::uuid AND o.semantic_group_key = ANY ($3::text[])
  AND {eligible}
ORDER BY o.semantic_group_key COLLATE "C", o.id COLLATE "C"
""".format(
    eligible=eligible_relationship(
        "o", "$1::text", "$2::uuid", "$4::integer", "$5::timestamptz", "$6::timestamptz"
    )
)


async def eligible_group_members(
    conn: Conn,
    team: str,
    space_id: UUID,
    generation: int,
    groups: Sequence[str],
    t_sys: datetime,
    t_valid: datetime,
) -> dict[str, list[RelationshipRow]]:
    """Every eligible relationship of the given semantic groups in the shared space,
    by group, in ID order (code points)."""
    if not groups:
        return {}
    sql, args = members_statement(team, space_id, generation, groups, t_sys, t_valid)
    return parse_members(await conn.fetch(sql, *args))


def members_statement(
    team: str,
    space_id: UUID,
    generation: int,
    groups: Sequence[str],
    t_sys: datetime,
    t_valid: datetime,
) -> tuple[str, list[Any]]:
    """:func:`eligible_group_members`' statement and parameters (also sent combined
    with the answer's conflicts: gateway/store/round_trips.py)."""
    return _MEMBERS, [team, space_id, list(groups), generation, t_sys, t_valid]


def parse_members(rows: Sequence[Sequence[Any]]) -> dict[str, list[RelationshipRow]]:
    """Rows of the members' statement by position (plain rows or the records of a
    combined statement alike): by group, in ID order (code points)."""
    out: dict[str, list[RelationshipRow]] = {}
    for r in sorted(rows, key=lambda r: (r[11], r[0])):
        out.setdefault(r[11], []).append(RelationshipRow(*r))
    return out
