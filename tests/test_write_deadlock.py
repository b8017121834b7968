"""Writers of several spaces never deadlock on the per-space counters (db/0160).

Every write of evidence, relationships or graph changes adds to per-space
counter rows (``evidence_search_stats``, ``relationship_search_stats``,
``graph_change_counters`` and the lexeme statistics), and holds those rows
until it commits. Before db/0160 the row a transaction wrote was picked by its
server process (``pg_backend_pid() % 8``): two transactions on connections of
one shard that wrote two spaces in opposite orders waited on each other, and
PostgreSQL cancelled one (40P01), which a ``remember`` reported as
DATABASE_UNAVAILABLE. Now each transaction claims a shard no other transaction
holds, so two writers never touch the same counter row.

The interleavings are made deterministic: connections of one old shard are
found by opening connections until two processes' IDs agree modulo 8, and each
step waits for the other side to be blocked (or not) before going on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx

from gateway.services.writes import WriteService
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_mutations import remember
from .test_recall import token

OLD_SHARDS = 8


@contextlib.asynccontextmanager
async def _connections_of_one_shard(
    dsn: str, pid: int | None = None, count: int = 2
) -> AsyncIterator[list[asyncpg.Connection]]:
    """``count`` owner connections whose server processes had the same counter shard
    before db/0160 (``pid % 8``; that of ``pid`` when given). Connections are
    opened until enough agree (nine suffice for a pair), the others closed."""
    found: dict[int, list[asyncpg.Connection]] = {}
    spare: list[asyncpg.Connection] = []
    chosen: list[asyncpg.Connection] = []
    try:
        for _ in range(400):
            conn = await asyncpg.connect(dsn)
            shard = conn.get_server_pid() % OLD_SHARDS
            if pid is not None and shard != pid % OLD_SHARDS:
                spare.append(conn)
                continue
            found.setdefault(shard, []).append(conn)
            if len(found[shard]) == count:
                chosen = found.pop(shard)
                break
        assert chosen, "no connections of one shard"
        for conns in found.values():
            spare += conns
        for conn in spare:
            await conn.close()
        spare.clear()
        yield chosen
    finally:
        for conn in chosen + spare + [c for cs in found.values() for c in cs]:
            await conn.close()


async def _waiting(observer: Conn, pid: int) -> bool:
    """Whether the server process ``pid`` is waiting for a lock."""
    return bool(await observer.fetchval("SELECT cardinality(pg_blocking_pids($1)) > 0", pid))


async def _until_waiting(observer: Conn, pid: int, task: asyncio.Task[Any]) -> None:
    """Until ``pid`` waits for a lock (or ``task``, its statement, has ended)."""
    for _ in range(500):
        if task.done() or await _waiting(observer, pid):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"process {pid} never waited")


async def _spaces(conn: Conn, team: str) -> dict[str | None, tuple[Any, int]]:
    """Each space of ``team`` (by owner; None: shared) with its generation."""
    rows = await conn.fetch(
        "SELECT s.owner_principal_id AS owner, s.id, "
        "(SELECT max(g.generation) FROM space_generations g "
        " WHERE g.team_id = s.team_id AND g.space_id = s.id) AS generation "
        "FROM memory_spaces s WHERE s.team_id = $1",
        team,
    )
    return {r["owner"]: (r["id"], r["generation"]) for r in rows}


async def _insert_evidence(conn: Conn, team: str, source: str, evidence_id: str) -> None:
    """One evidence of ``source``'s space, as the owner writes it (its triggers:
    postings, the space's counters)."""
    await conn.execute(
        "INSERT INTO evidence (team_id, id, space_id, generation, source_id, content, "
        "content_sha256, recorded_by) "
        "SELECT s.team_id, $3, s.space_id, s.generation, s.id, $4, sha256(convert_to($4, 'UTF8')), "
        "'operator' FROM sources s WHERE s.team_id = $1 AND s.id = $2",
        team,
        source,
        evidence_id,
        f"Deadlock probe {evidence_id}: the export job retries the ingest cluster.",
    )


async def _counts_are_exact(conn: Conn, team: str) -> None:
    """The evidence counters of ``team``'s spaces sum to the evidence stored."""
    rows = await conn.fetch(
        "SELECT e.space_id, count(*) AS n, "
        "(SELECT sum(x.doc_count) FROM evidence_search_stats x "
        " WHERE x.team_id = e.team_id AND x.space_id = e.space_id) AS kept "
        "FROM evidence e WHERE e.team_id = $1 GROUP BY e.team_id, e.space_id",
        team,
    )
    assert rows and all(r["n"] == r["kept"] for r in rows), [dict(r) for r in rows]


async def test_two_writers_of_two_spaces_in_opposite_orders_both_commit(
    dsn: str, writes: WriteService
) -> None:
    """Two owner transactions on connections of one old shard: A writes evidence
    into the shared space, B into a private one, then A into the private one
    (it would wait for B's counter row) and B into the shared one (and B for
    A's): a cycle, one of them cancelled with 40P01, before db/0160. Now
    neither waits for the other, both commit, and the counters stay exact."""
    team = unique("dl-raw")
    await load_jsonl(writes, jsonl(team_records(team)))
    async with _connections_of_one_shard(dsn, count=3) as (a, b, observer):
        ta, tb = a.transaction(), b.transaction()
        await ta.start()
        await tb.start()
        try:
            await _insert_evidence(a, team, "src-handbook", "dl-a1")
            await _insert_evidence(b, team, "src-notes", "dl-b1")
            step_a = asyncio.create_task(_insert_evidence(a, team, "src-notes", "dl-a2"))
            await _until_waiting(observer, a.get_server_pid(), step_a)
            step_b = asyncio.create_task(_insert_evidence(b, team, "src-handbook", "dl-b2"))
            outcomes = await asyncio.gather(step_a, step_b, return_exceptions=True)
            assert list(outcomes) == [None, None], outcomes
            await ta.commit()
            await tb.commit()
        except BaseException:
            for tx in (ta, tb):
                with contextlib.suppress(Exception):
                    await tx.rollback()
            raise
        await _counts_are_exact(observer, team)
        assert (
            await observer.fetchval(
                "SELECT count(*) FROM evidence WHERE team_id = $1 AND id LIKE 'dl-%'", team
            )
            == 4
        )


async def test_remember_of_two_spaces_against_another_writer_commits(
    dsn: str, writes: WriteService
) -> None:
    """What a user got: alice's ``remember`` writes evidence into the shared space
    (a source there) and a relationship into her private space, while an owner
    transaction on a connection of the same old shard has written a graph change
    into her private space and then writes evidence into the shared space. Before
    db/0160 the two waited on each other, PostgreSQL cancelled alice's (the first
    to wait) and she got DATABASE_UNAVAILABLE. Now both commit."""
    team = unique("dl-api")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    app = app_for(dsn, pool_min_size=1, pool_max_size=1)
    async with app.router.lifespan_context(app):
        db: Database = app.state.services.db
        async with db.acquire() as conn:
            pid = conn.get_server_pid()
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://gateway") as client,
            _connections_of_one_shard(dsn, pid=pid, count=1) as (owner,),
        ):
            observer = await asyncpg.connect(dsn)
            try:
                spaces = await _spaces(observer, team)
                private = spaces["alice"][0]
                tx = owner.transaction()
                await tx.start()
                try:
                    # a graph change in alice's private space: its counter row is held
                    await owner.execute(
                        "INSERT INTO source_lifecycle_events (team_id, space_id, source_id, "
                        "status, reason, recorded_by) VALUES ($1, $2, 'src-notes', 'active', "
                        "'probe', 'operator')",
                        team,
                        private,
                    )
                    call = asyncio.create_task(
                        remember(
                            client,
                            tok,
                            {
                                "space": "PRIVATE",
                                "sourceId": "src-handbook",
                                "evidence": [
                                    {"id": "dl-ev", "content": "The export job runs nightly."}
                                ],
                                "relationships": [
                                    {
                                        "id": "dl-rel",
                                        "subject": "p-billing",
                                        "predicate": "runs",
                                        "objectValue": "nightly",
                                    }
                                ],
                            },
                        )
                    )
                    await _until_waiting(observer, pid, call)
                    step = asyncio.create_task(
                        _insert_evidence(owner, team, "src-handbook", "dl-owner")
                    )
                    body = await call
                    await step
                    await tx.commit()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await tx.rollback()
                    raise
                assert "errors" not in body, body
                await _counts_are_exact(observer, team)
            finally:
                await observer.close()


SHARD_LOCK = 1936220530
"""First key of the counter shards' advisory locks (db/0160)."""


async def test_a_transaction_keeps_its_shard_and_another_gets_another(
    dsn: str, writes: WriteService
) -> None:
    """The shard is claimed at a transaction's first counter write, kept for its
    later statements, and not given to a transaction in flight at the same time,
    even on a connection of the same old shard."""
    team = unique("dl-claim")
    await load_jsonl(writes, jsonl(team_records(team)))
    async with _connections_of_one_shard(dsn) as (a, b):
        shard = "SELECT current_setting('recall.stats_shard', true)"
        async with a.transaction():
            await _insert_evidence(a, team, "src-handbook", "cl-a1")
            mine = await a.fetchval(shard)
            await _insert_evidence(a, team, "src-notes", "cl-a2")
            assert await a.fetchval(shard) == mine
            async with b.transaction():
                # B must not wait for A (before db/0160 it waited for A's row, and
                # A, waiting for B here, never committed): bounded, not a hang.
                await asyncio.wait_for(_insert_evidence(b, team, "src-handbook", "cl-b1"), 3)
                other = await b.fetchval(shard)
            kept = await a.fetch(
                "SELECT space_id, shard FROM evidence_search_stats WHERE team_id = $1 "
                "AND shard = $2",
                team,
                int(mine),
            )
        assert mine is not None and other is not None and mine != other
        assert len(kept) == 2  # both of A's spaces, in its one shard
        await _counts_are_exact(a, team)


async def _shard_waiter(observer: Conn) -> int | None:
    """The server process of this database waiting to claim a counter shard, if one is."""
    pid: int | None = await observer.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND state = 'active' AND query LIKE '%recall_stats_shard()%' AND pid <> pg_backend_pid() "
        "LIMIT 1"
    )
    return pid


async def test_with_every_shard_held_a_write_waits_first_then_takes_the_first_freed(
    dsn: str, writes: WriteService
) -> None:
    """When other sessions hold all 32 shards, a principal's write waits for one at
    its very start, holding no row of its own yet (so nothing can wait for it in
    turn), and takes the first shard freed, whichever it is (not only the shard
    of its own process); if none frees within the statement timeout it fails with
    DATABASE_UNAVAILABLE and writes nothing."""
    team = unique("dl-full")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")

    async def note(client: httpx.AsyncClient, suffix: str) -> dict[str, Any]:
        return await remember(
            client,
            tok,
            {
                "sourceId": "src-handbook",
                "evidence": [{"id": f"full-{suffix}", "content": "Shards are all taken."}],
            },
        )

    holder = await asyncpg.connect(dsn)
    observer = await asyncpg.connect(dsn)
    try:
        for timeout_ms, frees in ((5000, True), (400, False)):
            app = app_for(dsn, statement_timeout_ms=timeout_ms)
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://gateway"
                ) as client,
            ):
                # session locks: released one at a time, or all when the session ends
                await holder.execute(
                    "SELECT pg_advisory_lock($1, k) FROM generate_series(0, 31) k", SHARD_LOCK
                )
                try:
                    call = asyncio.create_task(note(client, str(timeout_ms)))
                    waiter = None
                    for _ in range(300):
                        waiter = await _shard_waiter(observer)
                        if waiter is not None or call.done():
                            break
                        await asyncio.sleep(0.01)
                    assert waiter is not None, "the write never waited for a shard"
                    if frees:
                        held = await observer.fetchval(
                            "SELECT count(*) FROM pg_locks WHERE pid = $1 "
                            "AND locktype IN ('transactionid', 'tuple')",
                            waiter,
                        )
                        assert held == 0, "the write held rows while it waited"
                        other = (waiter + 1) % 32  # not the shard of its process
                        await holder.execute("SELECT pg_advisory_unlock($1, $2)", SHARD_LOCK, other)
                        body = await asyncio.wait_for(call, 4)
                    else:
                        body = await call
                finally:
                    await holder.execute("SELECT pg_advisory_unlock_all()")
            written = await observer.fetchval(
                "SELECT count(*) FROM evidence WHERE team_id = $1 AND id = $2",
                team,
                f"full-{timeout_ms}",
            )
            if frees:
                assert "errors" not in body, body
                assert written == 1
            else:
                codes = [e["extensions"]["code"] for e in body["errors"]]
                assert codes == ["DATABASE_UNAVAILABLE"], body
                assert written == 0
    finally:
        await holder.close()
        await observer.close()
