"""Two gateway processes on one database, as behind a load balancer: every piece of
state a request depends on lives in PostgreSQL, so alternating requests between
them changes nothing a client sees.

Each process is a real ``recall-gateway serve`` (uvicorn, as deployed) on its
own loopback port; requests alternate between the two.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from gateway.services.writes import WriteService

from .conftest import load_jsonl, token_id_of, unique
from .factories import jsonl, team_records
from .test_cli import run
from .test_feedback import RECALL as RECALL_WITH_EVENT
from .test_feedback import SUBMIT
from .test_mutations import REMEMBER_SELECTION, incident_memory
from .test_recall import token
from .test_serving import Served

pytestmark = pytest.mark.asyncio(loop_scope="session")

VIEWER = "{ viewer { principalId } }"
REMEMBER = (
    f"mutation M($input: RememberInput!) {{ remember(input: $input) {{ {REMEMBER_SELECTION} }} }}"
)


@pytest_asyncio.fixture(loop_scope="session")
async def pair(dsn: str, tmp_path: Path) -> AsyncIterator[list[str]]:
    """Two served gateways on the test database, keeping at most 10 operations per
    team (the smallest bound), so a test can push one out of the table."""
    served = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        served.append(Served(dsn, tmp_path / name, RECALL_PERSISTED_QUERY_MAX_ENTRIES="10"))
    try:
        await asyncio.gather(*(asyncio.to_thread(s.wait_ready) for s in served))
        yield [s.url for s in served]
    finally:
        for s in served:
            s.stop()


async def post(url: str, tok: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(
            f"{url}/graphql", json=body, headers={"Authorization": f"Bearer {tok}"}
        )
    assert "Traceback" not in r.text
    answer: dict[str, Any] = r.json()
    return answer


def apq(document: str | None, digest: str) -> dict[str, Any]:
    body: dict[str, Any] = {"extensions": {"persistedQuery": {"version": 1, "sha256Hash": digest}}}
    if document is not None:
        body["query"] = document
    return body


def code(body: dict[str, Any]) -> str | None:
    errors = body.get("errors") or [{}]
    found: str | None = errors[0].get("extensions", {}).get("code")
    return found


async def test_two_gateways_on_one_database_answer_alike(
    pair: list[str], writes: WriteService, dsn: str
) -> None:
    a, b = pair
    team = unique("replica")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    kept = await token(writes, team, "bob")

    # A write answered by one is read by the other at once.
    wrote = await post(a, tok, {"query": REMEMBER, "variables": {"input": incident_memory()}})
    assert "errors" not in wrote, wrote
    found = await post(
        b, tok, {"query": RECALL_WITH_EVENT, "variables": {"q": "nightly export job warehouse"}}
    )
    assert "ev-export" in [r["evidenceId"] for r in found["data"]["recallMemory"]["results"]]

    # APQ: registered on one, used by hash on the other.
    first = f"query First{secrets.token_hex(4)} {VIEWER}"
    digest = hashlib.sha256(first.encode()).hexdigest()
    assert "errors" not in await post(a, tok, apq(first, digest))
    by_hash = await post(b, tok, apq(None, digest))
    assert by_hash["data"] == {"viewer": {"principalId": "alice"}}, by_hash
    # One registered on a only, then pushed out of the table by ten registrations
    # on b (bound: 10 per team): b misses it, and the document sent again to a
    # (which still has it in its own cache) is kept again, so that b finds it.
    lost = f"query Lost{secrets.token_hex(4)} {VIEWER}"
    lost_digest = hashlib.sha256(lost.encode()).hexdigest()
    assert "errors" not in await post(a, tok, apq(lost, lost_digest))
    assert (await post(a, tok, apq(None, lost_digest)))["data"] is not None
    for n in range(10):
        other = f"query Other{n}x{secrets.token_hex(4)} {VIEWER}"
        assert "errors" not in await post(
            b, tok, apq(other, hashlib.sha256(other.encode()).hexdigest())
        )
    assert code(await post(b, tok, apq(None, lost_digest))) == "PERSISTED_QUERY_NOT_FOUND"
    assert "errors" not in await post(a, tok, apq(lost, lost_digest))
    again = await post(b, tok, apq(None, lost_digest))
    assert again["data"] == {"viewer": {"principalId": "alice"}}, again

    # Feedback on a recall event that the other process served and recorded.
    for served_by, judged_by in ((a, b), (b, a)):
        recalled = await post(
            served_by,
            tok,
            {"query": RECALL_WITH_EVENT, "variables": {"q": "who owns the billing service"}},
        )
        event = recalled["data"]["recallMemory"]["recallEventId"]
        assert event
        fields = {"feedbackId": unique("fb"), "recallEventId": event, "used": True}
        sent = await post(judged_by, tok, {"query": SUBMIT, "variables": {"input": fields}})
        assert sent["data"]["submitRecallSessionFeedback"]["created"] is True, sent
        repeat = await post(served_by, tok, {"query": SUBMIT, "variables": {"input": fields}})
        assert repeat["data"]["submitRecallSessionFeedback"]["created"] is False, repeat

    # A revoked token is refused by both from their next request; others still pass.
    for url in (a, b, a, b):
        assert (await post(url, tok, {"query": VIEWER}))["data"] is not None
    token_id = token_id_of(tok)
    revoked = await asyncio.to_thread(run, ["tokens", "revoke", token_id], dsn)
    assert revoked.returncode == 0, revoked.stderr
    for url in (b, a, b, a):
        refused = await post(url, tok, {"query": VIEWER})
        assert code(refused) == "UNAUTHENTICATED", refused
        assert (await post(url, kept, {"query": VIEWER}))["data"] == {
            "viewer": {"principalId": "bob"}
        }
