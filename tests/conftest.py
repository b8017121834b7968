"""Test fixtures: a real PostgreSQL with pgvector, never a mock.

The server is chosen in this order: ``RECALL_TEST_DATABASE_URL`` (or
``DATABASE_URL``) from the environment; a testcontainers pgvector container if
a Docker engine answers; else the embedded server in a temporary folder. Each
test session works in a fresh database made for it, and each test makes its
own teams with unique IDs, so tests never see each other's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pgvector.asyncpg as pgvector_asyncpg
import pytest
import pytest_asyncio
from hypothesis import settings as hypothesis_settings
from starlette.applications import Starlette

from gateway import tokens
from gateway.app import create_app
from gateway.embeddings import EmbeddingProvider, create_provider
from gateway.services import loader
from gateway.services.writes import Actor, WriteService
from gateway.settings import Settings
from gateway.store.connection import Conn
from gateway.store.database import Database, prepare

from . import session_guard
from .session_guard import no_session_state_after_skipped_resets  # noqa: F401 (autouse)

session_guard.install()

REPO = Path(__file__).resolve().parents[1]

# Every embedded server of the suite (the session's, those tests start for
# themselves, those of the CLI's subprocesses, which inherit this) keeps
# PostgreSQL's stock memory instead of a quarter of the machine: several suites
# and engineers start servers at once on one machine, CI machines are small,
# and the same effective_cache_size everywhere keeps the tests' plans alike.
# The tests of the sizing itself (tests/test_embedded.py) unset these.
os.environ.setdefault("RECALL_PG_SHARED_BUFFERS_MB", "128")
os.environ.setdefault("RECALL_PG_EFFECTIVE_CACHE_SIZE_MB", "4096")
# No start-up warm-up (its own tests ask for it): the suite's stores are small and
# cached, and tests that start a gateway expect /readyz to say ready at once.
os.environ.setdefault("RECALL_WARM_UP_MB", "0")

# No timed assertions: hypothesis's default deadline (200 ms per example) is
# one, and on a loaded 2-core machine a large example of tests/test_fusion.py
# can outlast it and fail a correct run. Tests that want a bound on the number
# of examples still set max_examples themselves.
hypothesis_settings.register_profile("recall", deadline=None)
hypothesis_settings.load_profile("recall")


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:
        return False


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


@dataclass(frozen=True)
class Server:
    kind: str
    admin_dsn: str


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    given = os.environ.get("RECALL_TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if given:
        yield Server("environment", given)
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("pgvector/pgvector:pg17", driver=None) as container:
            yield Server("testcontainers", container.get_connection_url())
        return
    from gateway.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg"), database="postgres")
    server.start()
    try:
        yield Server("embedded", server.dsn)
    finally:
        server.stop()


def _migrated_database(server: Server, prefix: str) -> Iterator[str]:
    """Create a database on the server, migrate it, yield its DSN, drop it."""
    name = prefix + secrets.token_hex(4)

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(server.admin_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    url = _with_database(server.admin_dsn, name)
    asyncio.run(prepare(url, migrate=True))
    try:
        yield url
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def dsn(pg_server: Server) -> Iterator[str]:
    """A fresh, migrated database for this test session."""
    yield from _migrated_database(pg_server, "recall_test_")


@pytest.fixture
def fresh_dsn(pg_server: Server) -> Iterator[str]:
    """A database of one test's own, for tests that change the whole store
    (its embedding model, for instance), which the session database must keep."""
    yield from _migrated_database(pg_server, "recall_one_")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def db(dsn: str) -> AsyncIterator[Database]:
    database = await Database.open(dsn, min_size=1, max_size=8)
    try:
        yield database
    finally:
        await database.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def embedder() -> AsyncIterator[EmbeddingProvider]:
    provider = create_provider(Settings(embedding_provider="local"))
    try:
        yield provider
    finally:
        await provider.aclose()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def writes(db: Database, embedder: EmbeddingProvider) -> WriteService:
    return WriteService(db, embedder)


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def token_id_of(raw: str) -> str:
    """The ID part of a bearer token the tests made (``tests.test_recall.token``)."""
    parsed = tokens.parse_token(raw)
    assert parsed is not None, raw
    return parsed.token_id


async def load_jsonl(writes: WriteService, text: str, *, batch_size: int = 50) -> loader.LoadReport:
    records = loader.parse(loader.split_lines(text))
    return await loader.load(writes, records, batch_size=batch_size, actor=Actor.operator())


async def until(
    check: Callable[[], bool | Awaitable[bool]], what: str, seconds: float = 10.0
) -> None:
    """Poll ``check`` (plain or async) every 20 ms until it holds; fail after
    ``seconds`` saying ``what`` never happened. A bounded wait for a state, not
    a timing claim."""
    for _ in range(int(seconds / 0.02)):
        got = check()
        if await got if inspect.isawaitable(got) else got:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {seconds} s: {what}")


async def fetch_one(conn: Conn, query: str, *args: Any) -> asyncpg.Record:
    """The row a query returns: a test's check of one row, where no row is a failure
    (``fetchrow`` says None)."""
    row = await conn.fetchrow(query, *args)
    assert row is not None, query
    row_: asyncpg.Record = row
    return row_


async def register_vector(conn: Conn) -> None:
    """pgvector's codecs on a test's connection. ``pgvector.asyncpg.register_vector``
    is typed for a plain connection; a pool's proxy forwards every call to one."""
    await pgvector_asyncpg.register_vector(cast(asyncpg.Connection, conn))


async def analyze(conn: Conn, *tables: str) -> None:
    """ANALYZE a fixture's tables without the pool's statement timeout.

    The tests' database holds every earlier test's rows, and on a busy machine
    sampling them took longer than the pool's 5 s (a fixture failed with
    ``QueryCanceledError``, not the test). ANALYZE runs inside a transaction, so
    the setting stays there."""
    async with conn.transaction():
        await conn.execute("SET LOCAL statement_timeout = 0")
        await conn.execute(f"ANALYZE {', '.join(tables)}")


@pytest_asyncio.fixture(loop_scope="session")
async def admin_conn(db: Database) -> AsyncIterator[Conn]:
    """A plain connection as the owner role, for checking what was written."""
    async with db.pool.acquire() as conn:
        yield conn


def app_for(dsn: str, **settings: Any) -> Starlette:
    """The gateway app on the test database (its lifespan is the caller's to run)."""
    return create_app(Settings(**{"database_url": dsn, "pool_max_size": 4, **settings}))


@pytest_asyncio.fixture(loop_scope="session")
async def gateway_app(dsn: str) -> AsyncIterator[Starlette]:
    app = app_for(dsn)
    async with app.router.lifespan_context(app):
        yield app


@pytest_asyncio.fixture(loop_scope="session")
async def client(gateway_app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=gateway_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
        yield c


class MakeClient(Protocol):
    """A ``make_client`` fixture: a client of a new app with the given settings."""

    async def __call__(self, **settings: Any) -> httpx.AsyncClient: ...


@dataclass
class LiveServer:
    """A gateway served by uvicorn on a loopback port, in a thread of its own."""

    url: str
    app: Starlette


@contextlib.contextmanager
def serve_in_thread(app: Starlette) -> Iterator[LiveServer]:
    """Run ``app`` with uvicorn on 127.0.0.1 (a free port) until the block ends.

    For clients that need a real socket (a browser, streaming HTTP clients);
    the app opens its own pool in the server's own event loop."""
    import socket
    import threading
    import time

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test gateway did not start")
        time.sleep(0.05)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", app)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module")
def live_server(dsn: str) -> Iterator[LiveServer]:
    with serve_in_thread(app_for(dsn)) as server:
        yield server
