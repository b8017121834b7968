"""Deadlines, cancellation, a database that stops and comes back, a full pool.

The database-outage tests run their own embedded PostgreSQL (not the session's),
stop it in the middle of the test and start it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette

from gateway.app import create_app
from gateway.embedded import EmbeddedPostgres
from gateway.embeddings import EmbeddingProvider
from gateway.errors import DatabaseUnavailable
from gateway.http.body import RequestBodyMiddleware
from gateway.services.writes import WriteService
from gateway.settings import Settings
from gateway.store.database import Database, prepare, translate

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token

VIEWER = "{ viewer { principalId } }"
RECALL = '{ recallMemory(query: "billing") { results { evidenceId } } }'


@pytest.fixture()
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(tmp_path_factory.mktemp("faults"), database="faults")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def seeded(
    own_server: EmbeddedPostgres, embedder: EmbeddingProvider
) -> AsyncIterator[tuple[EmbeddedPostgres, str]]:
    """The own server, migrated, with a team and a token."""
    await prepare(own_server.dsn, migrate=True)
    db = await Database.open(own_server.dsn, min_size=1, max_size=2)
    try:
        writes = WriteService(db, embedder)
        team = unique("faults")
        await load_jsonl(writes, jsonl(team_records(team)))
        tok = await token(writes, team, "alice")
    finally:
        await db.close()
    yield own_server, tok


async def _client(
    dsn: str, **settings: Any
) -> tuple[Starlette, httpx.AsyncClient, AbstractAsyncContextManager[Any]]:
    app = create_app(Settings(database_url=dsn, **settings))
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    return app, client, lifespan


async def _ask(client: httpx.AsyncClient, tok: str, query: str = VIEWER) -> httpx.Response:
    return await client.post(
        "/graphql", json={"query": query}, headers={"Authorization": f"Bearer {tok}"}
    )


def _code(r: httpx.Response) -> str:
    return str(r.json()["errors"][0]["extensions"]["code"])


async def test_database_outage_fails_fast_and_service_resumes(
    seeded: tuple[EmbeddedPostgres, str],
) -> None:
    server, tok = seeded
    # A long deadline: if the outage made requests hang, they would end in
    # REQUEST_TIMEOUT (504) instead of DATABASE_UNAVAILABLE.
    _, client, lifespan = await _client(server.dsn, pool_max_size=2, request_timeout_ms=60_000)
    try:
        assert (await _ask(client, tok)).json()["data"]["viewer"]["principalId"] == "alice"
        assert (await client.get("/readyz")).status_code == 200

        server.stop()
        for query in (VIEWER, RECALL):
            r = await _ask(client, tok, query)
            # the request failed as a whole for the database: 503, retry later
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"].isdigit()
            assert _code(r) == "DATABASE_UNAVAILABLE", r.text
            assert "asyncpg" not in r.text and "Traceback" not in r.text
        r = await client.get("/readyz")
        assert r.status_code == 503 and r.json()["status"] == "not ready"
        # a persisted-query lookup needs the database before GraphQL even runs
        # (entries belong to the caller's team: the caller is checked first)
        ext = {"persistedQuery": {"version": 1, "sha256Hash": "ab" * 32}}
        r = await client.post(
            "/graphql", json={"extensions": ext}, headers={"Authorization": f"Bearer {tok}"}
        )
        assert r.status_code == 503 and _code(r) == "DATABASE_UNAVAILABLE", r.text
        assert r.headers["retry-after"].isdigit()

        server.start()
        answers = []
        for _ in range(20):  # the pool reconnects by itself; no restart of the gateway
            r = await _ask(client, tok)
            answers.append(r.json())
            if "data" in r.json() and r.json()["data"]:
                break
            await asyncio.sleep(0.2)
        assert answers[-1]["data"]["viewer"]["principalId"] == "alice", answers
        for failed in answers[:-1]:
            assert failed["errors"][0]["extensions"]["code"] == "DATABASE_UNAVAILABLE"
        assert (await client.get("/readyz")).status_code == 200
        r = await _ask(client, tok, RECALL)
        assert "errors" not in r.json(), r.text
    finally:
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


def test_connection_level_driver_failures_are_unavailable() -> None:
    """asyncpg's InternalClientError is its protocol giving up on a connection
    that went away mid-statement (seen from token lookup during fast stops)."""
    for exc in (
        asyncpg.InternalClientError("cannot switch to state 12"),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        ConnectionResetError(104, "Connection reset by peer"),
    ):
        assert isinstance(translate(exc), DatabaseUnavailable), exc


async def test_fast_stops_in_the_middle_of_requests_never_answer_internal(
    seeded: tuple[EmbeddedPostgres, str],
) -> None:
    """The server stops (fast mode, from another thread) while requests are
    authenticating and recalling: each answer is either a full answer or
    DATABASE_UNAVAILABLE, never INTERNAL or a hang."""
    server, tok = seeded
    _, client, lifespan = await _client(server.dsn, pool_max_size=4, request_timeout_ms=60_000)
    seen: list[tuple[int, str]] = []
    try:
        for _ in range(4):
            if not (await _ask(client, tok)).status_code == 200:
                for _ in range(50):  # the pool reconnects by itself
                    if (await _ask(client, tok)).status_code == 200:
                        break
                    await asyncio.sleep(0.1)
            asks = [
                asyncio.create_task(_ask(client, tok, VIEWER if i % 2 else RECALL))
                for i in range(12)
            ]
            await asyncio.sleep(0.01)
            await asyncio.to_thread(server.stop)
            for r in await asyncio.gather(*asks):
                if r.status_code == 200 and "errors" not in r.json():
                    seen.append((200, "ok"))
                    continue
                assert "Traceback" not in r.text and "asyncpg" not in r.text, r.text
                codes = {e["extensions"]["code"] for e in r.json()["errors"]}
                assert codes == {"DATABASE_UNAVAILABLE"}, r.text
                if r.json().get("data") is None or not any(r.json()["data"].values()):
                    assert r.status_code == 503 and "retry-after" in r.headers, r.text
                seen.append((r.status_code, "unavailable"))
            await asyncio.to_thread(server.start)
        assert any(kind == "unavailable" for _, kind in seen), seen
    finally:
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


async def test_deadline_cancels_the_request_and_its_statements(
    seeded: tuple[EmbeddedPostgres, str],
) -> None:
    server, tok = seeded
    _, client, lifespan = await _client(server.dsn, pool_max_size=2, request_timeout_ms=400)
    blocker = await asyncpg.connect(server.dsn)
    try:
        # Hold a lock that recall's statements wait for (lock_timeout is 2 s,
        # longer than the deadline): only the deadline can end the wait.
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE evidence IN ACCESS EXCLUSIVE MODE")
        r = await _ask(client, tok, RECALL)
        assert r.status_code in (200, 504), r.text
        assert _code(r) == "REQUEST_TIMEOUT", r.text
        await tx.rollback()
        # Nothing of the gateway is still running in PostgreSQL.
        waiting = 1
        for _ in range(50):
            waiting = await blocker.fetchval(
                # the pool's connections and the side connections (recall-gateway-side)
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                "'recall-gateway%' AND state = 'active'"
            )
            if waiting == 0:
                break
            await asyncio.sleep(0.05)
        assert waiting == 0
        # and the gateway is healthy afterwards: a cheap request answers within the
        # 400 ms deadline (retried: on a loaded machine one attempt may not)
        healthy = []
        for _ in range(20):
            healthy.append((await _ask(client, tok)).json())
            if "errors" not in healthy[-1]:
                break
        assert healthy[-1] == {"data": {"viewer": {"principalId": "alice"}}}, healthy
    finally:
        await blocker.close()
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


async def test_more_requests_than_connections_queue_within_the_deadline(
    seeded: tuple[EmbeddedPostgres, str],
) -> None:
    server, tok = seeded
    app, client, lifespan = await _client(server.dsn, pool_min_size=1, pool_max_size=1)
    try:
        answers = await asyncio.gather(*(_ask(client, tok, RECALL) for _ in range(8)))
        for r in answers:
            assert r.status_code == 200 and "errors" not in r.json(), r.text
        assert app.state.services.db.pool.get_max_size() == 1
    finally:
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


async def test_work_is_cancelled_when_the_client_goes_away() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await messages.put({"type": "http.request", "body": b"{}", "more_body": False})

    async def receive() -> dict[str, Any]:
        return await messages.get()

    async def send(message: Any) -> None:
        raise AssertionError("nothing is sent to a client that left")

    middleware = RequestBodyMiddleware(slow_app, max_bytes=1024)
    scope = {"type": "http", "headers": [], "query_string": b""}
    task = asyncio.create_task(middleware(scope, receive, send))
    await asyncio.wait_for(started.wait(), 5)
    await messages.put({"type": "http.disconnect"})
    await asyncio.wait_for(task, 5)
    assert cancelled.is_set()
