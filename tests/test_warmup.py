"""The start-up warm-up (gateway/services/warmup.py): what it reads, in which
order, within which budget, and what /readyz says meanwhile.

Each test has a database of its own (``fresh_dsn``) with one table of vectors
and its HNSW index standing in for a space's vector partition."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest
import pytest_asyncio

from gateway.embedded import EmbeddedPostgres, machine_memory_mb
from gateway.services.warmup import WarmUp, budget_mb
from gateway.services.writes import WriteService
from gateway.store import warmup as store
from gateway.store.connection import Conn
from gateway.store.database import Database
from tests.conftest import REPO, app_for, load_jsonl, unique
from tests.factories import jsonl, team_records
from tests.test_app import _token
from tests.test_cli import CLI, _free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")

DIM = 384
WAITING = (
    "warming up: waiting for another process of this store to finish its warm-up "
    "(it holds the warm-up lock)"
)


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


async def test_the_default_budget_stops_at_what_the_page_cache_can_hold(
    vectors_db: Database, vectors_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """effective_cache_size (the suite's 4 GB) is more than a machine of
    shared_buffers + 1 MB can cache: the derived budget is that 1 MB, and the
    log says why (it read up to effective_cache_size, past memory)."""
    async with vectors_db.pool.acquire() as conn:
        buffers = await store.shared_buffers_bytes(conn)
        total = sum(r.size for r in await store.relations(conn))
    assert total > 2**20
    warm = WarmUp(vectors_dsn, None, machine_mb=buffers // 2**20 + 1)
    with caplog.at_level("WARNING", logger="gateway.warmup"):
        await warm.run()
    assert warm.state == "done"
    assert warm.read == warm.planned == 2**20
    assert "is more than the page cache can hold" in caplog.text

    roomy = WarmUp(vectors_dsn, None, machine_mb=buffers // 2**20 + 2 * total // 2**20 + 1)
    await roomy.run()
    assert roomy.read == roomy.planned == total  # not capped when it all fits


async def test_zero_turns_it_off(vectors_dsn: str) -> None:
    warm = WarmUp(vectors_dsn, 0)
    assert warm.state == "skipped" and not warm.warming
    await warm.run()
    assert warm.state == "skipped" and warm.read == warm.planned == 0


async def _ready(client: httpx.AsyncClient) -> httpx.Response:
    return await client.get("/readyz")


async def _until_waiting(client: httpx.AsyncClient) -> None:
    """Until the warm-up has found the lock taken (it connects first)."""
    for _ in range(200):
        if (await _ready(client)).json().get("reason") == WAITING:
            return
        await asyncio.sleep(0.05)


async def test_readyz_says_warming_until_it_is_done(vectors_dsn: str) -> None:
    """Another process of the store is warming (it holds the lock): this one
    waits for it, /readyz says 503 with the reason meanwhile; then it reads the
    files itself, and is ready. The holder here read nothing, as one that died
    halfway would (its lock goes with its connection): the lock cannot tell
    that from a finished warm-up. (The waiter went ready without reading.)"""
    holder = await asyncpg.connect(vectors_dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1::bigint)", store.LOCK_KEY)
        app = app_for(vectors_dsn, warm_up_mb=1024)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                await _until_waiting(client)
                for _ in range(3):
                    r = await _ready(client)
                    assert r.status_code == 503
                    assert r.json() == {"status": "not ready", "reason": WAITING}
                    await asyncio.sleep(0.1)
                assert app.state.warmup.state == "waiting"
                await holder.execute("SELECT pg_advisory_unlock($1::bigint)", store.LOCK_KEY)
                for _ in range(100):
                    r = await _ready(client)
                    if r.status_code == 200:
                        break
                    await asyncio.sleep(0.05)
                assert r.status_code == 200 and r.json() == {"status": "ready"}
                warm = app.state.warmup
                assert warm.state == "done" and warm.read == warm.planned > 0
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
        app = app_for(
            vectors_dsn,
            warm_up_mb=1024,
            pool_min_size=1,
            pool_max_size=1,
            request_timeout_ms=3000,
        )
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                await _until_waiting(client)
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
                    assert r.json() == {"status": "not ready", "reason": WAITING}
                assert app.state.warmup.state == "waiting"
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
        app = app_for(vectors_dsn, warm_up_mb=None)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                r = await _ready(client)
                assert r.status_code == 200 and r.json() == {"status": "ready"}
                assert app.state.warmup.state == "skipped"
    finally:
        await holder.close()


async def _warm_up_sessions(conn: Conn) -> list[asyncpg.Record]:
    """The server's sessions of a warm-up (any gateway's), as pg_stat_activity lists them."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT pid, state, wait_event_type, query FROM pg_stat_activity "
        "WHERE application_name = 'recall-gateway warm-up'"
    )
    return rows


async def _no_warm_up_sessions(conn: Conn) -> None:
    """Its session gone from the server (a backend ends a moment after its client
    goes; 10 s is a safety bound, not a timing claim)."""
    for _ in range(200):
        if not await _warm_up_sessions(conn):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"a warm-up session outlived it: {await _warm_up_sessions(conn)}")


async def test_a_cancelled_warm_up_closes_its_connection(
    vectors_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutdown (the app cancels the task) in the middle of a read statement and
    while waiting for another process's lock: the cancellation propagates, the
    state says cancelled (not running), and its session is gone from the server."""
    reading = asyncio.Event()
    read_chunk = store.read_chunk

    async def read_and_signal(conn: Any, path: str, offset: int, length: int) -> int:
        reading.set()  # the statement is sent right after, before the task yields
        return await read_chunk(conn, path, offset, length)

    monkeypatch.setattr(store, "read_chunk", read_and_signal)
    admin = await asyncpg.connect(vectors_dsn)
    try:
        warm = WarmUp(vectors_dsn, None)
        task = asyncio.create_task(warm.run())
        await reading.wait()
        assert len(await _warm_up_sessions(admin)) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert warm.state == "cancelled" and not warm.warming
        await _no_warm_up_sessions(admin)

        await admin.execute("SELECT pg_advisory_lock($1::bigint)", store.LOCK_KEY)
        warm = WarmUp(vectors_dsn, None)
        task = asyncio.create_task(warm.run())
        for _ in range(200):
            if warm.state == "waiting" and await _warm_up_sessions(admin):
                break
            await asyncio.sleep(0.05)
        [session] = await _warm_up_sessions(admin)
        assert session["wait_event_type"] == "Lock" and "pg_advisory_lock" in session["query"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert warm.state == "cancelled"
        await _no_warm_up_sessions(admin)
    finally:
        await admin.close()


async def test_the_log_says_what_it_reads_and_how_far_it_got(
    vectors_db: Database, vectors_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A start line (how much, of how many relations, within which budget), progress
    lines (every PROGRESS_LOG_S; here after every statement), the end line."""
    async with vectors_db.pool.acquire() as conn:
        relations = await store.relations(conn)
    warm = WarmUp(vectors_dsn, 1)
    warm.progress_log_s = 0
    with caplog.at_level("INFO", logger="gateway.warmup"):
        await warm.run()
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.warmup"]
    assert lines[0] == (
        f"warm-up: reading 1 MB of the store's files (1 of {len(relations)} relations, "
        f"{sum(r.size for r in relations) / 2**20:.0f} MB in all; budget 1 MB, "
        "RECALL_WARM_UP_MB)"
    )
    assert lines[1].startswith(
        "warming up: 1 of 1 MB of the store's files read (vector indexes first), "
    )
    assert lines[-1].startswith("warm-up: read 1 MB of the store's files in ")


async def test_the_embedded_server_served_by_the_cli_gets_the_embedded_defaults(
    vectors_dsn: str,
) -> None:
    """``serve`` hands the app the embedded server's DSN as database_url: with
    embedded_server the warm-up runs (budget: effective_cache_size), as the
    embedded server's default says, and an absurd RECALL_WARM_UP_MB is refused."""
    from gateway.app import create_app
    from gateway.errors import ConfigurationError
    from gateway.settings import Settings

    holder = await asyncpg.connect(vectors_dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1::bigint)", store.LOCK_KEY)
        settings = Settings(database_url=vectors_dsn, pool_max_size=2, warm_up_mb=None)
        app = create_app(settings, embedded_server=True)
        async with app.router.lifespan_context(app):
            assert app.state.warmup.budget_mb is None
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for _ in range(100):
                    r = await _ready(client)
                    if r.json().get("reason") == WAITING:
                        break
                    await asyncio.sleep(0.05)
                assert r.status_code == 503 and r.json()["reason"] == WAITING
    finally:
        await holder.close()
    too_much = settings.model_copy(update={"warm_up_mb": machine_memory_mb()})
    app = create_app(too_much, embedded_server=True)
    with pytest.raises(ConfigurationError, match=r"RECALL_WARM_UP_MB of \d+ is not less than"):
        async with app.router.lifespan_context(app):
            pass


# --- `serve` on the embedded server (a real process, signalled as in production)


@pytest.fixture
def embedded_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """An embedded server of the test's own (started here, so that ``serve``
    attaches to it and the test can hold the warm-up lock before it starts)."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("warm-serve"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _serve(data_dir: Path, port: int, log: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "RECALL_DATABASE_URL", "RECALL_WARM_UP_MB")
    }
    environ.update(
        RECALL_DATA_DIR=str(data_dir),
        RECALL_PORT=str(port),
        RECALL_SHUTDOWN_DRAIN_MS="0",
        RECALL_POOL_MAX_SIZE="2",
        **env,
    )
    with log.open("wb") as sink:
        return subprocess.Popen(
            [*CLI, "serve", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=REPO,
        )


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    """After a failure: the process and its uvicorn workers (the parent alone
    killed left them running, holding the port and the test's database)."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("workers", [1, 2])
async def test_serve_warms_the_embedded_server_by_default_and_sigterm_ends_it(
    embedded_store: EmbeddedPostgres, tmp_path: Path, workers: int
) -> None:
    """RECALL_WARM_UP_MB unset, no DATABASE_URL: ``serve`` warms the store (it
    ran cold: ``serve`` handed the app the embedded server's DSN as if it were an
    external server's, whose default is no warm-up). Here another process holds
    the lock, so /readyz says it waits for it; a SIGTERM then ends the process
    and leaves no warm-up session on the server."""
    holder = await asyncpg.connect(embedded_store.dsn)
    port = _free_port()
    log = tmp_path / "serve.log"
    proc = None
    try:
        await holder.execute("SELECT pg_advisory_lock($1::bigint)", store.LOCK_KEY)
        proc = _serve(embedded_store.data_dir, port, log, "--workers", str(workers))
        answer: dict[str, Any] = {}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            for _ in range(1200):  # the workers load the embedding model first
                assert proc.poll() is None, log.read_text(errors="replace")
                try:
                    r = await _ready(client)
                    answer = r.json()
                    if r.status_code == 200 or answer.get("reason") == WAITING:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        assert answer == {"status": "not ready", "reason": WAITING}, log.read_text()
        for _ in range(600):  # each worker warms (the second may start later)
            sessions = await _warm_up_sessions(holder)
            # a session is listed as it connects, a moment before it asks for the lock
            if len(sessions) == workers and all(s["wait_event_type"] == "Lock" for s in sessions):
                break
            await asyncio.sleep(0.1)
        assert len(sessions) == workers and all(s["wait_event_type"] == "Lock" for s in sessions)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)  # a hang fails; not a timing claim
        assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), log.read_text()
        await _no_warm_up_sessions(holder)
        text = log.read_text(errors="replace")
        assert "warm-up cancelled (shutting down)" in text and "Traceback" not in text, text
    finally:
        await holder.close()
        _kill(proc)


@pytest.mark.parametrize(
    ("value", "says", "exit_code"),
    [
        ("-1", "RECALL_WARM_UP_MB: Input should be greater than or equal to 0 (got '-1')", 2),
        ("lots", "RECALL_WARM_UP_MB: Input should be a valid integer", 2),
        ("1.5", "RECALL_WARM_UP_MB: Input should be a valid integer", 2),
        ("99999999999", "RECALL_WARM_UP_MB: Input should be less than or equal to 16777216", 2),
        ("MACHINE", "RECALL_WARM_UP_MB of {machine} is not less than this machine's memory", 1),
    ],
)
async def test_a_bad_warm_up_budget_stops_serve_before_it_starts(
    tmp_path: Path, value: str, says: str, exit_code: int
) -> None:
    """Refused at start with a coded message naming the variable, before the
    embedded server starts: negative, not a whole number, past the bound, or (for
    the embedded server) not below the machine's memory, which the page cache
    could not hold."""
    machine = machine_memory_mb()
    value = value.replace("MACHINE", str(machine))
    data_dir = tmp_path / "data"
    log = tmp_path / "serve.log"
    proc = _serve(data_dir, _free_port(), log, RECALL_WARM_UP_MB=value)
    try:
        code = await asyncio.to_thread(proc.wait, 120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # it served: the server it started stops with it
        await asyncio.to_thread(proc.wait, 60)
        pytest.fail(f"serve started with RECALL_WARM_UP_MB={value}: {log.read_text()}")
    text = log.read_text(errors="replace")
    assert code == exit_code, text
    assert "CONFIGURATION_ERROR" in text and says.format(machine=machine) in text, text
    assert "Traceback" not in text
    assert not (data_dir / "pgdata").exists()  # no server was started
