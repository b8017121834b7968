"""The pruned BM25 top-k (gateway/store/bm25.py, db/0085) against full scoring, on
the real database.

Both full-text lists read only the postings of the essential lexemes and score
only the hits whose bound can reach the ``k``-th best visible score. These
tests give them corpora where most documents hit, ``per_list`` far below the
number of hits (so the pruning decides), exact ties at the cut, and views in
which the hits of highest bound are not visible (excluded, recorded later, or
of another team), and compare every list with BM25 computed here over every
document. Every test runs twice: with the first floor and the minor lexemes
(``PRUNE_FROM_POSTINGS`` = 0, the path of large spaces) and without them (the
default threshold, far above these corpora: every lexeme essential). The last
tests break the bounds on purpose and check that the lists then differ.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pytest

from gateway.services.writes import WriteService
from gateway.store import bm25, related
from gateway.store.connection import Conn
from gateway.store.database import Database
from gateway.store.search import (
    BranchSearch,
    CandidateQuery,
    build_statement,
    evidence_candidates,
)

from .conftest import load_jsonl, unique
from .factories import jsonl
from .test_search import _branch, _ev, _team, bm25_order

# Each its own lexeme under the 'english' configuration (see test_search.BM25_CORPUS).
WORDS = ["kafka", "broker", "partition", "consumer", "lag", "offset", "leader", "replica"]
QUERIES = ["kafka broker lag", "replica", "offset leader consumer kafka", "partition lag replica"]


def corpus(seed: int, n: int, prefix: str) -> dict[str, str]:
    """``n`` texts of 1 to 12 words, common words far more often than rare ones,
    plus copies of some texts (equal scores that only the ID orders)."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    texts = {
        f"{prefix}{i:03d}": " ".join(rng.choices(WORDS, weights, k=rng.randint(1, 12)))
        for i in range(n)
    }
    for i in range(0, n, 7):  # ties of several terms at every depth
        texts[f"{prefix}{i:03d}-copy"] = texts[f"{prefix}{i:03d}"]
    return texts


def cut_corpus() -> dict[str, str]:
    """Texts that decide db/0204's cut for ``per_list`` 1 (CUT_QUERIES): many short
    texts without a query word, and long ones (filler words) whose rare lexeme
    gives the grouping a cut above the best score ("kafka broker": the best is
    the short "broker", whose bound is below the cut, so the first try's
    theta is below it and the second try decides), or whose many occurrences
    put their bound above twice the cut while a short text below it is the best
    ("offset leader")."""
    filler = " ".join(["walrus", "yak", "ibis", "okapi", "tapir", "gecko", "heron", "lemur"] * 8)
    texts = {f"f{i:02d}": "walrus yak ibis" for i in range(30)}
    texts |= {f"a{i}": f"kafka {filler}" for i in (1, 2)}
    texts |= {"a3": "broker"} | {f"a{i}": f"broker {filler}" for i in (4, 5, 6)}
    texts |= {"b1": f"offset offset offset leader leader leader {filler}", "b2": "offset leader"}
    texts |= {"b3": f"offset {filler}", "b4": f"leader {filler}", "b5": f"leader {filler}"}
    return texts


CUT_QUERIES = ["kafka broker", "offset leader"]


def visible_order(ranked: Sequence[str], hidden: set[str], k: int) -> list[str]:
    return [d for d in ranked if d not in hidden][:k]


async def _fulltext(
    db: Database,
    team: str,
    branch: BranchSearch,
    text: str,
    per_list: int,
    *,
    exclude: Sequence[str] = (),
    known_at: datetime | None = None,
    as_of: datetime | None = None,
) -> list[str]:
    q = CandidateQuery(team, (branch,), text, None, (), tuple(exclude), per_list, known_at, as_of)
    async with db.tenant(team, [branch.space_id]) as conn:
        return (await evidence_candidates(conn, q))[(branch.branch, "fulltext")]


@pytest.fixture(autouse=True, params=["minor-lexemes", "all-essential"])
def prune_from(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Both paths of the functions: with the first floor (and minor lexemes
    whenever the floor allows), and with every lexeme essential."""
    value = 0 if request.param == "minor-lexemes" else bm25.PRUNE_FROM_POSTINGS
    monkeypatch.setattr(bm25, "PRUNE_FROM_POSTINGS", value)
    return value


async def _documents_looked_up(db: Database, team: str, q: CandidateQuery) -> int:
    """How many evidence lookups the full-text statement made (each hit's visibility
    check and each scored document's lookup is one index scan, plain or
    index-only), from the transaction's own statistics: the function's plan is
    not in EXPLAIN."""
    sql, args = build_statement(q, ["fulltext"])
    count = (
        "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_xact_user_tables WHERE relname = 'evidence'"
    )
    async with db.tenant(team, [b.space_id for b in q.branches]) as conn:
        before = await conn.fetchval(count)
        await conn.fetch(sql, *args)
        return int(await conn.fetchval(count)) - int(before)


async def test_evidence_top_k_is_the_top_of_full_scoring(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    team, crowd = unique("topk"), unique("topk-crowd")
    docs = corpus(1, 90, "d")
    records = _team(team) + [_ev(team, d, t) for d, t in docs.items()]
    # Another team's documents share every word: they change nothing here.
    records += _team(crowd) + [_ev(crowd, f"c{i}", "replica " * 9 + "kafka") for i in range(20)]
    await load_jsonl(writes, jsonl(records))
    branch = await _branch(admin_conn, team)
    for query in QUERIES:
        ranked = bm25_order(docs, query)
        assert len(ranked) > 20, query  # most documents hit: the pruning decides
        for k in (1, 2, 5, 13, 40):
            got = await _fulltext(db, team, branch, query, k)
            assert got == ranked[:k], (query, k)


async def test_evidence_top_k_when_the_best_bounds_are_not_visible(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """The documents of highest bound are excluded or recorded after known_at: the
    threshold comes from visible documents only, so nothing visible is lost."""
    team = unique("topk-hidden")
    early = corpus(2, 60, "e")
    # Later: many copies of the query words, the highest bounds of all.
    late = {f"l{i:02d}": "replica replica replica replica lag lag kafka" for i in range(30)}
    await load_jsonl(writes, jsonl(_team(team) + [_ev(team, d, t) for d, t in early.items()]))
    t_early = await admin_conn.fetchval(
        "SELECT max(recorded_at) FROM evidence WHERE team_id = $1", team
    )
    await load_jsonl(writes, jsonl([_ev(team, d, t) for d, t in late.items()]))
    branch = await _branch(admin_conn, team)
    everything = {**early, **late}
    query = "replica lag kafka"
    ranked = bm25_order(everything, query)
    assert ranked[:30] == sorted(late)  # the late ones lead the present view
    for k in (1, 4, 10):
        # Present statistics, later documents hidden by system time.
        got = await _fulltext(db, team, branch, query, k, known_at=t_early)
        assert got == visible_order(ranked, set(late), k), k
        # The late ones and the best early ones excluded by the caller.
        excluded = sorted(late) + ranked[30:33]
        got = await _fulltext(db, team, branch, query, k, exclude=excluded)
        assert got == visible_order(ranked, set(excluded), k), k
        # A knownAt view: the statistics of then, as if the late ones never were.
        got = await _fulltext(db, team, branch, query, k, known_at=t_early, as_of=t_early)
        assert got == bm25_order(early, query)[:k], k


def _private_source(team: str, owner: str) -> dict[str, Any]:
    return {
        "kind": "source",
        "team": team,
        "id": "src-private",
        "space": f"private:{owner}",
        "type": "conversation",
        "title": "Private notes",
    }


# Many copies of the query words: the highest bounds of a space.
STRONG = "replica replica replica replica lag lag kafka"


async def test_evidence_top_k_of_both_branches_in_one_statement(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """Shared and private in one statement, the private space holding the highest
    bounds: each branch is ranked with its own statistics and its own threshold."""
    team = unique("topk-both")
    shared_docs = corpus(4, 70, "s")
    private_docs = {**corpus(5, 40, "p"), **{f"p-strong{i:02d}": STRONG for i in range(15)}}
    records = _team(team, "alice") + [_ev(team, d, t) for d, t in shared_docs.items()]
    records.append(_private_source(team, "alice"))
    records += [_ev(team, d, t, source="src-private") for d, t in private_docs.items()]
    await load_jsonl(writes, jsonl(records))
    shared = await _branch(admin_conn, team)
    private = await _branch(admin_conn, team, "alice")
    for query in ("replica lag kafka", "offset leader consumer kafka"):
        want_shared = bm25_order(shared_docs, query)
        want_private = bm25_order(private_docs, query)
        for k in (1, 3, 10, 30):
            q = CandidateQuery(team, (shared, private), query, None, (), (), k, None, None)
            async with db.tenant(team, [shared.space_id, private.space_id]) as conn:
                got = await evidence_candidates(conn, q)
            assert got[("shared", "fulltext")] == want_shared[:k], (query, k)
            assert got[("private", "fulltext")] == want_private[:k], (query, k)


async def test_evidence_top_k_in_a_reset_space_scores_few_documents(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """After a reset the old generation keeps its postings and the highest bounds; the
    list is still that of full scoring, and the statement reads only a few documents
    although most of the current generation matches (the threshold comes from the
    visible hits, so the pruning does not switch off)."""
    team = unique("topk-reset")
    old = {**corpus(6, 40, "g"), **{f"g-strong{i:02d}": STRONG for i in range(40)}}
    await load_jsonl(writes, jsonl(_team(team) + [_ev(team, d, t) for d, t in old.items()]))
    reset = {"kind": "space_reset", "team": team, "id": "r1", "space": "shared"}
    await load_jsonl(writes, jsonl([reset]))
    new = corpus(7, 600, "n")
    source = {"kind": "source", "team": team, "id": "src-2", "type": "document", "title": "N"}
    await load_jsonl(
        writes, jsonl([source] + [_ev(team, d, t, source="src-2") for d, t in new.items()])
    )
    branch = await _branch(admin_conn, team)
    assert branch.generation == 2
    query = "replica lag kafka"
    # The present statistics cover every generation of the space.
    ranked = [d for d in bm25_order({**old, **new}, query) if d in new]
    assert len(ranked) > 400  # most of the current generation matches
    for k in (1, 4, 10):
        assert await _fulltext(db, team, branch, query, k) == ranked[:k], k
    q = CandidateQuery(team, (branch,), query, None, (), (), 4, None, None)
    looked_up = await _documents_looked_up(db, team, q)
    # The old generation's invisible documents are walked past (by the first
    # floor's walk too: their IDs sort first) and those of highest bound looked
    # up again when scored; far from the 600-odd hits all the same.
    assert 4 <= looked_up <= len(ranked) // 2, looked_up


async def test_evidence_top_k_scores_few_documents_when_later_ones_are_hidden(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """A knownAt instant before the writes of highest bound: few documents scored."""
    team = unique("topk-early")
    early = corpus(8, 600, "e")
    await load_jsonl(writes, jsonl(_team(team) + [_ev(team, d, t) for d, t in early.items()]))
    t_early = await admin_conn.fetchval(
        "SELECT max(recorded_at) FROM evidence WHERE team_id = $1", team
    )
    late = {f"l{i:02d}": STRONG for i in range(40)}
    await load_jsonl(writes, jsonl([_ev(team, d, t) for d, t in late.items()]))
    branch = await _branch(admin_conn, team)
    query = "replica lag kafka"
    ranked = bm25_order({**early, **late}, query)
    hits = len(ranked)
    assert len(visible_order(ranked, set(late), 1000)) > 400
    for k in (1, 4, 10):
        got = await _fulltext(db, team, branch, query, k, known_at=t_early)
        assert got == visible_order(ranked, set(late), k), k
    q = CandidateQuery(team, (branch,), query, None, (), (), 4, t_early, None)
    looked_up = await _documents_looked_up(db, team, q)
    assert 4 <= looked_up <= hits // 3, looked_up


# --- relationship discovery ---------------------------------------------------------


def _relationships(team: str, texts: dict[str, str]) -> list[dict[str, Any]]:
    """One supported relationship per text: statement "<subject> notes <text>"."""
    out: list[dict[str, Any]] = [
        {"kind": "entity", "team": team, "id": "zebra", "name": "zebra", "type": "thing"}
    ]
    for rid, text in texts.items():
        out.append(_ev(team, f"ev-{rid}", f"Evidence for {rid}."))
        out.append(
            {
                "kind": "relationship",
                "team": team,
                "id": rid,
                "space": "shared",
                "owner": "alice",
                "subject": "zebra",
                "predicate": "notes",
                "object_value": text,
                "supports": [{"id": f"sup-{rid}", "evidence": f"ev-{rid}"}],
            }
        )
    return out


def _discovery_query(
    team: str,
    branch: BranchSearch,
    text: str,
    per_list: int,
    t: datetime,
    as_of: datetime | None = None,
) -> related.DiscoveryQuery:
    """Discovery of the full-text list only, at system and valid time ``t``."""
    return related.DiscoveryQuery(
        team_id=team,
        space_id=branch.space_id,
        generation=branch.generation,
        readable_space_ids=[branch.space_id],
        t_sys=t,
        t_valid=t,
        text=text,
        vector=None,
        per_list=per_list,
        returned_relationship_ids=[],
        known_evidence_ids=[],
        known_relationship_ids=[],
        as_of=as_of,
    )


async def _discover(
    db: Database,
    team: str,
    branch: BranchSearch,
    text: str,
    per_list: int,
    t: datetime,
    as_of: datetime | None = None,
) -> list[str]:
    q = _discovery_query(team, branch, text, per_list, t, as_of)
    async with db.tenant(team, [branch.space_id]) as conn:
        found = await related.discover(conn, q)
    return [rid for rid, _ in found.lists["fulltext"]]


async def test_discovery_top_k_is_the_top_of_full_scoring(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("topk-rel")
    early = corpus(3, 45, "r")
    records = _team(team, "alice") + _relationships(team, early)
    await load_jsonl(writes, jsonl(records))
    t_early = await admin_conn.fetchval(
        "SELECT max(recorded_at) FROM relationships WHERE team_id = $1", team
    )
    late = {f"s{i:02d}": "replica replica replica lag lag kafka" for i in range(12)}
    await load_jsonl(writes, jsonl(_relationships(team, late)))
    now = await admin_conn.fetchval("SELECT now()")
    branch = await _branch(admin_conn, team)
    # The statements as the database tokenises them: "zebra notes <text>".
    statements = {rid: f"zebra note {t}" for rid, t in {**early, **late}.items()}
    for query in ("kafka broker lag", "replica lag kafka", "offset leader"):
        ranked = bm25_order(statements, query)
        for k in (1, 3, 8, 30):
            assert await _discover(db, team, branch, query, k, now) == ranked[:k], (query, k)
            # Earlier system time: the late ones are hidden, the statistics the present's.
            got = await _discover(db, team, branch, query, k, t_early)
            assert got == visible_order(ranked, set(late), k), (query, k)
            # A knownAt view: the statistics of then, as if the late ones never were.
            got = await _discover(db, team, branch, query, k, t_early, as_of=t_early)
            early_statements = {rid: statements[rid] for rid in early}
            assert got == bm25_order(early_statements, query)[:k], (query, k)


# --- broken bounds are caught -------------------------------------------------------

# Each breaks one step of db/0085's functions (as db/0197 and db/0198 write them)
# so that it may leave out a document of the real list. The same text is in both
# functions, so each breakage applies to either (but those of EVIDENCE_ONLY); every
# one of them is replaced wherever it occurs in the function.
BREAKAGES = {
    # 1. A lexeme bound below the lexeme's real contribution.
    "lexeme bound halved": [
        ("greatest(u.idf, 0) * u.max_tf", "0.5 * greatest(u.idf, 0) * u.max_tf"),
    ],
    # A floor above the k-th best visible score (theta0, theta).
    "floor raised": [
        ("min(k.score) - 1e-9 * abs(min(k.score))", "min(k.score) * 1.3"),
    ],
    # 2. The minor-lexeme cut above the floor: lexemes whose bounds together can
    # still lift a document into the list are skipped (rest stays right).
    "minor cut above the floor": [
        (
            "l.upto < (SELECT t.v FROM theta0 t) AS minor",
            "l.upto < 2 * (SELECT t.v FROM theta0 t) AS minor",
        ),
    ],
    # 2. The rest (what the minor lexemes can add at most) below their real sum.
    "rest halved": [
        ("coalesce(max(l.upto)", "0.5 * coalesce(max(l.upto)"),
    ],
    # 3. A document bound (essential lexemes' part) below its score.
    "document bound halved": [
        ("sum(greatest(r.idf, 0) * h.tf", "0.5 * sum(greatest(r.idf, 0) * h.tf"),
    ],
    # 4. The survivors' filters on a bound below the score: their bound with the
    # rest (the whole bound when no lexeme is minor), and their whole bound.
    "final filter on half the bound": [
        ("HAVING sum(x.part) >=", "HAVING 0.5 * sum(x.part) >="),
        ("WHERE g.part + v_rest >= (SELECT t.v", "WHERE 0.5 * g.part + v_rest >= (SELECT t.v"),
    ],
    # 4. The survivors' whole bound without their minor lexemes' term parts (db/0105
    # reads those for the survivors only, apart from the essential lexemes' bound).
    "survivors' minor parts left out": [
        ("            WHERE r.minor\n        ) x", "            WHERE false\n        ) x"),
    ],
    # 3. (evidence, db/0204) The grouping's cut not checked against theta: when theta is
    # below the cut, the first try's grp lacks survivors, and its list is taken.
    "cut unguarded": [
        ("    WHERE (SELECT t.v FROM theta t) >= (SELECT c.v FROM cut c)\n", ""),
    ],
    # 3. (evidence, db/0204) The grouping keeps less than the guard assumes.
    "grouping above the cut": [
        (
            "+ v_rest >= greatest(v_theta0, (SELECT c.v FROM cut c))",
            "+ v_rest >= greatest(v_theta0, 2 * (SELECT c.v FROM cut c))",
        ),
    ],
    # 5. (evidence db/0175, relationships db/0197) Survivors taken for members of
    # best, whose scores the answer reuses, although they are not: they are
    # neither rescored nor reused.
    "best's edge lowered": [
        ("coalesce(g.part > (SELECT e.part", "coalesce(g.part > 0.5 * (SELECT e.part"),
    ],
}

# Steps that only the evidence function has: db/0204's cut.
EVIDENCE_ONLY = {"cut unguarded", "grouping above the cut"}

# Steps that exist only on the path of large spaces (a finite first floor): with
# every lexeme essential there are no minor lexemes, and the lexeme bounds and the
# rest decide nothing.
MINOR_LEXEMES_ONLY = {
    "lexeme bound halved",
    "minor cut above the floor",
    "rest halved",
    "survivors' minor parts left out",
}


# db/0204's cut, checked on cut_corpus (the corpus above never puts theta below
# the cut where it matters).
CUT_BREAKAGES = {"cut unguarded", "grouping above the cut"}

# The evidence function's cut applies below PRUNE_FROM_POSTINGS only (db/0204).
ESSENTIAL_ONLY = {"cut unguarded", "grouping above the cut"}

# The limits the broken copies are asked for.
LIMITS = (1, 3, 10, 30)


async def _broken_copy(admin_conn: Conn, function: str, breakage: str) -> str:
    """A temporary copy of ``function`` with ``breakage`` applied, on ``admin_conn``
    only; returns its name (``pg_temp.<name>``)."""
    definition = await admin_conn.fetchval(f"SELECT pg_get_functiondef('{function}'::regproc)")
    name = f"broken_{unique('f').replace('-', '_')}"
    broken = definition.replace(
        f"CREATE OR REPLACE FUNCTION public.{function}", f"CREATE FUNCTION pg_temp.{name}"
    )
    assert broken != definition
    # Every text is in the function (one query for both paths since db/0197 and
    # db/0198).
    assert all(old in broken for old, _ in BREAKAGES[breakage]), breakage
    for old, new in BREAKAGES[breakage]:
        broken = broken.replace(old, new)
    await admin_conn.execute(broken)
    return name


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
async def test_a_broken_bound_changes_the_list(
    db: Database,
    writes: WriteService,
    admin_conn: Conn,
    prune_from: int,
    breakage: str,
) -> None:
    """The lists above are compared with full scoring; this checks that such a
    comparison fails when a bound is wrong, so that the tests above could catch it.
    The broken copy runs on the admin connection (as its own temporary function);
    the real one on the same connection still gives the reference lists."""
    if breakage in MINOR_LEXEMES_ONLY and prune_from:
        pytest.skip("with every lexeme essential this step decides nothing")
    if breakage in ESSENTIAL_ONLY and not prune_from:
        pytest.skip("the cut is not applied from PRUNE_FROM_POSTINGS on")
    team = unique("topk-broken")
    docs = cut_corpus() if breakage in CUT_BREAKAGES else corpus(11, 300, "b")
    queries, limits = (CUT_QUERIES, (1, 2)) if breakage in CUT_BREAKAGES else (QUERIES, LIMITS)
    await load_jsonl(writes, jsonl(_team(team) + [_ev(team, d, t) for d, t in docs.items()]))
    branch = await _branch(admin_conn, team)
    name = await _broken_copy(admin_conn, "evidence_fulltext_top_k", breakage)

    async def fulltext(sql: str, args: Sequence[Any]) -> list[str]:
        rows = await admin_conn.fetch(sql, *args)
        return [r["evidence_id"] for r in sorted(rows, key=lambda r: r["rank"])]

    differ = 0
    try:
        for query in queries:
            ranked = bm25_order(docs, query)
            for k in limits:
                q = CandidateQuery(team, (branch,), query, None, (), (), k, None, None)
                sql, args = build_statement(q, ["fulltext"])
                assert await fulltext(sql, args) == ranked[:k], (query, k)
                got = await fulltext(
                    sql.replace("evidence_fulltext_top_k(", f"pg_temp.{name}("), args
                )
                differ += got != ranked[:k]
    finally:
        await admin_conn.execute(f"DROP FUNCTION pg_temp.{name}")
    assert differ, breakage


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
async def test_a_broken_relationship_bound_changes_the_list(
    writes: WriteService,
    admin_conn: Conn,
    prune_from: int,
    breakage: str,
) -> None:
    """The same for ``relationship_fulltext_top_k``: each breakage of its steps makes
    discovery's full-text list differ from full scoring for some question and
    ``per_list``, while the real function on the same connection matches it."""
    if breakage in MINOR_LEXEMES_ONLY and prune_from:
        pytest.skip("with every lexeme essential this step decides nothing")
    if breakage in ESSENTIAL_ONLY and not prune_from:
        pytest.skip("the cut is not applied from PRUNE_FROM_POSTINGS on")
    if breakage in EVIDENCE_ONLY:
        pytest.skip("a step of the evidence function only")
    team = unique("topk-rel-broken")
    texts = cut_corpus() if breakage in CUT_BREAKAGES else corpus(12, 240, "r")
    queries, limits = (CUT_QUERIES, (1, 2)) if breakage in CUT_BREAKAGES else (QUERIES, LIMITS)
    await load_jsonl(writes, jsonl(_team(team, "alice") + _relationships(team, texts)))
    branch = await _branch(admin_conn, team)
    now = await admin_conn.fetchval("SELECT now()")
    statements = {rid: f"zebra note {t}" for rid, t in texts.items()}
    name = await _broken_copy(admin_conn, "relationship_fulltext_top_k", breakage)

    async def fulltext(sql: str, args: Sequence[Any]) -> list[str]:
        found = related.parse_discovery(["fulltext"], await admin_conn.fetch(sql, *args))
        return [rid for rid, _ in found.lists["fulltext"]]

    differ = 0
    try:
        for query in queries:
            ranked = bm25_order(statements, query)
            for k in limits:
                q = _discovery_query(team, branch, query, k, now)
                sql, args = related.build_discovery(q)
                assert await fulltext(sql, args) == ranked[:k], (query, k)
                got = await fulltext(
                    sql.replace("relationship_fulltext_top_k(", f"pg_temp.{name}("), args
                )
                differ += got != ranked[:k]
    finally:
        await admin_conn.execute(f"DROP FUNCTION pg_temp.{name}")
    assert differ, breakage


async def test_the_functions_use_the_modules_bm25_parameters(
    admin_conn: Conn,
) -> None:
    for function in ("evidence_fulltext_top_k", "relationship_fulltext_top_k"):
        body = await admin_conn.fetchval("SELECT prosrc FROM pg_proc WHERE proname = $1", function)
        assert f"CAST({bm25.BM25_K1!r} AS double precision)" in body
        assert f"CAST({bm25.BM25_B!r} AS double precision)" in body
        assert body.count("CAST(") == body.count(
            f"CAST({bm25.BM25_K1!r} AS double precision)"
        ) + body.count(f"CAST({bm25.BM25_B!r} AS double precision)")


# --- db/0204's cut on adversarial corpora (review s22's harness) --------------------

FILLER = ["walrus", "yak", "ibis", "okapi", "tapir", "gecko", "heron", "lemur"]
ADVERSARIAL_QUERIES = [
    "kafka broker",
    "kafka kafka broker broker",  # repeated words
    "replica",
    "leader replica",
    " ".join(WORDS),  # every query lexeme
    "walrus yak kafka",
    "walrus yak ibis okapi",  # common words only
    "offset leader",
]


def adversarial_corpus(seed: int, n: int, prefix: str) -> dict[str, str]:
    """Texts that put theta below db/0204's cut: very short ones, long ones (one to
    three query words among 30 to 200 filler words), one query word repeated 2 to
    25 times, mixed ones, and a copy of every fifth (ties at every depth)."""
    rng = random.Random(seed)
    weights = [8, 6, 5, 4, 3, 2, 1, 1]
    texts: dict[str, str] = {}
    for i in range(n):
        shape = rng.random()
        if shape < 0.25:
            words = rng.choices(WORDS, weights, k=rng.randint(1, 2))
        elif shape < 0.5:
            words = rng.choices(WORDS, weights, k=rng.randint(1, 3))
            words += rng.choices(FILLER, k=rng.randint(30, 200))
        elif shape < 0.7:
            words = [rng.choice(WORDS)] * rng.randint(2, 25)
            words += rng.choices(FILLER, k=rng.randint(0, 40))
        else:
            words = rng.choices(WORDS + FILLER, k=rng.randint(1, 15))
        rng.shuffle(words)
        texts[f"{prefix}{i:03d}"] = " ".join(words)
    for i in range(0, n, 5):
        texts[f"{prefix}{i:03d}-copy"] = texts[f"{prefix}{i:03d}"]
    return texts


async def test_evidence_top_k_on_adversarial_texts_and_views(
    db: Database, writes: WriteService, admin_conn: Conn, prune_from: int
) -> None:
    """The evidence list equals BM25 over every document on texts and views that
    make db/0204's first try fail (a short best text against a rare lexeme held
    mostly by long ones, repeated words, ties, exclusions of the best, knownAt
    views, ``per_list`` above the number of hits), on both paths. Below
    PRUNE_FROM_POSTINGS an instrumented copy shows that the second try ran for
    some of these calls and a copy without the guard gives some wrong list, so
    the comparison can fail."""
    team = unique("topk-adversarial")
    early = adversarial_corpus(1, 160, "e")
    await load_jsonl(writes, jsonl(_team(team) + [_ev(team, d, t) for d, t in early.items()]))
    t_early = await admin_conn.fetchval(
        "SELECT max(recorded_at) FROM evidence WHERE team_id = $1", team
    )
    late = adversarial_corpus(101, 60, "l")
    await load_jsonl(writes, jsonl([_ev(team, d, t) for d, t in late.items()]))
    docs = {**early, **late}
    branch = await _branch(admin_conn, team)
    definition = await admin_conn.fetchval(
        "SELECT pg_get_functiondef('evidence_fulltext_top_k'::regproc)"
    )
    copies = {}
    for kind, old, new in (
        (
            "counted",
            "    v_cut := false;\n",
            "    RAISE NOTICE 'second try';\n    v_cut := false;\n",
        ),
        ("unguarded", "    WHERE (SELECT t.v FROM theta t) >= (SELECT c.v FROM cut c)\n", ""),
    ):
        name = f"{kind}_{unique('f').replace('-', '_')}"
        assert old in definition, kind
        copy = definition.replace(
            "CREATE OR REPLACE FUNCTION public.evidence_fulltext_top_k",
            f"CREATE FUNCTION pg_temp.{name}",
        ).replace(old, new)
        await admin_conn.execute(copy)
        copies[kind] = name
    notices: list[str] = []
    admin_conn.add_log_listener(lambda _conn, message: notices.append(message.message))

    async def fulltext(sql: str, args: Sequence[Any], copy: str | None = None) -> list[str]:
        if copy is not None:
            sql = sql.replace("evidence_fulltext_top_k(", f"pg_temp.{copies[copy]}(")
        rows = await admin_conn.fetch(sql, *args)
        return [r["evidence_id"] for r in sorted(rows, key=lambda r: r["rank"])]

    rng = random.Random(7)
    unguarded_wrong = 0
    try:
        for query in ADVERSARIAL_QUERIES:
            ranked = bm25_order(docs, query)
            for k in (1, 2, 3, 5, 8, 13, 40, 150, 1000):
                for view in ("present", "knownAt", "exclude", "asOf"):
                    known = t_early if view in ("knownAt", "asOf") else None
                    as_of = t_early if view == "asOf" else None
                    exclude = tuple(ranked[: rng.randint(1, 3 * k)]) if view == "exclude" else ()
                    if view == "present":
                        expected = ranked[:k]
                    elif view == "exclude":
                        expected = visible_order(ranked, set(exclude), k)
                    elif view == "knownAt":
                        expected = visible_order(ranked, set(late), k)
                    else:
                        expected = bm25_order(early, query)[:k]
                    q = CandidateQuery(team, (branch,), query, None, (), exclude, k, known, as_of)
                    sql, args = build_statement(q, ["fulltext"])
                    assert await fulltext(sql, args) == expected, (query, k, view)
                    assert await fulltext(sql, args, "counted") == expected, (query, k, view)
                    unguarded_wrong += await fulltext(sql, args, "unguarded") != expected
    finally:
        for name in copies.values():
            await admin_conn.execute(f"DROP FUNCTION pg_temp.{name}")
    if prune_from:  # below the threshold: the cut and both tries decided
        assert "second try" in notices
        assert unguarded_wrong
