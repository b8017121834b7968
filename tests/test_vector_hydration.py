"""Vector candidates that cannot reach the answer are not hydrated.

A recall of a new question reads its full-text and entity lists, with their
hydration, in the scope round, and its vector lists after the query embedding
(docs/recall.md, "Cost"). A vector candidate that no earlier list holds scores
``1 / (60 + rank)`` in its branch's fusion; once ``limit`` eligible candidates
of the earlier lists score more than that, it cannot be among the branch's
results, so the vector round hydrates only the vector candidates ranked up to
that point (``services/evidence.py``, ``vector_hydration_bounds``).

A question whose embedding is known sends every list in one statement; there
the bound is computed in SQL from the other lists' eligible candidates
(``round_trips._VECTOR_BOUNDS``, floats: never below the exact bound).

Checked here: against fusion itself, on random lists (the answer and the
starved flag from the hydrated candidates only equal those from every
candidate's eligibility); the SQL bound against the exact one on the same
lists; and on the real PostgreSQL through the gateway, for both paths (the
candidates below the bound are left unhydrated, and the answers equal those of
hydrating them all, for several limits, known IDs and both branches).
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from gateway.fusion import EVIDENCE_WEIGHTS, RRF_K, fuse_weighted
from gateway.services import recall as recall_service
from gateway.services.evidence import vector_hydration_bounds
from gateway.services.writes import WriteService
from gateway.store import round_trips
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl
from .test_conflicts import ownership_case
from .test_recall import more_evidence, recall, token


def _answer(
    lists: dict[tuple[str, str], list[str]],
    eligible: set[str],
    branch: str,
    known: set[str],
    limit: int,
) -> tuple[list[str], bool]:
    """A branch's results and whether it has fewer than ``limit`` eligible, as
    search_evidence computes them."""
    fused = fuse_weighted(
        {name: ids for (b, name), ids in lists.items() if b == branch}, known=known
    )
    kept = [i for i in fused if i in eligible]
    return kept[:limit], len(kept) < limit


def _case(
    seed: int,
) -> tuple[dict[tuple[str, str], list[str]], set[str], set[str], int]:
    """Random lists of two branches, eligibility, known IDs and a limit."""
    rng = random.Random(seed)
    pool = [f"ev-{i:03d}" for i in range(rng.choice([8, 30, 90]))]
    limit = rng.choice([1, 2, 3, 5, 10])
    per_list = 4 * limit + 20
    known = set(rng.sample(pool, rng.choice([0, 0, 1, 3])))
    eligible = {i for i in pool if rng.random() < rng.choice([0.2, 0.7, 1.0])}
    lists: dict[tuple[str, str], list[str]] = {}
    home = {i: rng.choice(["shared", "private"]) for i in pool}  # one space per evidence
    for branch in ("shared", "private"):
        mine = [i for i in pool if home[i] == branch]
        # The vector list mostly finds other evidence than the earlier lists (as
        # on the benchmark's data), and sometimes the same.
        cut = rng.randint(0, len(mine))
        overlap = rng.choice([0.0, 0.1, 0.5])
        for name in ("fulltext", "entity", "vector"):
            if name != "vector" and rng.random() < 0.3:
                continue
            own = mine[cut:] if name == "vector" else mine[:cut]
            other = mine[:cut] if name == "vector" else mine[cut:]
            found = own + [i for i in other if rng.random() < overlap]
            picked = rng.sample(found, min(len(found), rng.randint(0, per_list)))
            if name == "vector" and rng.random() < 0.5:
                picked = [i for i in picked if i not in known]  # as the SQL excludes them
            if name != "vector" and picked and rng.random() < 0.2:
                picked.insert(rng.randrange(len(picked)), picked[0])  # a repeat
            lists[branch, name] = picked  # (a vector list never repeats an ID: its table's key)
    return lists, eligible, known, limit


def _hydrated(
    lists: dict[tuple[str, str], list[str]], eligible: set[str], known: set[str], limit: int
) -> set[str]:
    """The candidates a recall hydrates: every one of the earlier lists, and the
    vector lists' up to their bounds."""
    early = {k: v for k, v in lists.items() if k[1] != "vector"}
    hydrated = {i for ids in early.values() for i in ids}
    bounds = vector_hydration_bounds(
        early, eligible & hydrated, ["shared", "private"], known, limit
    )
    for (branch, name), ids in lists.items():
        if name == "vector":
            # As the SQL filter: the bound plus the known IDs the list holds.
            bound = bounds.get(branch, len(ids)) + len(set(ids) & known)
            hydrated |= {i for rank, i in enumerate(ids, start=1) if rank <= bound}
    return hydrated


@pytest.mark.parametrize("seed", range(400))
def test_the_bound_changes_no_answer(seed: int) -> None:
    lists, eligible, known, limit = _case(seed)
    hydrated = _hydrated(lists, eligible, known, limit)
    for branch in ("shared", "private"):
        assert _answer(lists, eligible & hydrated, branch, known, limit) == _answer(
            lists, eligible, branch, known, limit
        ), (seed, branch)


def test_the_bound_is_the_last_rank_that_can_reach_the_answer() -> None:
    # Two eligible full-text candidates at ranks 1 and 2: a vector-only candidate
    # at rank 2 scores 1/62, equal to the second one (its ID could win the tie),
    # at rank 3 1/63, below it.
    lists = {("shared", "fulltext"): ["a", "b", "c"]}
    assert vector_hydration_bounds(lists, {"a", "b"}, ["shared"], (), 2) == {"shared": 2}
    # One eligible candidate at rank 1 and limit 1: the vector list's first may
    # tie it (1/61) and win on its ID, and must be hydrated.
    first = {("shared", "fulltext"): ["b"]}
    assert vector_hydration_bounds(first, {"b"}, ["shared"], (), 1) == {"shared": 1}
    both_lists = {**first, ("shared", "vector"): ["a", "c"]}
    hydrated = _hydrated(both_lists, {"a", "b", "c"}, set(), 1)
    assert hydrated == {"a", "b"}
    assert _answer(both_lists, {"a", "b"}, "shared", set(), 1) == (["a"], False)
    # Fewer than `limit` eligible: every vector candidate may count.
    assert vector_hydration_bounds(lists, {"a"}, ["shared"], (), 2) == {}
    # A known ID leaves every list first (ranks move up): b and c rank 1 and 2.
    assert vector_hydration_bounds(lists, {"b", "c"}, ["shared"], {"a"}, 2) == {"shared": 2}
    # A repeat keeps its first rank, and the items after it move up.
    again = {("shared", "fulltext"): ["a", "a", "b"]}
    assert vector_hydration_bounds(again, {"a", "b"}, ["shared"], (), 2) == {"shared": 2}
    # Entity expansion counts half: 1/2 / 61 is below 1/62, so no vector
    # candidate at all can pass a candidate found by both lists ...
    both = {("shared", "fulltext"): ["a"], ("shared", "entity"): ["a"]}
    assert vector_hydration_bounds(both, {"a"}, ["shared"], (), 1) == {"shared": 0}
    # ... and a branch whose earlier lists found nothing has no bound.
    assert vector_hydration_bounds(both, {"a"}, ["shared", "private"], (), 1) == {"shared": 0}


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 10])
@pytest.mark.parametrize("known_above", [False, True])
@pytest.mark.parametrize("vector_first", [False, True])
def test_a_tie_at_the_bound_keeps_its_answer(
    limit: int, known_above: bool, vector_first: bool
) -> None:
    """The limit-th full-text candidate and the vector list's candidate at the
    bound score the same (1/(60 + limit)); the lower ID wins, whichever it is."""
    text = [f"ev-m-{i:02d}" for i in range(limit + 5)]
    vector = [f"ev-{'a' if vector_first else 'z'}-{i:02d}" for i in range(30)]
    known = {"ev-m-known"} if known_above else set()
    if known_above:
        text.insert(0, "ev-m-known")
        vector.insert(limit // 2, "ev-m-known")  # as if a list kept it
    lists = {("shared", "fulltext"): text, ("shared", "vector"): vector}
    eligible = set(text) | set(vector)
    hydrated = _hydrated(lists, eligible, known, limit)
    assert _answer(lists, eligible & hydrated, "shared", known, limit) == _answer(
        lists, eligible, "shared", known, limit
    )
    early = {("shared", "fulltext"): text}
    assert vector_hydration_bounds(early, set(text), ["shared"], known, limit) == {"shared": limit}
    if limit == 1:  # the tie decides the answer: the lower ID
        kept, _ = _answer(lists, eligible, "shared", known, limit)
        assert (kept[0] in vector) == vector_first


def _unrelated(team: str, n: int, *, space: str = "shared") -> list[dict[str, Any]]:
    """n supported evidence fragments that share no word with the question: the
    vector list finds them, the full-text list does not."""
    suffix = "" if space == "shared" else "-" + space.replace(":", "-")
    src, ent = f"src-menu{suffix}", f"ent-menu{suffix}"
    out: list[dict[str, Any]] = [
        {
            "kind": "source",
            "team": team,
            "id": src,
            "space": space,
            "type": "document",
            "title": "Menus",
        },
        {
            "kind": "entity",
            "team": team,
            "id": ent,
            "space": space,
            "name": "Menu",
            "type": "system",
        },
    ]
    for i in range(n):
        out.append(
            {
                "kind": "evidence",
                "team": team,
                "id": f"ev-menu{suffix}-{i:03d}",
                "source": src,
                "content": f"Cafeteria menu {i}: tomato soup with bread on Tuesday.",
            }
        )
        out.append(
            {
                "kind": "relationship",
                "team": team,
                "id": f"rel-menu{suffix}-{i:03d}",
                "space": space,
                "subject": ent,
                "predicate": "serves",
                "object_value": str(i),
                "owner": "alice",
                "supports": [
                    {"id": f"sup-menu{suffix}-{i:03d}", "evidence": f"ev-menu{suffix}-{i:03d}"}
                ],
            }
        )
    return out


async def test_the_vector_round_hydrates_only_what_can_reach_the_answer(
    client: httpx.AsyncClient,
    gateway_app: Starlette,
    writes: WriteService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    team = unique("vh")
    records = (
        ownership_case(team)
        + more_evidence(team, 12)
        + _unrelated(team, 14)
        + more_evidence(team, 6, space="private:alice")
        + _unrelated(team, 8, space="private:alice")
    )
    await load_jsonl(writes, jsonl(records))
    tok = await token(writes, team, "alice")
    service = gateway_app.state.services.recall
    question = "who owns the billing service and its invoices"

    rounds: list[tuple[Any, dict[str, Any], Any]] = []
    real = round_trips.first_round

    async def spy(conn: Any, candidates: Any, t_valid: Any, discovery: Any, **kw: Any) -> Any:
        got = await real(conn, candidates, t_valid, discovery, **kw)
        rounds.append((candidates, kw, got))
        return got

    monkeypatch.setattr(round_trips, "first_round", spy)

    async def fresh(**variables: Any) -> dict[str, Any]:
        # A new question each time (the LRU emptied): the scope round, then the vector round.
        monkeypatch.setattr(service.embeddings, "_cache", type(service.embeddings._cache)())
        rounds.clear()
        got = await recall(client, tok, q=question, **variables)
        for key in ("recallId", "recallEventId", "suggestedActions"):
            got.pop(key, None)
        return got

    skipped = 0
    cases: list[dict[str, Any]] = [
        {"limit": 1},
        {"limit": 2},
        {"limit": 5},
        {"limit": 2, "with_known": True},
    ]
    for variables in cases:
        if variables.pop("with_known", False):
            first = await fresh(limit=2)
            variables["known"] = [r["evidenceId"] for r in first["results"]]
        got = await fresh(**variables)
        [(_, kw, late)] = [r for r in rounds if r[0].text is None]  # the vector round
        bounds = kw.get("vector_ranks") or {}
        for (branch, name), ids in late.lists.items():
            assert name == "vector"
            bound = bounds.get(branch, len(ids))
            below = {i for rank, i in enumerate(ids, start=1) if rank > bound}
            below -= set(kw["checked"])
            assert not below & set(late.eligible), (branch, bound)
            skipped += len(below)
        # The answer of hydrating every vector candidate.
        monkeypatch.setattr(recall_service, "vector_hydration_bounds", lambda *a, **k: {})
        every = await fresh(**variables)
        monkeypatch.setattr(recall_service, "vector_hydration_bounds", vector_hydration_bounds)
        assert got == every and got["results"], variables
    # Eligible vector candidates below the bound (the menu notes) were there to skip.
    assert skipped > 0


@pytest.mark.parametrize("seed", range(60))
async def test_the_statements_bound_is_never_below_the_exact_one(db: Database, seed: int) -> None:
    """The bound a statement that holds every list computes in SQL (floats, and
    the lists' own ranks) against the exact one: never below it (a candidate that
    can reach the answer is always hydrated), and at most one rank above it when
    no known ID or repeat moves the ranks."""
    lists, eligible, known, limit = _case(seed)
    rows = [
        (branch, name, rank, item)
        for (branch, name), ids in lists.items()
        for rank, item in enumerate(ids, start=1)
    ]
    early = {k: v for k, v in lists.items() if k[1] != "vector"}
    early_ids = {i for ids in early.values() for i in ids}
    bound = round_trips.VectorBound(limit, EVIDENCE_WEIGHTS, RRF_K)
    names = list(bound.weights)
    sql = (
        "WITH cands AS (SELECT * FROM unnest($6::text[], $7::text[], $8::bigint[], $9::text[])"
        " AS c (branch, list_name, rank, evidence_id)),\n"
        "hyd_early AS (SELECT x.id FROM unnest($10::text[]) AS x (id))\n"
        + round_trips._VECTOR_BOUNDS
    )
    async with db.pool.acquire() as conn:
        got = await conn.fetch(
            sql,
            limit,
            sorted(known),
            names,
            [bound.weights[n] for n in names],
            float(bound.k),
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            [r[3] for r in rows],
            sorted(eligible & early_ids),
        )
    in_sql = {r["branch"]: r["r"] for r in got}
    exact = vector_hydration_bounds(
        early, eligible & early_ids, ["shared", "private"], known, limit
    )
    assert set(in_sql) == set(exact), (in_sql, exact)
    for branch, r in exact.items():
        # Both as ranks of the list itself: plus the known IDs it holds.
        r += len(set(lists.get((branch, "vector"), [])) & known)
        assert in_sql[branch] >= r, (branch, in_sql, exact)
        moved = known & early_ids or any(len(set(ids)) < len(ids) for ids in early.values())
        if not moved:
            assert in_sql[branch] <= r + 1, (branch, in_sql, exact)


async def test_a_repeated_question_hydrates_only_what_can_reach_the_answer(
    client: httpx.AsyncClient,
    gateway_app: Starlette,
    writes: WriteService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one statement of a question whose embedding is known (the LRU): the
    scope round with every list, its vector candidates bounded in SQL."""
    team = unique("vh1")
    records = (
        ownership_case(team)
        + more_evidence(team, 12)
        + _unrelated(team, 14)
        + more_evidence(team, 6, space="private:alice")
        + _unrelated(team, 8, space="private:alice")
    )
    await load_jsonl(writes, jsonl(records))
    tok = await token(writes, team, "alice")
    question = "who owns the billing service and its invoices"

    rounds: list[Any] = []
    real = round_trips.scope_round

    async def spy(
        conn: Any, scope: Any, candidates: Any, discovery: Any, *rest: Any, **kw: Any
    ) -> Any:
        got = await real(conn, scope, candidates, discovery, *rest, **kw)
        rounds.append(got)
        return got

    monkeypatch.setattr(round_trips, "scope_round", spy)

    async def again(**variables: Any) -> dict[str, Any]:
        await recall(client, tok, q=question, **variables)  # the embedding is then known
        rounds.clear()
        got = await recall(client, tok, q=question, **variables)
        for key in ("recallId", "recallEventId", "suggestedActions"):
            got.pop(key, None)
        return got

    skipped = 0
    cases: list[dict[str, Any]] = [
        {"limit": 1},
        {"limit": 2},
        {"limit": 5},
        {"limit": 2, "with_known": True},
    ]
    for variables in cases:
        if variables.pop("with_known", False):
            first = await again(limit=2)
            variables["known"] = [r["evidenceId"] for r in first["results"]]
        got = await again(**variables)
        [scope] = rounds
        assert scope.first is not None
        lists = scope.first.lists
        assert any(name == "vector" for _, name in lists)
        early = {k: v for k, v in lists.items() if k[1] != "vector"}
        early_ids = {i for ids in early.values() for i in ids}
        for (_, name), ids in lists.items():
            if name == "vector":
                late = [i for i in ids if i not in early_ids]
                skipped += sum(1 for i in late if i not in scope.first.eligible)
        # The answer of hydrating every candidate (no vector bound; the support
        # paths' groups still asked for, when discovery runs beside the unit).
        monkeypatch.setattr(
            round_trips, "scope_round", lambda c, s, cq, d, *rest, **kw: spy(c, s, cq, d, **kw)
        )
        every = await again(**variables)
        monkeypatch.setattr(round_trips, "scope_round", spy)
        assert got == every and got["results"], variables
    # Eligible vector candidates (the menu notes) left unhydrated.
    assert skipped > 0


def _gazpacho(team: str, n: int) -> list[dict[str, Any]]:
    """A note about the cold server room and n about gazpacho (IDs below it): the
    question "cold tomato soup" finds the first by full text, the others by
    vector."""
    out: list[dict[str, Any]] = [
        {
            "kind": "source",
            "team": team,
            "id": "src-k",
            "space": "shared",
            "type": "document",
            "title": "Kitchen",
        },
        {"kind": "entity", "team": team, "id": "ent-k", "space": "shared", "name": "Kitchen"},
    ]
    texts = {"ev-z-cold": "The server room runs cold at night; check the thermostat."}
    for i in range(n):
        texts[f"ev-a-gaz-{i:02d}"] = f"Gazpacho number {i}: a chilled Andalusian blended dish."
    for i, (ident, text) in enumerate(texts.items()):
        out.append(
            {"kind": "evidence", "team": team, "id": ident, "source": "src-k", "content": text}
        )
        out.append(
            {
                "kind": "relationship",
                "team": team,
                "id": f"rel-k-{i:02d}",
                "space": "shared",
                "subject": "ent-k",
                "predicate": "notes",
                "object_value": str(i),
                "owner": "alice",
                "supports": [{"id": f"sup-k-{i:02d}", "evidence": ident}],
            }
        )
    return out


async def test_a_tie_at_the_bound_through_the_gateway(
    client: httpx.AsyncClient,
    gateway_app: Starlette,
    writes: WriteService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """limit 1: the full-text list's first and the vector list's first both score
    1/61, and the lower ID is the answer. The bound is 1 and that vector
    candidate is hydrated, in the vector round (a new question) and in the one
    statement of a repeated question: a bound one lower, or a strict rank test
    in either SQL filter, answers the other one."""
    team = unique("vt")
    await load_jsonl(writes, jsonl(ownership_case(team) + _gazpacho(team, 30)))
    tok = await token(writes, team, "alice", "shared_only")
    service = gateway_app.state.services.recall
    scopes: list[Any] = []
    firsts: list[tuple[dict[str, Any], Any]] = []
    real_scope, real_first = round_trips.scope_round, round_trips.first_round

    async def scope_spy(*args: Any, **kw: Any) -> Any:
        got = await real_scope(*args, **kw)
        scopes.append(got)
        return got

    async def first_spy(*args: Any, **kw: Any) -> Any:
        got = await real_first(*args, **kw)
        firsts.append((kw, got))
        return got

    monkeypatch.setattr(round_trips, "scope_round", scope_spy)
    monkeypatch.setattr(round_trips, "first_round", first_spy)
    monkeypatch.setattr(service.embeddings, "_cache", type(service.embeddings._cache)())
    new = await recall(client, tok, q="cold tomato soup", limit=1)
    [scope] = scopes
    [(kw, late)] = firsts
    assert scope.first is not None
    text = scope.first.lists["shared", "fulltext"]
    vector = late.lists["shared", "vector"]
    assert text and vector and vector[0] not in text and text[0] not in vector[:1]
    assert text[0] in scope.first.eligible
    # The wiring: the bound from the scope round's lists, eligibility, limit, known IDs.
    expected = vector_hydration_bounds(scope.first.lists, scope.first.eligible, ["shared"], (), 1)
    assert kw["vector_ranks"] == expected == {"shared": 1}
    assert vector[0] in late.eligible
    winner = min(text[0], vector[0])  # equal scores: the lower ID
    assert vector[0] == winner  # the gazpacho notes sort before ev-z-cold
    assert [r["evidenceId"] for r in new["results"]] == [winner]
    # The same question again: its embedding is known, every list in one statement.
    scopes.clear()
    firsts.clear()
    again = await recall(client, tok, q="cold tomato soup", limit=1)
    [scope] = scopes
    assert not firsts and scope.first is not None
    assert scope.first.lists["shared", "vector"][0] == winner
    assert winner in scope.first.eligible
    assert [r["evidenceId"] for r in again["results"]] == [winner]
