"""Losing one space branch, with a real database fault.

The fault is PostgreSQL's own: a restrictive row-level-security policy, made
for the test and dropped after it, whose check raises an error for the rows
of exactly one memory space of one team. Every statement that reads such a row
fails inside the server, the way an unreadable object would, while the same
statement over the other space's rows runs untouched. Table locks cannot do
this (both branches read the same tables; only the vector list has a
partition of its own per space, see ``test_recall.py``), so this is how the
private branch, and nothing else, is lost.

- ``evidence``: every candidate list reads it (the full-text and entity lists
  join it, the vector list checks each hit's generation in it), and so does
  hydration: the branch cannot be searched.
- ``supports``: only canonical hydration reads it: the branch was searched but
  cannot be loaded.

Rule (SPEC section 3, step 8): the private branch is optional, so its loss
answers with the shared results and the degradation
``space_branch_unavailable``; the shared branch is required, so its loss is the
error ``DATABASE_UNAVAILABLE`` with no partial answer.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import httpx
import pytest
import pytest_asyncio

from gateway.services.writes import WriteService
from gateway.store.connection import Conn

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import RECALL, ids, recall, token

FAULTY_TABLES = ("evidence", "supports")


@pytest_asyncio.fixture(loop_scope="session")
async def client(dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    app = app_for(dsn)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            yield c


@asynccontextmanager
async def unreadable(conn: Conn, table: str, space: UUID) -> AsyncIterator[None]:
    """Make reading ``table``'s rows of ``space`` fail in the server, as the app role."""
    name = f"test_fault_{secrets.token_hex(4)}"
    await conn.execute(
        f"CREATE FUNCTION {name}() RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN "
        f"RAISE EXCEPTION 'fault injected by a test' USING ERRCODE = 'XX001'; END $$"
    )
    await conn.execute(
        f"CREATE POLICY {name} ON {table} AS RESTRICTIVE FOR SELECT TO recall_app "
        # Only rows the transaction may read at all: a transaction of the other
        # branch alone never sees them, whatever order the planner checks policies in.
        f"USING (space_id <> '{space}'::uuid "
        f"OR NOT (space_id = ANY (recall_allowed_spaces())) OR {name}())"
    )
    try:
        yield
    finally:
        await conn.execute(f"DROP POLICY {name} ON {table}")
        await conn.execute(f"DROP FUNCTION {name}()")


async def _spaces(conn: Conn, team: str) -> dict[str, UUID]:
    """'shared' and each owner's private space."""
    rows = await conn.fetch(
        "SELECT id, kind, owner_principal_id FROM memory_spaces WHERE team_id = $1", team
    )
    return {(r["owner_principal_id"] or r["kind"]): r["id"] for r in rows}


def evidence_degradations(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The evidence frontier's degradations (the other frontiers have their own tests)."""
    return [d for d in result["degradations"] if d["frontier"] == "EVIDENCE"]


async def _post(c: httpx.AsyncClient, tok: str, **variables: Any) -> tuple[dict[str, Any], str]:
    r = await c.post(
        "/graphql",
        json={"query": RECALL, "variables": variables},
        headers={"Authorization": f"Bearer {tok}"},
    )
    body: dict[str, Any] = r.json()
    return body, r.text


@pytest.mark.parametrize("table", FAULTY_TABLES)
async def test_private_branch_lost_answers_shared_with_degradation(
    client: httpx.AsyncClient,
    writes: WriteService,
    admin_conn: Conn,
    table: str,
) -> None:
    team = unique("privfault")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    query = "billing service latency spikes owned"
    healthy = await recall(client, tok, q=query)
    assert {"ev-owner", "ev-private"} <= set(ids(healthy)), healthy
    assert evidence_degradations(healthy) == []

    spaces = await _spaces(admin_conn, team)
    async with unreadable(admin_conn, table, spaces["alice"]):
        result = await recall(client, tok, q=query)

    assert ids(result) == ["ev-owner"], result
    assert [r["spaceKind"] for r in result["results"]] == ["SHARED"]
    lost = evidence_degradations(result)
    assert lost == [
        {
            "frontier": "EVIDENCE",
            "code": "space_branch_unavailable",
            "message": lost[0]["message"] if lost else None,
            "optional": True,
        }
    ], result
    evidence_state = result["searchStates"]["evidence"]
    assert evidence_state["complete"] is False
    if table == "evidence":  # not searched at all
        private = {
            s["list"]: s["status"] for s in evidence_state["lists"] if s["spaceKind"] == "PRIVATE"
        }
        assert private == {"FULLTEXT": "FAILED", "VECTOR": "FAILED", "ENTITY": "SKIPPED"}

    # The fault gone, the same recall is whole again: nothing was cached.
    again = await recall(client, tok, q=query)
    assert ids(again) == ids(healthy) and evidence_degradations(again) == []


@pytest.mark.parametrize("table", FAULTY_TABLES)
async def test_shared_branch_lost_is_an_error_without_partial_answer(
    client: httpx.AsyncClient,
    writes: WriteService,
    admin_conn: Conn,
    table: str,
) -> None:
    team = unique("sharedfault")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    spaces = await _spaces(admin_conn, team)
    async with unreadable(admin_conn, table, spaces["shared"]):
        body, text = await _post(client, tok, q="billing service latency spikes owned")
    assert body["data"] is None, body  # no partial answer, not even the private results
    assert [e["extensions"]["code"] for e in body["errors"]] == ["DATABASE_UNAVAILABLE"]
    assert "fault injected" not in text and "SELECT" not in text and "Traceback" not in text


async def test_fault_of_another_team_changes_nothing(
    client: httpx.AsyncClient, writes: WriteService, admin_conn: Conn
) -> None:
    """The fault is confined to one space: another team's recall is untouched."""
    victim, bystander = unique("victim"), unique("bystander")
    await load_jsonl(writes, jsonl(team_records(victim)))
    await load_jsonl(writes, jsonl(team_records(bystander)))
    tok = await token(writes, bystander, "alice")
    bystander_before = await recall(client, tok, q="billing service latency spikes owned")
    spaces = await _spaces(admin_conn, victim)
    async with unreadable(admin_conn, "evidence", spaces["shared"]):
        result = await recall(client, tok, q="billing service latency spikes owned")
    assert {"ev-owner", "ev-private"} <= set(ids(result))
    assert result["degradations"] == bystander_before["degradations"]
