"""Read replicas against real servers: an embedded primary and a streaming replica
made from it with ``pg_basebackup`` (the embedded server's own binaries), both on
unix sockets of their own.

Recall and trace read from the replica when it has replayed what the read needs
(the position a write answered with, the primary's position now, or a settled
``knownAt`` instant); writes, recall-event snapshots and feedback go to the
primary. Waits below are bounded polls for a state, never timing claims.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import httpx
import pytest
import pytest_asyncio

from gateway.embedded import EmbeddedPostgres
from gateway.embeddings import EmbeddingProvider
from gateway.services.writes import WriteService
from gateway.store import replicas
from gateway.store.database import Database, prepare
from gateway.store.replicas import (
    InvalidPosition,
    ReadRouter,
    commit_settings,
    format_lsn,
    parse_lsn,
)

from .conftest import app_for, load_jsonl, unique, until
from .factories import jsonl, team_records
from .test_feedback import SUBMIT
from .test_mutations import REMEMBER_SELECTION, incident_memory
from .test_recall import token

pytestmark = pytest.mark.asyncio(loop_scope="session")

POSITION = "X-Recall-Min-Position"
REMEMBER = (
    "mutation M($input: RememberInput!) { remember(input: $input) { " + REMEMBER_SELECTION + " } }"
)
RECALL = """
query R($q: String, $knownAt: DateTime) {
  recallMemory(query: $q, limit: 50, knownAt: $knownAt) {
    recallEventId
    results { evidenceId rank context spaceKind supportingRelationships { id statement } }
    relatedRelationships { representativeId equivalentIds }
    conflicts { id }
    degradations { frontier code }
  }
}
"""
TRACE = "query T($id: ID!) { traceMemory(relationshipId: $id) { relationship { id status } } }"


@dataclass
class Replicated:
    primary: EmbeddedPostgres
    standby: EmbeddedPostgres
    root: Path


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicated]:
    """A migrated primary and a streaming replica of it, for this module."""
    root = tmp_path_factory.mktemp("replication")
    primary = EmbeddedPostgres(root / "primary", database="recall").start()
    try:
        asyncio.run(prepare(primary.dsn, migrate=True))
        standby = primary.start_standby(root / "standby")
        try:
            yield Replicated(primary, standby, root)
        finally:
            standby.stop()
    finally:
        primary.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def primary_writes(
    replicated: Replicated, embedder: EmbeddingProvider
) -> AsyncIterator[WriteService]:
    db = await Database.open(replicated.primary.dsn, max_size=2)
    try:
        yield WriteService(db, embedder)
    finally:
        await db.close()


@pytest_asyncio.fixture(loop_scope="session")
async def team_token(primary_writes: WriteService) -> tuple[str, str]:
    team = unique("rep")
    await load_jsonl(primary_writes, jsonl(team_records(team)))
    return team, await token(primary_writes, team, "alice")


async def _replay(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return parse_lsn(await conn.fetchval("SELECT pg_last_wal_replay_lsn()::text"))
    finally:
        await conn.close()


async def _until_replica(ask: Callable[[], Awaitable[Body]]) -> Body:
    """Ask until a replica serves the answer (bounded: fails after 60 s). On a loaded
    machine a read may still find the replica's pool busy right after it replayed."""
    deadline = time.monotonic() + 60
    while True:
        body = await ask()
        if _served(body)["servedBy"] == "replica":
            return body
        assert time.monotonic() < deadline, body["extensions"]
        await asyncio.sleep(0.05)


async def _caught_up(standby: EmbeddedPostgres, position: str) -> None:
    """Poll until the replica has replayed ``position`` (bounded: fails after 60 s)."""
    deadline = time.monotonic() + 60
    while await _replay(standby.dsn) < parse_lsn(position):
        assert time.monotonic() < deadline, "the replica never replayed the write"
        await asyncio.sleep(0.02)


Body = dict[str, Any]
"""A GraphQL response's JSON body (the tests assert its shape)."""


class Gateway:
    """An app on the primary (with or without the replica) and a client on it."""

    def __init__(self, client: httpx.AsyncClient, tok: str) -> None:
        self.client = client
        self.tok = tok

    async def post(self, query: str, position: str | None = None, **variables: Any) -> Body:
        headers = {"Authorization": f"Bearer {self.tok}"}
        if position is not None:
            headers[POSITION] = position
        r = await self.client.post(
            "/graphql", json={"query": query, "variables": variables}, headers=headers
        )
        assert r.status_code == 200, r.text
        body: Body = r.json()
        assert "errors" not in body, body
        return body

    async def remember(self, suffix: str) -> str:
        body = await self.post(REMEMBER, input=incident_memory(suffix=suffix))
        position: str = body["extensions"]["consistency"]["position"]
        return position

    async def recall(self, position: str | None = None, **variables: Any) -> Body:
        return await self.post(RECALL, position, q="nightly export job warehouse", **variables)


class MakeGateway(Protocol):
    """The ``gateway_factory`` fixture: a gateway on the primary, with the given
    replicas (default: the standby) and settings."""

    async def __call__(
        self, *, replicas: list[EmbeddedPostgres] | None = None, **settings: Any
    ) -> Gateway: ...


@pytest_asyncio.fixture(loop_scope="session")
async def gateway_factory(
    replicated: Replicated, team_token: tuple[str, str]
) -> AsyncIterator[MakeGateway]:
    stack: list[AbstractAsyncContextManager[Any]] = []

    async def make(*, replicas: list[EmbeddedPostgres] | None = None, **settings: Any) -> Gateway:
        urls = ",".join(s.dsn for s in (replicas if replicas is not None else [replicated.standby]))
        app = app_for(
            replicated.primary.dsn,
            read_database_urls=urls,
            **{"replica_check_interval_ms": 50, **settings},
        )
        life = app.router.lifespan_context(app)
        await life.__aenter__()
        stack.append(life)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
        stack.append(client)
        return Gateway(client, team_token[1])

    try:
        yield make
    finally:
        for item in reversed(stack):
            await item.__aexit__(None, None, None)


def _ids(body: Body) -> list[str]:
    return [r["evidenceId"] for r in body["data"]["recallMemory"]["results"]]


def _served(body: Body) -> dict[str, Any]:
    reads: list[dict[str, Any]] = body["extensions"]["consistency"]["reads"]
    assert len(reads) == 1, reads
    return reads[0]


async def test_a_read_right_after_a_write_sees_it(
    gateway_factory: MakeGateway, replicated: Replicated
) -> None:
    gw = await gateway_factory(replica_wait_ms=500)
    for _ in range(4):
        suffix = unique("-w")
        position = await gw.remember(suffix)
        parse_lsn(position)  # a well-formed position
        # with the position the write answered, and without any: both see it
        seen = await gw.recall(position)
        assert f"ev-export{suffix}" in _ids(seen)
        assert _served(seen)["servedBy"] in ("replica", "primary")
        fresh = await gw.recall()
        assert f"ev-export{suffix}" in _ids(fresh)
    # once the replica has replayed the write, the read is the replica's
    await _caught_up(replicated.standby, position)
    again = await _until_replica(lambda: gw.recall(position))
    assert f"ev-export{suffix}" in _ids(again)
    # the recall event of a replica-served recall was written to the primary:
    # feedback on it is accepted
    event = again["data"]["recallMemory"]["recallEventId"]
    fields = {"feedbackId": unique("fb"), "recallEventId": event, "used": True}
    sent = await gw.post(SUBMIT, input=fields)
    assert sent["data"]["submitRecallSessionFeedback"]["created"] is True
    # trace reads from the replica too
    traced = await _until_replica(lambda: gw.post(TRACE, position, id=f"rel-export{suffix}"))
    assert traced["data"]["traceMemory"]["relationship"]["id"] == f"rel-export{suffix}"


async def test_a_known_at_view_is_identical_on_primary_and_replica(
    gateway_factory: MakeGateway, replicated: Replicated
) -> None:
    # settle: a knownAt instant 1 s old has settled (request deadline 1 s)
    gw = await gateway_factory(request_timeout_ms=1000, replica_wait_ms=500)
    primary_only = await gateway_factory(replicas=[])
    before = unique("-k")
    await gw.remember(before)
    known_at = datetime.now(UTC)
    await asyncio.sleep(0.05)
    position = await gw.remember(unique("-k"))  # after the instant: not in its view
    await _caught_up(replicated.standby, position)
    await asyncio.sleep(1.3)  # let the instant settle (request deadline: 1 s)
    stamp = known_at.isoformat()
    on_replica = await _until_replica(lambda: gw.recall(knownAt=stamp))
    on_primary = await primary_only.recall(knownAt=stamp)
    assert "consistency" not in on_primary.get("extensions", {})

    def view(body: Body) -> dict[str, Any]:
        answer = dict(body["data"]["recallMemory"])
        answer.pop("recallEventId")
        return answer

    assert view(on_replica) == view(on_primary)
    assert f"ev-export{before}" in _ids(on_replica)


async def test_a_paused_replica_is_bypassed_then_leaves_and_rejoins_the_rotation(
    gateway_factory: MakeGateway, replicated: Replicated
) -> None:
    gw = await gateway_factory(replica_max_lag_ms=300)
    standby = await asyncpg.connect(replicated.standby.dsn)
    try:
        await standby.execute("SELECT pg_wal_replay_pause()")
        suffix = unique("-p")
        position = await gw.remember(suffix)
        seen = await gw.recall(position)
        assert f"ev-export{suffix}" in _ids(seen)
        served = _served(seen)
        assert served["servedBy"] == "primary"
        # behind (waited, then the primary), out of rotation already, or (a loaded
        # machine) no replica connection free within the wait: the primary, each time
        assert served["reason"] in (
            "replica_behind",
            "no_replica_in_rotation",
            "replica_busy",
        ), served
        # past the lag bound it is out of rotation: reads go to the primary at once
        deadline = time.monotonic() + 60
        while _served(await gw.recall())["reason"] != "no_replica_in_rotation":
            assert time.monotonic() < deadline, "the paused replica stayed in rotation"
            await asyncio.sleep(0.05)
        await standby.execute("SELECT pg_wal_replay_resume()")
        while _served(await gw.recall(position))["servedBy"] != "replica":
            assert time.monotonic() < deadline, "the replica did not come back"
            await asyncio.sleep(0.05)
    finally:
        await standby.execute("SELECT pg_wal_replay_resume()")
        await standby.close()


async def test_a_replica_stopped_mid_run_fails_no_request(
    gateway_factory: MakeGateway, replicated: Replicated
) -> None:
    second = replicated.primary.start_standby(replicated.root / unique("standby"))
    try:
        gw = await gateway_factory(replicas=[second])
        await _until_replica(gw.recall)  # in rotation and serving
        results: list[Any] = []
        enough = asyncio.Event()

        async def ask(n: int) -> None:
            for _ in range(n):
                results.append(await gw.recall())
                if len(results) >= 6:
                    enough.set()

        load = asyncio.gather(*(ask(15) for _ in range(3)))
        await enough.wait()
        await asyncio.to_thread(second.stop)
        await load  # every request answered without an error (Gateway.post checks)
        assert len(results) == 45
        assert _served(await gw.recall())["servedBy"] == "primary"
        # back up: the monitor puts it in rotation again
        await asyncio.to_thread(second.start)
        deadline = time.monotonic() + 60
        while _served(await gw.recall())["servedBy"] != "replica":
            assert time.monotonic() < deadline, "the restarted replica did not come back"
            await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(second.stop)


async def test_an_older_position_reads_the_replica_and_an_unsettled_instant_the_primary(
    gateway_factory: MakeGateway, replicated: Replicated
) -> None:
    """Where a read ran, shown by what it returns: with replay paused, a current view
    with an older position is the replica's (it lacks the newer write; a router
    that read the primary would include it), while ``knownAt: now`` with the same
    older position must include the newer write (the primary's position now is
    required, not the header alone)."""
    # the paused replica stays in rotation for the whole test
    gw = await gateway_factory(replica_max_lag_ms=600_000, replica_wait_ms=20)
    old = unique("-o")
    older = await gw.remember(old)
    await _caught_up(replicated.standby, older)
    standby = await asyncpg.connect(replicated.standby.dsn)
    try:
        await standby.execute("SELECT pg_wal_replay_pause()")
        new = unique("-n")
        newer = await gw.remember(new)
        assert parse_lsn(newer) > parse_lsn(older)
        current = await _until_replica(lambda: gw.recall(older))
        assert f"ev-export{old}" in _ids(current)
        assert f"ev-export{new}" not in _ids(current)  # it ran on the paused replica
        assert _served(current)["requiredPosition"] == older
        # knownAt an instant after the newer write, not settled (deadline 30 s)
        stamp = datetime.now(UTC).isoformat()
        known = await gw.recall(older, knownAt=stamp)
        assert f"ev-export{new}" in _ids(known)
        served = _served(known)
        assert served["servedBy"] == "primary", served  # the replica cannot have it
        assert parse_lsn(served["requiredPosition"]) >= parse_lsn(newer)
    finally:
        await standby.execute("SELECT pg_wal_replay_resume()")
        await standby.close()


async def test_settled_instants_are_judged_by_the_database_clock(
    replicated: Replicated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """knownAt instants are the database's times (recordedAt is its now()): a gateway
    clock an hour ahead must not make a just-passed instant look settled."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    primary = await Database.open(replicated.primary.dsn, max_size=2)
    router = await ReadRouter.open(
        primary, [replicated.standby.dsn], max_size=1, interval_s=0.05, settle_s=0.5
    )
    try:
        conn = await asyncpg.connect(replicated.primary.dsn)
        try:
            db_now: datetime = await conn.fetchval("SELECT clock_timestamp()")
            await router.check()
            after: datetime = await conn.fetchval("SELECT clock_timestamp()")
        finally:
            await conn.close()
        sample = router._samples[-1]
        assert db_now.timestamp() <= sample.at <= after.timestamp()
        # the instant is 0.5 s from settling by the database's clock
        assert router._settled_position(after) is None
        # once it has (by the database's clock), its position is a sample's
        deadline = time.monotonic() + 60
        while router._settled_position(after) is None:
            assert time.monotonic() < deadline, "the instant never settled"
            await asyncio.sleep(0.05)
        settled = router._settled_position(after)
        assert settled is not None and settled >= sample.position
    finally:
        await router.close()
        await primary.close()


async def test_overlapping_checks_look_at_a_replica_one_at_a_time(replicated: Replicated) -> None:
    """The monitor and a caller's check() may overlap (so did this file's settled-instant
    test with its router's monitor): every look completes on the one probe, and a
    healthy replica never leaves the rotation for it."""
    primary = await Database.open(replicated.primary.dsn, max_size=2)
    router = await ReadRouter.open(primary, [replicated.standby.dsn], max_size=1, interval_s=0.01)
    try:
        replica = router.replicas[0]
        for _ in range(20):
            await asyncio.gather(*(router.check() for _ in range(4)))
            assert replica.in_rotation, replica.state
        assert replica.probe is not None and not replica.probe.is_closed()
    finally:
        await router.close()
        await primary.close()


class HeldProxy:
    """A loopback TCP proxy in front of a server's unix socket that holds every
    connection (reads nothing, forwards nothing) until ``released`` is set, then
    pipes both ways: a probe "still connecting" to the real server for as long as
    a test wants (not a database double: the server answers everything)."""

    def __init__(self, server: EmbeddedPostgres) -> None:
        self.socket = str(server.socket_dir / f".s.PGSQL.{server.port}")
        self.accepted = asyncio.Event()
        self.released = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.port = 0
        self.connections = 0

    async def start(self) -> None:
        # port 0: the OS's pick, as this suite's other loopback servers
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.accepted.set()
        await self.released.wait()
        try:
            server_r, server_w = await asyncio.open_unix_connection(self.socket)
        except OSError:  # the server is gone (a failing run): the client sees its end
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either end closes, then close the other (a terminated client's
    backend then sees the end of its connection and exits)."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@dataclass
class HeldProbe:
    """A router whose one replica's probe goes through a :class:`HeldProxy`, and a
    connection of the test's own to the replica to count the probe's backends."""

    router: ReadRouter
    proxy: HeldProxy
    watcher: asyncpg.Connection
    name: str  # the probe's application_name

    async def gone(self) -> bool:
        """No backend of the probe's connections on the replica."""
        count = await self.watcher.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", self.name
        )
        return int(count) == 0


@asynccontextmanager
async def held_probe(
    replicated: Replicated, monkeypatch: pytest.MonkeyPatch, **router: Any
) -> AsyncIterator[HeldProbe]:
    """A :class:`HeldProbe` (no monitor started: the test starts what looks), closed
    afterwards with the proxy released."""
    # the probe's own bound, out of the way of the hold (60 s, not 1 s)
    monkeypatch.setattr(replicas, "_PROBE_TIMEOUT_S", 60.0)
    name = unique("probe")
    proxy = HeldProxy(replicated.standby)
    await proxy.start()
    url = (
        f"postgresql://postgres@127.0.0.1:{proxy.port}/{replicated.standby.database}"
        f"?application_name={name}&sslmode=disable"
    )
    # The way in works (the hold is the only thing that can stop a probe): through
    # the proxy, released, a connection reaches the replica by that name.
    proxy.released.set()
    direct = await asyncpg.connect(url)
    try:
        assert await direct.fetchval("SELECT current_setting('application_name')") == name
    finally:
        await direct.close()
    proxy.released.clear()
    proxy.accepted.clear()
    primary = await Database.open(replicated.primary.dsn, max_size=2)
    pool = await Database.open(replicated.standby.dsn, min_size=0, max_size=1)
    held = ReadRouter(primary, [replicas.Replica("replica-1", url, pool)], **router)
    watcher = await asyncpg.connect(replicated.standby.dsn)
    try:
        yield HeldProbe(held, proxy, watcher, name)
    finally:
        proxy.released.set()
        await held.close()
        await watcher.close()
        await primary.close()
        await proxy.close()


async def test_close_leaves_no_probe_a_check_was_still_opening(
    replicated: Replicated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's check() still connecting the probe when the router closes: close()
    returns without waiting for it, the connection it gets is closed at once (none
    stays open on the replica), and a check after close() opens none."""
    async with held_probe(replicated, monkeypatch) as held:
        router, proxy, replica = held.router, held.proxy, held.router.replicas[0]
        checking = asyncio.create_task(router.check())
        await until(proxy.accepted.is_set, "the probe reached the proxy")
        await asyncio.wait_for(router.close(), 20)  # returns with the probe held
        assert not checking.done()
        proxy.released.set()
        await asyncio.wait_for(checking, 20)
        await until(held.gone, "the probe connected after close() was closed")
        assert replica.probe is None
        assert (replica.in_rotation, replica.state) == (False, "closed")
        connections = proxy.connections
        await router.check()  # after close(): no probe opened, not even for a moment
        assert proxy.connections == connections
        assert replica.probe is None and replica.state == "closed"


async def test_close_while_the_look_lock_is_held_does_not_wait(replicated: Replicated) -> None:
    """close() called while the replica's look lock is held (here by the test's own
    task, as a look that called it would hold it) returns: it does not wait for that
    lock. The replica is out of rotation at once, its probe closed, and no later
    check opens one."""
    primary = await Database.open(replicated.primary.dsn, max_size=2)
    router = await ReadRouter.open(primary, [replicated.standby.dsn], max_size=1)
    replica = router.replicas[0]
    try:
        probe = replica.probe
        assert probe is not None and not probe.is_closed()  # open() looked once
        assert replica.in_rotation, replica.state
        async with replica._looking:  # as a look in this task holds it
            await asyncio.wait_for(router.close(), 20)
        assert (replica.in_rotation, replica.state) == (False, "closed")
        assert probe.is_closed() and replica.probe is None
        await router.check()
        assert replica.probe is None and replica.state == "closed"
    finally:
        await router.close()
        await primary.close()


async def test_a_look_answered_as_the_router_closes_leaves_it_out_of_rotation(
    replicated: Replicated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() may run after a look's row arrived and before the look resumes (both
    are ready callbacks of one loop): the replica, in rotation until then, stays out
    of it. Here close() runs as the real answer is read."""
    primary = await Database.open(replicated.primary.dsn, max_size=2)
    router = await ReadRouter.open(primary, [replicated.standby.dsn], max_size=1)
    replica = router.replicas[0]
    try:
        assert replica.in_rotation, replica.state
        if router._monitor is not None:  # only the check below looks
            router._monitor.cancel()
        read = replicas._state

        def closing(row: object) -> tuple[bool, str | None]:
            replica.close_probe()
            return read(row)

        monkeypatch.setattr(replicas, "_state", closing)
        await router.check()
        assert (replica.in_rotation, replica.state) == (False, "closed")
    finally:
        await router.close()
        await primary.close()


async def test_close_during_the_monitors_connect_leaves_no_probe(
    replicated: Replicated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shutdown path: the monitor's own look is still connecting (held by the
    proxy) when close() cancels it. close() returns, and once the connection is let
    through no probe stays on the replica."""
    async with held_probe(replicated, monkeypatch, interval_s=0.01) as held:
        router = held.router
        router._monitor = asyncio.create_task(router._watch())  # as open() starts it
        await until(held.proxy.accepted.is_set, "the monitor's probe reached the proxy")
        await asyncio.wait_for(router.close(), 20)
        held.proxy.released.set()
        await asyncio.sleep(0.5)  # time for a connection let through to show up
        await until(held.gone, "a probe stayed on the replica after close()")
        assert router.replicas[0].probe is None


async def test_commits_are_flushed_before_they_return_when_replicas_are_set(
    replicated: Replicated,
) -> None:
    """Positions are the primary's flush position: a database default of
    ``synchronous_commit = off`` (a COMMIT returning before its record is flushed)
    is turned back to ``local`` on the gateway's connections; others are kept."""
    assert await commit_settings(replicated.primary.dsn) == {}
    conn = await asyncpg.connect(replicated.primary.dsn)
    try:
        await conn.execute("ALTER DATABASE recall SET synchronous_commit = off")
        settings = await commit_settings(replicated.primary.dsn)
        assert settings == {"synchronous_commit": "local"}
        db = await Database.open(replicated.primary.dsn, max_size=1, settings=settings)
        try:
            for _ in range(2):  # kept after the pool resets the connection
                async with db.pool.acquire() as pooled:
                    assert await pooled.fetchval("SHOW synchronous_commit") == "local"
        finally:
            await db.close()
    finally:
        await conn.execute("ALTER DATABASE recall RESET synchronous_commit")
        await conn.close()


def _server_pids(server: EmbeddedPostgres) -> list[int]:
    """The server's postmaster and every process it started (its backends)."""
    postmaster = int((server.pgdata / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(entry.name))
    return [*children, postmaster]


async def test_a_replica_that_stops_answering_fails_no_request(
    gateway_factory: MakeGateway, replicated: Replicated
) -> None:
    """A replica that hangs without dropping its connections (every process of it
    stopped, as a paused VM): the read gives up on it within a share of the
    request's deadline and runs on the primary."""
    second = replicated.primary.start_standby(replicated.root / unique("standby"))
    stopped: list[int] = []
    try:
        # no monitor sample after the first: the read itself must find out
        gw = await gateway_factory(
            replicas=[second], replica_check_interval_ms=60_000, request_timeout_ms=6000
        )
        replayed = format_lsn(await _replay(second.dsn))
        await _until_replica(lambda: gw.recall(replayed))
        for pid in _server_pids(second):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        body = await gw.recall(replayed)  # no error (Gateway.post checks)
        served = _served(body)
        assert served["servedBy"] == "primary", served
        assert served["reason"] == "replica_timeout", served
        # out of rotation now: the next read goes to the primary at once
        assert _served(await gw.recall(replayed))["reason"] == "no_replica_in_rotation"
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        await asyncio.to_thread(second.stop)


async def test_a_malformed_position_is_refused(gateway_factory: MakeGateway) -> None:
    gw = await gateway_factory()
    r = await gw.client.post(
        "/graphql",
        json={"query": RECALL, "variables": {"q": "x"}},
        headers={"Authorization": f"Bearer {gw.tok}", POSITION: "not-a-position"},
    )
    assert r.status_code == 400
    assert r.json()["errors"][0]["extensions"]["code"] == "INVALID_READ_POSITION"


async def test_without_replicas_nothing_changes(gateway_factory: MakeGateway) -> None:
    gw = await gateway_factory(replicas=[])
    body = await gw.recall()
    assert "consistency" not in (body.get("extensions") or {})
    # a position header is accepted (checked) and ignored
    assert "errors" not in await gw.recall("0/0")


async def test_positions_parse_and_print_like_postgresql() -> None:
    for text in ("0/0", "0/1A2B3C4D", "16/B374D848", "FFFFFFFF/FFFFFFFF"):
        assert format_lsn(parse_lsn(text)) == text
    assert parse_lsn("1/0") > parse_lsn("0/FFFFFFFF")
    for bad in ("", "12", "0/", "/1", "0/1/2", "G/1", "123456789/0", "0/-1"):
        with pytest.raises(InvalidPosition):
            parse_lsn(bad)
