"""A real ``serve`` process: read timeouts, SIGTERM drain and shutdown, token
revocation seen by every worker.

Each test starts ``recall-gateway serve`` as a subprocess on a free loopback
port and talks to it over sockets, as a client (or an attacker) would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest

from gateway import tokens
from gateway.embedded import EmbeddedPostgres
from gateway.services.writes import WriteService
from gateway.serving import MAX_HEADER_BYTES, MAX_URL_BYTES

from .conftest import REPO, load_jsonl, token_id_of, unique
from .factories import jsonl, team_records
from .test_cli import CLI, _free_port, run
from .test_faults import own_server, seeded  # noqa: F401  (fixtures)
from .test_recall import token

VIEWER = "{ viewer { principalId } }"


class Served:
    """A ``recall-gateway serve`` child process and its port."""

    def __init__(self, dsn: str, folder: Path, **env: str) -> None:
        self.port = _free_port()
        self.log = folder / f"serve-{self.port}.log"
        environ = {
            k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RECALL_DATABASE_URL")
        }
        environ.update(
            DATABASE_URL=dsn,
            RECALL_PORT=str(self.port),
            RECALL_DATA_DIR=str(folder / "unused"),
            RECALL_POOL_MAX_SIZE="4",
            **env,
        )
        with self.log.open("wb") as sink:
            self.proc = subprocess.Popen(
                [*CLI, "serve"], stdout=sink, stderr=subprocess.STDOUT, env=environ, cwd=REPO
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"serve exited: {self.log.read_text(errors='replace')}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail(f"serve never became ready: {self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a server that neither answers
    nor closes fails the test after a long safety bound (not a timing claim)."""
    sock.settimeout(60)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"the server held the connection without closing it; got {data!r}")
        if not chunk:
            return data
        data += chunk


@pytest.fixture(scope="module")
def timed_server(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = Served(
        dsn,
        tmp_path_factory.mktemp("serve-timeouts"),
        RECALL_HEADER_TIMEOUT_MS="700",
        RECALL_BODY_TIMEOUT_MS="700",
    )
    try:
        served.wait_ready()
        yield served
    finally:
        served.stop()


def _code_of(answer: bytes) -> tuple[int, str, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    code = json.loads(body)["errors"][0]["extensions"]["code"]
    return status, code, head.lower()


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # connects and sends nothing
        b"POST /graphql HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n",  # slow headers
        b"POST /graphql HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"query":',  # 10 of 100 bytes: slow body
    ],
    ids=["nothing", "slow-headers", "slow-body"],
)
def test_slow_clients_get_408_and_the_connection_closes(timed_server: Served, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", timed_server.port)) as sock:
        sock.sendall(sent)
        answer = _read_until_closed(sock)
    status, code, head = _code_of(answer)
    assert (status, code) == (408, "REQUEST_READ_TIMEOUT"), answer
    assert b"connection: close" in head


def test_a_timely_client_is_not_timed_out_on_a_kept_alive_connection(
    timed_server: Served,
) -> None:
    """Requests that arrive in time are served, one after another on one connection,
    with pauses between them shorter than the keep-alive timeout."""
    body = json.dumps({"query": "{ __typename }"}).encode()
    request = (
        b"POST /graphql HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    with socket.create_connection(("127.0.0.1", timed_server.port)) as sock:
        sock.settimeout(30)
        for _ in range(3):
            sock.sendall(request)
            answer = sock.recv(65536)
            while not answer.endswith(b"}"):  # the body may come in its own segment
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            assert answer.endswith(b'{"data":{"__typename":"Query"}}')
            time.sleep(0.4)


# --- oversized heads --------------------------------------------------------------------


def _exchange(port: int, request: bytes) -> bytes:
    """Send a whole request and read the answer until the server closes (or, for a
    kept-alive answer, until its body is complete). The server may refuse before the
    request is all sent: what it answered is still read."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(60)
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return data
            except TimeoutError:
                pytest.fail(f"no complete answer; got {data[:300]!r}")
            if not chunk:
                return data
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            length = [
                int(line.split(b":", 1)[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            ]
            if sep and length and len(body) >= length[0]:
                return data


def _get_with_url_of(size: int) -> bytes:
    """A GET of exactly ``size`` bytes of URL (request target) that the gateway
    answers with data when it is served: a small document and padding."""
    target = b"/graphql?query=%7B__typename%7D&pad="
    target += b"x" * (size - len(target))
    assert len(target) == size
    return b"GET " + target + b" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "size", [1_000, 65_534, MAX_URL_BYTES, MAX_URL_BYTES + 1, 70_000, 100_000, 1_000_000]
)
def test_every_url_size_gets_data_or_the_coded_413(timed_server: Served, size: int) -> None:
    """Up to the parser's limit (65,535 bytes, included) the request is served; past
    it, the coded JSON 413 instead of uvicorn's plain-text 400."""
    answer = _exchange(timed_server.port, _get_with_url_of(size))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), answer[:300]
    if size <= MAX_URL_BYTES:
        assert head.startswith(b"HTTP/1.1 200"), answer[:300]
        assert json.loads(body) == {"data": {"__typename": "Query"}}
        return
    status, code, lowered = _code_of(answer)
    assert (status, code) == (413, "REQUEST_TOO_LARGE"), answer[:300]
    assert json.loads(body)["errors"][0]["extensions"]["maxBytes"] == MAX_URL_BYTES
    assert b"connection: close" in lowered


def _post_with_header_bytes(total: int, *, headers: int = 1) -> bytes:
    """A small POST whose header names and values add up to exactly ``total`` bytes,
    the padding spread over ``headers`` headers."""
    body = b'{"query":"{ __typename }"}'
    fixed = [
        (b"Host", b"gw"),
        (b"Content-Type", b"application/json"),
        (b"Content-Length", str(len(body)).encode()),
        (b"Connection", b"close"),
    ]
    left = total - sum(len(n) + len(v) for n, v in fixed)
    pads = []
    for i in range(headers):
        name = b"X-Pad-%06d" % i
        share = left // (headers - i)
        pads.append((name, b"p" * (share - len(name))))
        left -= share
    lines = b"".join(n + b": " + v + b"\r\n" for n, v in fixed + pads)
    assert sum(len(n) + len(v) for n, v in fixed + pads) == total
    return b"POST /graphql HTTP/1.1\r\n" + lines + b"\r\n" + body


@pytest.mark.parametrize(
    ("total", "headers"),
    [
        (8_000, 1),
        (MAX_HEADER_BYTES - 1, 1),
        (MAX_HEADER_BYTES, 1),
        (MAX_HEADER_BYTES + 1, 1),
        (MAX_HEADER_BYTES + 1, 500),  # many small headers
        (100_000, 1),
        (3_000_000, 1),  # past the raw head guard: refused before the header ends
    ],
)
def test_every_header_size_gets_data_or_the_coded_431(
    timed_server: Served, total: int, headers: int
) -> None:
    answer = _exchange(timed_server.port, _post_with_header_bytes(total, headers=headers))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), answer[:300]
    if total <= MAX_HEADER_BYTES:
        assert head.startswith(b"HTTP/1.1 200"), answer[:300]
        assert json.loads(body) == {"data": {"__typename": "Query"}}
        return
    status, code, lowered = _code_of(answer)
    assert (status, code) == (431, "REQUEST_HEADERS_TOO_LARGE"), answer[:300]
    assert b"connection: close" in lowered


@pytest.mark.parametrize(
    "request_",
    [
        b"GET /graphql HTTP/1.1\r\nHost: gw\r\nBad Header Name: x\r\n\r\n",
        b"GET /graphql HTTP/9.9\r\nHost: gw\r\n\r\n",
        b"\x00\x01\x02 garbage\r\n\r\n",
    ],
    ids=["space-in-header-name", "http-9.9", "binary"],
)
def test_unparsable_requests_get_a_coded_400(timed_server: Served, request_: bytes) -> None:
    status, code, lowered = _code_of(_exchange(timed_server.port, request_))
    assert (status, code) == (400, "BAD_REQUEST")
    assert b"content-type: application/json" in lowered and b"connection: close" in lowered


# --- SIGTERM ----------------------------------------------------------------------------


def _smart_stop(server: EmbeddedPostgres) -> subprocess.CompletedProcess[str]:
    """PostgreSQL's smart shutdown: it waits until every session has ended."""
    return server._run_server_tool(
        "pg_ctl", ["-D", str(server.pgdata), "-m", "smart", "-w", "-t", "120", "stop"]
    )


async def test_sigterm_drains_finishes_in_flight_work_and_frees_postgres(
    seeded: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    server, tok = seeded
    served = Served(
        server.dsn,
        tmp_path,
        RECALL_SHUTDOWN_DRAIN_MS="2000",
        RECALL_SHUTDOWN_GRACE_MS="20000",
        RECALL_STATEMENT_TIMEOUT_MS="60000",
    )
    blocker = await asyncpg.connect(server.dsn)
    try:
        await asyncio.to_thread(served.wait_ready)
        async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
            warm = await client.post(
                "/graphql", json={"query": VIEWER}, headers={"Authorization": f"Bearer {tok}"}
            )
            assert warm.json()["data"]["viewer"]["principalId"] == "alice", warm.text
            # An in-flight request, its token lookup held up by a lock until the
            # test lets it go.
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute("LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE")
            in_flight = asyncio.create_task(
                client.post(
                    "/graphql", json={"query": VIEWER}, headers={"Authorization": f"Bearer {tok}"}
                )
            )
            for _ in range(500):  # until the request waits for the lock in PostgreSQL
                waiting = await blocker.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                    "'api_tokens'::regclass"
                )
                if waiting:
                    break
                await asyncio.sleep(0.02)
            served.proc.send_signal(signal.SIGTERM)
            # A load balancer's probe on a new connection: out at once, not refused.
            ready = await client.get("/readyz", headers={"Connection": "close"})
            assert ready.status_code == 503, ready.text
            assert ready.json() == {"status": "not ready", "reason": "shutting down"}
            # After the drain the listener closes; the request still in flight
            # is let go only then, and must still be answered (the grace period).
            for _ in range(600):
                try:
                    socket.create_connection(("127.0.0.1", served.port), timeout=1).close()
                except OSError:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the server kept accepting connections after the drain")
            assert not in_flight.done()
            await tx.rollback()
            finished = await in_flight
            assert finished.json() == {"data": {"viewer": {"principalId": "alice"}}}
        await blocker.close()  # the test's own session, so only the gateway's remain
        # PostgreSQL's smart shutdown waits for the gateway's sessions: it completes
        # only because the gateway closes its pool on the way out.
        smart = asyncio.create_task(asyncio.to_thread(_smart_stop, server))
        exit_code = await asyncio.to_thread(served.proc.wait, 120)
        assert exit_code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), served.log.read_text()
        stopped = await smart
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        log = served.log.read_text(errors="replace")
        assert "Traceback" not in log, log
    finally:
        served.stop()
        if not blocker.is_closed():
            blocker.terminate()


# --- tokens list / revoke ----------------------------------------------------------------


def _worker_of_port(workers: list[psutil.Process], client_port: int) -> int | None:
    for worker in workers:
        for conn in worker.net_connections(kind="tcp"):
            if conn.raddr and conn.raddr.port == client_port:
                return worker.pid
    return None


async def _ask_on(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], tok: str) -> int:
    reader, writer = conn
    body = json.dumps({"query": VIEWER}).encode()
    writer.write(
        b"POST /graphql HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {tok}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


async def test_tokens_list_and_a_revoked_token_is_refused_by_every_worker(
    dsn: str, writes: WriteService, tmp_path: Path
) -> None:
    team, other = unique("revoke"), unique("revokex")
    await load_jsonl(writes, jsonl(team_records(team) + team_records(other)))
    tok = await token(writes, team, "alice")
    kept = await token(writes, team, "alice", "shared_only")
    stranger = await token(writes, other, "alice")
    token_id = token_id_of(tok)

    listed = run(["tokens", "list", "--team", team], dsn)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert sorted(r[0] for r in rows) == sorted(token_id_of(t) for t in (tok, kept))
    assert {r[4] for r in rows} == {"active"}
    for secret_part in (tok, kept, stranger):
        assert secret_part[-tokens.SECRET_LENGTH :] not in listed.stdout

    served = Served(dsn, tmp_path, RECALL_WORKERS="2")
    connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        await asyncio.to_thread(served.wait_ready)
        workers = psutil.Process(served.proc.pid).children(recursive=True)
        workers = [w for w in workers if "python" in w.name().lower()]
        # A kept-alive connection on each worker. /readyz answered from one worker;
        # the other may still be starting (loading the model: many seconds on a
        # loaded machine) and accepts nothing until then, so connect until both
        # hold one, keeping one connection per worker, and asking on the kept ones
        # meanwhile so that the keep-alive timeout does not close them.
        served_by: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        deadline = time.monotonic() + 180
        while len(served_by) < 2 and time.monotonic() < deadline:
            for kept_conn in connections:
                assert await _ask_on(kept_conn, tok) == 200
            conn = await asyncio.open_connection("127.0.0.1", served.port)
            assert await _ask_on(conn, tok) == 200
            pid = _worker_of_port(workers, conn[1].get_extra_info("sockname")[1])
            assert pid is not None
            if pid in served_by:
                conn[1].close()
                await asyncio.sleep(0.1)
            else:
                served_by[pid] = conn
                connections.append(conn)
        assert len(served_by) == 2, "one worker served every connection for 180 s"

        revoked = run(["tokens", "revoke", token_id], dsn)
        assert revoked.returncode == 0, revoked.stderr
        assert f"token {token_id} revoked at" in revoked.stdout
        # the next request of each connection, on either worker, is refused
        for conn in connections:
            assert await _ask_on(conn, tok) == 401
            assert await _ask_on(conn, kept) == 200
        again = run(["tokens", "revoke", tok], dsn)  # the whole token works too; idempotent
        assert again.returncode == 0 and revoked.stdout == again.stdout, again.stderr
        missing = run(["tokens", "revoke", "t-0000000000000000"], dsn)
        assert missing.returncode == 1 and "no token 't-0000000000000000'" in missing.stderr
        states = {
            line.split()[0]: line.split()[4]
            for line in run(["tokens", "list", "--team", team], dsn).stdout.splitlines()[1:]
        }
        assert states[token_id] == "revoked"
    finally:
        for _, writer in connections:
            writer.close()
        served.stop()
