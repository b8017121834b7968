"""traceMemory over HTTP against the real database: evidence, history, equivalents,
conflicts, bounded lineage, time views, and authorisation that reveals nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from gateway.services.writes import WriteService
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import _hold_lock, more_evidence, token

TRACE = """
query Trace($id: ID!, $depth: Int, $edges: Int, $events: Int, $content: Boolean,
            $validAt: DateTime, $knownAt: DateTime) {
  traceMemory(relationshipId: $id, maxDepth: $depth, maxEdges: $edges, maxEvents: $events,
              includeEvidenceContent: $content, validAt: $validAt, knownAt: $knownAt) {
    relationship { id status spaceKind semanticGroup subject { id } object { id } }
    validAtView semanticGroup
    evidence {
      supportId evidenceId decision supportsAtView evidenceStatus occurrenceId quote
      spanStart spanEnd content contentTruncated source { id title status }
    }
    evidenceTotal
    events { kind relationshipId supportId caseId status supersededById decision
             conflictEvent preferredPositionId reason }
    eventsTotal
    equivalents { id ownerId spaceKind status }
    equivalentsTotal
    conflicts {
      id question state preferredPositionId
      positions { id label disposition relationshipIds supporterCount
                  supporters { evidenceId sourceId authority } supportersTruncated }
    }
    conflictsTotal
    lineage { depth relationship { id status } fromRelationshipId viaEntityId
              viaEntity { id name } validAtView events { kind status } }
    visited { relationshipIds entityIds relationshipCount entityCount depthReached }
    truncated stoppedReason stoppedReasons
  }
}
"""


async def post(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    r = await client.post(
        "/graphql",
        json={"query": TRACE, "variables": variables},
        headers={"Authorization": f"Bearer {tok}"},
    )
    body: dict[str, Any] = r.json()
    return body


async def trace(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    body = await post(client, tok, **variables)
    assert "errors" not in body, body
    result: dict[str, Any] = body["data"]["traceMemory"]
    return result


async def trace_error(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    body = await post(client, tok, **variables)
    assert body.get("errors") and body.get("data") is None, body
    error: dict[str, Any] = body["errors"][0]
    return error


def scenario(team: str) -> list[dict[str, Any]]:
    """rel-owner (billing owned by payments) with an equivalent, a rival in a
    conflict case, and a chain billing -> orders-db -> pg -> region for lineage."""
    records = team_records(team)

    def ent(i: str, name: str) -> dict[str, Any]:
        return {"kind": "entity", "team": team, "id": i, "name": name}

    def ev(i: str, text: str) -> dict[str, Any]:
        return {
            "kind": "evidence",
            "team": team,
            "id": i,
            "source": "src-handbook",
            "content": text,
        }

    def rel(i: str, s: str, p: str, o: str, owner: str, ev_id: str, **kw: Any) -> dict[str, Any]:
        return {
            "kind": "relationship",
            "team": team,
            "id": i,
            "subject": s,
            "predicate": p,
            "object": o,
            "owner": owner,
            "supports": [{"id": "sup-" + i, "evidence": ev_id}],
            **kw,
        }

    records += [
        ent("ledger", "Ledger team"),
        ent("orders-db", "Orders database"),
        ent("pg", "PostgreSQL 16"),
        ent("region", "eu-west-1"),
        ev("ev-owner-2", "Billing belongs to the payments team, per the org chart."),
        ev("ev-alt", "The billing service is owned by the ledger team, says the old chart."),
        ev("ev-dep", "Billing stores invoices in the orders database."),
        ev("ev-db", "The orders database runs on PostgreSQL 16."),
        ev("ev-region", "PostgreSQL 16 is hosted in eu-west-1."),
        rel("rel-owner-2", "billing", "owned_by", "payments-team", "bob", "ev-owner-2"),
        rel("rel-alt", "billing", "owned_by", "ledger", "bob", "ev-alt"),
        rel("rel-dep", "billing", "depends_on", "orders-db", "alice", "ev-dep"),
        rel("rel-db", "orders-db", "runs_on", "pg", "alice", "ev-db"),
        rel(
            "rel-region",
            "pg",
            "hosted_in",
            "region",
            "alice",
            "ev-region",
            valid_to="2020-01-01T00:00:00Z",
        ),
        {
            "kind": "conflict_case",
            "team": team,
            "id": "case",
            "question": "Who owns billing?",
            "positions": [
                {"id": "pos-pay", "label": "payments", "relationships": ["rel-owner"]},
                {"id": "pos-led", "label": "ledger", "relationships": ["rel-alt"]},
            ],
        },
    ]
    return records


async def setup(writes: WriteService, prefix: str) -> tuple[str, str]:
    team = unique(prefix)
    await load_jsonl(writes, jsonl(scenario(team)))
    return team, await token(writes, team, "alice")


async def later(writes: WriteService, team: str, *records: dict[str, Any]) -> None:
    await load_jsonl(writes, jsonl([{"team": team, **r} for r in records]))


def instant_between() -> str:
    return datetime.now(UTC).isoformat()


async def test_trace_shows_evidence_history_equivalents_and_conflicts(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    _, tok = await setup(writes, "tr")
    t = await trace(client, tok, id="rel-owner", depth=0)
    assert t["relationship"]["id"] == "rel-owner" and t["relationship"]["status"] == "ACTIVE"
    assert t["relationship"]["spaceKind"] == "SHARED"
    assert t["validAtView"] is True
    assert t["evidence"] == [
        {
            "supportId": "sup-owner",
            "evidenceId": "ev-owner",
            "decision": "GRANT",
            "supportsAtView": True,
            "evidenceStatus": "ACTIVE",
            "occurrenceId": "occ-owner",
            "quote": "billing service",
            "spanStart": 4,
            "spanEnd": 19,
            "content": None,  # only when asked for
            "contentTruncated": False,
            "source": {"id": "src-handbook", "title": "Handbook", "status": "ACTIVE"},
        }
    ]
    assert t["evidenceTotal"] == 1
    assert [
        (e["kind"], e["status"] or e["decision"] or e["conflictEvent"]) for e in t["events"]
    ] == [
        ("STATUS_TRANSITION", "ACTIVE"),
        ("SUPPORT_DECISION", "GRANT"),
        ("CONFLICT_EVENT", "OPEN"),
    ]
    assert t["events"][1]["supportId"] == "sup-owner" and t["events"][2]["caseId"] == "case"
    assert t["eventsTotal"] == 3
    # the equivalent keeps its own owner; the rival is not an equivalent
    assert t["equivalents"] == [
        {"id": "rel-owner-2", "ownerId": "bob", "spaceKind": "SHARED", "status": "ACTIVE"}
    ]
    assert t["equivalents"][0]["id"] != "rel-alt" and t["equivalentsTotal"] == 1
    [case] = t["conflicts"]
    assert case["id"] == "case" and case["state"] == "OPEN" and case["preferredPositionId"] is None
    assert [(p["id"], p["disposition"], p["relationshipIds"]) for p in case["positions"]] == [
        ("pos-led", "CONTESTED", ["rel-alt"]),
        ("pos-pay", "CONTESTED", ["rel-owner"]),
    ]
    pay = case["positions"][1]
    assert pay["supporterCount"] == 1
    assert pay["supporters"] == [
        {"evidenceId": "ev-owner", "sourceId": "src-handbook", "authority": "HIGH"}
    ]
    # depth 0: the neighbours exist but were not visited, and the trace says so
    assert t["truncated"] is True and t["stoppedReason"] == "max_depth"
    assert t["stoppedReasons"] == ["max_depth"] and t["lineage"] == []

    with_text = await trace(client, tok, id="rel-owner", depth=0, content=True)
    assert with_text["evidence"][0]["content"].startswith("The billing service of")


async def test_decisions_and_transitions_over_time_and_earlier_views_stay(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team, tok = await setup(writes, "trt")
    before = await trace(client, tok, id="rel-owner")
    await asyncio.sleep(0.01)
    t1 = instant_between()
    await asyncio.sleep(0.01)
    await later(
        writes,
        team,
        {"kind": "support_decision", "id": "d1", "support": "sup-owner", "decision": "revoke"},
        {
            "kind": "conflict_resolution",
            "id": "r1",
            "case": "case",
            "preferred_position": "pos-led",
        },
    )
    await asyncio.sleep(0.01)
    t2 = instant_between()
    await asyncio.sleep(0.01)
    await later(
        writes,
        team,
        {"kind": "support_decision", "id": "d2", "support": "sup-owner", "decision": "reinstate"},
        {
            "kind": "relationship_transition",
            "id": "x1",
            "relationship": "rel-owner",
            "status": "superseded",
            "superseded_by": "rel-owner-2",
            "reason": "the org chart is newer",
        },
    )
    now = await trace(client, tok, id="rel-owner")
    kinds = [(e["kind"], e["status"] or e["decision"] or e["conflictEvent"]) for e in now["events"]]
    assert kinds == [
        ("STATUS_TRANSITION", "ACTIVE"),
        ("SUPPORT_DECISION", "GRANT"),
        ("CONFLICT_EVENT", "OPEN"),
        ("SUPPORT_DECISION", "REVOKE"),
        ("CONFLICT_EVENT", "RESOLVE"),
        ("STATUS_TRANSITION", "SUPERSEDED"),
        ("SUPPORT_DECISION", "REINSTATE"),
    ]
    assert now["events"][5]["supersededById"] == "rel-owner-2"
    assert now["events"][5]["reason"] == "the org chart is newer"
    assert now["events"][4]["preferredPositionId"] == "pos-led"
    assert now["relationship"]["status"] == "SUPERSEDED"
    assert now["evidence"][0]["decision"] == "REINSTATE"
    [case] = now["conflicts"]
    assert case["state"] == "RESOLVED" and case["preferredPositionId"] == "pos-led"
    assert {p["id"]: p["disposition"] for p in case["positions"]} == {
        "pos-led": "PREFERRED",
        "pos-pay": "DISPREFERRED",
    }

    mid = await trace(client, tok, id="rel-owner", knownAt=t2)
    assert mid["relationship"]["status"] == "ACTIVE"
    assert mid["evidence"][0]["decision"] == "REVOKE"
    assert mid["evidence"][0]["supportsAtView"] is False
    assert mid["conflicts"][0]["state"] == "RESOLVED"
    # the revoked support no longer backs its position; the reinstated one does again

    def counts(t: dict[str, Any]) -> dict[str, int]:
        return {p["id"]: p["supporterCount"] for p in t["conflicts"][0]["positions"]}

    assert counts(mid) == {"pos-led": 1, "pos-pay": 0}
    assert counts(now) == {"pos-led": 1, "pos-pay": 1}
    assert len(mid["events"]) == 5

    # The view before any later write is exactly what the trace said then.
    past = await trace(client, tok, id="rel-owner", knownAt=t1)
    assert past == before
    # and the relationship did not exist before the team did
    error = await trace_error(client, tok, id="rel-owner", knownAt="2000-01-01T00:00:00Z")
    assert error["extensions"]["code"] == "NOT_FOUND"


async def test_lineage_is_breadth_first_and_each_bound_stops_it(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    _, tok = await setup(writes, "trl")
    full = await trace(client, tok, id="rel-owner", depth=4)
    assert full["truncated"] is False
    assert full["stoppedReason"] is None and full["stoppedReasons"] == []
    got = [(n["depth"], n["relationship"]["id"], n["viaEntityId"]) for n in full["lineage"]]
    assert got == [
        (1, "rel-alt", "billing"),
        (1, "rel-dep", "billing"),
        (1, "rel-owner-2", "billing"),
        (2, "rel-db", "orders-db"),
        (3, "rel-region", "pg"),
    ]
    assert full["lineage"][3]["fromRelationshipId"] == "rel-dep"
    assert full["lineage"][1]["viaEntity"] == {"id": "billing", "name": "Billing service"}
    assert full["lineage"][4]["validAtView"] is False  # valid only until 2020
    assert full["lineage"][0]["events"] == [{"kind": "STATUS_TRANSITION", "status": "ACTIVE"}]
    visited = full["visited"]
    assert visited["relationshipIds"] == [
        "rel-owner",
        "rel-alt",
        "rel-dep",
        "rel-owner-2",
        "rel-db",
        "rel-region",
    ]
    assert visited["relationshipCount"] == 6 and visited["depthReached"] == 3
    assert set(visited["entityIds"]) == {
        "billing",
        "payments-team",
        "ledger",
        "orders-db",
        "pg",
        "region",
    }
    assert visited["entityCount"] == 6

    by_depth = await trace(client, tok, id="rel-owner")  # default depth 2
    assert by_depth["truncated"] is True and by_depth["stoppedReason"] == "max_depth"
    assert [n["relationship"]["id"] for n in by_depth["lineage"]][-1] == "rel-db"
    assert by_depth["visited"]["depthReached"] == 2
    zero = await trace(client, tok, id="rel-owner", depth=0)
    assert zero["lineage"] == [] and zero["stoppedReason"] == "max_depth"
    assert zero["visited"]["relationshipIds"] == ["rel-owner"]

    by_edges = await trace(client, tok, id="rel-owner", depth=4, edges=2)
    assert by_edges["truncated"] is True and by_edges["stoppedReason"] == "max_edges"
    assert [n["relationship"]["id"] for n in by_edges["lineage"]] == ["rel-alt", "rel-dep"]
    assert by_edges["visited"]["relationshipCount"] == 3

    # 3 events of the root, then one status event per lineage relationship
    by_events = await trace(client, tok, id="rel-owner", depth=4, events=5)
    assert by_events["truncated"] is True and by_events["stoppedReason"] == "max_events"
    assert [n["relationship"]["id"] for n in by_events["lineage"]] == ["rel-alt", "rel-dep"]
    assert len(by_events["events"]) == 3
    root_cut = await trace(client, tok, id="rel-owner", depth=4, events=2)
    assert root_cut["stoppedReason"] == "max_events" and root_cut["lineage"] == []
    assert [e["kind"] for e in root_cut["events"]] == ["SUPPORT_DECISION", "CONFLICT_EVENT"]
    assert root_cut["eventsTotal"] == 3


async def test_edge_bound_cuts_evidence_and_equivalents_visibly(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("tre")
    records = scenario(team) + [
        {
            "kind": "support",
            "team": team,
            "id": "sup-owner-extra",
            "relationship": "rel-owner",
            "evidence": "ev-owner-2",
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-owner-3",
            "subject": "billing",
            "predicate": "owned_by",
            "object": "payments-team",
            "owner": "alice",
            "supports": [{"id": "sup-owner-3", "evidence": "ev-owner-2"}],
        },
    ]
    await load_jsonl(writes, jsonl(records))
    tok = await token(writes, team, "alice")
    full = await trace(client, tok, id="rel-owner", depth=0, edges=10)
    assert [e["supportId"] for e in full["evidence"]] == ["sup-owner", "sup-owner-extra"]
    assert [r["id"] for r in full["equivalents"]] == ["rel-owner-2", "rel-owner-3"]
    cut = await trace(client, tok, id="rel-owner", depth=0, edges=1)
    assert [e["supportId"] for e in cut["evidence"]] == ["sup-owner"]
    assert cut["evidenceTotal"] == 2 and cut["equivalentsTotal"] == 2
    assert [r["id"] for r in cut["equivalents"]] == ["rel-owner-2"]
    assert cut["truncated"] is True
    assert cut["stoppedReasons"] == ["max_depth", "max_edges"]


async def test_private_relationship_reads_its_own_space_only(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("trp")
    records = team_records(team) + [
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-private-twin",
            "space": "private:alice",
            "subject": "p-billing",
            "predicate": "owned_by",
            "object_value": "payments",
            # the same group key as the shared rel-owner: still never its equivalent
            "semantic_group": "billing-owner",
            "supports": [{"id": "sup-private-twin", "evidence": "ev-private"}],
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-owner-grouped",
            "subject": "billing",
            "predicate": "owned_by",
            "object": "payments-team",
            "owner": "bob",
            "semantic_group": "billing-owner",
            "supports": [{"id": "sup-owner-grouped", "evidence": "ev-owner"}],
        },
    ]
    await load_jsonl(writes, jsonl(records))
    alice = await token(writes, team, "alice")
    mine = await trace(client, alice, id="rel-private")
    assert mine["relationship"]["spaceKind"] == "PRIVATE"
    assert mine["evidence"][0]["evidenceId"] == "ev-private"
    assert [n["relationship"]["id"] for n in mine["lineage"]] == ["rel-private-twin"]
    assert all(n["relationship"]["id"].startswith("rel-private") for n in mine["lineage"])
    shared = await trace(client, alice, id="rel-owner-grouped")
    assert shared["equivalents"] == []  # the private twin shares the key, not the space
    twin = await trace(client, alice, id="rel-private-twin")
    assert twin["equivalents"] == [] and twin["relationship"]["spaceKind"] == "PRIVATE"


async def test_unreadable_ids_look_exactly_like_missing_ones(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService
) -> None:
    team_a, team_b = unique("tra"), unique("trb")
    records = team_records(team_a) + team_records(team_b)
    records.append(
        {
            "kind": "relationship",
            "team": team_a,
            "id": "rel-only-a",
            "subject": "billing",
            "predicate": "audited_by",
            "object_value": "finance",
            "owner": "alice",
        }
    )
    await load_jsonl(writes, jsonl(records))
    alice_b = await token(writes, team_b, "alice")
    bob_a = await token(writes, team_a, "bob")
    alice_a_shared = await token(writes, team_a, "alice", "shared_only")
    counter = gateway_app.state.services.db.counter

    async def refused(tok: str, rel_id: str) -> tuple[dict[str, Any], int]:
        before = counter.count
        error = await trace_error(client, tok, id=rel_id)
        return error, counter.count - before

    cases = {
        "missing": await refused(bob_a, "rel-nowhere"),
        "other team": await refused(alice_b, "rel-only-a"),
        "other owner's private": await refused(bob_a, "rel-private"),
        "shared-only token": await refused(alice_a_shared, "rel-private"),
    }
    shapes = set()
    for name, (error, statements) in cases.items():
        assert error["extensions"] == {"code": "NOT_FOUND"}, name
        assert error["path"] == ["traceMemory"], name
        rel_id = "rel-nowhere" if name == "missing" else None
        message = error["message"]
        for known in ("rel-nowhere", "rel-only-a", "rel-private"):
            message = message.replace(known, "<id>")
        shapes.add((message, statements))
        assert rel_id is None or "rel-nowhere" in error["message"]
    assert len(shapes) == 1, shapes  # same words, same number of statements
    # the owner does read it
    alice_a = await token(writes, team_a, "alice")
    assert (await trace(client, alice_a, id="rel-private"))["relationship"]["id"] == "rel-private"


async def test_a_space_reset_hides_the_older_generation_but_not_the_past(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("trr")
    await load_jsonl(writes, jsonl(team_records(team)))
    alice = await token(writes, team, "alice")
    before = await trace(client, alice, id="rel-private")
    await asyncio.sleep(0.01)
    t = instant_between()
    await asyncio.sleep(0.01)
    await later(writes, team, {"kind": "space_reset", "id": "reset-1", "space": "private:alice"})
    error = await trace_error(client, alice, id="rel-private")
    assert error["extensions"]["code"] == "NOT_FOUND"
    assert error["message"] == "relationship 'rel-private' was not found"
    assert await trace(client, alice, id="rel-private", knownAt=t) == before


async def test_valid_at_marks_what_was_true_then(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    _, tok = await setup(writes, "trv")
    now = await trace(client, tok, id="rel-region", depth=0)
    assert now["validAtView"] is False
    then = await trace(client, tok, id="rel-region", depth=0, validAt="2019-06-01T00:00:00Z")
    assert then["validAtView"] is True


async def test_statements_do_not_grow_with_the_lineage(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService
) -> None:
    counter = gateway_app.state.services.db.counter
    counts = {}
    for n in (4, 40):
        team = unique("trs")
        await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, n)))
        tok = await token(writes, team, "alice")
        before = counter.count
        result = await trace(client, tok, id="rel-bulk-000", depth=1, edges=100)
        counts[n] = counter.count - before
        assert len(result["lineage"]) == n - 1 and result["truncated"] is False
    assert counts[4] == counts[40], counts


@pytest.mark.parametrize(
    ("variables", "field"),
    [
        ({"depth": -1}, "maxDepth"),
        ({"depth": 5}, "maxDepth"),
        ({"edges": 0}, "maxEdges"),
        ({"edges": 201}, "maxEdges"),
        ({"events": 0}, "maxEvents"),
        ({"events": 1001}, "maxEvents"),
        ({"knownAt": "2026-01-01T00:00:00"}, "knownAt"),
        ({"knownAt": "2999-01-01T00:00:00Z"}, "knownAt"),
        ({"validAt": "2026-01-01T00:00:00"}, "validAt"),
        ({"id": "bad id!"}, "relationshipId"),
    ],
)
async def test_bad_input_is_a_clear_error(
    client: httpx.AsyncClient, writes: WriteService, variables: dict[str, Any], field: str
) -> None:
    team = unique("trbad")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    error = await trace_error(client, tok, **{"id": "rel-owner", **variables})
    assert error["extensions"]["code"] == "BAD_USER_INPUT", error
    assert error["extensions"]["field"] == field


async def test_without_a_token_nothing_is_traced(client: httpx.AsyncClient) -> None:
    r = await client.post("/graphql", json={"query": TRACE, "variables": {"id": "rel-owner"}})
    assert r.status_code == 401
    assert r.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_a_database_failure_is_an_error_not_a_partial_trace(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService, db: Database
) -> None:
    """A real fault: the supports table locked past the read's lock timeout."""
    _, tok = await setup(writes, "trf")
    services = gateway_app.state.services
    services.db.lock_timeout = "300ms"
    ready, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold_lock(db, "supports", ready, release))
    await ready.wait()
    try:
        body = await post(client, tok, id="rel-owner")
    finally:
        release.set()
        await holder
        services.db.lock_timeout = "2s"
    assert body["data"] is None
    error = body["errors"][0]
    assert error["extensions"]["code"] == "DATABASE_UNAVAILABLE", error
    assert "SELECT" not in error["message"] and "supports" not in error["message"]
