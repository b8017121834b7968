"""Recall events, suggested actions and the two feedback operations, over HTTP
against the real database, with other principals and another team."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any
from uuid import UUID

import httpx
import pytest
from starlette.applications import Starlette

from gateway.embeddings import EmbeddingProvider
from gateway.services.auth import authenticate
from gateway.services.feedback import FeedbackService
from gateway.services.recall import RecallService
from gateway.services.recall_input import validate
from gateway.services.recall_types import RecallOutcome
from gateway.services.writes import WriteService
from gateway.store.database import Database

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import (  # noqa: F401  (fixtures)
    _hold_lock,
    ids,
    recall,
    token,
)

RECALL = """
query Recall($q: String, $limit: Int) {
  recallMemory(query: $q, limit: $limit) {
    recallId recallEventId
    results { evidenceId rank context spaceKind source { id } supportingRelationships { id } }
    degradations { frontier code optional }
    suggestedActions { kind description recallEventId hypothesisIds }
  }
}
"""

SUBMIT = """
mutation Submit($input: RecallSessionFeedbackInput!) {
  submitRecallSessionFeedback(input: $input) { feedbackId recallEventId created recordedAt }
}
"""

RESOLVE = """
mutation Resolve($input: ResolveDreamFeedbackInput!) {
  resolveDreamFeedback(input: $input) {
    hypothesisId status receipt { kind id created recordedAt }
  }
}
"""


async def gql(client: httpx.AsyncClient, tok: str, query: str, **variables: Any) -> dict[str, Any]:
    r = await client.post(
        "/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {tok}"},
    )
    assert "Traceback" not in r.text
    body: dict[str, Any] = r.json()
    return body


async def ask(client: httpx.AsyncClient, tok: str, q: str, limit: int = 10) -> dict[str, Any]:
    body = await gql(client, tok, RECALL, q=q, limit=limit)
    assert "errors" not in body, body
    result: dict[str, Any] = body["data"]["recallMemory"]
    return result


async def submit(client: httpx.AsyncClient, tok: str, **fields: Any) -> dict[str, Any]:
    return await gql(client, tok, SUBMIT, input=fields)


def error_of(body: dict[str, Any]) -> dict[str, Any]:
    assert body.get("errors") and body.get("data") is None, body
    error: dict[str, Any] = body["errors"][0]
    return error


async def feedback_rows(db: Database, team: str) -> tuple[int, int]:
    async with db.pool.acquire() as conn:
        return (
            await conn.fetchval("SELECT count(*) FROM recall_feedback WHERE team_id = $1", team),
            await conn.fetchval(
                "SELECT count(*) FROM recall_feedback_items WHERE team_id = $1", team
            ),
        )


# --- the snapshot and the suggestion ---------------------------------------------------------


def feedback_degradations(result: dict[str, Any]) -> list[dict[str, Any]]:
    """This frontier's degradations (the others degrade on their own)."""
    return [d for d in result["degradations"] if d["frontier"] == "FEEDBACK"]


async def test_recall_is_recorded_and_suggests_feedback(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("fbev")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    q = "billing service owned by payments; latency at noon"
    result = await ask(client, tok, q)
    assert feedback_degradations(result) == []
    event_id = result["recallEventId"]
    assert event_id == result["recallId"]
    assert result["suggestedActions"] == [
        {
            "kind": "SUBMIT_RECALL_SESSION_FEEDBACK",
            "description": result["suggestedActions"][0]["description"],
            "recallEventId": event_id,
            "hypothesisIds": [],
        }
    ]
    async with db.pool.acquire() as conn:
        event = await conn.fetchrow(
            "SELECT * FROM recall_events WHERE team_id = $1 AND id = $2", team, UUID(event_id)
        )
        assert event is not None
        items = await conn.fetch(
            "SELECT frontier, item_id, rank FROM recall_event_items "
            "WHERE team_id = $1 AND recall_event_id = $2 ORDER BY rank",
            team,
            UUID(event_id),
        )
    assert event["principal_id"] == "alice"
    assert event["token_id"] == tok.split("_")[1]
    assert event["query_sha256"] == hashlib.sha256(q.encode()).digest()
    assert sorted(event["space_kinds"]) == ["private", "shared"]
    assert event["known_at"] is not None and event["valid_at"] == event["known_at"]
    returned = [(r["evidenceId"], r["rank"]) for r in result["results"]]
    assert len(returned) >= 2  # shared and private evidence
    assert [(i["item_id"], i["rank"]) for i in items] == returned
    assert {i["frontier"] for i in items} == {"evidence"}


async def test_snapshot_failure_keeps_the_answer_without_the_suggestion(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService, db: Database
) -> None:
    """A real fault: the recall_events table is locked past the lock timeout."""
    team = unique("fblock")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    q = "who owns the billing service"
    normal = await ask(client, tok, q)
    services = gateway_app.state.services
    services.db.lock_timeout = "300ms"
    ready, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold_lock(db, "recall_events", ready, release))
    await ready.wait()
    try:
        degraded = await ask(client, tok, q)
    finally:
        release.set()
        await holder
        services.db.lock_timeout = "2s"
    assert feedback_degradations(degraded) == [
        {"frontier": "FEEDBACK", "code": "recall_feedback_snapshot_unavailable", "optional": True}
    ]
    assert degraded["suggestedActions"] == [] and degraded["recallEventId"] is None

    def strip(r: dict[str, Any]) -> list[tuple[str, int, str]]:
        return [(x["evidenceId"], x["rank"], x["context"]) for x in r["results"]]

    assert strip(degraded) == strip(normal)
    async with db.pool.acquire() as conn:
        assert not await conn.fetchval(
            "SELECT count(*) FROM recall_events WHERE id = $1", UUID(degraded["recallId"])
        )
    # and such a recall cannot be cited
    body = await submit(
        client, tok, feedbackId="fb-lost", recallEventId=degraded["recallId"], used=True
    )
    assert error_of(body)["extensions"]["code"] == "NOT_FOUND"


async def test_feedback_can_be_switched_off(dsn: str, writes: WriteService, db: Database) -> None:
    team = unique("fboff")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    app = app_for(dsn, feedback_enabled=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            result = await ask(c, tok, "who owns the billing service")
    assert result["results"] and feedback_degradations(result) == []
    assert result["suggestedActions"] == [] and result["recallEventId"] is None
    async with db.pool.acquire() as conn:
        assert not await conn.fetchval(
            "SELECT count(*) FROM recall_events WHERE team_id = $1", team
        )


async def test_returned_hypotheses_add_a_dream_feedback_suggestion(
    db: Database, writes: WriteService, embedder: EmbeddingProvider
) -> None:
    """The hypotheses frontier is built elsewhere: its IDs arrive on the outcome."""
    team = unique("fbhyp")
    await load_jsonl(
        writes,
        jsonl(
            team_records(team)
            + [{"kind": "hypothesis", "team": team, "id": "h1", "statement": "a hunch"}]
        ),
    )
    raw = await token(writes, team, "alice")
    principal = await authenticate(db, raw)
    feedback = FeedbackService(db)
    service = RecallService(db, embedder)  # no feedback: the snapshot is attached below
    request = validate(query="who owns the billing service")
    outcome: RecallOutcome = await service.recall(principal, request)
    assert outcome.recall_event_id is None and outcome.suggested_actions == []
    outcome.hypothesis_ids = ["h1"]
    await feedback.attach(principal, request, outcome)
    kinds = [(a.kind, a.hypothesis_ids) for a in outcome.suggested_actions]
    assert kinds == [("submit_recall_session_feedback", ()), ("resolve_dream_feedback", ("h1",))]
    assert all(a.recall_event_id == outcome.recall_event_id for a in outcome.suggested_actions)
    async with db.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT frontier, item_id, rank FROM recall_event_items WHERE recall_event_id = $1",
            UUID(outcome.recall_id),
        )
    assert ("hypothesis", "h1", 1) in [tuple(r) for r in rows]


# --- submitRecallSessionFeedback --------------------------------------------------------------


async def test_feedback_on_what_the_recall_returned_is_idempotent(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("fbok")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    result = await ask(client, tok, "billing service owned by payments; latency at noon")
    event_id = result["recallEventId"]
    second = ids(result)[1]
    fields = {
        "feedbackId": "fb-1",
        "recallEventId": event_id,
        "used": True,
        "supportedAnswer": False,
        "rating": 2,
        "missingContext": "who is on call for billing",
        "irrelevantResults": [{"frontier": "EVIDENCE", "id": second}],
    }
    first = await submit(client, tok, **fields)
    assert "errors" not in first, first
    done = first["data"]["submitRecallSessionFeedback"]
    assert done["created"] is True and done["recallEventId"] == event_id
    again = await submit(client, tok, **fields)
    assert again["data"]["submitRecallSessionFeedback"] == {**done, "created": False}
    assert await feedback_rows(db, team) == (1, 1)
    async with db.pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT used, supported_answer, rating, missing_context, principal_id "
            "FROM recall_feedback WHERE team_id = $1",
            team,
        )
        assert row is not None
        item = await conn.fetchrow(
            "SELECT frontier, item_id, judgement FROM recall_feedback_items WHERE team_id = $1",
            team,
        )
        assert item is not None
    assert tuple(row) == (True, False, 2, "who is on call for billing", "alice")
    assert tuple(item) == ("evidence", second, "irrelevant")
    changed = await submit(client, tok, **{**fields, "rating": 3})
    assert error_of(changed)["extensions"]["code"] == "IDEMPOTENCY_CONFLICT"
    bob = await token(writes, team, "bob")
    # the same ID from another principal is not "the same write"
    assert error_of(await submit(client, bob, **fields))["extensions"]["code"] == (
        "IDEMPOTENCY_CONFLICT"
    )
    assert await feedback_rows(db, team) == (1, 1)


async def test_feedback_refuses_references_the_event_did_not_return(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team, other_team = unique("fbref"), unique("fbrefx")
    await load_jsonl(writes, jsonl(team_records(team) + team_records(other_team)))
    alice = await token(writes, team, "alice")
    bob = await token(writes, team, "bob")
    stranger = await token(writes, other_team, "alice")
    result = await ask(client, alice, "who owns the billing service", limit=1)
    event_id = result["recallEventId"]
    # the branches tie at rank 1 and the private one wins: ev-owner was not returned
    assert ids(result) == ["ev-private"]
    base = {"recallEventId": event_id, "used": True}

    async def refused(tok: str, fid: str, **extra: Any) -> dict[str, Any]:
        return error_of(await submit(client, tok, feedbackId=fid, **{**base, **extra}))

    not_returned = await refused(
        alice, "f1", irrelevantResults=[{"frontier": "EVIDENCE", "id": "ev-owner"}]
    )
    assert not_returned["extensions"] == {
        "code": "BAD_USER_INPUT",
        "field": "irrelevantResults[0]",
    }
    fabricated = await refused(
        alice, "f2", irrelevantResults=[{"frontier": "EVIDENCE", "id": "ev-made-up"}]
    )
    assert fabricated["extensions"]["code"] == "BAD_USER_INPUT"
    # an existing ID of the wrong frontier was not returned either
    wrong_frontier = await refused(
        alice, "f3", irrelevantResults=[{"frontier": "RELATIONSHIP", "id": "ev-private"}]
    )
    assert wrong_frontier["extensions"]["field"] == "irrelevantResults[0]"
    duplicate = await refused(
        alice,
        "f4",
        irrelevantResults=[
            {"frontier": "EVIDENCE", "id": "ev-private"},
            {"frontier": "EVIDENCE", "id": "ev-private"},
        ],
    )
    assert duplicate["extensions"] == {"code": "BAD_USER_INPUT", "field": "irrelevantResults[1]"}
    hypothesis = await refused(
        alice, "f5", hypotheses=[{"hypothesisId": "h-none", "judgement": "USEFUL"}]
    )
    assert hypothesis["extensions"]["field"] == "hypotheses[0].hypothesisId"
    for bad_rating in (0, 6):
        assert (await refused(alice, "f6", rating=bad_rating))["extensions"] == {
            "code": "BAD_USER_INPUT",
            "field": "rating",
        }
    malformed = await refused(alice, "f7", recallEventId="not-a-uuid")
    assert malformed["extensions"]["field"] == "recallEventId"
    # another principal of the team, another team, a made-up event: all alike
    foreign = await refused(bob, "f8")
    other_team_error = await refused(stranger, "f9")
    missing = await refused(alice, "f10", recallEventId="00000000-0000-4000-8000-000000000000")
    for e in (foreign, other_team_error):
        assert e["extensions"]["code"] == "NOT_FOUND"
        assert e["message"] == f"no recall event '{event_id}'"
    assert missing["extensions"]["code"] == "NOT_FOUND"
    assert await feedback_rows(db, team) == (0, 0)
    assert await feedback_rows(db, other_team) == (0, 0)


async def test_feedback_changes_no_ranking_and_no_lifecycle(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("fbrank")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    q = "billing service owned by payments; latency at noon"
    before = await ask(client, tok, q)
    body = await submit(
        client,
        tok,
        feedbackId="fb-rank",
        recallEventId=before["recallEventId"],
        used=False,
        rating=1,
        irrelevantResults=[{"frontier": "EVIDENCE", "id": i} for i in ids(before)],
    )
    assert "errors" not in body, body
    after = await ask(client, tok, q)

    def strip(r: dict[str, Any]) -> list[Any]:
        return [
            (x["evidenceId"], x["rank"], x["context"], x["source"], x["supportingRelationships"])
            for x in r["results"]
        ]

    assert strip(after) == strip(before)
    assert after["recallEventId"] != before["recallEventId"]


# --- resolveDreamFeedback ----------------------------------------------------------------------


async def test_dream_feedback_sets_status_with_checked_transitions(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team, other_team = unique("dream"), unique("dreamx")
    records = team_records(team) + [
        {"kind": "hypothesis", "team": team, "id": "h1", "statement": "deploys cause outages"}
    ]
    await load_jsonl(writes, jsonl(records + team_records(other_team)))
    alice = await token(writes, team, "alice")
    bob_shared = await token(writes, team, "bob", "shared_only")
    stranger = await token(writes, other_team, "alice")

    async def decide(tok: str, fid: str, decision: str, note: str | None = None) -> dict[str, Any]:
        return await gql(
            client,
            tok,
            RESOLVE,
            input={"feedbackId": fid, "hypothesisId": "h1", "decision": decision, "note": note},
        )

    first = await decide(alice, "d1", "CONFIRM", "seen twice")
    assert "errors" not in first, first
    done = first["data"]["resolveDreamFeedback"]
    assert done["status"] == "CONFIRMED" and done["hypothesisId"] == "h1"
    assert done["receipt"]["created"] is True and done["receipt"]["kind"] == "hypothesis_feedback"
    replay = (await decide(alice, "d1", "CONFIRM", "seen twice"))["data"]["resolveDreamFeedback"]
    assert replay["receipt"] == {**done["receipt"], "created": False}
    assert error_of(await decide(alice, "d1", "REJECT"))["extensions"]["code"] == (
        "IDEMPOTENCY_CONFLICT"
    )
    again = error_of(await decide(alice, "d2", "CONFIRM"))
    assert again["extensions"] == {"code": "BAD_USER_INPUT", "field": "decision"}
    # any principal of the team may review a shared hypothesis, also with a shared-only token
    stale = await decide(bob_shared, "d3", "MARK_STALE")
    assert stale["data"]["resolveDreamFeedback"]["status"] == "STALE"
    reopened = await decide(alice, "d4", "REOPEN")
    assert reopened["data"]["resolveDreamFeedback"]["status"] == "PROPOSED"
    assert error_of(await decide(alice, "d5", "REOPEN"))["extensions"]["code"] == "BAD_USER_INPUT"
    foreign = error_of(await decide(stranger, "d6", "REJECT"))
    missing = error_of(
        await gql(
            client,
            stranger,
            RESOLVE,
            input={"feedbackId": "d7", "hypothesisId": "h-none", "decision": "REJECT"},
        )
    )
    assert (
        foreign["extensions"]
        == missing["extensions"]
        == {
            "code": "NOT_FOUND",
            "field": "hypothesisId",
        }
    )
    assert foreign["message"].replace("h1", "X") == missing["message"].replace("h-none", "X")
    async with db.pool.acquire() as conn:
        history = await conn.fetch(
            "SELECT decision, status, feedback_id, recorded_by FROM hypothesis_feedback "
            "WHERE team_id = $1 ORDER BY seq",
            team,
        )
    assert [tuple(h) for h in history] == [
        ("propose", "proposed", None, "operator"),
        ("confirm", "confirmed", "d1", "principal:alice"),
        ("mark_stale", "stale", "d3", "principal:bob"),
        ("reopen", "proposed", "d4", "principal:alice"),
    ]


@pytest.mark.parametrize("judgement", ["USEFUL", "WRONG"])
async def test_hypothesis_judgements_need_a_returned_hypothesis(
    client: httpx.AsyncClient,
    writes: WriteService,
    db: Database,
    embedder: EmbeddingProvider,
    judgement: str,
) -> None:
    team = unique("fbhj")
    await load_jsonl(
        writes,
        jsonl(
            team_records(team)
            + [{"kind": "hypothesis", "team": team, "id": "h1", "statement": "a hunch"}]
        ),
    )
    raw = await token(writes, team, "alice")
    principal = await authenticate(db, raw)
    request = validate(query="who owns the billing service")
    outcome = await RecallService(db, embedder).recall(principal, request)
    outcome.hypothesis_ids = ["h1"]
    await FeedbackService(db).attach(principal, request, outcome)
    body = await submit(
        client,
        raw,
        feedbackId="fb-h",
        recallEventId=outcome.recall_event_id,
        used=True,
        hypotheses=[{"hypothesisId": "h1", "judgement": judgement, "note": "checked"}],
    )
    assert "errors" not in body, body
    async with db.pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT frontier, item_id, judgement, note FROM recall_feedback_items "
            "WHERE team_id = $1",
            team,
        )
        assert row is not None
    assert tuple(row) == ("hypothesis", "h1", judgement.lower(), "checked")


async def test_the_snapshot_costs_the_recall_no_statement(
    client: httpx.AsyncClient, gateway_app: Starlette, dsn: str, writes: WriteService, db: Database
) -> None:
    """What feedback costs a recall: the snapshot is written in the recall's own
    transaction, in the statement that also reads the answer's nested rows
    (gateway/store/round_trips.py), so the same recall with it off sends as many
    statements; with it on, the event is there."""
    team = unique("fbcost")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    q = "who owns the billing service"
    off = app_for(dsn, feedback_enabled=False)
    counts: dict[str, int] = {}
    events: dict[str, str | None] = {}
    async with off.router.lifespan_context(off):
        transport = httpx.ASGITransport(app=off)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            for name, app, http in (("on", gateway_app, client), ("off", off, c)):
                counter = app.state.services.db.counter
                await ask(http, tok, q)  # warm: type introspection of new statements
                before = counter.count
                answer = await ask(http, tok, q)
                counts[name] = counter.count - before
                events[name] = answer["recallEventId"]
    assert counts["on"] == counts["off"], counts
    assert events["off"] is None and events["on"] is not None, events
    async with db.pool.acquire() as conn:
        written = await conn.fetchval(
            "SELECT count(*) FROM recall_events WHERE team_id = $1 AND id = $2::uuid",
            team,
            events["on"],
        )
    assert written == 1


async def test_feedback_may_cite_every_frontier_the_recall_returned(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    """Related relationships (representative and equivalents), conflicts and the
    evidence are all recorded in the recall event, so feedback may cite them;
    an ID the recall did not return in that frontier is refused."""
    from .test_conflicts import ownership_case

    team = unique("fbfr")
    await load_jsonl(writes, jsonl(ownership_case(team)))
    alice = await token(writes, team, "alice")
    body = await gql(
        client,
        alice,
        """query { recallMemory(query: "billing service owned by team payments ledger", limit: 1) {
             recallEventId results { evidenceId }
             relatedRelationships { representativeId equivalentIds }
             conflicts { id } } }""",
    )
    assert "errors" not in body, body
    result = body["data"]["recallMemory"]
    assert result["relatedRelationships"] and result["conflicts"], result
    handle = result["relatedRelationships"][0]
    refs = [
        {"frontier": "RELATIONSHIP", "id": handle["representativeId"]},
        *({"frontier": "RELATIONSHIP", "id": i} for i in handle["equivalentIds"]),
        {"frontier": "CONFLICT", "id": result["conflicts"][0]["id"]},
        {"frontier": "EVIDENCE", "id": result["results"][0]["evidenceId"]},
    ]
    event = result["recallEventId"]
    ok = await submit(
        client, alice, feedbackId="fb-all", recallEventId=event, used=True, irrelevantResults=refs
    )
    assert "errors" not in ok, ok
    assert await feedback_rows(db, team) == (1, len(refs))
    # A conflict ID cited as a relationship was not returned as one.
    wrong = await submit(
        client,
        alice,
        feedbackId="fb-wrong",
        recallEventId=event,
        used=True,
        irrelevantResults=[{"frontier": "RELATIONSHIP", "id": result["conflicts"][0]["id"]}],
    )
    assert error_of(wrong)["extensions"]["code"] == "BAD_USER_INPUT"
    assert await feedback_rows(db, team) == (1, len(refs))


async def test_an_event_is_citable_only_by_a_binding_that_reads_its_spaces(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    """A shared-only token of the principal whose private-bound token made the
    event must not learn which private IDs it returned: for that token the
    event is missing, worded like a made-up one, whatever it cites."""
    team = unique("fbbind")
    await load_jsonl(writes, jsonl(team_records(team)))
    private = await token(writes, team, "alice")
    private_again = await token(writes, team, "alice")  # another private-bound token
    shared = await token(writes, team, "alice", "shared_only")
    made_private = await ask(client, private, "who owns the billing service", limit=1)
    assert ids(made_private) == ["ev-private"]
    event = made_private["recallEventId"]
    made_up = "00000000-0000-4000-8000-000000000000"

    def cite(evidence: str) -> list[dict[str, str]]:
        return [{"frontier": "EVIDENCE", "id": evidence}]

    answers = [
        error_of(
            await submit(client, shared, feedbackId=fid, recallEventId=rid, used=True, **extra)
        )
        for fid, rid, extra in (
            ("b1", event, {"irrelevantResults": cite("ev-private")}),  # returned, private
            ("b2", event, {"irrelevantResults": cite("ev-owner")}),  # not returned
            ("b3", event, {}),
            ("b4", made_up, {"irrelevantResults": cite("ev-private")}),
        )
    ]
    for answer, rid in zip(answers, (event, event, event, made_up), strict=True):
        assert answer == {
            "message": f"no recall event '{rid}'",
            "locations": answer["locations"],
            "path": ["submitRecallSessionFeedback"],
            "extensions": {"code": "NOT_FOUND"},
        }
    assert await feedback_rows(db, team) == (0, 0)

    # another private-bound token reads every space the event read: citable
    ok = await submit(
        client,
        private_again,
        feedbackId="b5",
        recallEventId=event,
        used=True,
        irrelevantResults=cite("ev-private"),
    )
    assert ok["data"]["submitRecallSessionFeedback"]["created"] is True, ok
    # an event of the shared-only token read the shared space only: both cite it
    made_shared = await ask(client, shared, "who owns the billing service", limit=1)
    assert ids(made_shared) == ["ev-owner"]
    for fid, tok in (("b6", shared), ("b7", private)):
        body = await submit(
            client,
            tok,
            feedbackId=fid,
            recallEventId=made_shared["recallEventId"],
            used=True,
            irrelevantResults=cite("ev-owner"),
        )
        assert body["data"]["submitRecallSessionFeedback"]["created"] is True, body
