"""The pruned BM25 top-k (gateway/store/bm25.py) against full scoring, on the real database.

Both full-text lists score only the hits whose bound can reach the ``k``-th
best visible score. These tests give them corpora where most documents hit,
``per_list`` far below the number of hits (so the pruning decides), exact
ties at the cut, and views in which the hits of highest bound are not visible
(excluded, recorded later, or of another team), and compare every list with
BM25 computed here over every document.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from gateway.services.writes import WriteService
from gateway.store import related
from gateway.store.database import Database
from gateway.store.search import BranchSearch, CandidateQuery, evidence_candidates

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
        return (await evidence_candidates(conn, q))[("shared", "fulltext")]


async def test_evidence_top_k_is_the_top_of_full_scoring(
    db: Database, writes: WriteService, admin_conn: asyncpg.Connection
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
    db: Database, writes: WriteService, admin_conn: asyncpg.Connection
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


async def _discover(
    db: Database, team: str, branch: BranchSearch, text: str, per_list: int, t: datetime
) -> list[str]:
    q = related.DiscoveryQuery(
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
    )
    async with db.tenant(team, [branch.space_id]) as conn:
        found = await related.discover(conn, q)
    return [rid for rid, _ in found.lists["fulltext"]]


async def test_discovery_top_k_is_the_top_of_full_scoring(
    db: Database, writes: WriteService, admin_conn: asyncpg.Connection
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
