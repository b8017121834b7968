"""The related frontiers' handles are read in the answer round.

A relationship case's reach needs the handles (relationships the related and
community frontiers return reach cases after every evidence result, in the
answer's order); nothing else in the answer round does. So the handles are read
in the same statement as the hypotheses and conflicts, their reach numbered in
SQL (gateway/store/round_trips.py, ``HandlesQuery``): a full recall costs one
round trip less, and answers exactly as the separate statements did (the
combined statement's failure falls back to them, which is what these tests
compare against).
"""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest
from starlette.applications import Starlette

from gateway.embeddings import embedding_epoch
from gateway.services.communities import build_communities
from gateway.services.conflicts import MAX_CONFLICTS
from gateway.services.writes import WriteService
from gateway.store import round_trips
from gateway.store.database import Database, StatementCounter

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import more_evidence, token

N = 30
QUERY = "billing ran batch"
RECALL = """
query Recall($q: String, $limit: Int, $rels: Int, $communities: Int) {
  recallMemory(query: $q, limit: $limit, relationshipLimit: $rels, communityLimit: $communities) {
    results { evidenceId rank }
    relatedRelationships { representativeId equivalentIds }
    relatedCommunities { id members { representativeId equivalentIds } membersTruncated }
    relatedHypotheses { id }
    conflicts {
      __typename id question
      ... on RelationshipConflict { positions { id relationshipIds supporterCount } }
    }
    degradations { code }
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


def _records(team: str) -> list[dict[str, Any]]:
    """N supported relationships and a case over each pair: more cases than the
    cap, reached mostly through the related relationships' handles."""
    records = team_records(team) + more_evidence(team, N)
    for i in range(0, N, 2):
        records.append(
            {
                "kind": "conflict_case",
                "team": team,
                # IDs in the opposite order of the relationships: reach, not ID, orders them
                "id": f"case-{N - i:02d}",
                "question": f"Batch {i} or {i + 1}?",
                "positions": [
                    {"id": f"pa-{i}", "label": "a", "relationships": [f"rel-bulk-{i:03d}"]},
                    {"id": f"pb-{i}", "label": "b", "relationships": [f"rel-bulk-{i + 1:03d}"]},
                ],
            }
        )
    return records


async def _answer(
    client: httpx.AsyncClient, counter: StatementCounter, tok: str, **variables: Any
) -> tuple[dict[str, Any], int]:
    before = counter.count
    got = await recall(client, tok, q=QUERY, **variables)
    return got, counter.count - before


@pytest.mark.parametrize("communities", [0, 3])
async def test_handles_reach_conflicts_in_the_answer_round(
    client: httpx.AsyncClient,
    gateway_app: Starlette,
    writes: WriteService,
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
    communities: int,
) -> None:
    team = unique("ansr")
    await load_jsonl(writes, jsonl(_records(team)))
    if communities:
        built = await build_communities(db, team, max_nodes=1000, max_edges=10_000)
        assert built.status == "succeeded"
    alice = await token(writes, team, "alice", "shared_only")
    counter = gateway_app.state.services.db.counter
    embedder = gateway_app.state.services.embedder
    asked = {"limit": 1, "rels": 20, "communities": communities}
    # The statement counts below are those of a question in the LRU. The LRU is
    # keyed by the embedder's epoch, which the store-model watcher bumps (about
    # once a second) when it first sees this store's vectors: if that happens
    # between the warm recall and the others, one of them embeds again and reads
    # its vector lists in a statement of their own. Ask again until no bump fell
    # in between (it happens once per store at most).
    for _ in range(3):
        epoch = embedding_epoch(embedder)
        await _answer(client, counter, alice, **asked)  # warm: type introspection, the LRU
        combined, combined_count = await _answer(client, counter, alice, **asked)
        evidence_only, evidence_count = await _answer(
            client, counter, alice, limit=1, rels=0, communities=0
        )
        if embedding_epoch(embedder) == epoch:
            break
    handles = [
        i
        for h in [
            *combined["relatedRelationships"],
            *(m for c in combined["relatedCommunities"] for m in c["members"]),
        ]
        for i in (h["representativeId"], *h["equivalentIds"])
    ]
    assert bool(combined["relatedCommunities"]) == bool(communities), combined
    assert len(handles) >= 12, combined  # the handles reach more cases than the cap
    assert len(combined["conflicts"]) == MAX_CONFLICTS
    assert len(evidence_only["conflicts"]) < MAX_CONFLICTS

    async def fails(*args: Any, **kwargs: Any) -> Any:
        raise asyncpg.PostgresError("injected")

    # the separate statements: the handles', then the hypotheses' and conflicts'
    monkeypatch.setattr(round_trips, "answer_round", fails)
    alone, alone_count = await _answer(client, counter, alice, **asked)
    for answer in (combined, alone):
        answer.pop("recallId", None)
    assert alone == combined
    # Without the community snapshot (communityLimit 0), a full recall costs the
    # statements of an evidence-only one and its discovery's on a side connection
    # (one statement): the handles cost no round trip.
    assert combined_count == evidence_count + 1 + (1 if communities else 0)
    assert alone_count > combined_count
