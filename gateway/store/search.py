"""Evidence candidate search: every candidate list of a recall in one SQL round trip.

A recall searches each allowed space branch (shared, private) with up to three
lists: full text, vector similarity and explicit entity expansion (SPEC section
3, step 1). This module sends them all as **one statement**: a ``UNION ALL`` of
one subquery per branch and list, returning ``(branch, list_name, rank,
evidence_id)`` rows that are grouped here. The number of statements of a
recall therefore depends neither on the overfetch (``per_list``) nor on the
number of branches.

Candidates are search hits, not answers: canonical eligibility (supports,
lifecycle, validity, conflicts) is decided later by hydration. Only three
things are filtered here, in every list: the evidence belongs to the branch's
space *and* the view's generation of it, it was recorded at or before
``known_at``, and it is not among the caller's known (excluded) IDs. Every
subquery names the team and the space itself; row-level security is the
second wall, not the only one.

**Full text ranks with BM25** (k1 = 0.9, b = 0.4), computed in PostgreSQL over
the postings in ``evidence_terms``. ``ts_rank_cd`` has neither IDF nor length
normalisation and scored about half of BM25's nDCG@10 on SciFact (see
``docs/data-model.md``). The query's lexemes come from
``to_tsvector('english', text)``, the same configuration the documents use, so
stemming matches; ``unnest`` of that vector yields each lexeme once. Any
lexeme match is a candidate (OR semantics): ``websearch_to_tsquery`` ANDs all
terms, which drops most matches of a natural-language question, and
``to_tsquery`` raises on user syntax. Neither is used, so no input can raise:
text without lexemes (stop words, punctuation) simply matches nothing. Per
lexeme, IDF = ln(1 + (N - df + 0.5) / (df + 0.5)); df and the lexeme's
largest tf come from ``evidence_lexeme_stats``, kept by the write path
(db/0106_lexeme_statistics.sql: sharded running totals over the postings,
summed here, one row per lexeme per writer that ran at once (up to 32 since
db/0160, lowest shard first), instead of a count of every posting of every
query lexeme), N and the total document length from
``evidence_search_stats`` (db/0002_search_stats.sql).
These statistics cover the whole space, all generations and the present
state; they shape the order of candidates, never which evidence qualifies.
Of the hits (most of a space, for a question with a common word), only those
whose score bound can reach the list are looked up and scored: the exact top
``per_list`` at a fraction of the lookups (gateway/store/bm25.py).

**A view of an earlier instant never moves** (``as_of``, the recall's
``knownAt``): its N, total length and df are counted over what was recorded at
or before that instant (:func:`_fulltext_prelude_as_of`; postings carry their
document's ``recorded_at``, db/0040), so later writes, matching or not, change
nothing of its order; and its vector list is always the exact scan, since the
answer of an approximate index (and the choice between the two, made by the
space's present size) moves with later inserts. The current view's statement
is the one above, unchanged: it reads the running totals.

**Vector similarity** goes through the SQL function
``evidence_vector_candidates`` (also db/0002), one call per branch. It runs in
the space's own partition of ``evidence_embeddings`` (so other teams' vectors
cannot crowd out this space's neighbours) and chooses the method by the size
of the space: an exact scan below :data:`EXACT_SEARCH_BELOW` vectors, else the
partition's HNSW index with an iterative scan and ``hnsw.ef_search`` =
max(2 * per_list, 150, space size / 100), at most 1000 (db/0060: the larger the
graph, the wider the walk must be to keep recall@10 near 0.98; db/0110: at
least 150, so that it holds on every build of a graph), re-sorted by
distance; when that path comes back
short of ``per_list`` (its nearest vectors filtered out, as after a reset), the
exact scan answers instead (db/0006). It is a server-side function so
that its settings (``plan_cache_mode = force_custom_plan``,
``hnsw.iterative_scan``, ``hnsw.ef_search``) are in force before its query is
planned and scanned, scoped to the function, without a second round trip: a
``set_config`` inside the statement itself cannot change how that statement
is planned, and a generic plan of a query over the partitioned table is built
over every partition of every space. Measured with about 300 spaces: building
it took 50 ms to 2 s; it did prune at executor startup ("Subplans Removed:
306") but had chosen a parallel sequential scan, 20-40 ms per execution,
against 1-3 ms for the custom plan on the partition's HNSW index.

**Entity expansion** returns evidence of the branch's space that mentions any
of the given entities, ranked by how many of them it mentions (more first),
then by recency of recording (newer first: of two equally matching texts the
later one is likelier to be current), then by ID.

Ties are always broken by evidence ID in code-point order (``COLLATE "C"``),
the order Python's ``sorted`` and the fusion engine use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal
from uuid import UUID

import numpy as np

from gateway.store import bm25
from gateway.store.bm25 import BM25_B, BM25_K1, top_k
from gateway.store.connection import Conn
from gateway.store.params import Params

__all__ = [
    "BM25_B",
    "BM25_K1",
    "DIMENSIONS",
    "EXACT_SEARCH_BELOW",
    "LISTS_OF_CANDS",
    "LIST_NAMES",
    "MAX_PER_LIST",
    "BranchSearch",
    "CandidateQuery",
    "build_statement",
    "check",
    "evidence_candidates",
    "parse_candidates",
    "parse_lists",
    "wanted_lists",
]

ListName = Literal["fulltext", "vector", "entity"]
LIST_NAMES: Final[tuple[ListName, ...]] = ("fulltext", "vector", "entity")
BRANCHES: Final = frozenset({"shared", "private"})

# Below this many vectors in a space the vector list is an exact scan, above it
# the HNSW index is used. Measured on 2 cores with 384-dimension vectors: an
# exact scan costs about 1.6 ms per 1000 vectors (8 ms at 5k, 32 ms at 20k),
# the HNSW scan 2-9 ms from 2k to 50k. At 10k the exact scan (~15 ms) is still
# affordable and its answer is complete by construction. Read at call time
# (passed as a parameter), so tests can force either path.
EXACT_SEARCH_BELOW: int = 10_000

MAX_PER_LIST: Final = 500
DIMENSIONS: Final = 384


@dataclass(frozen=True, slots=True)
class BranchSearch:
    """One space branch of a recall."""

    branch: str  # "shared" or "private"
    space_id: UUID
    generation: int  # the space generation of the requested view


@dataclass(frozen=True, slots=True)
class CandidateQuery:
    """Everything the candidate lists of one recall need, for all its branches."""

    team_id: str
    branches: Sequence[BranchSearch]
    # Full-text query; None or blank: no fulltext list.
    text: str | None
    # Query embedding, float32 (384,), unit norm; None: no vector list.
    vector: np.ndarray | None
    # Explicit entity expansion; empty: no entity list.
    entity_ids: Sequence[str]
    # Known evidence IDs, never returned.
    exclude_ids: Sequence[str]
    # Candidates per list per branch (the caller's overfetch), 1..500.
    per_list: int
    # Evidence recorded after known_at is not a candidate; None: now.
    known_at: datetime | None
    # A knownAt view's instant: rank with the statistics of then, and search
    # vectors exactly, so that later writes cannot move the view. None: the
    # current view (present statistics, the index above EXACT_SEARCH_BELOW).
    as_of: datetime | None = None


def _visible(p: Params, alias: str, space: str, generation: str) -> str:
    """The filters every list applies: team, space, generation, system time, exclusions."""
    return (
        f"{alias}.team_id = {p['team']} AND {alias}.space_id = {space} "
        f"AND {alias}.generation = {generation} "
        f"AND {alias}.recorded_at <= coalesce({p['known_at']}, "
        "'infinity'::timestamptz) "
        f"AND NOT ({alias}.id = ANY ({p['exclude']}))"
    )


def _fulltext(p: Params, branch: str, space: str, generation: str) -> str:
    """BM25 over the space's postings, OR semantics over the query's lexemes.

    score(d) = sum over matching lexemes of
    idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)).
    The prelude computes each lexeme's IDF, df and largest tf once per branch
    space (``query_idf``); only the postings and documents that can reach the
    top are read (gateway/store/bm25.py says why the answer is the same).
    """
    top = top_k(
        "evidence_fulltext_top_k",
        lexemes=f"(SELECT * FROM query_idf q WHERE q.space_id = {space})",
        team=p["team"],
        space=space,
        generation=generation,
        view=[p["known_at"], p["exclude"]],
        limit=p["per_list"],
        prune_from=p["prune_from"],
    )
    return f"""
SELECT {branch} AS branch, 'fulltext'::text AS list_name, s.rank, s.doc_id AS evidence_id
FROM ({top}
) s"""


def _fulltext_prelude(p: Params) -> str:
    """The query's lexemes, and per branch each lexeme's IDF, both computed once.

    ``unnest(tsvector)`` yields each lexeme once. ``query_idf`` holds one row
    per branch space and query lexeme present in it. It is a materialised CTE
    so that df is read once per lexeme: inlined as a subquery, the planner
    (which estimates one posting per lexeme) counted df once per *posting*
    instead, 4,508 times for a 4-lexeme query on a 10,000-evidence space of
    the recall benchmark, 1.4 s under EXPLAIN ANALYZE (the p50 of 325 ms).
    df and max_tf are the sums of the write path's running totals
    (``evidence_lexeme_stats``, db/0106): every posting of the space, all
    generations, as the count of postings they replace.
    """
    team = p["team"]
    return f"""WITH query_lexemes AS MATERIALIZED (
    SELECT u.lexeme FROM unnest(to_tsvector('english'::regconfig, {p["text"]})) AS u
),
query_idf AS MATERIALIZED (
    SELECT b.space_id, ql.lexeme,
           ln(1 + (st.n - d.df + 0.5) / (d.df + 0.5)) AS idf,
           st.avgdl, d.df, d.max_tf
    FROM unnest({p["spaces"]}) AS b (space_id)
    CROSS JOIN query_lexemes ql
    CROSS JOIN LATERAL (
        SELECT sum(x.doc_count)::double precision AS n,
               sum(x.total_length)::double precision / nullif(sum(x.doc_count), 0) AS avgdl
        FROM evidence_search_stats x
        WHERE x.team_id = {team} AND x.space_id = b.space_id
    ) st
    CROSS JOIN LATERAL (
        SELECT sum(c.df)::double precision AS df, max(c.max_tf) AS max_tf
        FROM evidence_lexeme_stats c
        WHERE c.team_id = {team} AND c.space_id = b.space_id AND c.lexeme = ql.lexeme
    ) d
    WHERE d.df > 0 AND st.avgdl > 0
)
"""


def _fulltext_prelude_as_of(p: Params) -> str:
    """:func:`_fulltext_prelude` with the statistics of the instant ``as_of``.

    N and the average length are counted, once per branch space, over the
    evidence recorded by then (index-only: ``evidence_search_filter`` carries
    ``recorded_at`` and ``doc_length``; db/0041 says why not an index of its own), df over the
    postings recorded by then (the postings' primary key carries
    ``recorded_at``: the same index-only scan as the present df, db/0040).
    Like the present statistics, they cover every generation of the space, so
    a view of the present instant ranks exactly like the current view.
    """
    team, at = p["team"], p["as_of"]
    return f"""WITH query_lexemes AS MATERIALIZED (
    SELECT u.lexeme FROM unnest(to_tsvector('english'::regconfig, {p["text"]})) AS u
),
space_stats AS MATERIALIZED (
    SELECT b.space_id, st.n, st.avgdl
    FROM unnest({p["spaces"]}) AS b (space_id)
    CROSS JOIN LATERAL (
        SELECT count(*)::double precision AS n,
               sum(x.doc_length)::double precision / nullif(count(*), 0) AS avgdl
        FROM evidence x
        WHERE x.team_id = {team} AND x.space_id = b.space_id AND x.recorded_at <= {at}
    ) st
),
query_idf AS MATERIALIZED (
    SELECT s.space_id, ql.lexeme,
           ln(1 + (s.n - d.df + 0.5) / (d.df + 0.5)) AS idf,
           s.avgdl, d.df, d.max_tf
    FROM space_stats s
    CROSS JOIN query_lexemes ql
    CROSS JOIN LATERAL (
        SELECT count(*)::double precision AS df, max(c.tf) AS max_tf
        FROM evidence_terms c
        WHERE c.team_id = {team} AND c.space_id = s.space_id AND c.lexeme = ql.lexeme
          AND c.recorded_at <= {at}
    ) d
    WHERE d.df > 0 AND s.avgdl > 0
)
"""


def _vector(p: Params, branch: str, space: str, generation: str) -> str:
    """Nearest neighbours inside the space's partition (db/0002: evidence_vector_candidates)."""
    return _vector_list(
        branch,
        f"""evidence_vector_candidates(
    {p["team"]}, {space}, {generation}, {p["vector"]},
    {p["per_list"]}, {p["known_at"]},
    {p["exclude"]}, {p["exact_below"]}
)""",
    )


def _vector_as_of(p: Params, branch: str, space: str, generation: str) -> str:
    """A knownAt view's vector list: db/0042, the exact top-N of the rows visible
    at its instant."""
    return _vector_list(
        branch,
        f"""evidence_vector_candidates_as_of(
    {p["team"]}, {space}, {generation}, {p["vector"]},
    {p["per_list"]}, {p["known_at"]}, {p["exclude"]}
)""",
    )


def _vector_list(branch: str, call: str) -> str:
    return f"""
SELECT {branch} AS branch, 'vector'::text AS list_name,
       row_number() OVER (ORDER BY v.distance, v.evidence_id COLLATE "C") AS rank,
       v.evidence_id
FROM {call} v"""


def _entity(p: Params, branch: str, space: str, generation: str) -> str:
    """Evidence mentioning the given entities: most mentioned first, then newest, then ID."""
    team = p["team"]
    entities = p["entities"]
    limit = p["per_list"]
    return f"""
SELECT {branch} AS branch, 'entity'::text AS list_name, s.rank, s.evidence_id
FROM (
    SELECT m.evidence_id::text AS evidence_id,
           row_number() OVER (ORDER BY count(*) DESC, e.recorded_at DESC,
                                       m.evidence_id::text COLLATE "C") AS rank
    FROM evidence_entity_mentions m
    JOIN evidence e ON e.team_id = {team} AND e.space_id = {space} AND e.id = m.evidence_id
    WHERE m.team_id = {team} AND m.space_id = {space} AND m.entity_id = ANY ({entities})
      AND {_visible(p, "e", space, generation)}
    GROUP BY m.evidence_id, e.recorded_at
    ORDER BY rank
    LIMIT {limit}
) s"""


_BUILDERS = {"fulltext": _fulltext, "vector": _vector, "entity": _entity}


def wanted_lists(q: CandidateQuery) -> list[ListName]:
    """The lists ``q`` asks for: full text for a non-blank text, vector for a vector,
    entity for entity IDs."""
    wanted: list[ListName] = []
    if q.text is not None and q.text.strip():
        wanted.append("fulltext")
    if q.vector is not None:
        wanted.append("vector")
    if q.entity_ids:
        wanted.append("entity")
    return wanted


def build_statement(
    q: CandidateQuery, wanted: Sequence[ListName], *, numbers: dict[str, int] | None = None
) -> tuple[str, list[Any]]:
    """The one statement and its parameters (public for tests and plan inspection).

    Branches are bound as arrays (space IDs, generations, names) and each
    branch's subqueries take element ``i``; the text varies only with the
    number of branches and the set of lists. ``numbers`` (if given) receives
    each named parameter's number (``generations``, ``known_at``, ...), for a
    combined statement that computes some of them in SQL (round_trips).
    """
    p = Params()
    p.bind("team", q.team_id, "text")
    p.bind("spaces", [b.space_id for b in q.branches], "uuid[]")
    p.bind("generations", [b.generation for b in q.branches], "integer[]")
    p.bind("branches", [b.branch for b in q.branches], "text[]")
    p.bind("per_list", q.per_list, "integer")
    p.bind("known_at", q.known_at, "timestamptz")
    p.bind("exclude", list(q.exclude_ids), "text[]")
    prelude = ""
    if "fulltext" in wanted:
        p.bind("text", _bindable(q.text or ""), "text")
        p.bind("prune_from", bm25.PRUNE_FROM_POSTINGS, "bigint")
        if q.as_of is None:
            prelude = _fulltext_prelude(p)
        else:
            p.bind("as_of", q.as_of, "timestamptz")
            prelude = _fulltext_prelude_as_of(p)
    if "vector" in wanted:
        p.bind("vector", np.asarray(q.vector, dtype=np.float32), "vector")
        if q.as_of is None:
            p.bind("exact_below", EXACT_SEARCH_BELOW, "bigint")
    if "entity" in wanted:
        p.bind("entities", list(q.entity_ids), "text[]")

    builders = _BUILDERS if q.as_of is None else {**_BUILDERS, "vector": _vector_as_of}
    parts = []
    for i in range(1, len(q.branches) + 1):
        branch = f"({p['branches']})[{i}]"
        space = f"({p['spaces']})[{i}]"
        generation = f"({p['generations']})[{i}]"
        for name in wanted:
            parts.append(builders[name](p, branch, space, generation))
    union = "\nUNION ALL\n".join(f"({part}\n)" for part in parts)
    sql = f"{prelude}SELECT c.branch, c.list_name, c.rank, c.evidence_id FROM (\n{union}\n) c"
    if numbers is not None:
        numbers.update(p.numbers())
    return sql, p.values


def _bindable(text: str) -> str:
    """Text that PostgreSQL accepts as a parameter, whatever the caller typed.

    A NUL character or a lone surrogate (JSON allows ``\\u0000`` and
    ``\\ud800``) would make the server or the driver refuse the whole
    statement; as spaces and question marks they are just punctuation to
    ``to_tsvector``, like any other symbol.
    """
    return text.replace("\x00", " ").encode("utf-8", "replace").decode("utf-8")


def check(q: CandidateQuery) -> None:
    """Refuse a query the statement would misread (a programming error, not user input)."""
    if not 1 <= q.per_list <= MAX_PER_LIST:
        raise ValueError(f"per_list must be between 1 and {MAX_PER_LIST}, not {q.per_list}")
    seen = set()
    for b in q.branches:
        if b.branch not in BRANCHES:
            raise ValueError(f"unknown branch {b.branch!r}")
        if b.branch in seen:
            raise ValueError(f"branch {b.branch!r} given twice")
        seen.add(b.branch)
    if q.vector is not None:
        shape = np.shape(q.vector)
        if shape != (DIMENSIONS,):
            raise ValueError(f"the query vector must have shape ({DIMENSIONS},), not {shape}")
        if not np.isfinite(q.vector).all():
            raise ValueError("the query vector has non-finite values")


async def evidence_candidates(conn: Conn, q: CandidateQuery) -> dict[tuple[str, str], list[str]]:
    """All candidate lists of all branches, in one round trip.

    Returns ``(branch, list_name) -> evidence IDs in rank order`` with every
    requested list present, possibly empty. A list is requested when its input
    is given: non-blank ``text``, a ``vector``, non-empty ``entity_ids``.
    Nothing requested (or no branch) sends no statement at all.
    """
    check(q)
    wanted = wanted_lists(q)
    if not (wanted and q.branches):
        return {}
    sql, args = build_statement(q, wanted)
    return parse_candidates(q, wanted, await conn.fetch(sql, *args))


def parse_candidates(
    q: CandidateQuery, wanted: Sequence[ListName], rows: Sequence[Sequence[Any]]
) -> dict[tuple[str, str], list[str]]:
    """The lists from the statement's rows ``(branch, list_name, rank, evidence_id)``,
    each in rank order, ties by ID in code-point order: the order
    :data:`LISTS_OF_CANDS` makes in SQL for the combined statements."""
    ranked: dict[tuple[str, str], list[tuple[int, str]]] = {
        (b.branch, name): [] for b in q.branches for name in wanted
    }
    for row in rows:
        ranked[(row[0], row[1])].append((row[2], row[3]))
    lists: dict[tuple[str, str], list[str]] = {}
    for key, hits in ranked.items():
        hits.sort()
        lists[key] = [evidence_id for _, evidence_id in hits]
    return lists


# The candidate lists for the combined statements (gateway/store/round_trips.py),
# over their CTE ``cands`` of this module's rows: one record per list, its
# branch, its name and its evidence IDs in the order parse_candidates sorts a
# list in (rank, ties by ID in code-point order). The rows of all lists, each a
# record of four fields, would cost the driver a codec lookup per field (an
# anonymous record names each field's type), about 500 a recall; a list's IDs
# are a text[], decoded in one go (docs/benchmarks.md, "Workers' connections and
# the round trips' records").
LISTS_OF_CANDS: Final = """(SELECT array_agg(ROW(l.branch, l.list_name, l.evidence_ids)) FROM (
    SELECT c.branch, c.list_name,
           array_agg(c.evidence_id::text ORDER BY c.rank, c.evidence_id::text COLLATE "C")
               AS evidence_ids
    FROM cands c
    GROUP BY c.branch, c.list_name
) l)"""


def parse_lists(
    q: CandidateQuery, wanted: Sequence[ListName], rows: Sequence[Sequence[Any]]
) -> dict[tuple[str, str], list[str]]:
    """The lists from :data:`LISTS_OF_CANDS`' records, as :func:`parse_candidates`
    returns them: every branch's wanted lists, empty where no row came."""
    lists: dict[tuple[str, str], list[str]] = {
        (b.branch, name): [] for b in q.branches for name in wanted
    }
    for branch, list_name, evidence_ids in rows:
        key = (branch, list_name)
        if key not in lists:
            raise KeyError(key)
        lists[key] = evidence_ids
    return lists
