"""The conflict frontier of recallMemory, against the real database.

Relationship cases reached from the answer, their state and dispositions as of
the view's system time (before and after a resolution, after a reopening),
supporter summaries, positions owned by different principals, evidence
conflicts with exact citations, what a caller may not read, cap and order,
statement count, and that a failure to load them is an error.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.applications import Starlette

from gateway.services.conflicts import MAX_CONFLICTS, MAX_SUPPORTERS
from gateway.services.writes import WriteService
from gateway.store import conflicts as store
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import more_evidence, token

RECALL = """
query Recall(
  $q: String, $limit: Int, $knownAt: DateTime, $known: [ID!], $rels: Int, $communities: Int
) {
  recallMemory(
    query: $q, limit: $limit, knownAt: $knownAt, knownEvidenceIds: $known,
    relationshipLimit: $rels, communityLimit: $communities
  ) {
    results { evidenceId rank spaceKind supportingRelationships { id } }
    relatedRelationships { representativeId equivalentIds }
    conflicts {
      __typename id question
      ... on RelationshipConflict {
        state preferredPositionId stateChangedAt
        positions {
          id label disposition relationshipIds supporterCount supportersTruncated
          supporters { evidenceId sourceId authority }
          relationships { id ownerId }
        }
      }
      ... on EvidenceConflict {
        positions { id label citation { evidenceId occurrenceId quote spanStart spanEnd authority } }
      }
    }
    degradations { code }
  }
}
"""


async def post(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    r = await client.post(
        "/graphql",
        json={"query": RECALL, "variables": variables},
        headers={"Authorization": f"Bearer {tok}"},
    )
    body: dict[str, Any] = r.json()
    return body


async def recall(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    body = await post(client, tok, **variables)
    assert "errors" not in body, body
    result: dict[str, Any] = body["data"]["recallMemory"]
    return result


def ids(result: dict[str, Any]) -> list[str]:
    return [r["evidenceId"] for r in result["results"]]


def case(result: dict[str, Any], case_id: str) -> dict[str, Any] | None:
    found = [c for c in result["conflicts"] if c["id"] == case_id]
    assert len(found) <= 1
    return found[0] if found else None


def positions(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["id"]: p for p in c["positions"]}


async def instant() -> str:
    """A system-time instant strictly between two writes."""
    await asyncio.sleep(0.02)
    t = datetime.now(UTC).isoformat()
    await asyncio.sleep(0.02)
    return t


def ownership_case(team: str, *, extra_supporters: int = 0) -> list[dict[str, Any]]:
    """Who owns billing: payments (alice's statement) or ledger (bob's)."""
    out = team_records(team) + [
        {"kind": "entity", "team": team, "id": "ledger", "name": "Ledger team", "type": "org"},
        {
            "kind": "source",
            "team": team,
            "id": "src-chart",
            "type": "document",
            "title": "Old org chart",
            "authority": "low",
        },
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-alt",
            "source": "src-chart",
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
            "kind": "source",
            "team": team,
            "id": "src-board",
            "type": "document",
            "title": "Board minutes",
            "authority": "authoritative",
        },
    ]
    for i in range(extra_supporters):
        src = "src-board" if i == 0 else "src-chart"
        out.append(
            {
                "kind": "evidence",
                "team": team,
                "id": f"ev-extra-{i}",
                "source": src,
                "content": f"Zanzibar memo {i}: payments team keeps billing.",
            }
        )
        out.append(
            {
                "kind": "support",
                "team": team,
                "id": f"sup-extra-{i}",
                "relationship": "rel-owner",
                "evidence": f"ev-extra-{i}",
            }
        )
    out.append(
        {
            "kind": "conflict_case",
            "team": team,
            "id": "case",
            "question": "Who owns billing?",
            "positions": [
                {"id": "pos-pay", "label": "payments", "relationships": ["rel-owner"]},
                {"id": "pos-led", "label": "ledger", "relationships": ["rel-alt"]},
            ],
        }
    )
    return out


def change(team: str, kind: str, id_: str, **fields: Any) -> str:
    return jsonl([{"kind": kind, "team": team, "id": id_, **fields}])


async def test_case_state_over_time_with_owners_and_supporters(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team, other = unique("cft"), unique("cfo")
    # Six extra supporters of the payments position: one authoritative, five low;
    # one more low one whose support is revoked and one withdrawn: neither counts.
    records = ownership_case(team, extra_supporters=8)
    await load_jsonl(writes, jsonl(records + ownership_case(other)))
    await load_jsonl(
        writes, change(team, "support_decision", "rv", support="sup-extra-6", decision="revoke")
    )
    await load_jsonl(
        writes, change(team, "evidence_lifecycle", "wd", evidence="ev-extra-7", status="withdrawn")
    )
    # The other team resolves its own case of the same IDs: never seen here.
    await load_jsonl(
        writes,
        change(other, "conflict_resolution", "res", case="case", preferred_position="pos-led"),
    )
    alice = await token(writes, team, "alice")
    q = "billing service owned by team"

    t_open = await instant()
    await load_jsonl(
        writes,
        change(team, "conflict_resolution", "res", case="case", preferred_position="pos-pay"),
    )
    t_resolved = await instant()
    await load_jsonl(writes, change(team, "conflict_reopening", "reo", case="case"))

    # Before the resolution: both sides recalled, the case open and contested.
    before = await recall(client, alice, q=q, knownAt=t_open)
    assert {"ev-owner", "ev-alt"} <= set(ids(before))
    c = case(before, "case")
    assert c is not None and c["__typename"] == "RelationshipConflict"
    assert c["state"] == "OPEN" and c["preferredPositionId"] is None
    assert [p["id"] for p in c["positions"]] == ["pos-led", "pos-pay"]
    ps = positions(c)
    assert {p["disposition"] for p in ps.values()} == {"CONTESTED"}
    assert ps["pos-pay"]["relationshipIds"] == ["rel-owner"]
    assert ps["pos-led"]["relationshipIds"] == ["rel-alt"]
    # Positions owned by different principals keep their owners.
    assert ps["pos-pay"]["relationships"] == [{"id": "rel-owner", "ownerId": "alice"}]
    assert ps["pos-led"]["relationships"] == [{"id": "rel-alt", "ownerId": "bob"}]
    # ev-owner + ev-extra-0..5 (ev-extra-6 revoked, ev-extra-7 withdrawn).
    pay = ps["pos-pay"]
    assert pay["supporterCount"] == 7
    assert len(pay["supporters"]) == MAX_SUPPORTERS and pay["supportersTruncated"] is True
    assert pay["supporters"][0] == {
        "evidenceId": "ev-extra-0",
        "sourceId": "src-board",
        "authority": "AUTHORITATIVE",
    }
    assert pay["supporters"][1] == {
        "evidenceId": "ev-owner",
        "sourceId": "src-handbook",
        "authority": "HIGH",
    }
    assert [s["evidenceId"] for s in pay["supporters"][2:]] == [
        "ev-extra-1",
        "ev-extra-2",
        "ev-extra-3",
    ]
    led = ps["pos-led"]
    assert led["supporterCount"] == 1 and led["supportersTruncated"] is False
    assert led["supporters"] == [
        {"evidenceId": "ev-alt", "sourceId": "src-chart", "authority": "LOW"}
    ]

    # As resolved: the losing side's evidence has no eligible path any more,
    # but the case is still reached from the winning side, and the losing
    # position keeps its supporters.
    resolved = await recall(client, alice, q=q, knownAt=t_resolved)
    assert "ev-owner" in ids(resolved) and "ev-alt" not in ids(resolved)
    c = case(resolved, "case")
    assert c is not None
    assert c["state"] == "RESOLVED" and c["preferredPositionId"] == "pos-pay"
    ps = positions(c)
    assert ps["pos-pay"]["disposition"] == "PREFERRED"
    assert ps["pos-led"]["disposition"] == "DISPREFERRED"
    assert ps["pos-led"]["supporterCount"] == 1
    earlier = case(before, "case")
    assert earlier is not None
    assert c["stateChangedAt"] > earlier["stateChangedAt"]

    # Now (reopened): contested again, and the earlier views did not change.
    now = await recall(client, alice, q=q)
    c = case(now, "case")
    assert c is not None and c["state"] == "REOPENED" and c["preferredPositionId"] is None
    assert {p["disposition"] for p in c["positions"]} == {"CONTESTED"}
    assert {"ev-owner", "ev-alt"} <= set(ids(now))
    assert await recall(client, alice, q=q, knownAt=t_open) == before
    assert await recall(client, alice, q=q, knownAt=t_resolved) == resolved

    # Bob, the owner of the other position, sees the same case.
    bob = await token(writes, team, "bob", "shared_only")
    bob_view = await recall(client, bob, q=q)
    assert case(bob_view, "case") == c


async def test_case_not_shown_before_it_was_opened(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("cfb")
    base = ownership_case(team)
    await load_jsonl(writes, jsonl(base[:-1]))
    t_before = await instant()
    await load_jsonl(writes, jsonl(base[-1:]))
    alice = await token(writes, team, "alice")
    q = "billing service owned by team"
    assert case(await recall(client, alice, q=q, knownAt=t_before), "case") is None
    assert case(await recall(client, alice, q=q), "case") is not None


async def test_case_only_reachable_from_returned_material(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    """A resolved case is reached from its winning side; when the winning side is
    not returned (here: the caller already knows it) and the losing side has no
    eligible path, nothing returned reaches the case and it is not shown."""
    team = unique("cfr")
    await load_jsonl(writes, jsonl(ownership_case(team)))
    await load_jsonl(
        writes,
        change(team, "conflict_resolution", "res", case="case", preferred_position="pos-pay"),
    )
    alice = await token(writes, team, "alice")
    q = "billing owned by the ledger team old chart"
    shown = await recall(client, alice, q=q, limit=50)
    assert "ev-owner" in ids(shown) and "ev-alt" not in ids(shown)
    assert case(shown, "case") is not None
    # Evidence only (the related frontiers off): nothing returned reaches the case.
    hidden = await recall(client, alice, q=q, limit=50, known=["ev-owner"], rels=0, communities=0)
    assert ids(hidden) and not {"ev-owner", "ev-alt"} & set(ids(hidden))
    assert case(hidden, "case") is None
    unrelated = await recall(
        client, alice, q="billing latency spikes at noon", limit=1, rels=0, communities=0
    )
    assert ids(unrelated) == ["ev-private"] and unrelated["conflicts"] == []
    # With the related frontier on, a case is shown only when a returned related
    # relationship stands in one of its positions.
    related = await recall(client, alice, q=q, limit=50, known=["ev-owner"])
    returned = {
        i
        for h in related["relatedRelationships"]
        for i in (h["representativeId"], *h["equivalentIds"])
    }
    found = case(related, "case")
    if found is None:
        assert not returned & {"rel-owner", "rel-alt"}
    else:
        assert returned & {r for p in found["positions"] for r in p["relationshipIds"]}


def private_case(team: str) -> list[dict[str, Any]]:
    """A case in alice's private space between two of her private statements."""
    return [
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-private-2",
            "source": "src-notes",
            "content": "Private note of alice: billing latency spikes at midnight.",
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-private-2",
            "space": "private:alice",
            "subject": "p-billing",
            "predicate": "spikes_at",
            "object_value": "midnight",
            "supports": [{"id": "sup-private-2", "evidence": "ev-private-2"}],
        },
        {
            "kind": "conflict_case",
            "team": team,
            "id": "case-private",
            "space": "private:alice",
            "question": "When does billing latency spike?",
            "positions": [
                {"id": "pp-noon", "label": "noon", "relationships": ["rel-private"]},
                {"id": "pp-midnight", "label": "midnight", "relationships": ["rel-private-2"]},
            ],
        },
        {
            "kind": "evidence_conflict",
            "team": team,
            "id": "evc-private",
            "space": "private:alice",
            "question": "Noon or midnight?",
            "positions": [
                {"id": "epp-1", "label": "noon", "evidence": "ev-private", "occurrence": "occ-p1"},
                {
                    "id": "epp-2",
                    "label": "midnight",
                    "evidence": "ev-private-2",
                    "occurrence": "occ-p2",
                },
            ],
        },
    ]


async def test_private_conflicts_only_for_their_owner(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("cfp")
    records = team_records(team)
    for r in records:  # give alice's private note an occurrence to cite
        if r.get("id") == "ev-private":
            r["occurrences"] = [{"id": "occ-p1", "start": 0, "end": 12}]
    extra = private_case(team)
    extra[0]["occurrences"] = [{"id": "occ-p2", "start": 0, "end": 12}]
    await load_jsonl(writes, jsonl(records + extra))
    q = "billing latency spikes at noon midnight"
    alice = await recall(client, await token(writes, team, "alice"), q=q)
    assert {c["id"] for c in alice["conflicts"]} == {"case-private", "evc-private"}
    for tok in (
        await token(writes, team, "alice", "shared_only"),
        await token(writes, team, "bob"),
    ):
        other = await recall(client, tok, q=q)
        assert other["conflicts"] == []
        assert not {"ev-private", "ev-private-2"} & set(ids(other))


def evidence_conflict_records(team: str) -> list[dict[str, Any]]:
    return [
        {
            "kind": "source",
            "team": team,
            "id": "src-wiki",
            "type": "document",
            "title": "Wiki",
            "authority": "unverified",
        },
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-dock-b",
            "source": "src-handbook",
            "content": "Runbook: the robot fleet charges at dock B every night.",
            "occurrences": [{"id": "o-b", "start": 9, "end": 42}],
        },
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-dock-c",
            "source": "src-wiki",
            "content": "Since Monday, the robot fleet charges at dock C (🚀 rewiring).",
            "occurrences": [{"id": "o-c", "start": 14, "end": 50}],
        },
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-dock-d",
            "source": "src-wiki",
            "content": "Someone said the robot fleet charges at dock D.",
            "occurrences": [{"id": "o-d", "start": 13, "end": 46}],
        },
        {
            "kind": "entity",
            "team": team,
            "id": "fleet",
            "name": "Robot fleet",
            "type": "system",
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-dock-b",
            "subject": "fleet",
            "predicate": "charges_at",
            "object_value": "dock B",
            "owner": "alice",
            "supports": [{"id": "sup-dock-b", "evidence": "ev-dock-b", "occurrence": "o-b"}],
        },
        {
            "kind": "evidence_conflict",
            "team": team,
            "id": "evc-dock",
            "question": "Which dock does the fleet charge at?",
            "positions": [
                {"id": "ep-b", "label": "dock B", "evidence": "ev-dock-b", "occurrence": "o-b"},
                {"id": "ep-c", "label": "dock C", "evidence": "ev-dock-c", "occurrence": "o-c"},
                {"id": "ep-d", "label": "dock D", "evidence": "ev-dock-d", "occurrence": "o-d"},
            ],
        },
        {
            "kind": "evidence_conflict",
            "team": team,
            "id": "evc-pair",
            "question": "Dock B or D?",
            "positions": [
                {"id": "ep2-b", "label": "dock B", "evidence": "ev-dock-b", "occurrence": "o-b"},
                {"id": "ep2-d", "label": "dock D", "evidence": "ev-dock-d", "occurrence": "o-d"},
            ],
        },
    ]


async def test_evidence_conflict_citations_are_exact(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("cfe")
    records = team_records(team) + evidence_conflict_records(team)
    conflicts = [r for r in records if r["kind"] == "evidence_conflict"]
    await load_jsonl(writes, jsonl([r for r in records if r not in conflicts]))
    t_none = await instant()
    await load_jsonl(writes, jsonl(conflicts))
    alice = await token(writes, team, "alice")
    q = "where does the robot fleet charge dock"
    t_both = await instant()
    await load_jsonl(
        writes, change(team, "evidence_lifecycle", "q", evidence="ev-dock-d", status="quarantined")
    )
    now = await recall(client, alice, q=q)
    # Only supported evidence is a result: cited evidence is not made evidence.
    assert "ev-dock-b" in ids(now)
    assert not {"ev-dock-c", "ev-dock-d"} & set(ids(now))
    # The quarantined citation is omitted; the pair left with one readable
    # position is not shown at all.
    assert [c["id"] for c in now["conflicts"]] == ["evc-dock"]
    c = now["conflicts"][0]
    assert c["__typename"] == "EvidenceConflict"
    content = {r["id"]: r["content"] for r in records if r["kind"] == "evidence"}
    authority = {"src-handbook": "HIGH", "src-wiki": "UNVERIFIED"}
    source = {r["id"]: r["source"] for r in records if r["kind"] == "evidence"}
    occurrence = {
        o["id"]: (r["id"], o["start"], o["end"])
        for r in records
        if r["kind"] == "evidence"
        for o in r.get("occurrences", [])
    }
    assert [p["id"] for p in c["positions"]] == ["ep-b", "ep-c"]
    for p in c["positions"]:
        cite = p["citation"]
        ev, start, end = occurrence[cite["occurrenceId"]]
        assert cite["evidenceId"] == ev
        assert (cite["spanStart"], cite["spanEnd"]) == (start, end)
        assert cite["quote"] == content[ev][start:end]
        assert cite["authority"] == authority[source[ev]]
    # Before the conflicts were recorded there were none.
    none = await recall(client, alice, q=q, knownAt=t_none)
    assert "ev-dock-b" in ids(none) and none["conflicts"] == []
    # Before the quarantine, the third position and the pair were readable.
    then = await recall(client, alice, q=q, knownAt=t_both)
    assert [c["id"] for c in then["conflicts"]] == ["evc-dock", "evc-pair"]
    assert [p["id"] for p in then["conflicts"][0]["positions"]] == ["ep-b", "ep-c", "ep-d"]


async def test_cap_and_deterministic_order(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService
) -> None:
    """More reachable cases than the cap: the nearest ones, in (reach, ID) order,
    and the same answer twice. The statement count does not grow with the limit."""
    team = unique("cfc")
    n = 24
    records = team_records(team) + more_evidence(team, n)
    for i in range(0, n, 2):
        records.append(
            {
                "kind": "conflict_case",
                "team": team,
                "id": f"case-{n - i:02d}",  # IDs in the opposite order of the evidence
                "question": f"Batch {i} or {i + 1}?",
                "positions": [
                    {"id": f"pa-{i}", "label": "a", "relationships": [f"rel-bulk-{i:03d}"]},
                    {"id": f"pb-{i}", "label": "b", "relationships": [f"rel-bulk-{i + 1:03d}"]},
                ],
            }
        )
    await load_jsonl(writes, jsonl(records))
    alice = await token(writes, team, "alice", "shared_only")
    counter = gateway_app.state.services.db.counter
    counts = {}
    # the question's embedding in the LRU first: every recall below reads it
    # there alike (a fresh question costs one statement more, whatever the limit)
    await recall(client, alice, q="note invoices batch number ran", rels=0, communities=0)
    for limit in (1, 10, n):
        before = counter.count
        # Evidence reach only: the related frontiers (off here) would reach more cases.
        result = await recall(
            client, alice, q="note invoices batch number ran", limit=limit, rels=0, communities=0
        )
        counts[limit] = counter.count - before
        rank = {r["evidenceId"]: r["rank"] for r in result["results"]}
        reach: dict[str, int] = {}
        for i in range(0, n, 2):
            ranks = [rank[f"ev-bulk-{j:03d}"] for j in (i, i + 1) if f"ev-bulk-{j:03d}" in rank]
            if ranks:
                reach[f"case-{n - i:02d}"] = min(ranks)
        expected = sorted(reach, key=lambda k: (reach[k], k))[:MAX_CONFLICTS]
        assert [c["id"] for c in result["conflicts"]] == expected
        assert len(expected) == min(MAX_CONFLICTS, len(reach)) and expected
        assert (
            await recall(
                client,
                alice,
                q="note invoices batch number ran",
                limit=limit,
                rels=0,
                communities=0,
            )
            == result
        )
    assert counts[1] == counts[10] == counts[n], counts


async def test_conflict_load_failure_is_an_error(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService, db: Database
) -> None:
    """Conflicts decide eligibility: losing them is not an optional degradation."""
    team = unique("cff")
    await load_jsonl(writes, jsonl(team_records(team) + evidence_conflict_records(team)))
    alice = await token(writes, team, "alice")
    services = gateway_app.state.services
    services.db.lock_timeout = "300ms"
    ready, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with db.pool.acquire() as conn, conn.transaction():
            await conn.execute("LOCK TABLE evidence_conflict_positions IN ACCESS EXCLUSIVE MODE")
            ready.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    try:
        await ready.wait()
        body = await post(client, alice, q="robot fleet charges at dock")
    finally:
        release.set()
        await holder
        services.db.lock_timeout = "2s"
    assert body["errors"][0]["extensions"]["code"] == "DATABASE_UNAVAILABLE", body
    assert "SELECT" not in str(body)


async def test_row_level_security_is_the_second_wall(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """Called with another team's ID, or with spaces the transaction may not read,
    the store's statements return nothing: row-level security filters them even
    where the statement's own predicates would match."""
    team, other = unique("cfw"), unique("cfx")
    await load_jsonl(writes, jsonl(ownership_case(team) + ownership_case(other)))
    extra = private_case(team)
    await load_jsonl(writes, jsonl(extra[:3]))  # the private case, without the evidence conflict
    spaces = {
        (r["team_id"], r["owner_principal_id"]): r["id"]
        for r in await admin_conn.fetch(
            "SELECT team_id, id, owner_principal_id FROM memory_spaces WHERE team_id = ANY($1)",
            [team, other],
        )
    }
    now = await admin_conn.fetchval("SELECT now()")
    reach = {"rel-owner": 1, "rel-private": 2}
    all_spaces = [spaces[team, None], spaces[team, "alice"], spaces[other, None]]

    async def cases(tenant: str, allowed: list[Any], asked_team: str) -> set[str]:
        async with db.tenant(tenant, allowed) as conn:
            found = await store.relationship_cases(
                conn, asked_team, all_spaces, reach, now, cap=10, supporter_cap=5
            )
        return {c.id for c in found}

    assert await cases(team, [spaces[team, None], spaces[team, "alice"]], team) == {
        "case",
        "case-private",
    }
    # The tenant may read only the shared space: the private case is filtered out.
    assert await cases(team, [spaces[team, None]], team) == {"case"}
    # The statement names the other team, the transaction is this team's: nothing.
    assert await cases(team, [spaces[team, None]], other) == set()


async def test_position_relationships_in_trace_memory(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    """traceMemory shows the same position type: its relationships load through
    that request's view too."""
    team = unique("cftr")
    await load_jsonl(writes, jsonl(ownership_case(team)))
    bob = await token(writes, team, "bob", "shared_only")
    r = await client.post(
        "/graphql",
        json={
            "query": '{ traceMemory(relationshipId: "rel-alt") { conflicts { id '
            "positions { id relationships { id ownerId } } } } }"
        },
        headers={"Authorization": f"Bearer {bob}"},
    )
    body = r.json()
    assert "errors" not in body, body
    (c,) = body["data"]["traceMemory"]["conflicts"]
    assert c["id"] == "case"
    assert {p["id"]: p["relationships"] for p in c["positions"]} == {
        "pos-pay": [{"id": "rel-owner", "ownerId": "alice"}],
        "pos-led": [{"id": "rel-alt", "ownerId": "bob"}],
    }
