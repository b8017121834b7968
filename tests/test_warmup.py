"""The start-up warm-up (gateway/services/warmup.py): what it reads, in which
order, within which budget, and what /readyz says meanwhile.

Each test has a database of its own (``fresh_dsn``) with one table of vectors
and its HNSW index standing in for a space's vector partition."""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio

from gateway.services.warmup import WarmUp, budget_mb
from gateway.services.writes import WriteService
from gateway.store import warmup as store
from gateway.store.database import Database
from tests.conftest import app_for, load_jsonl, unique
from tests.factories import jsonl, team_records
from tests.test_app import _token

pytestmark = pytest.mark.asyncio(loop_scope="session")

DIM = 384


@pytest_asyncio.fixture(loop_scope="session")
async def vectors_dsn(fresh_dsn: str) -> str:
    """The store plus ``warm_vectors``: 1,500 vectors (about 2.4 MB of rows) and
    their HNSW graph (larger still)."""
    conn = await asyncpg.connect(fresh_dsn)
    try:
        await conn.execute(
            f"CREATE TABLE warm_vectors (id int PRIMARY KEY, v vector({DIM}));"
            f"INSERT INTO warm_vectors SELECT i, (SELECT array_agg(random())::vector({DIM}) "
            f"FROM generate_series(1, {DIM}) WHERE i > 0) FROM generate_series(1, 1500) i;"
            "CREATE INDEX warm_vectors_v ON warm_vectors USING hnsw (v vector_cosine_ops);"
        )
    finally:
        await conn.close()
    return fresh_dsn


@pytest_asyncio.fixture(loop_scope="session")
async def vectors_db(vectors_dsn: str) -> AsyncIterator[Database]:
    db = await Database.open(vectors_dsn, min_size=1, max_size=2)
    try:
        yield db
    finally:
        await db.close()


async def test_the_vector_graph_first_then_its_rows_then_the_rest_smallest_first(
    vectors_db: Database,
) -> None:
    async with vectors_db.pool.acquire() as conn:
        relations = await store.relations(conn)
        sizes = {
            r["name"]: int(r["size"])
            for r in await conn.fetch(
                "SELECT oid::regclass::text AS name, pg_relation_size(oid) AS size "
                "FROM pg_class WHERE oid >= 16384 AND relpersistence = 'p' "
                "AND relkind IN ('r', 'i', 'm', 't') AND pg_relation_size(oid) > 0"
            )
        }
    names = [r.name for r in relations]
    assert names[:2] == ["warm_vectors_v", "warm_vectors"]
    rest = [r.size for r in relations[2:]]
    assert rest == sorted(rest)
    # every relation of the store with a file, each once, at its size; no catalog
    assert {r.name: r.size for r in relations} == sizes
    assert not any(n.startswith("pg_catalog.") or n.startswith("pg_class") for n in names)
    assert "teams_pkey" in names and "schema_migrations" in names


async def test_warm_up_reads_it_all_within_the_default_budget(
    vectors_db: Database, vectors_dsn: str
) -> None:
    async with vectors_db.pool.acquire() as conn:
        total = sum(r.size for r in await store.relations(conn))
        cache = await store.effective_cache_bytes(conn)
    assert total < cache  # the suite's 4 GB (tests/conftest.py)
    warm = WarmUp(vectors_dsn, None)
    assert warm.warming
    await warm.run()
    assert warm.state == "done" and not warm.warming
    assert warm.read == warm.planned == total


async def test_a_budget_bounds_the_reads(vectors_db: Database, vectors_dsn: str) -> None:
    """1 MB: the first megabyte of the HNSW graph, nothing else."""
    async with vectors_db.pool.acquire() as conn:
        first = (await store.relations(conn))[0]
    assert first.name == "warm_vectors_v" and first.size > 2**20
    warm = WarmUp(vectors_dsn, 1)
    await warm.run()
    assert warm.state == "done"
    assert warm.read == warm.planned == 2**20


async def test_zero_turns_it_off(vectors_dsn: str) -> None:
    warm = WarmUp(vectors_dsn, 0)
    assert warm.state == "skipped" and not warm.warming
    await warm.run()
    assert warm.state == "skipped" and warm.read == warm.planned == 0


async def _ready(client: httpx.AsyncClient) -> httpx.Response:
    return await client.get("/readyz")


async def test_readyz_says_warming_until_it_is_done(vectors_dsn: str) -> None:
    """Another process of the store is warming (it holds the lock): this one
    waits for it, /readyz says 503 with the reason meanwhile, then ready, and
    this process reads nothing itself."""
    holder = await asyncpg.connect(vectors_dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1::bigint)", store.LOCK_KEY)
        app: Any = app_for(vectors_dsn, warm_up_mb=1024)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for _ in range(3):
                    r = await _ready(client)
                    assert r.status_code == 503
                    assert r.json() == {"status": "not ready", "reason": "warming up"}
                    await asyncio.sleep(0.1)
                assert app.state.warmup.state == "running"
                await holder.execute("SELECT pg_advisory_unlock($1::bigint)", store.LOCK_KEY)
                for _ in range(100):
                    r = await _ready(client)
                    if r.status_code == 200:
                        break
                    await asyncio.sleep(0.05)
                assert r.status_code == 200 and r.json() == {"status": "ready"}
                assert app.state.warmup.state == "done" and app.state.warmup.read == 0
    finally:
        await holder.close()


async def test_progress_names_what_is_read() -> None:
    warm = WarmUp("", None)
    warm.planned, warm.read = 300 * 2**20, 120 * 2**20
    assert warm.progress() == (
        "warming up: 120 of 300 MB of the store's files read (vector indexes first)"
    )


async def test_a_login_that_may_not_read_files_skips_it(vectors_dsn: str) -> None:
    """An external server's ordinary login: no warm-up, ready at once, no error."""
    role = f"warm_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(vectors_dsn)
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        dsn = vectors_dsn.replace("://postgres@", f"://{role}@", 1)
        assert dsn != vectors_dsn
        warm = WarmUp(dsn, None)
        await warm.run()
        assert warm.state == "skipped" and warm.read == 0 and not warm.warming
    finally:
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


async def test_a_failed_warm_up_leaves_the_gateway_ready(vectors_dsn: str) -> None:
    """The server went away (here: nothing listens where the DSN points) or
    anything else broke: logged, state failed, /readyz no longer held at 503 by it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # a port of ours that nobody listens on
    port = sock.getsockname()[1]
    try:
        warm = WarmUp(f"postgresql://postgres@127.0.0.1:{port}/recall", None)
        await warm.run()
    finally:
        sock.close()
    assert warm.state == "failed" and not warm.warming


async def test_requests_are_served_while_it_waits_with_a_pool_of_one(
    vectors_dsn: str, embedder: Any
) -> None:
    """The warm-up (here: waiting for another process's, which holds the lock)
    reads on a connection of its own: with a pool of one connection, GraphQL
    requests and /readyz still get it. (It took a pool connection: the request
    timed out waiting for it, 504.)"""
    db = await Database.open(vectors_dsn, min_size=1, max_size=1)
    try:
        team = unique("warm")
        await load_jsonl(WriteService(db, embedder), jsonl(team_records(team)))
        token = await _token(WriteService(db, embedder), team, "alice", "private")
    finally:
        await db.close()
    holder = await asyncpg.connect(vectors_dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1::bigint)", store.LOCK_KEY)
        app: Any = app_for(
            vectors_dsn,
            warm_up_mb=1024,
            pool_min_size=1,
            pool_max_size=1,
            request_timeout_ms=3000,
        )
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for _ in range(3):
                    r = await client.post(
                        "/graphql",
                        json={"query": "{ viewer { principalId team { id } } }"},
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    assert r.status_code == 200, r.text
                    assert r.json() == {
                        "data": {"viewer": {"principalId": "alice", "team": {"id": team}}}
                    }
                    r = await _ready(client)
                    assert r.status_code == 503
                    assert r.json() == {"status": "not ready", "reason": "warming up"}
                assert app.state.warmup.state == "running"
    finally:
        await holder.close()


async def test_against_an_external_server_it_is_off_unless_asked_for(vectors_dsn: str) -> None:
    """DATABASE_URL (the suite's stores) and RECALL_WARM_UP_MB unset: no warm-up,
    ready at once, even while another process holds the lock; the embedded
    server's default is the server's effective_cache_size."""
    assert budget_mb(None, embedded=False) == 0
    assert budget_mb(None, embedded=True) is None
    assert budget_mb(512, embedded=False) == 512
    assert budget_mb(0, embedded=True) == 0
    holder = await asyncpg.connect(vectors_dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1::bigint)", store.LOCK_KEY)
        app: Any = app_for(vectors_dsn, warm_up_mb=None)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                r = await _ready(client)
                assert r.status_code == 200 and r.json() == {"status": "ready"}
                assert app.state.warmup.state == "skipped"
    finally:
        await holder.close()
