"""The HTTP surface: viewer over /graphql with bearer tokens, health and readiness."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from gateway.app import create_app
from gateway.services.writes import WriteService
from gateway.settings import Settings
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import Binding

VIEWER = "{ viewer { principalId displayName kind team { id name } tokenBinding readableSpaces } }"


@pytest_asyncio.fixture(loop_scope="session")
async def client(dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(database_url=dsn, pool_max_size=4))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            yield c


async def _token(writes: WriteService, team: str, principal: str, binding: Binding) -> str:
    import asyncio

    from gateway import tokens
    from gateway.services.records import TokenRecord
    from gateway.services.writes import Actor

    token_id, secret = tokens.new_token_id(), tokens.new_secret()
    record = TokenRecord(
        kind="token", team=team, id=token_id, principal=principal, binding=binding, secret=secret
    )
    await writes.apply([record], Actor.operator())
    await asyncio.sleep(0)
    return tokens.format_token(token_id, secret)


async def _ask(client: httpx.AsyncClient, token: str | None, query: str = VIEWER) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return await client.post("/graphql", json={"query": query}, headers=headers)


async def test_viewer_with_private_and_shared_only_tokens(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("app")
    await load_jsonl(writes, jsonl(team_records(team)))
    private = await _token(writes, team, "alice", "private")
    shared = await _token(writes, team, "alice", "shared_only")

    r = await _ask(client, private)
    assert r.status_code == 200
    assert r.json() == {
        "data": {
            "viewer": {
                "principalId": "alice",
                "displayName": "Alice",
                "kind": "PERSON",
                "team": {"id": team, "name": f"Team {team}"},
                "tokenBinding": "PRIVATE",
                "readableSpaces": ["SHARED", "PRIVATE"],
            }
        }
    }
    assert r.headers["x-request-id"]

    r = await _ask(client, shared)
    assert r.json()["data"]["viewer"]["readableSpaces"] == ["SHARED"]
    assert r.json()["data"]["viewer"]["tokenBinding"] == "SHARED_ONLY"


@pytest.mark.parametrize(
    "token",
    [None, "", "garbage", "rgt_t-0000000000000000_" + "A" * 43, "Basic abc"],
)
async def test_missing_or_bad_token_is_unauthenticated(
    client: httpx.AsyncClient, token: str | None
) -> None:
    if token == "Basic abc":
        r = await client.post(
            "/graphql", json={"query": VIEWER}, headers={"Authorization": "Basic abc"}
        )
    else:
        r = await _ask(client, token)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    body = r.json()
    assert body["data"] is None
    assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert "Traceback" not in r.text


async def test_revoked_and_wrong_secret_tokens(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    from gateway import tokens
    from gateway.store.auth import revoke_token

    team = unique("rev")
    await load_jsonl(writes, jsonl(team_records(team)))
    good = await _token(writes, team, "bob", "private")
    parsed = tokens.parse_token(good)
    assert parsed is not None
    forged = tokens.format_token(parsed.token_id, tokens.new_secret())
    assert (await _ask(client, forged)).status_code == 401
    assert (await _ask(client, good)).status_code == 200
    async with db.pool.acquire() as conn:
        assert await revoke_token(conn, parsed.token_id)
    assert (await _ask(client, good)).status_code == 401


async def test_another_teams_principal_sees_only_its_team(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team_a, team_b = unique("va"), unique("vb")
    await load_jsonl(writes, jsonl(team_records(team_a) + team_records(team_b)))
    token_b = await _token(writes, team_b, "bob", "private")
    viewer = (await _ask(client, token_b)).json()["data"]["viewer"]
    assert viewer["team"]["id"] == team_b


async def test_syntax_and_validation_errors_have_codes(client: httpx.AsyncClient) -> None:
    r = await _ask(client, None, "{ viewer { ")
    assert r.json()["errors"][0]["extensions"]["code"] == "GRAPHQL_PARSE_FAILED"
    r = await _ask(client, None, "{ viewer { nope } }")
    assert r.json()["errors"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    r = await client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready"}


async def test_a_path_the_gateway_does_not_serve_says_where_graphql_is(
    client: httpx.AsyncClient,
) -> None:
    """``http://127.0.0.1:8000/`` opened by a newcomer answered Starlette's
    plain-text ``Not Found``. Any unserved path is now a coded JSON 404 naming the
    endpoint; the endpoints themselves are unchanged."""
    for path in ("/", "/graphq", "/api/graphql", "/graphiql/3.9.0/nope.js"):
        r = await client.get(path)
        assert r.status_code == 404, (path, r.text)
        assert r.headers["content-type"].startswith("application/json")
        assert r.headers["x-content-type-options"] == "nosniff"
        error = r.json()["errors"][0]
        assert error["extensions"] == {"code": "NOT_FOUND"}, error
        assert f"'{path}'" in error["message"] and "/graphql" in error["message"], error
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    r = await _ask(client, None, "{ __typename }")
    assert r.json() == {"data": {"__typename": "Query"}}
