"""Several statements of one recall sent as one statement: fewer round trips.

A recall's statements form a short chain of data dependencies (the view, then
the candidate lists, then fusion in Python, ...). Statements that do not
depend on each other's answers in Python are sent together here, each keeping
its own SQL text (the modules that own them stay the one place of their
rules): every part's parameters are renumbered after the previous parts', and
each part's rows come back as one array of records in one row. Three rounds:

- :func:`first_round`: the candidate lists of every branch, the canonical
  hydration of all their candidates (fed in SQL from the lists, so it needs
  no round trip of its own), relationship discovery beside them (its coverage
  by the *returned* evidence is applied later, by the caller, from the
  semantic groups of the hydrated support paths returned here), and those
  groups;
- :func:`answer_round`: the related frontiers' handles, the related hypotheses
  and both kinds of conflicts (the handles reach relationship cases in SQL,
  from the handles read in the same statement);
- :func:`last_round`: the rows of the answer's nested fields and the recall
  event for feedback (a data-modifying statement, so its CTEs lead).

Every part reads exactly what its own statement reads (same SQL, same
parameters), so the answers are the ones of the separate statements. A
failure of a combined statement is the caller's cue to run the separate ones,
each with its own degradation. Rows of a part come in the order its SQL
sorts them (an aggregate over a sorted subquery keeps that order in
PostgreSQL); the parsers that depend on an order sort again anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from gateway.store import conflicts, feedback, hypotheses, recall, related, search
from gateway.store.connection import Conn

__all__ = [
    "AnswerRound",
    "FirstRound",
    "HandlesQuery",
    "answer_round",
    "first_round",
    "last_round",
]

_PARAM = re.compile(r"\$(\d+)")

_PLACED_MAX = 512
_PLACED: dict[
    tuple[str, tuple[tuple[int, str], ...], int, tuple[tuple[int, str], ...]],
    tuple[str, tuple[int, ...], tuple[tuple[int, str], ...]],
] = {}
"""Placements already made: (part SQL, its expressions, parameters bound before,
the part's numbers so far) -> (rewritten SQL, the part's parameter numbers bound
by it in order, the part's numbers after). The rewriting depends on nothing
else, and a recall's statements take a handful of shapes, so the regular
expression runs once per shape and process, not about 240 times per recall
(0.2-0.3 ms of a worker's CPU per full recall; docs/benchmarks.md, "Worker CPU
per recall at 100k")."""


def _place(
    sql: str, given: Mapping[int, str], bound: int, numbers: Mapping[int, str]
) -> tuple[str, tuple[int, ...], tuple[tuple[int, str], ...]]:
    """One part's SQL with its ``$n`` renumbered (see ``_Placer.part``), the part's
    parameter numbers newly bound, and the part's numbers afterwards."""
    mine = dict(numbers)
    added: list[int] = []

    def sub(m: re.Match[str]) -> str:
        n = int(m.group(1))
        if n in given:
            return given[n]
        if n not in mine:
            added.append(n)
            mine[n] = f"${bound + len(added)}"
        return mine[n]

    return _PARAM.sub(sub, sql), tuple(added), tuple(mine.items())


class _Placer:
    """Parameters of several statements, numbered for one combined statement."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def part(
        self, args: Sequence[Any], exprs: Mapping[int, str] | None = None
    ) -> Callable[[str], str]:
        """A function that rewrites one part's SQL: its ``$n`` become the combined
        statement's numbers (bound once per part), or the SQL expression
        ``exprs[n]`` (a value that another part computes)."""
        numbers: dict[int, str] = {}
        given = exprs or {}
        given_key = tuple(given.items())

        def place(sql: str) -> str:
            key = (sql, given_key, len(self.args), tuple(numbers.items()))
            placed = _PLACED.get(key)
            if placed is None:
                placed = _place(sql, given, len(self.args), numbers)
                if len(_PLACED) >= _PLACED_MAX:
                    _PLACED.clear()
                _PLACED[key] = placed
            text, added, after = placed
            self.args.extend(args[n - 1] for n in added)
            numbers.update(after)
            return text

        return place


def _rows(value: Sequence[Any] | None) -> list[Any]:
    return list(value or ())


# --- the candidates, their hydration, relationship discovery ---------------------------

# Coverage by returned evidence needs the semantic group of each relationship a
# returned evidence supports. The rule is the one of discovery's `covered` CTE
# (gateway/store/related.py): a relationship of a readable space, recorded at
# t_sys; here for the support paths of every hydrated candidate (a superset of
# the returned ones, which the caller picks after fusion).
_PATH_GROUPS = """
SELECT r.id::text AS id, r.semantic_group_key
FROM relationships r
WHERE r.team_id = $1 AND r.space_id = ANY ($2::uuid[]) AND r.recorded_at <= $3
  AND r.id = ANY (ARRAY(SELECT DISTINCT unnest(h.relationship_ids) FROM hyd h))
"""


@dataclass(frozen=True, slots=True)
class FirstRound:
    lists: dict[tuple[str, str], list[str]]
    eligible: dict[str, recall.EligibleEvidence]
    # None: discovery was not asked for. Its covered groups are those of the
    # known IDs only; the caller adds the groups of the returned evidence.
    discovery: related.Discovery | None
    # Relationship ID -> semantic group, for every support path of ``eligible``
    # (filled only with discovery).
    path_groups: dict[str, str]


async def first_round(
    conn: Conn,
    candidates: search.CandidateQuery,
    t_valid: datetime,
    discovery: related.DiscoveryQuery | None,
) -> FirstRound | None:
    """Candidates, hydration and discovery in one statement; None when there is no
    candidate list to search (the caller's separate path answers that case)."""
    wanted = search.wanted_lists(candidates)
    if not wanted or not candidates.branches:
        return None
    search.check(candidates)
    placer = _Placer()
    cand_sql, cand_args = search.build_statement(candidates, wanted)
    ctes = [f"cands AS MATERIALIZED (\n{placer.part(cand_args)(cand_sql)}\n)"]
    team = candidates.team_id
    spaces = [b.space_id for b in candidates.branches]
    t_sys = candidates.known_at
    hydrate = placer.part(
        [team, None, spaces, t_sys, t_valid],
        {2: "ARRAY(SELECT DISTINCT c.evidence_id FROM cands c)"},
    )
    ctes.append(f"hyd AS MATERIALIZED (\n{hydrate(recall.ELIGIBLE_SQL)}\n)")
    selects = [
        "(SELECT array_agg(ROW(c.branch, c.list_name, c.rank, c.evidence_id)) FROM cands c)",
        "(SELECT array_agg(ROW(h.*)) FROM hyd h)",
    ]
    disc_wanted: list[str] = []
    if discovery is not None:
        disc_wanted = related.wanted_lists(discovery)
    if disc_wanted and discovery is not None:
        related.check(discovery)
        disc_sql, disc_args = related.build_discovery(discovery)
        selects.append(
            f"(SELECT array_agg(ROW(d.*)) FROM (\n{placer.part(disc_args)(disc_sql)}\n) d)"
        )
        groups = placer.part([team, list(discovery.readable_space_ids), discovery.t_sys])
        selects.append(f"(SELECT array_agg(ROW(g.*)) FROM (\n{groups(_PATH_GROUPS)}\n) g)")
    sql = "WITH " + ",\n".join(ctes) + "\nSELECT " + ",\n       ".join(selects)
    row = await conn.fetchrow(sql, *placer.args)
    assert row is not None
    found: related.Discovery | None = None
    path_groups: dict[str, str] = {}
    if discovery is not None:
        if disc_wanted:
            found = related.parse_discovery(disc_wanted, _rows(row[2]))
            path_groups = {r[0]: r[1] for r in _rows(row[3])}
        else:
            found = related.Discovery({}, frozenset(), None)
    return FirstRound(
        lists=search.parse_candidates(candidates, wanted, _rows(row[0])),
        eligible=recall.parse_eligible(_rows(row[1])),
        discovery=found,
        path_groups=path_groups,
    )


# --- hypotheses and conflicts -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HandlesQuery:
    """The related frontiers' handles: every eligible relationship of ``groups`` in
    the shared space (gateway/store/related.py, :func:`related.members_statement`).

    Read in the answer round, they also reach conflicts after every evidence
    result, in the order the answer returns them
    (:func:`gateway.services.recall_types.answer_reach`): ``groups`` in that order
    (the direct fallback's, then each community's shown groups), within a group
    its representative first (``representatives``: the group's best-ranked
    discovered relationship if it is eligible, else its lowest ID), then the
    others in ID order, numbered from ``after + 1`` (``after``: the last
    evidence result's rank), groups without an eligible relationship skipped."""

    team: str
    space_id: UUID
    generation: int
    t_sys: datetime
    t_valid: datetime
    groups: Sequence[str]
    representatives: Sequence[str | None]
    after: int


# The handles' reach, from the handles read in the same statement ($1 after,
# $2 groups in answer order, $3 their representatives).
_MORE = """
SELECT h.id::text AS relationship_id,
       ($1::int + row_number() OVER (
           ORDER BY o.n, coalesce(h.id::text = o.rep, false) DESC, h.id COLLATE "C"))::int AS reach
FROM handles h
JOIN unnest($2::text[], $3::text[]) WITH ORDINALITY AS o (grp, rep, n)
  ON o.grp = h.semantic_group_key
"""


@dataclass(frozen=True, slots=True)
class AnswerRound:
    hypotheses: hypotheses.HypothesisLists | None
    cases: list[conflicts.CaseRow]
    evidence_conflicts: list[conflicts.EvidenceConflictRow]
    # The handles' relationships by group (None: no handles were asked for).
    members: dict[str, list[recall.RelationshipRow]] | None = None


async def answer_round(
    conn: Conn,
    hypothesis_query: hypotheses.HypothesisQuery | None,
    conflict_query: conflicts.ConflictQuery,
    handles: HandlesQuery | None = None,
) -> AnswerRound:
    """The related hypotheses (if asked for) and the reachable conflicts of both
    kinds, in one statement; with ``handles``, the related frontiers' handles
    too, which then also reach relationship cases (so that they cost no round
    trip of their own: a case's reach needs the handles, nothing else does)."""
    placer = _Placer()
    ctes: list[str] = []
    selects: list[str] = []
    if handles is not None:
        members_sql, members_args = related.members_statement(
            handles.team,
            handles.space_id,
            handles.generation,
            handles.groups,
            handles.t_sys,
            handles.t_valid,
        )
        ctes.append(f"handles AS MATERIALIZED (\n{placer.part(members_args)(members_sql)}\n)")
        more = placer.part([handles.after, list(handles.groups), list(handles.representatives)])
        ctes.append(f"more AS MATERIALIZED (\n{more(_MORE)}\n)")
        selects.append("(SELECT array_agg(ROW(h.*)) FROM handles h)")
    hyp = hypotheses.statement(hypothesis_query) if hypothesis_query is not None else None
    cases = conflicts.cases_statement(conflict_query, "more" if handles is not None else None)
    evidence = conflicts.evidence_statement(conflict_query)
    selects += [
        f"(SELECT array_agg(ROW(x.*)) FROM (\n{placer.part(args)(sql)}\n) x)"
        for sql, args in (s for s in (hyp, cases, evidence) if s is not None)
    ]
    if not selects:
        return AnswerRound(None, [], [])
    with_ = "WITH " + ",\n".join(ctes) + "\n" if ctes else ""
    row = await conn.fetchrow(with_ + "SELECT " + ",\n       ".join(selects), *placer.args)
    assert row is not None
    got = iter(row)
    members = related.parse_members(_rows(next(got))) if handles is not None else None
    return AnswerRound(
        hypotheses.parse(_rows(next(got))) if hyp is not None else None,
        conflicts.parse_cases(_rows(next(got))) if cases is not None else [],
        conflicts.parse_evidence_conflicts(_rows(next(got))) if evidence is not None else [],
        members,
    )


# --- nested rows and the recall event ----------------------------------------------------


async def last_round(
    conn: Conn,
    nested: recall.NestedQuery,
    event: feedback.NewRecallEvent | None,
) -> tuple[recall.NestedRows, datetime | None]:
    """The answer's nested rows and (if given) the recall event, in one statement.
    An INSERT in a WITH must be at the statement's top level, so both parts'
    CTEs lead and their selections follow."""
    placer = _Placer()
    ctes: list[str] = []
    selects: list[str] = []
    if event is not None:
        place = placer.part(feedback.event_args(event))
        ctes.append(place(feedback.EVENT_CTES))
        selects.append("(SELECT e.recorded_at FROM event e)")
    else:
        selects.append("NULL::timestamptz")
    place = placer.part(recall.nested_args(nested))
    ctes.append(place(recall.NESTED_CTES))
    selects.append(place(recall.NESTED_SELECT))
    sql = "WITH " + ",\n".join(ctes) + "\nSELECT " + ",\n       ".join(selects)
    row = await conn.fetchrow(sql, *placer.args)
    assert row is not None
    return recall.parse_nested(row[1], row[2], row[3]), row[0]
