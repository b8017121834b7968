"""recallMemory over HTTP against the real database: eligibility, views, branches."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
import pytest
from starlette.applications import Starlette

from gateway import tokens
from gateway.services.communities import build_communities
from gateway.services.records import TokenRecord
from gateway.services.writes import Actor, WriteService
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records

RECALL = """
query Recall($q: String, $limit: Int, $knownAt: DateTime, $validAt: DateTime,
             $known: [ID!], $entities: [ID!]) {
  recallMemory(query: $q, limit: $limit, knownAt: $knownAt, validAt: $validAt,
               knownEvidenceIds: $known, expandFromEntityIds: $entities) {
    recallId
    results {
      evidenceId rank context spaceKind recordedAt
      source { id title status authority }
      supportingRelationships { id predicate statement status subject { id name } object { id } }
    }
    relatedRelationships { representativeId }
    conflicts { id }
    degradations { frontier code message optional }
    searchStates { evidence { status complete lists { spaceKind list status } } }
  }
}
"""


Binding = Literal["private", "shared_only"]
"""A token's binding (gateway.services.records.TokenRecord)."""


async def token(
    writes: WriteService, team: str, principal: str, binding: Binding = "private"
) -> str:
    token_id, secret = tokens.new_token_id(), tokens.new_secret()
    record = TokenRecord(
        kind="token", team=team, id=token_id, principal=principal, binding=binding, secret=secret
    )
    await writes.apply([record], Actor.operator())
    return tokens.format_token(token_id, secret)


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


def ids(result: dict[str, Any]) -> list[str]:
    return [r["evidenceId"] for r in result["results"]]


def evidence_codes(result: dict[str, Any]) -> list[str]:
    """Degradations of the evidence frontier (a team without a community snapshot
    also reports community_snapshot_unavailable, tested in test_communities.py)."""
    return [d["code"] for d in result["degradations"] if d["frontier"] == "EVIDENCE"]


async def recall_error(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    r = await client.post(
        "/graphql",
        json={"query": RECALL, "variables": variables},
        headers={"Authorization": f"Bearer {tok}"},
    )
    body = r.json()
    assert body.get("errors"), body
    error: dict[str, Any] = body["errors"][0]
    return error


def more_evidence(team: str, n: int, *, space: str = "shared") -> list[dict[str, Any]]:
    """n supported evidence fragments about billing, in a space."""
    suffix = "" if space == "shared" else "-" + space.replace(":", "-")
    src, ent = f"src-bulk{suffix}", f"ent-bulk{suffix}"
    out: list[dict[str, Any]] = [
        {
            "kind": "source",
            "team": team,
            "id": src,
            "space": space,
            "type": "document",
            "title": "Bulk notes",
        },
        {
            "kind": "entity",
            "team": team,
            "id": ent,
            "space": space,
            "name": "Billing",
            "type": "system",
        },
    ]
    for i in range(n):
        out.append(
            {
                "kind": "evidence",
                "team": team,
                "id": f"ev-bulk{suffix}-{i:03d}",
                "source": src,
                "content": f"Billing note {i}: invoices batch number {i} ran.",
            }
        )
        out.append(
            {
                "kind": "relationship",
                "team": team,
                "id": f"rel-bulk{suffix}-{i:03d}",
                "space": space,
                "subject": ent,
                "predicate": "ran_batch",
                "object_value": str(i),
                "owner": "alice",
                "supports": [
                    {"id": f"sup-bulk{suffix}-{i:03d}", "evidence": f"ev-bulk{suffix}-{i:03d}"}
                ],
            }
        )
    return out


async def test_finds_supported_evidence_with_its_source_and_relationships(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("rc")
    await load_jsonl(writes, jsonl(team_records(team)))
    await build_communities(db, team, max_nodes=100, max_edges=100)
    tok = await token(writes, team, "bob")  # bob's private space is empty
    result = await recall(client, tok, q="who owns the billing service")
    assert ids(result)[0] == "ev-owner"
    top = result["results"][0]
    assert top["rank"] == 1 and top["spaceKind"] == "SHARED"
    assert top["source"] == {
        "id": "src-handbook",
        "title": "Handbook",
        "status": "ACTIVE",
        "authority": "HIGH",
    }
    rel = top["supportingRelationships"][0]
    assert rel["id"] == "rel-owner" and rel["subject"] == {
        "id": "billing",
        "name": "Billing service",
    }
    assert rel["object"] == {"id": "payments-team"}
    assert result["degradations"] == []
    assert result["searchStates"]["evidence"]["complete"] is True


async def test_private_material_only_for_its_owner_with_a_private_token(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("rcp")
    await load_jsonl(writes, jsonl(team_records(team)))
    alice = await token(writes, team, "alice")
    alice_shared = await token(writes, team, "alice", "shared_only")
    bob = await token(writes, team, "bob")
    q = "billing latency spikes at noon"
    assert "ev-private" in ids(await recall(client, alice, q=q))
    kinds = {r["evidenceId"]: r["spaceKind"] for r in (await recall(client, alice, q=q))["results"]}
    assert kinds["ev-private"] == "PRIVATE"
    assert "ev-private" not in ids(await recall(client, alice_shared, q=q))
    assert "ev-private" not in ids(await recall(client, bob, q=q))
    lists = (await recall(client, alice_shared, q=q))["searchStates"]["evidence"]["lists"]
    assert {entry["spaceKind"] for entry in lists} == {"SHARED"}


async def test_another_team_never_appears(client: httpx.AsyncClient, writes: WriteService) -> None:
    team_a, team_b = unique("rca"), unique("rcb")
    await load_jsonl(writes, jsonl(team_records(team_a) + team_records(team_b)))
    tok_b = await token(writes, team_b, "alice")
    result = await recall(client, tok_b, q=f"billing service of {team_a} owned by payments")
    for r in result["results"]:
        assert team_a not in r["context"]
    assert ids(result) and all(
        team_b in r["context"] or "Private" in r["context"] for r in result["results"]
    )


async def test_stale_hits_are_dropped(client: httpx.AsyncClient, writes: WriteService) -> None:
    """Search documents stay; canonical state decides."""
    team = unique("stale")
    records = team_records(team) + [
        {"kind": "source", "team": team, "id": "src-2", "type": "document", "title": "Wiki"},
        {"kind": "entity", "team": team, "id": "cache", "name": "Cache", "type": "system"},
    ]
    topics = ["withdrawn-ev", "withdrawn-src", "revoked", "retracted", "expired", "current"]
    for t in topics:
        src = "src-2" if t == "withdrawn-src" else "src-handbook"
        valid_to = "2020-01-01T00:00:00Z" if t == "expired" else None
        rel: dict[str, Any] = {
            "kind": "relationship",
            "team": team,
            "id": f"rel-{t}",
            "subject": "cache",
            "predicate": "evicts",
            "object_value": t,
            "owner": "alice",
            "supports": [{"id": f"sup-{t}", "evidence": f"ev-{t}"}],
        }
        if valid_to:
            rel["valid_from"], rel["valid_to"] = "2019-01-01T00:00:00Z", valid_to
        records += [
            {
                "kind": "evidence",
                "team": team,
                "id": f"ev-{t}",
                "source": src,
                "content": f"The cache evicts entries hourly ({t}).",
            },
            rel,
        ]
    records.append(
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-unsupported",
            "source": "src-handbook",
            "content": "The cache evicts entries hourly (unsupported).",
        }
    )
    await load_jsonl(writes, jsonl(records))
    await load_jsonl(
        writes,
        jsonl(
            [
                {
                    "kind": "evidence_lifecycle",
                    "team": team,
                    "id": "c1",
                    "evidence": "ev-withdrawn-ev",
                    "status": "withdrawn",
                },
                {
                    "kind": "source_lifecycle",
                    "team": team,
                    "id": "c2",
                    "source": "src-2",
                    "status": "withdrawn",
                },
                {
                    "kind": "support_decision",
                    "team": team,
                    "id": "c3",
                    "support": "sup-revoked",
                    "decision": "revoke",
                },
                {
                    "kind": "relationship_transition",
                    "team": team,
                    "id": "c4",
                    "relationship": "rel-retracted",
                    "status": "retracted",
                },
            ]
        ),
    )
    tok = await token(writes, team, "alice")
    found = ids(await recall(client, tok, q="cache evicts entries hourly", limit=20))
    assert "ev-current" in found
    for gone in (
        "ev-withdrawn-ev",
        "ev-withdrawn-src",
        "ev-revoked",
        "ev-retracted",
        "ev-expired",
        "ev-unsupported",
    ):
        assert gone not in found, gone
    then = await recall(
        client, tok, q="cache evicts entries hourly", limit=20, validAt="2019-06-01T00:00:00Z"
    )
    assert "ev-expired" in ids(then) and "ev-current" in ids(then)


async def test_known_at_view_is_unchanged_by_later_writes(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("kat")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    q = "who owns the billing service"
    before = await recall(client, tok, q=q)
    await asyncio.sleep(0.01)
    t = datetime.now(UTC).isoformat()
    await asyncio.sleep(0.01)
    await load_jsonl(
        writes,
        jsonl(
            [
                {
                    "kind": "source_lifecycle",
                    "team": team,
                    "id": "w",
                    "source": "src-handbook",
                    "status": "withdrawn",
                },
            ]
        ),
    )
    after = await recall(client, tok, q=q)
    assert "ev-owner" in ids(before) and "ev-owner" not in ids(after)
    past = await recall(client, tok, q=q, knownAt=t)

    def strip(r: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
        return [(x["evidenceId"], x["rank"], x["source"]) for x in r["results"]]

    assert strip(past) == strip(before)
    # and before the team existed, nothing at all
    early = await recall(client, tok, q=q, knownAt="2000-01-01T00:00:00Z")
    assert early["results"] == []


async def test_conflict_resolution_changes_eligible_paths(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("conf")
    records = team_records(team) + [
        {
            "kind": "entity",
            "team": team,
            "id": "ledger",
            "name": "Ledger team",
            "type": "organization",
        },
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-alt",
            "source": "src-handbook",
            "content": "The billing service is owned by the ledger team, says the old chart.",
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-alt",
            "subject": "billing",
            "predicate": "owned_by",
            "object": "ledger",
            "owner": "bob",
            "supports": [{"id": "sup-alt", "evidence": "ev-alt"}],
        },
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
    await load_jsonl(writes, jsonl(records))
    tok = await token(writes, team, "alice")
    q = "billing service owned by team"
    assert {"ev-owner", "ev-alt"} <= set(ids(await recall(client, tok, q=q)))
    await load_jsonl(
        writes,
        jsonl(
            [
                {
                    "kind": "conflict_resolution",
                    "team": team,
                    "id": "res",
                    "case": "case",
                    "preferred_position": "pos-pay",
                }
            ]
        ),
    )
    resolved = ids(await recall(client, tok, q=q))
    assert "ev-owner" in resolved and "ev-alt" not in resolved
    await load_jsonl(
        writes, jsonl([{"kind": "conflict_reopening", "team": team, "id": "reo", "case": "case"}])
    )
    assert "ev-alt" in ids(await recall(client, tok, q=q))


async def test_hypotheses_never_satisfy_support(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("hyp")
    records = team_records(team) + [
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-hunch",
            "source": "src-handbook",
            "content": "Maybe the billing outage came from the payments deploy.",
        },
        {
            "kind": "hypothesis",
            "team": team,
            "id": "h",
            "statement": "deploys cause outages",
            "evidence": ["ev-hunch"],
            "relationships": ["rel-owner"],
        },
    ]
    await load_jsonl(writes, jsonl(records))
    tok = await token(writes, team, "alice")
    assert "ev-hunch" not in ids(await recall(client, tok, q="billing outage payments deploy"))


async def test_known_ids_and_entity_expansion(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("known")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    assert "ev-owner" not in ids(await recall(client, tok, q="billing owned", known=["ev-owner"]))
    by_entity = await recall(client, tok, entities=["payments-team"])
    assert ids(by_entity) == ["ev-owner"]


async def test_private_before_shared_on_equal_fused_score(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("tie")
    text = "Zebra unicorn quartz rhapsody."
    records = team_records(team) + [
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-tie-shared",
            "source": "src-handbook",
            "content": text,
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-tie-s",
            "subject": "billing",
            "predicate": "noted",
            "object_value": "z",
            "owner": "alice",
            "supports": [{"id": "sup-tie-s", "evidence": "ev-tie-shared"}],
        },
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-tie-private",
            "source": "src-notes",
            "content": text,
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-tie-p",
            "space": "private:alice",
            "subject": "p-billing",
            "predicate": "noted",
            "object_value": "z",
            "supports": [{"id": "sup-tie-p", "evidence": "ev-tie-private"}],
        },
    ]
    await load_jsonl(writes, jsonl(records))
    tok = await token(writes, team, "alice")
    top = ids(await recall(client, tok, q=text, limit=2))
    assert top == ["ev-tie-private", "ev-tie-shared"]


@pytest.mark.parametrize(
    ("variables", "field"),
    [
        ({"q": "x", "limit": 0}, "limit"),
        ({"q": "x", "limit": 51}, "limit"),
        ({}, "query"),
        ({"q": "   "}, "query"),
        ({"q": "x", "knownAt": "2026-01-01T00:00:00"}, "knownAt"),
        ({"q": "x", "knownAt": "2999-01-01T00:00:00Z"}, "knownAt"),
        ({"q": "x", "known": ["bad id!"]}, "knownEvidenceIds"),
    ],
)
async def test_bad_input_is_a_clear_error(
    client: httpx.AsyncClient, writes: WriteService, variables: dict[str, Any], field: str
) -> None:
    team = unique("bad")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    error = await recall_error(client, tok, **variables)
    assert error["extensions"]["code"] == "BAD_USER_INPUT", error
    assert error["extensions"]["field"] == field


async def test_statements_do_not_grow_with_limit(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService
) -> None:
    team = unique("stmts")
    await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, 40)))
    tok = await token(writes, team, "alice")
    counter = gateway_app.state.services.db.counter
    counts = {}
    for limit in (1, 10, 40):
        before = counter.count
        # A question of its own per limit: none is in the query embedding LRU.
        result = await recall(client, tok, q=f"billing note invoices batch {limit}", limit=limit)
        counts[limit] = counter.count - before
        assert len(result["results"]) == limit
    assert counts[1] == counts[10] == counts[40], counts
    # A full recall (every frontier at its default limits, feedback on) sends 10:
    # the token lookup, BEGIN, the tenant settings, the view with the full-text
    # lists and their hydration (sent while the question is embedded), the
    # vector lists with theirs, relationship discovery on a side connection
    # beside them (one statement, its tenant settings in it), the community
    # snapshot, the handles with the hypotheses and the conflicts, the nested
    # rows with the recall event, and COMMIT (gateway/store/round_trips.py).
    assert counts[10] == 10, counts
    # A question asked before has its embedding at once (the LRU): every list
    # goes with the view, one statement fewer, whatever the limit.
    repeated = {}
    for limit in (1, 10, 40):
        before = counter.count
        await recall(client, tok, q="billing note invoices batch 10", limit=limit)
        repeated[limit] = counter.count - before
    assert repeated == {1: 9, 10: 9, 40: 9}, repeated


BARE = """query Bare($q: String) { recallMemory(query: $q) {
  results { evidenceId } relatedRelationships { representativeId } } }"""

NESTED = """query Nested($q: String) { recallMemory(query: $q) {
  results { evidenceId source { id title status }
            supportingRelationships { id statement subject { name } object { name } } }
  relatedRelationships { representativeId representative { subject { name } } } } }"""


async def test_nested_fields_cost_no_statement_of_their_own(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService
) -> None:
    """Sources, supporting relationships and their entities are read with the
    answer (one statement in the recall's transaction) and prime the request's
    loaders: asking for them sends no more statements than not asking, and they
    are the rows the loaders would read."""
    team = unique("nested")
    await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, 5)))
    tok = await token(writes, team, "alice")
    counter = gateway_app.state.services.db.counter
    headers = {"Authorization": f"Bearer {tok}"}
    counts, bodies = {}, {}
    for name, document in (("bare", BARE), ("nested", NESTED)):
        # warm: type introspection of new statements, and the question's embedding
        # (so that both documents' recalls read it from the LRU alike)
        await client.post(
            "/graphql",
            json={"query": document, "variables": {"q": "billing service owner"}},
            headers=headers,
        )
        before = counter.count
        r = await client.post(
            "/graphql",
            json={"query": document, "variables": {"q": "billing service owner"}},
            headers=headers,
        )
        counts[name] = counter.count - before
        bodies[name] = r.json()
        assert "errors" not in bodies[name], bodies[name]
    assert counts["nested"] == counts["bare"], counts
    results = bodies["nested"]["data"]["recallMemory"]["results"]
    assert results and all(r["source"]["status"] == "ACTIVE" for r in results), results
    assert all(rel["subject"]["name"] for r in results for rel in r["supportingRelationships"]), (
        results
    )


async def _hold_lock(
    dsn_admin_db: Database, table: str, ready: asyncio.Event, release: asyncio.Event
) -> None:
    async with dsn_admin_db.pool.acquire() as conn, conn.transaction():
        await conn.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
        ready.set()
        await release.wait()


async def test_vector_failure_degrades_and_required_failure_fails(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService, db: Database
) -> None:
    """Real faults: a lock that the search cannot get within its lock timeout."""
    team = unique("lock")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    async with db.pool.acquire() as conn:
        spaces = {
            r["owner_principal_id"]: r["id"]
            for r in await conn.fetch(
                "SELECT id, owner_principal_id FROM memory_spaces WHERE team_id = $1", team
            )
        }
    services = gateway_app.state.services
    services.db.lock_timeout = "300ms"
    private_vectors = "evidence_embeddings_" + str(spaces["alice"]).replace("-", "")
    try:
        ready, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold_lock(db, private_vectors, ready, release))
        await ready.wait()
        try:
            result = await recall(client, tok, q="billing latency spikes at noon")
        finally:
            release.set()
            await holder
        assert evidence_codes(result) == ["vector_branch_failed"]
        assert "ev-private" in ids(result)  # the private full-text list still answered
        assert result["searchStates"]["evidence"]["complete"] is False

        ready, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold_lock(db, "evidence", ready, release))
        await ready.wait()
        try:
            r = await client.post(
                "/graphql",
                json={"query": RECALL, "variables": {"q": "billing"}},
                headers={"Authorization": f"Bearer {tok}"},
            )
        finally:
            release.set()
            await holder
        error = r.json()["errors"][0]
        assert error["extensions"]["code"] == "DATABASE_UNAVAILABLE"
        assert "Traceback" not in r.text and "SELECT" not in r.text
    finally:
        services.db.lock_timeout = "2s"
