"""Several statements of one recall sent as one statement: fewer round trips.

A recall's statements form a short chain of data dependencies (the view, then
the candidate lists, then fusion in Python, ...). Statements that do not
depend on each other's answers in Python are sent together here, each keeping
its own SQL text (the modules that own them stay the one place of their
rules): every part's parameters are renumbered after the previous parts'
(gateway/store/placement.py), and each part's rows come back in the statement's
one row: hydration's and discovery's as one array per column (``_HYD_COLUMNS``,
``_DISC_COLUMNS``: the driver decodes a column with the codec its prepared
statement resolved once), the candidate lists as one record per list and the
support paths' groups as one record of two arrays (see
``search.LISTS_OF_CANDS``), the other parts as arrays of records, whose every
field costs the driver a codec lookup. The rounds:

- :func:`scope_round`: the view (the readable spaces' generations at the
  view's instant, the database's ``now()``) and, computed from it in SQL, the
  first round's parts whose inputs are known when it is sent: the full-text
  and entity lists, the hydration of their candidates, discovery by full text
  (and the vector parts too when the query's embedding is already known).
  A recall sends it while its question is embedded, so the lexical work runs
  on the server during the model run instead of after it;
- :func:`first_round`: the candidate lists of every branch, the canonical
  hydration of all their candidates (fed in SQL from the lists, so it needs
  no round trip of its own), relationship discovery beside them (its coverage
  by the *returned* evidence is applied later, by the caller, from the
  semantic groups of the hydrated support paths returned here), and those
  groups; after a scope round, only the vector parts, hydrating only the
  candidates the scope round did not (``checked``), merged with
  :func:`merge_rounds`;
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
PostgreSQL; hydration's columns follow the evidence ID in code-point order); the
parsers that depend on an order sort again anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from gateway.store import conflicts, database, feedback, hypotheses, recall, related, search
from gateway.store.connection import Conn
from gateway.store.placement import Placer as _Placer

__all__ = [
    "AnswerRound",
    "FirstRound",
    "HandlesQuery",
    "ScopeQuery",
    "ScopeRound",
    "VectorBound",
    "answer_round",
    "first_round",
    "last_round",
    "merge_rounds",
    "scope_round",
]


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


# Hydration's and discovery's rows come back as columns: one array per column, all
# in the same row order, each a column of the statement's own row. asyncpg decodes
# a column through the codec its prepared statement resolved once, where the
# records of ``array_agg(ROW(...))`` name every field's type and cost a codec
# lookup per field (on main 08dcfe2, hydration's 120 rows x 7 fields and
# discovery's 80 x 4, about 1,150 lookups a recall; docs/benchmarks.md, "Hydration
# and discovery as columns"). Identifiers are cast to text: an array of the ``client_id`` domain is
# a type of its own, which the driver would have to look up on each connection
# (gateway/store/database.py, ``_learn_domains``). A hydrated row's support paths,
# a text[] of its own, are flattened: their count per row, and all of them in row
# order (``ORDER BY`` the unique evidence ID, in code-point order, in every
# aggregate: both must follow one order, which the rows' physical order, left to
# the server's collation and plan, would not guarantee;
# tests/test_round_trips.py feeds them out of order).
_HYD_NAMES: Final = (
    "ids",
    "space_ids",
    "source_ids",
    "contents",
    "observed",
    "recorded",
    "path_counts",
    "paths",
)
_HYD_COLUMNS: Final = """hyd_columns AS MATERIALIZED (
SELECT array_agg(h.id::text ORDER BY h.id::text COLLATE "C") AS ids,
       array_agg(h.space_id ORDER BY h.id::text COLLATE "C") AS space_ids,
       array_agg(h.source_id::text ORDER BY h.id::text COLLATE "C") AS source_ids,
       array_agg(h.content ORDER BY h.id::text COLLATE "C") AS contents,
       array_agg(h.observed_at ORDER BY h.id::text COLLATE "C") AS observed,
       array_agg(h.recorded_at ORDER BY h.id::text COLLATE "C") AS recorded,
       array_agg(cardinality(h.relationship_ids) ORDER BY h.id::text COLLATE "C")
           AS path_counts,
       (SELECT array_agg(p.id ORDER BY x.id::text COLLATE "C", p.n)
        FROM hyd x CROSS JOIN LATERAL unnest(x.relationship_ids) WITH ORDINALITY AS p (id, n))
           AS paths
FROM hyd h
)"""
# Discovery's rows (list name, rank, relationship ID, semantic group): their order
# does not matter, parse_discovery orders each list by rank.
_DISC_NAMES: Final = ("names", "ranks", "ids", "groups")
_DISC_COLUMNS: Final = """disc_columns AS MATERIALIZED (
SELECT array_agg(d.list_name::text) AS names, array_agg(d.rank) AS ranks,
       array_agg(d.relationship_id::text) AS ids, array_agg(d.group_key::text) AS groups
FROM (
{discovery}
) d
)"""


def _columns(cte: str, names: Sequence[str]) -> list[str]:
    """One selection per column of a one-row CTE of arrays."""
    return [f"(SELECT c.{name} FROM {cte} c)" for name in names]


def _parse_hydrated(columns: Sequence[Any]) -> dict[str, recall.EligibleEvidence]:
    """Hydrated rows from :data:`_HYD_COLUMNS`' arrays, as
    :func:`recall.parse_eligible` makes them from rows."""
    ids, spaces, sources, contents, observed, recorded, counts, paths = (_rows(c) for c in columns)
    rows = []
    at = 0
    for values in zip(ids, spaces, sources, contents, observed, recorded, counts, strict=True):
        rows.append((*values[:6], paths[at : at + values[6]]))
        at += values[6]
    if at != len(paths):
        raise ValueError("hydrated support paths do not add up")
    return recall.parse_eligible(rows)


@dataclass(frozen=True, slots=True)
class PathGroups:
    """The semantic groups of the hydrated candidates' support paths, asked for
    without discovery (which then runs beside the unit, :func:`side_discovery`):
    its coverage by the returned evidence needs them (:data:`_PATH_GROUPS`)."""

    readable_space_ids: Sequence[UUID]
    t_sys: datetime


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


# Per branch, the last vector rank whose candidate can still be in the answer, from
# the eligible candidates of the statement's other lists (hyd_early), for the
# statement that holds every list (gateway.fusion.last_reachable_rank says why and
# computes it exactly). $1 the answer's limit, $2 the known IDs, $3 and $4 the
# lists' names and fusion weights, $5 the RRF k. The float score only approximates
# the exact one, so a margin (1e-9, far above the rounding of a sum of a few terms)
# is added before the rank is rounded down: never below the exact bound, and above
# it only when the exact quotient falls within 1e-9 under an integer. A list's
# repeated ID counts at its best rank once, known IDs not at all, and the ranks are
# the lists' own (known IDs, which every list leaves out already, would only lower
# a score): no score above fusion's, so no bound below it. The vector list's known
# IDs are added to the bound, as in the late round's filter (_search_parts).
_VECTOR_BOUNDS = """
SELECT s.branch,
       greatest(floor(s.vector_weight / s.score - $5::double precision + 1e-9), 0)::integer
           + (SELECT count(*) FROM cands k WHERE k.branch = s.branch
              AND k.list_name = 'vector' AND k.evidence_id = ANY ($2::text[]))::integer AS r
FROM (
    SELECT e.branch, e.score, e.vector_weight,
           row_number() OVER (PARTITION BY e.branch ORDER BY e.score DESC) AS n
    FROM (
        SELECT d.branch, d.evidence_id,
               sum(w.weight / ($5::double precision + d.rank)) AS score,
               (SELECT v.weight FROM unnest($3::text[], $4::double precision[]) AS v (name, weight)
                 WHERE v.name = 'vector') AS vector_weight
        FROM (
            SELECT c.branch, c.list_name, c.evidence_id, min(c.rank) AS rank
            FROM cands c
            WHERE c.list_name <> 'vector' AND c.evidence_id <> ALL ($2::text[])
            GROUP BY c.branch, c.list_name, c.evidence_id
        ) d
        JOIN unnest($3::text[], $4::double precision[]) AS w (name, weight)
          ON w.name = d.list_name
        WHERE d.evidence_id IN (SELECT h.id::text FROM hyd_early h)
        GROUP BY d.branch, d.evidence_id
    ) e
) s
WHERE s.n = $1 AND s.score > 0
"""


@dataclass(frozen=True, slots=True)
class VectorBound:
    """What bounds the hydration of vector candidates in a statement that holds
    every list: the answer's limit and fusion's rule (its lists' weights and k)."""

    limit: int
    weights: Mapping[str, float]
    k: float


@dataclass(frozen=True, slots=True)
class _ViewExprs:
    """SQL expressions of the view's values, for parts sent with the view itself:
    ``None`` keeps a part's own parameter (a value known before the view)."""

    generations: str | None = None  # the branches' generations, an integer[]
    shared_generation: str | None = None  # discovery's space's generation
    t_sys: str | None = None
    t_valid: str | None = None


def _search_parts(
    placer: _Placer,
    candidates: search.CandidateQuery,
    t_valid: datetime,
    discovery: related.DiscoveryQuery | None,
    view: _ViewExprs,
    checked: Sequence[str],
    vector_ranks: Mapping[str, int] | None = None,
    vector_bound: VectorBound | None = None,
    groups: PathGroups | None = None,
) -> tuple[list[str], list[str], list[search.ListName], list[str] | None, bool]:
    """The CTEs and selections of the candidate lists, their hydration, discovery and
    the support paths' groups; and what they ask: the lists, discovery's lists
    (None: discovery not asked for), and whether the groups are read (with
    discovery's lists, or ``groups`` without discovery: discovery runs elsewhere)."""
    wanted = search.wanted_lists(candidates)
    search.check(candidates)
    numbers: dict[int, str] = {}
    cand_numbers: dict[str, int] = {}
    cand_sql, cand_args = search.build_statement(candidates, wanted, numbers=cand_numbers)
    if view.generations is not None:
        numbers[cand_numbers["generations"]] = view.generations
    if view.t_sys is not None:
        numbers[cand_numbers["known_at"]] = view.t_sys
    ctes = [f"cands AS MATERIALIZED (\n{placer.part(cand_args, numbers)(cand_sql)}\n)"]
    team = candidates.team_id
    spaces = [b.space_id for b in candidates.branches]
    t_sys = candidates.known_at
    # Candidates the caller has hydrated already (a scope round's) are not again,
    # nor vector candidates ranked below their branch's bound in ``vector_ranks``
    # (services/evidence.py, vector_hydration_bounds: they cannot be in the answer).
    tests = []
    if checked:
        tests.append("c.evidence_id <> ALL (" + placer.part([list(checked)])("$1::text[]") + ")")
    if vector_ranks:
        # The bound is a rank with known IDs removed (fusion's); a list's own rank
        # is that plus the known IDs above it, which every list leaves out already
        # (search.py): counted anyway, all of the list's, so never too few.
        bounds = placer.part(
            [list(vector_ranks), list(vector_ranks.values()), list(candidates.exclude_ids)]
        )(
            "(SELECT x.r FROM unnest($1::text[], $2::integer[]) AS x (b, r) WHERE x.b = c.branch)"
            " + (SELECT count(*) FROM cands k WHERE k.branch = c.branch"
            " AND k.list_name = 'vector' AND k.evidence_id = ANY ($3::text[]))"
        )
        tests.append(f"(c.list_name <> 'vector' OR c.rank <= coalesce({bounds}, c.rank))")
    fresh = " WHERE " + " AND ".join(tests) if tests else ""
    hyd_exprs = {2: f"ARRAY(SELECT DISTINCT c.evidence_id FROM cands c{fresh})"}
    if view.t_sys is not None:
        hyd_exprs[4] = view.t_sys
    if view.t_valid is not None:
        hyd_exprs[5] = view.t_valid
    if vector_bound is not None and "vector" in wanted and len(wanted) > 1 and not tests:
        # Every list in this statement: the other lists' candidates first, then
        # the vector-only ones down to their branch's bound (see _VECTOR_BOUNDS).
        early = placer.part(
            [team, None, spaces, t_sys, t_valid],
            {
                **hyd_exprs,
                2: "ARRAY(SELECT DISTINCT c.evidence_id FROM cands c WHERE c.list_name <> 'vector')",
            },
        )
        ctes.append(f"hyd_early AS MATERIALIZED (\n{early(recall.ELIGIBLE_SQL)}\n)")
        names = list(vector_bound.weights)
        bounds_part = placer.part(
            [
                vector_bound.limit,
                list(candidates.exclude_ids),
                names,
                [float(vector_bound.weights[n]) for n in names],
                float(vector_bound.k),
            ]
        )
        ctes.append(f"vector_bounds AS MATERIALIZED (\n{bounds_part(_VECTOR_BOUNDS)}\n)")
        late = placer.part(
            [team, None, spaces, t_sys, t_valid],
            {
                **hyd_exprs,
                2: (
                    "ARRAY(SELECT DISTINCT c.evidence_id FROM cands c WHERE c.list_name = 'vector'"
                    " AND c.evidence_id NOT IN (SELECT o.evidence_id FROM cands o"
                    " WHERE o.list_name <> 'vector')"
                    " AND c.rank <= coalesce((SELECT b.r FROM vector_bounds b"
                    " WHERE b.branch = c.branch), c.rank))"
                ),
            },
        )
        ctes.append(f"hyd_late AS MATERIALIZED (\n{late(recall.ELIGIBLE_SQL)}\n)")
        ctes.append(
            "hyd AS MATERIALIZED (\nSELECT * FROM hyd_early UNION ALL SELECT * FROM hyd_late\n)"
        )
    else:
        hydrate = placer.part([team, None, spaces, t_sys, t_valid], hyd_exprs)
        ctes.append(f"hyd AS MATERIALIZED (\n{hydrate(recall.ELIGIBLE_SQL)}\n)")
    ctes.append(_HYD_COLUMNS)
    selects = [search.LISTS_OF_CANDS, *_columns("hyd_columns", _HYD_NAMES)]
    disc_wanted: list[str] | None = None
    if discovery is not None:
        disc_wanted = related.wanted_lists(discovery)
    if disc_wanted and discovery is not None:
        related.check(discovery)
        disc_numbers: dict[str, int] = {}
        disc_sql, disc_args = related.build_discovery(discovery, numbers=disc_numbers)
        exprs: dict[int, str] = {}
        for key, expr in (
            ("generation", view.shared_generation),
            ("t_sys", view.t_sys),
            ("t_valid", view.t_valid),
        ):
            if expr is not None:
                exprs[disc_numbers[key]] = expr
        disc_part = placer.part(disc_args, exprs)(disc_sql)
        ctes.append(_DISC_COLUMNS.format(discovery=disc_part))
        selects += _columns("disc_columns", _DISC_NAMES)
        groups = PathGroups(discovery.readable_space_ids, discovery.t_sys)
    elif discovery is not None:
        groups = None  # discovery asked for nothing: no group is needed
    if groups is not None:
        place = placer.part(
            [team, list(groups.readable_space_ids), groups.t_sys],
            {3: view.t_sys} if view.t_sys is not None else None,
        )
        selects.append(
            "(SELECT ROW(array_agg(g.id), array_agg(g.semantic_group_key)) "
            f"FROM (\n{place(_PATH_GROUPS)}\n) g)"
        )
    return ctes, selects, wanted, disc_wanted, groups is not None


def _parse_search(
    candidates: search.CandidateQuery,
    wanted: Sequence[search.ListName],
    disc_wanted: Sequence[str] | None,
    with_groups: bool,
    row: Sequence[Any],
) -> FirstRound:
    """A round's lists, hydration and discovery from its selections ``row``."""
    found: related.Discovery | None = None
    path_groups: dict[str, str] = {}
    at = 1 + len(_HYD_NAMES)
    if disc_wanted is not None:
        if disc_wanted:
            names, ranks, ids, keys = (_rows(c) for c in row[at : at + len(_DISC_NAMES)])
            at += len(_DISC_NAMES)
            found = related.parse_discovery(
                disc_wanted, list(zip(names, ranks, ids, keys, strict=True))
            )
        else:
            found = related.Discovery({}, frozenset(), None)
    if with_groups:
        ids, groups = row[at]
        path_groups = dict(zip(_rows(ids), _rows(groups), strict=True))
    return FirstRound(
        lists=search.parse_lists(candidates, wanted, _rows(row[0])),
        eligible=_parse_hydrated(row[1 : 1 + len(_HYD_NAMES)]),
        discovery=found,
        path_groups=path_groups,
    )


async def first_round(
    conn: Conn,
    candidates: search.CandidateQuery,
    t_valid: datetime,
    discovery: related.DiscoveryQuery | None,
    *,
    checked: Sequence[str] = (),
    vector_ranks: Mapping[str, int] | None = None,
    groups: PathGroups | None = None,
) -> FirstRound | None:
    """Candidates, hydration and discovery in one statement; None when there is no
    candidate list to search (the caller's separate path answers that case).
    ``checked``: candidates already hydrated (by a scope round), not hydrated
    again; ``eligible`` then holds only the others. ``vector_ranks``: per branch,
    the last rank of its vector list whose candidates are hydrated (a branch left
    out: all of them). ``groups``: without ``discovery`` (read beside the unit),
    the support paths' groups its coverage needs."""
    if not search.wanted_lists(candidates) or not candidates.branches:
        return None
    placer = _Placer()
    ctes, selects, wanted, disc_wanted, with_groups = _search_parts(
        placer, candidates, t_valid, discovery, _ViewExprs(), checked, vector_ranks, None, groups
    )
    sql = "WITH " + ",\n".join(ctes) + "\nSELECT " + ",\n       ".join(selects)
    row = await conn.fetchrow(sql, *placer.args)
    assert row is not None
    return _parse_search(candidates, wanted, disc_wanted, with_groups, row)


# --- the view, with the parts of the first round that need no query embedding ------------


@dataclass(frozen=True, slots=True)
class ScopeQuery:
    """The view a recall asks for: its readable spaces (shared first) and instants."""

    team_id: str
    space_ids: Sequence[UUID]
    known_at: datetime | None  # None: the transaction's now()
    valid_at: datetime | None  # None: the view's t_sys


@dataclass(frozen=True, slots=True)
class ScopeRound:
    now: datetime
    spaces: list[recall.SpaceView]
    # The lists read with the view (their branches are every readable space:
    # a space without a generation in the view has empty lists), their
    # hydration and discovery; None when none was asked.
    first: FirstRound | None


async def scope_round(
    conn: Conn,
    scope: ScopeQuery,
    candidates: search.CandidateQuery | None,
    discovery: related.DiscoveryQuery | None,
    vector_bound: VectorBound | None = None,
    *,
    groups: PathGroups | None = None,
) -> ScopeRound:
    """The view and, in the same statement, the lists of ``candidates`` with their
    hydration and ``discovery``, fed in SQL from the view's values.

    ``candidates`` has a branch per readable space (``scope.space_ids``, in that
    order) and ``discovery`` is of one of them; the values they take from the
    view (the generations, and ``t_sys`` and ``t_valid`` when they default to
    ``now()``) are the view's own expressions here, whatever the queries hold
    for them. A space with no generation at the view's instant gets NULL, which
    no row matches: its lists come back empty, and its branch is not searched.
    The statement reads what the view statement and :func:`first_round` would
    read in one transaction (``now()`` is the transaction's instant), but that
    with ``vector_bound``, when it holds the vector lists and others, it
    hydrates a branch's vector-only candidates only down to the last rank that
    can still reach the answer (``_VECTOR_BOUNDS``)."""
    placer = _Placer()
    view = placer.part([scope.team_id, list(scope.space_ids), scope.known_at])
    ctes = [
        f"scope AS MATERIALIZED (\n{view(recall.VIEW_SQL)}\n)",
        # The generations in the order of the branches (NULL: not in the view).
        "scope_generations AS MATERIALIZED (\n"
        "SELECT array_agg(v.generation ORDER BY w.n) AS generations\n"
        f"FROM unnest({view('$2::uuid[]')}) WITH ORDINALITY AS w (id, n)\n"
        "LEFT JOIN scope v ON v.id = w.id\n)",
    ]
    selects = ["(SELECT array_agg(ROW(v.*)) FROM scope v)", "now()"]
    t_sys = "now()" if scope.known_at is None else None
    t_valid = "now()" if scope.known_at is None and scope.valid_at is None else None
    parsed: tuple[search.CandidateQuery, list[search.ListName], list[str] | None, bool] | None = (
        None
    )
    if candidates is not None and search.wanted_lists(candidates):
        if [b.space_id for b in candidates.branches] != list(scope.space_ids):
            raise ValueError("the candidate branches must be the scope's spaces, in order")
        shared = None
        if discovery is not None:
            shared = list(scope.space_ids).index(discovery.space_id) + 1
        exprs = _ViewExprs(
            generations="(SELECT sg.generations FROM scope_generations sg)",
            shared_generation=(
                f"(SELECT sg.generations[{shared}] FROM scope_generations sg)"
                if shared is not None
                else None
            ),
            t_sys=t_sys,
            t_valid=t_valid,
        )
        more_ctes, more, wanted, disc_wanted, with_groups = _search_parts(
            placer,
            candidates,
            # A placeholder when t_valid is now(): its expression replaces it.
            scope.valid_at or scope.known_at or candidates.known_at or datetime.min,
            discovery,
            exprs,
            (),
            None,
            vector_bound,
            groups,
        )
        ctes += more_ctes
        selects += more
        parsed = (candidates, wanted, disc_wanted, with_groups)
    sql = "WITH " + ",\n".join(ctes) + "\nSELECT " + ",\n       ".join(selects)
    row = await conn.fetchrow(sql, *placer.args)
    assert row is not None
    first = None
    if parsed is not None:
        first = _parse_search(*parsed, tuple(row)[2:])
    return ScopeRound(row[1], recall.parse_view(_rows(row[0])), first)


# --- relationship discovery on a side connection ------------------------------------------


@dataclass(frozen=True, slots=True)
class SideDiscovery:
    """What :func:`side_discovery` read: the role it read as, the shared space's
    generation at the view's instant (None: none then), and the discovery."""

    role: str
    generation: int | None
    discovery: related.Discovery


async def side_discovery(
    conn: Conn,
    team_id: str,
    space_ids: Sequence[UUID],
    discovery: related.DiscoveryQuery,
    budget_s: float | None = None,
) -> SideDiscovery:
    """Relationship discovery as one statement on a side connection
    (:class:`gateway.store.database.SideConnections`), outside any transaction:
    its first selection makes the tenant settings (``team_id``, ``space_ids``),
    the rest reads through row-level security after it. The shared space's
    generation is read in the statement at ``discovery.t_sys`` by the view's own
    rule (:data:`recall.VIEW_SQL`) and stands for ``discovery.generation``; it is
    returned, for the caller to check against the view it read on its unit."""
    related.check(discovery)
    wanted = related.wanted_lists(discovery)
    if not wanted:
        raise ValueError("discovery asks for no list")
    placer = _Placer()
    tenant = placer.part(database.side_tenant_args(team_id, space_ids))
    view = placer.part([discovery.team_id, [discovery.space_id], discovery.t_sys])
    numbers: dict[str, int] = {}
    disc_sql, disc_args = related.build_discovery(discovery, numbers=numbers)
    generation = "(SELECT v.generation FROM side_scope v)"
    disc_part = placer.part(disc_args, {numbers["generation"]: generation})(disc_sql)
    ctes = [
        f"side_tenant AS MATERIALIZED (\n{tenant(database.SIDE_TENANT_SQL)}\n)",
        f"side_scope AS MATERIALIZED (\n{view(recall.VIEW_SQL)}\n)",
        _DISC_COLUMNS.format(discovery=disc_part),
    ]
    # The tenant settings first: selections are evaluated in order, and each
    # MATERIALIZED CTE when a selection first reads it (SideConnections).
    selects = [
        "(SELECT t.role FROM side_tenant t)",
        generation,
        *_columns("disc_columns", _DISC_NAMES),
    ]
    sql = "WITH " + ",\n".join(ctes) + "\nSELECT " + ",\n       ".join(selects)
    # budget_s: what is left of the request's deadline (the login's statement
    # timeout bounds it too); past it, the driver cancels the statement.
    row = await conn.fetchrow(sql, *placer.args, timeout=budget_s)
    assert row is not None
    names, ranks, ids, keys = (_rows(c) for c in row[2:])
    found = related.parse_discovery(wanted, list(zip(names, ranks, ids, keys, strict=True)))
    return SideDiscovery(row[0], row[1], found)


def merge_rounds(
    candidates: search.CandidateQuery,
    discovery: related.DiscoveryQuery | None,
    early: FirstRound,
    late: FirstRound | None,
) -> FirstRound:
    """One first round from a scope round's parts and a later round's (the vector
    parts, hydrating only what the scope round did not), as :func:`first_round`
    would have returned them for ``candidates`` and ``discovery`` (the whole
    queries): the lists in the same order (fusion adds in that order), each
    candidate hydrated once, discovery's lists and covered groups together."""
    lists: dict[tuple[str, str], list[str]] = {}
    for b in candidates.branches:
        for list_name in search.wanted_lists(candidates):
            key = (b.branch, str(list_name))
            if key in early.lists:
                lists[key] = early.lists[key]
            elif late is not None and key in late.lists:
                lists[key] = late.lists[key]
            else:
                raise ValueError(f"no round read the list {key}")
    found = early.discovery if discovery is not None else None
    if discovery is not None and late is not None and late.discovery is not None:
        parts = [early.discovery, late.discovery] if early.discovery else [late.discovery]
        named: dict[str, list[tuple[str, str]]] = {}
        for name in related.wanted_lists(discovery):
            for part in parts:
                if name in part.lists:
                    named[name] = part.lists[name]
                    break
            else:
                raise ValueError(f"no round read the discovery list {name}")
        found = related.Discovery(
            named,
            frozenset().union(*(p.covered_groups for p in parts)),
            late.discovery.projection_status,
        )
    return FirstRound(
        lists=lists,
        eligible={**early.eligible, **(late.eligible if late is not None else {})},
        discovery=found,
        path_groups={**early.path_groups, **(late.path_groups if late is not None else {})},
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
