"""The hypothesis frontier of recallMemory, against the real database.

Which hypotheses (linked to the answer, matched lexically), which statuses,
the fused order, the limit, never support, other teams, and the two
degradations (knownAt view, store failure).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.applications import Starlette

from gateway.services.writes import WriteService
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token

RECALL = """
query Recall($q: String, $hl: Int, $knownAt: DateTime, $validAt: DateTime, $rl: Int,
             $limit: Int) {
  recallMemory(query: $q, hypothesisLimit: $hl, knownAt: $knownAt, validAt: $validAt,
               relationshipLimit: $rl, limit: $limit) {
    relatedRelationships { representativeId }
    results { evidenceId spaceKind }
    relatedHypotheses {
      __typename id statement status origin sourceRelationshipIds sourceEvidenceIds
    }
    degradations { frontier code optional }
    searchStates { hypotheses { status complete lists { spaceKind list status candidates } } }
  }
}
"""


async def recall(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    r = await client.post(
        "/graphql",
        json={"query": RECALL, "variables": variables},
        headers={"Authorization": f"Bearer {tok}"},
    )
    body = r.json()
    assert "errors" not in body, body
    result: dict[str, Any] = body["data"]["recallMemory"]
    return result


def hyp_degradations(result: dict[str, Any]) -> list[dict[str, Any]]:
    """This frontier's degradations (other frontiers degrade on their own)."""
    return [d for d in result["degradations"] if d["frontier"] == "HYPOTHESES"]


def hyp_ids(result: dict[str, Any]) -> list[str]:
    return [h["id"] for h in result["relatedHypotheses"]]


def hypothesis(team: str, id_: str, statement: str, **links: list[str]) -> dict[str, Any]:
    return {"kind": "hypothesis", "team": team, "id": id_, "statement": statement, **links}


def feedback(team: str, id_: str, hyp: str, decision: str) -> dict[str, Any]:
    return {
        "kind": "hypothesis_feedback",
        "team": team,
        "id": id_,
        "hypothesis": hyp,
        "decision": decision,
    }


def scenario(team: str) -> list[dict[str, Any]]:
    """Hypotheses around "who owns the billing service" (ev-owner, rel-owner)."""
    return [
        *team_records(team),
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-hunch",
            "source": "src-handbook",
            "content": "Maybe the billing outage came from the payments deploy.",
        },
        hypothesis(team, "h-ev", "Quokka ribbon lantern.", evidence=["ev-owner"]),
        hypothesis(team, "h-rel", "Walrus velvet compass.", relationships=["rel-owner"]),
        hypothesis(team, "h-lex", "The billing service might be owned by several teams."),
        hypothesis(
            team,
            "h-both",
            "Payments team owns billing service.",
            evidence=["ev-hunch"],
            relationships=["rel-owner"],
        ),
        hypothesis(team, "h-rejected", "Billing service owned by payments.", evidence=["ev-owner"]),
        hypothesis(team, "h-stale", "Billing service owned by payments.", evidence=["ev-owner"]),
        hypothesis(team, "h-confirmed", "Otter.", relationships=["rel-owner"]),
        hypothesis(team, "h-reopened", "Heron.", relationships=["rel-owner"]),
        hypothesis(team, "h-unrelated", "Penguin marble thunder."),
    ]


def decisions(team: str) -> list[dict[str, Any]]:
    return [
        feedback(team, "f1", "h-rejected", "reject"),
        feedback(team, "f2", "h-stale", "mark_stale"),
        feedback(team, "f3", "h-confirmed", "confirm"),
        feedback(team, "f4", "h-reopened", "reject"),
        feedback(team, "f5", "h-reopened", "reopen"),
    ]


async def loaded(writes: WriteService) -> str:
    team, other = unique("hy"), unique("hyo")
    await load_jsonl(
        writes,
        jsonl(
            scenario(team)
            + scenario(other)
            + [hypothesis(other, "h-other-team", "Who owns the billing service?")]
        ),
    )
    await load_jsonl(writes, jsonl(decisions(team)))
    return team


Q = "who owns the billing service"


async def test_linked_and_lexical_hypotheses_in_fused_order(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = await loaded(writes)
    alice = await token(writes, team, "alice")
    result = await recall(client, alice, q=Q, hl=20)
    shared = [r["evidenceId"] for r in result["results"] if r["spaceKind"] == "SHARED"]
    assert shared == ["ev-owner"]  # the only supported shared evidence: reach 1 for all links
    # linked (reach 1, then ID): h-both, h-confirmed, h-ev, h-rel, h-reopened
    # lexical (query lexemes own, bill, servic matched: 3 each, then ID): h-both, h-lex
    # RRF k=60: h-both 2/61; h-confirmed and h-lex 1/62 (tie: ID); h-ev 1/63;
    # h-rel 1/64; h-reopened 1/65. Rejected, stale, unrelated and the other
    # team's hypotheses are absent.
    assert hyp_ids(result) == ["h-both", "h-confirmed", "h-lex", "h-ev", "h-rel", "h-reopened"]
    by_id = {h["id"]: h for h in result["relatedHypotheses"]}
    assert by_id["h-both"] == {
        "__typename": "Hypothesis",
        "id": "h-both",
        "statement": "Payments team owns billing service.",
        "status": "PROPOSED",
        "origin": "dreaming",
        "sourceRelationshipIds": ["rel-owner"],
        "sourceEvidenceIds": ["ev-hunch"],
    }
    assert by_id["h-confirmed"]["status"] == "CONFIRMED"
    assert by_id["h-reopened"]["status"] == "PROPOSED"
    # Never support: the hypothesis' evidence is not a result.
    assert "ev-hunch" not in [r["evidenceId"] for r in result["results"]]
    state = result["searchStates"]["hypotheses"]
    assert state["status"] == "COMPLETE" and state["complete"] is True
    assert state["lists"] == [
        {"spaceKind": "SHARED", "list": "LINKED", "status": "COMPLETE", "candidates": 5},
        {"spaceKind": "SHARED", "list": "FULLTEXT", "status": "COMPLETE", "candidates": 2},
    ]
    assert hyp_degradations(result) == []
    # The default limit (5) cuts the same order.
    assert hyp_ids(await recall(client, alice, q=Q)) == hyp_ids(result)[:5]
    # Status is read from the feedback history: a rejection hides, a reopening shows.
    await load_jsonl(writes, jsonl([feedback(team, "f6", "h-both", "reject")]))
    assert "h-both" not in hyp_ids(await recall(client, alice, q=Q, hl=20))
    await load_jsonl(writes, jsonl([feedback(team, "f7", "h-both", "reopen")]))
    assert "h-both" in hyp_ids(await recall(client, alice, q=Q, hl=20))


async def test_source_evidence_listed_only_while_readable(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = await loaded(writes)
    alice = await token(writes, team, "alice", "shared_only")
    await load_jsonl(
        writes,
        jsonl(
            [
                {
                    "kind": "evidence_lifecycle",
                    "team": team,
                    "id": "wd",
                    "evidence": "ev-hunch",
                    "status": "withdrawn",
                }
            ]
        ),
    )
    by_id = {h["id"]: h for h in (await recall(client, alice, q=Q))["relatedHypotheses"]}
    assert by_id["h-both"]["sourceEvidenceIds"] == []
    assert by_id["h-both"]["sourceRelationshipIds"] == ["rel-owner"]


async def test_temporal_view_and_disabled(client: httpx.AsyncClient, writes: WriteService) -> None:
    team = await loaded(writes)
    bob = await token(writes, team, "bob")
    await asyncio.sleep(0.02)
    past = await recall(client, bob, q=Q, knownAt=datetime.now(UTC).isoformat())
    assert past["relatedHypotheses"] == []
    assert "ev-owner" in [r["evidenceId"] for r in past["results"]]
    assert hyp_degradations(past) == [
        {
            "frontier": "HYPOTHESES",
            "code": "related_hypotheses_temporal_not_supported",
            "optional": True,
        }
    ]
    assert past["searchStates"]["hypotheses"]["status"] == "SKIPPED"
    assert past["searchStates"]["hypotheses"]["complete"] is False
    # A real-world view alone is not a system-time view: hypotheses answer.
    valid = await recall(client, bob, q=Q, validAt="2026-01-01T00:00:00Z")
    assert hyp_degradations(valid) == [] and hyp_ids(valid)
    off = await recall(client, bob, q=Q, hl=0)
    assert off["relatedHypotheses"] == [] and hyp_degradations(off) == []
    assert off["searchStates"]["hypotheses"]["status"] == "DISABLED"


async def test_without_query_only_linked_hypotheses(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = await loaded(writes)
    bob = await token(writes, team, "bob")
    r = await client.post(
        "/graphql",
        json={
            "query": '{ recallMemory(expandFromEntityIds: ["payments-team"], hypothesisLimit: 20)'
            " { relatedHypotheses { id } searchStates { hypotheses { lists { list status } } } } }"
        },
        headers={"Authorization": f"Bearer {bob}"},
    )
    result = r.json()["data"]["recallMemory"]
    assert [h["id"] for h in result["relatedHypotheses"]] == [
        "h-both",
        "h-confirmed",
        "h-ev",
        "h-rel",
        "h-reopened",
    ]
    assert result["searchStates"]["hypotheses"]["lists"] == [
        {"list": "LINKED", "status": "COMPLETE"},
        {"list": "FULLTEXT", "status": "SKIPPED"},
    ]


async def test_store_failure_degrades(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService, db: Database
) -> None:
    """A real fault: the hypotheses table is locked past the lock timeout."""
    team = await loaded(writes)
    alice = await token(writes, team, "alice")
    services = gateway_app.state.services
    services.db.lock_timeout = "300ms"
    ready, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with db.pool.acquire() as conn, conn.transaction():
            await conn.execute("LOCK TABLE hypotheses IN ACCESS EXCLUSIVE MODE")
            ready.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    try:
        await ready.wait()
        result = await recall(client, alice, q=Q)
    finally:
        release.set()
        await holder
        services.db.lock_timeout = "2s"
    assert "ev-owner" in [r["evidenceId"] for r in result["results"]]
    assert result["relatedHypotheses"] == []
    assert hyp_degradations(result) == [
        {"frontier": "HYPOTHESES", "code": "related_hypotheses_unavailable", "optional": True}
    ]
    state = result["searchStates"]["hypotheses"]
    assert state["status"] == "PARTIAL" and state["complete"] is False
    assert {s["status"] for s in state["lists"]} == {"FAILED"}


async def test_linked_only_through_the_evidence_answer(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    """Links count from the returned shared evidence and the relationships it
    supports, not from the related-relationship frontier (which runs beside this
    one); the caller's private evidence links nothing (hypotheses cite shared
    material only)."""
    team = await loaded(writes)
    alice = await token(writes, team, "alice")
    q = "billing latency spikes at noon"
    for rl in (0, 5):
        result = await recall(client, alice, q=q, limit=1, rl=rl, hl=20)
        assert [r["evidenceId"] for r in result["results"]] == ["ev-private"]
        # Only the lexical list answers ("billing"): nothing returned is linked.
        assert set(hyp_ids(result)) == {"h-both", "h-lex"}
        if rl:
            reps = [h["representativeId"] for h in result["relatedRelationships"]]
            assert "rel-owner" in reps  # returned there, yet it links nothing here
