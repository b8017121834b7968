"""Related relationships (recallMemory, part 2) against the real database.

The scenario is a small shared graph with equivalent statements by two owners,
ineligible relationships of every kind, private relationships and another team.
"""

from __future__ import annotations

from typing import Any

import httpx
from starlette.applications import Starlette

from gateway.services.writes import WriteService
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl
from .test_recall import token

RELATED = """
query Related($q: String, $limit: Int, $rel: Int, $com: Int, $comRel: Int,
              $knownEv: [ID!], $knownRel: [ID!], $knownAt: DateTime, $validAt: DateTime) {
  recallMemory(query: $q, limit: $limit, relationshipLimit: $rel, communityLimit: $com,
               communityRelationshipLimit: $comRel, knownEvidenceIds: $knownEv,
               knownRelationshipIds: $knownRel, knownAt: $knownAt, validAt: $validAt) {
    results { evidenceId supportingRelationships { id semanticGroup } }
    relatedRelationships {
      representativeId equivalentIds semanticGroup
      representative { id statement ownerId spaceKind status semanticGroup subject { name } object { name } }
    }
    relatedCommunities {
      id summary topEntities topPredicates relationshipCount membersTruncated
      members { representativeId equivalentIds semanticGroup representative { id ownerId spaceKind } }
    }
    degradations { frontier code message optional }
    searchStates {
      relationships { status complete lists { spaceKind list status candidates } }
      communities { status complete }
    }
  }
}
"""


def rel(
    team: str,
    rid: str,
    subject: str,
    predicate: str,
    obj: str | None = None,
    *,
    value: str | None = None,
    owner: str = "alice",
    evidence: tuple[str, ...] = (),
    space: str = "shared",
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": "relationship",
        "team": team,
        "id": rid,
        "space": space,
        "subject": subject,
        "predicate": predicate,
        "supports": [{"id": f"sup-{rid}-{e}", "evidence": e} for e in evidence],
    }
    if space == "shared":
        out["owner"] = owner
    if obj is not None:
        out["object"] = obj
    else:
        out["object_value"] = value
    return out


def graph_records(team: str, *, secret: bool = False) -> list[dict[str, Any]]:
    """A shared graph in two clusters and a singleton, plus private and ineligible material.

    Billing cluster: billing owned_by payments (alice and bob: one semantic group),
    billing charges_cards_through stripe, invoice job feeds billing, invoice job
    writes_to ledger (shared evidence), payments reconciles ledger.
    Orders cluster: orders accessed_through pool, pool max_connections 400.
    Singleton: zebra eats hay. Ineligible: retracted, revoked, unsupported.
    """
    ent = [
        ("billing", "Billing service"),
        ("payments", "Payments team"),
        ("stripe", "Stripe"),
        ("invoices", "Invoice job"),
        ("ledger", "Ledger"),
        ("orders", "Orders database"),
        ("pool", "Connection pool"),
        ("zebra", "Zebra"),
        ("hay", "Hay"),
        ("vault", "Vault"),
    ]
    ev = [
        ("e-own", "The billing service is owned by the payments team."),
        ("e-own2", "Bob says the payments team owns billing."),
        ("e-stripe", "Billing charges cards through Stripe."),
        ("e-invoice", "The invoice job feeds billing and writes invoices to the ledger."),
        ("e-ledger", "The ledger is reconciled by the payments team."),
        ("e-orders", "The orders database is reached through the connection pool."),
        ("e-pool", "The connection pool is capped at 400 connections."),
        ("e-zebra", "The zebra eats hay."),
        ("e-retracted", "Billing was once retired by the vault."),
        ("e-revoked", "Billing is audited by the vault."),
    ]
    records: list[dict[str, Any]] = [
        {"kind": "team", "id": team, "name": f"Team {team}"},
        {"kind": "principal", "team": team, "id": "alice", "display_name": "Alice"},
        {"kind": "principal", "team": team, "id": "bob", "display_name": "Bob"},
        {"kind": "source", "team": team, "id": "src", "type": "document", "title": "Wiki"},
    ]
    records += [
        {"kind": "entity", "team": team, "id": i, "name": n, "type": "thing"} for i, n in ent
    ]
    records += [
        {"kind": "evidence", "team": team, "id": i, "source": "src", "content": c} for i, c in ev
    ]
    records += [
        rel(team, "r-own-alice", "billing", "owned_by", "payments", evidence=("e-own",)),
        rel(
            team, "r-own-bob", "billing", "owned_by", "payments", owner="bob", evidence=("e-own2",)
        ),
        rel(team, "r-stripe", "billing", "charges_cards_through", "stripe", evidence=("e-stripe",)),
        rel(team, "r-inv-billing", "invoices", "feeds", "billing", evidence=("e-invoice",)),
        rel(team, "r-inv-ledger", "invoices", "writes_to", "ledger", evidence=("e-invoice",)),
        rel(
            team,
            "r-ledger",
            "payments",
            "reconciles",
            "ledger",
            owner="bob",
            evidence=("e-ledger",),
        ),
        rel(team, "r-orders", "orders", "accessed_through", "pool", evidence=("e-orders",)),
        rel(team, "r-pool", "pool", "max_connections", value="400", evidence=("e-pool",)),
        rel(team, "r-zebra", "zebra", "eats", "hay", evidence=("e-zebra",)),
        rel(team, "r-retracted", "billing", "retired_by", "vault", evidence=("e-retracted",)),
        rel(team, "r-revoked", "billing", "audited_by", "vault", evidence=("e-revoked",)),
        rel(team, "r-unsupported", "billing", "billed_by", "vault"),
        # Alice's private notes: a private relationship about billing ownership.
        {
            "kind": "source",
            "team": team,
            "id": "src-private",
            "space": "private:alice",
            "type": "conversation",
            "title": "Notes",
        },
        {
            "kind": "entity",
            "team": team,
            "id": "p-billing",
            "space": "private:alice",
            "name": "Billing service",
            "type": "thing",
        },
        {
            "kind": "evidence",
            "team": team,
            "id": "e-private",
            "source": "src-private",
            "content": "Private: billing payments owner is changing.",
        },
        rel(
            team,
            "r-private",
            "p-billing",
            "owned_by_soon",
            value="payments team",
            evidence=("e-private",),
            space="private:alice",
        ),
    ]
    if secret:  # only in the other team: must never be visible to the first
        records.append(
            rel(team, "r-secret", "billing", "owned_by_secretly", "vault", evidence=("e-own",))
        )
    return records


def changes(team: str) -> list[dict[str, Any]]:
    return [
        {
            "kind": "relationship_transition",
            "team": team,
            "id": "t-retract",
            "relationship": "r-retracted",
            "status": "retracted",
        },
        {
            "kind": "support_decision",
            "team": team,
            "id": "d-revoke",
            "support": "sup-r-revoked-e-revoked",
            "decision": "revoke",
        },
    ]


async def load_graph(writes: WriteService, team: str, **kw: Any) -> None:
    await load_jsonl(writes, jsonl(graph_records(team, **kw)))
    await load_jsonl(writes, jsonl(changes(team)))


async def related(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    r = await client.post(
        "/graphql",
        json={"query": RELATED, "variables": variables},
        headers={"Authorization": f"Bearer {tok}"},
    )
    body = r.json()
    assert "errors" not in body, body
    result: dict[str, Any] = body["data"]["recallMemory"]
    return result


def rep_ids(result: dict[str, Any]) -> list[str]:
    return [h["representativeId"] for h in result["relatedRelationships"]]


def all_ids(result: dict[str, Any]) -> set[str]:
    """Every relationship ID of the related and community frontiers."""
    out: set[str] = set()
    for h in result["relatedRelationships"]:
        out |= {h["representativeId"], *h["equivalentIds"]}
    for c in result["relatedCommunities"]:
        for h in c["members"]:
            out |= {h["representativeId"], *h["equivalentIds"]}
    return out


def codes(result: dict[str, Any], frontier: str) -> list[str]:
    return [d["code"] for d in result["degradations"] if d["frontier"] == frontier]


async def test_related_relationships_collapse_equivalents_and_keep_owners(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("rel")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")  # bob's private space is empty
    # limit 1: only the Stripe evidence is returned, so the ownership group is not covered.
    result = await related(
        client, tok, q="billing charges cards through Stripe", limit=1, rel=20, com=0
    )
    assert [r["evidenceId"] for r in result["results"]] == ["e-stripe"]
    handles = {h["semanticGroup"]: h for h in result["relatedRelationships"]}
    own = next(h for h in handles.values() if h["representativeId"] in ("r-own-alice", "r-own-bob"))
    ids = {own["representativeId"], *own["equivalentIds"]}
    assert ids == {"r-own-alice", "r-own-bob"}
    assert len(own["equivalentIds"]) == 1
    # owners are not merged: the representative keeps its own owner
    expected_owner = "alice" if own["representativeId"] == "r-own-alice" else "bob"
    assert own["representative"]["ownerId"] == expected_owner
    assert own["representative"]["spaceKind"] == "SHARED"
    assert own["representative"]["status"] == "ACTIVE"
    assert own["representative"]["subject"] == {"name": "Billing service"}
    # one handle per group; the returned evidence's group (Stripe) is covered
    assert len(handles) == len(result["relatedRelationships"])
    assert "r-stripe" not in all_ids(result)
    assert result["searchStates"]["relationships"]["status"] == "COMPLETE"
    lists = {entry["list"]: entry for entry in result["searchStates"]["relationships"]["lists"]}
    assert lists["FULLTEXT"]["status"] == "COMPLETE" and lists["FULLTEXT"]["candidates"] > 0
    assert lists["VECTOR"]["status"] == "COMPLETE" and lists["VECTOR"]["candidates"] > 0
    assert codes(result, "RELATIONSHIPS") == []


async def test_ineligible_private_and_other_team_relationships_never_appear(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team, other = unique("relx"), unique("rely")
    await load_graph(writes, team)
    await load_graph(writes, other, secret=True)
    tok = await token(writes, team, "alice")  # private-bound: reads her private space too
    result = await related(client, tok, q="billing vault payments owner", limit=1, rel=20, com=0)
    found = all_ids(result)
    assert found, "the scenario should discover something"
    for never in ("r-retracted", "r-revoked", "r-unsupported", "r-private", "r-secret"):
        assert never not in found, never
    assert all(h["representative"]["spaceKind"] == "SHARED" for h in result["relatedRelationships"])
    # the other team's own recall does see its secret relationship (the scenario is live)
    other_tok = await token(writes, other, "alice")
    seen = await related(
        client, other_tok, q="billing owned secretly by vault", limit=1, rel=20, com=0
    )
    assert "r-secret" in all_ids(seen) or "r-secret" in {
        r["id"] for x in seen["results"] for r in x["supportingRelationships"]
    }


async def test_known_equivalents_and_known_evidence_suppress_the_whole_group(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("relk")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")  # bob's private space is empty
    q = "billing charges cards through Stripe"
    base = await related(client, tok, q=q, limit=1, rel=20, com=0)
    assert {"r-own-alice", "r-own-bob"} <= all_ids(base)
    # knowing bob's statement covers alice's equivalent statement too
    by_rel = await related(client, tok, q=q, limit=1, rel=20, com=0, knownRel=["r-own-bob"])
    assert not {"r-own-alice", "r-own-bob"} & all_ids(by_rel)
    # knowing the evidence that supports bob's statement covers the group as well
    by_ev = await related(client, tok, q=q, limit=1, rel=20, com=0, knownEv=["e-own2"])
    assert not {"r-own-alice", "r-own-bob"} & all_ids(by_ev)
    # and the returned evidence covers its own groups
    own_q = await related(client, tok, q="who owns the billing service", limit=10, rel=20, com=0)
    returned = {r["id"] for x in own_q["results"] for r in x["supportingRelationships"]}
    assert "r-own-alice" in returned
    assert not {"r-own-alice", "r-own-bob"} & all_ids(own_q)
    # an ID of another team or a private one covers nothing and is not an error
    other = await related(client, tok, q=q, limit=1, rel=20, com=0, knownRel=["no-such-id"])
    assert rep_ids(other) == rep_ids(base)


async def test_order_is_deterministic_and_limit_cuts_it(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("relo")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")  # bob's private space is empty
    q = "billing ledger invoices payments"
    first = await related(client, tok, q=q, limit=1, rel=20, com=0)
    again = await related(client, tok, q=q, limit=1, rel=20, com=0)
    assert rep_ids(first) == rep_ids(again) and len(rep_ids(first)) >= 3
    cut = await related(client, tok, q=q, limit=1, rel=2, com=0)
    assert rep_ids(cut) == rep_ids(first)[:2]
    off = await related(client, tok, q=q, limit=1, rel=0, com=0)
    assert off["relatedRelationships"] == []
    assert off["searchStates"]["relationships"]["status"] == "DISABLED"


async def test_vectors_of_an_inactive_projection_degrade_to_lexical(
    client: httpx.AsyncClient, writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("relw")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")  # bob's private space is empty
    q = "connection pool capped"
    # the projection generation is rebuilding: its vectors must not be searched
    await admin_conn.execute(
        "UPDATE relationship_projections SET status = 'building' WHERE team_id = $1", team
    )
    warming = await related(client, tok, q=q, limit=1, rel=20, com=0)
    assert codes(warming, "RELATIONSHIPS") == ["relationship_vector_warming"]
    lists = {e["list"]: e for e in warming["searchStates"]["relationships"]["lists"]}
    assert lists["VECTOR"]["candidates"] == 0 and lists["VECTOR"]["status"] == "SKIPPED"
    assert lists["FULLTEXT"]["status"] == "COMPLETE"
    assert warming["searchStates"]["relationships"]["complete"] is False
    assert "r-orders" in all_ids(warming)  # lexical discovery still answers ("connection pool")
    # with the vector list alone, unrelated statements are found too; lexical-only is narrower
    assert "r-zebra" not in all_ids(warming)
    await admin_conn.execute(
        "UPDATE relationship_projections SET status = 'failed' WHERE team_id = $1", team
    )
    failed = await related(client, tok, q=q, limit=1, rel=20, com=0)
    assert codes(failed, "RELATIONSHIPS") == ["relationship_vector_failed"]
    await admin_conn.execute(
        "UPDATE relationship_projections SET status = 'active' WHERE team_id = $1", team
    )
    ready = await related(client, tok, q=q, limit=1, rel=20, com=0)
    assert codes(ready, "RELATIONSHIPS") == []
    assert "r-zebra" in all_ids(ready)  # the vector list returns the nearest, however far


async def test_temporal_view_of_related_relationships(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("relt")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")  # bob's private space is empty
    early = await related(
        client, tok, q="billing payments", limit=1, rel=20, com=0, knownAt="2000-01-01T00:00:00Z"
    )
    assert early["relatedRelationships"] == []


async def test_lost_relationship_vectors_degrade_and_lost_lexical_list_fails(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService, db: Database
) -> None:
    """Real faults: a lock that discovery cannot get within its lock timeout."""
    import asyncio

    from .test_recall import _hold_lock

    team = unique("relf")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")
    async with db.pool.acquire() as conn:
        shared = await conn.fetchval(
            "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", team
        )
    services = gateway_app.state.services
    services.db.lock_timeout = "300ms"
    vectors = "relationship_embeddings_" + str(shared).replace("-", "")
    try:
        ready, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold_lock(db, vectors, ready, release))
        await ready.wait()
        try:
            result = await related(client, tok, q="connection pool capped", limit=1, rel=20, com=0)
        finally:
            release.set()
            await holder
        assert codes(result, "RELATIONSHIPS") == ["relationship_vector_failed"]
        assert "r-orders" in all_ids(result)  # the lexical list still answered
        lists = {e["list"]: e["status"] for e in result["searchStates"]["relationships"]["lists"]}
        assert lists == {"FULLTEXT": "COMPLETE", "VECTOR": "FAILED"}

        ready, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold_lock(db, "relationship_terms", ready, release))
        await ready.wait()
        try:
            r = await client.post(
                "/graphql",
                json={"query": RELATED, "variables": {"q": "connection pool", "limit": 1}},
                headers={"Authorization": f"Bearer {tok}"},
            )
        finally:
            release.set()
            await holder
        error = r.json()["errors"][0]
        assert error["extensions"]["code"] == "DATABASE_UNAVAILABLE"
    finally:
        services.db.lock_timeout = "2s"


async def test_known_at_view_of_related_is_unchanged_by_later_writes(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    import asyncio
    from datetime import UTC, datetime

    team = unique("relh")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")
    q = "billing charges cards through Stripe"
    before = await related(client, tok, q=q, limit=1, rel=20, com=0)
    assert "r-ledger" in all_ids(before)
    await asyncio.sleep(0.01)
    t = datetime.now(UTC).isoformat()
    await asyncio.sleep(0.01)
    await load_jsonl(
        writes,
        jsonl(
            [
                {
                    "kind": "relationship_transition",
                    "team": team,
                    "id": "t-later",
                    "relationship": "r-ledger",
                    "status": "retracted",
                },
                {
                    "kind": "support_decision",
                    "team": team,
                    "id": "d-later",
                    "support": "sup-r-orders-e-orders",
                    "decision": "revoke",
                },
            ]
        ),
    )
    after = await related(client, tok, q=q, limit=1, rel=20, com=0)
    assert not {"r-ledger", "r-orders"} & all_ids(after)
    past = await related(client, tok, q=q, limit=1, rel=20, com=0, knownAt=t)

    def strip(r: dict[str, Any]) -> list[tuple[str, list[str]]]:
        return [(h["representativeId"], h["equivalentIds"]) for h in r["relatedRelationships"]]

    assert strip(past) == strip(before)
