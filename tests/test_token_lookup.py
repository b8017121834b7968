"""The bearer token's lookup runs beside the document's work, and nothing about
who may do what changed: the same refusals, a revoked token refused at the next
request, nothing left running after a request."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from gateway import tokens
from gateway.errors import Unauthenticated
from gateway.schema.context import RequestContext
from gateway.store import auth as auth_store

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_app import _token

TWO_CALLERS = "{ a: viewer { principalId } b: viewer { team { id } } }"
VIEWER = "{ viewer { principalId } }"


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(dsn: str) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    app = app_for(dsn)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            yield app, c


async def _ask(client: httpx.AsyncClient, token: str, query: str = VIEWER) -> httpx.Response:
    return await client.post(
        "/graphql", json={"query": query}, headers={"Authorization": f"Bearer {token}"}
    )


async def test_the_lookup_does_not_hold_up_the_document(gateway, writes, monkeypatch) -> None:
    """The lookup's statement waits here until the document has been parsed: a
    lookup that had to end before the document's work began (as before) never
    sees it parsed, and the request fails."""
    app, client = gateway
    team = unique("look")
    await load_jsonl(writes, jsonl(team_records(team)))
    token = await _token(writes, team, "alice", "private")
    documents = app.state.documents
    parse, parsed = documents.parse, asyncio.Event()
    find_token = auth_store.find_token

    def parse_and_tell(*args: Any, **kwargs: Any) -> Any:
        parsed.set()
        return parse(*args, **kwargs)

    async def after_the_parse(conn: Any, token_id: str) -> Any:
        await asyncio.wait_for(parsed.wait(), 5)  # the old order: TimeoutError
        return await find_token(conn, token_id)

    monkeypatch.setattr(documents, "parse", parse_and_tell)
    monkeypatch.setattr(auth_store, "find_token", after_the_parse)
    r = await _ask(client, token)
    assert r.status_code == 200, r.text
    assert r.json() == {"data": {"viewer": {"principalId": "alice"}}}


async def test_fields_that_wait_together_get_the_same_caller_or_refusal(gateway, writes) -> None:
    _, client = gateway
    team = unique("both")
    await load_jsonl(writes, jsonl(team_records(team)))
    token = await _token(writes, team, "alice", "private")
    r = await _ask(client, token, TWO_CALLERS)
    assert r.json() == {"data": {"a": {"principalId": "alice"}, "b": {"team": {"id": team}}}}

    unknown = tokens.format_token(tokens.new_token_id(), tokens.new_secret())
    r = await _ask(client, unknown, TWO_CALLERS)
    assert r.status_code == 401
    errors = r.json()["errors"]
    assert errors and {e["extensions"]["code"] for e in errors} == {"UNAUTHENTICATED"}
    assert len({e["message"] for e in errors}) == 1
    assert r.json()["data"] is None


@pytest.mark.parametrize("query", ["{ viewer { nope } }", "{ __typename }", "{ viewer { "])
async def test_a_request_that_needs_no_caller_leaves_no_lookup_behind(
    gateway, writes, query: str
) -> None:
    """A refused document, or one that needs no caller: its lookup (here of a
    token that is refused) has ended when the answer is sent, its refusal
    retrieved (no "exception never retrieved"), its connection back in the pool."""
    app, client = gateway
    pool = app.state.services.db.pool
    unknown = tokens.format_token(tokens.new_token_id(), tokens.new_secret())
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    try:
        r = await _ask(client, unknown, query)
        lookups = [t for t in asyncio.all_tasks() if "authenticate" in repr(t.get_coro())]
        assert lookups == []
        assert pool.get_idle_size() == pool.get_size()
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(handler)
    assert unretrieved == []
    assert r.status_code == 200
    codes = [e["extensions"]["code"] for e in r.json().get("errors", [])]
    assert "UNAUTHENTICATED" not in codes


async def test_a_revoked_token_is_refused_from_the_next_request_on(gateway, writes, db) -> None:
    _, client = gateway
    team = unique("revl")
    await load_jsonl(writes, jsonl(team_records(team)))
    token = await _token(writes, team, "bob", "private")
    parsed = tokens.parse_token(token)
    assert parsed is not None
    assert (await _ask(client, token)).status_code == 200
    async with db.pool.acquire() as conn:
        assert await auth_store.revoke_token(conn, parsed.token_id)
    r = await _ask(client, token)
    assert r.status_code == 401
    assert r.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_the_caller_is_never_read_before_its_lookup_ended() -> None:
    """A resolver that reads the caller without awaiting the lookup fails (a bug,
    masked as INTERNAL); it is never answered as anonymous nor as the caller."""
    gate = asyncio.Event()

    async def slow() -> Any:
        await gate.wait()
        raise Unauthenticated("refused")

    ctx = RequestContext(request=None, response=None, services=None, request_id="x")
    ctx.look_up(slow())
    with pytest.raises(RuntimeError, match="await caller"):
        ctx.require_principal()
    waiting = asyncio.gather(ctx.caller(), ctx.caller(), return_exceptions=True)
    await asyncio.sleep(0)
    gate.set()
    outcomes = await waiting
    assert [type(o) for o in outcomes] == [Unauthenticated, Unauthenticated]
    with pytest.raises(Unauthenticated):
        ctx.require_principal()
