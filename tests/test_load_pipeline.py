"""Batches in flight at once (``loader.load(concurrency=2)``) against one at a time.

Each test loads through the pipelined loader on the real PostgreSQL and checks
what the brief of the loader promises whatever the concurrency: the same rows
field by field (``tests/test_load_paths.py``'s comparison, sharded counters
summed), every batch all or nothing, a refusal naming its line with every
earlier batch committed and nothing after it written, a re-run that writes
nothing and says so, and system times that follow the file, one per batch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.errors import DatabaseUnavailable
from gateway.services import bulk_writes, loader, vector_indexes
from gateway.services.writes import Actor, PreviousRefused, Turn, TurnYielded, WriteService
from gateway.store import bulk_writes as bulk_store
from gateway.store import writes as store_writes
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl
from .test_load_paths import _TABLES, _generated, _retarget, _rows

# The sharded counters (one row per writing backend's shard): compared as sums.
_COUNTERS = {
    "evidence_lexeme_stats": "lexeme",
    "relationship_lexeme_stats": "lexeme",
    "graph_change_counters": None,
}


def _documents(team: str, docs: int) -> list[dict[str, Any]]:
    """The benchmark's shape: a source, an entity, the evidence and a relationship
    supported by it per document, in the team's shared space."""
    out: list[dict[str, Any]] = [
        {"kind": "team", "id": team, "name": "Pipeline"},
        {"kind": "principal", "team": team, "id": "reader", "display_name": "Reader"},
    ]
    for i in range(docs):
        out += [
            {
                "kind": "source",
                "team": team,
                "id": f"src-{i}",
                "type": "document",
                "title": f"T{i}",
            },
            {"kind": "entity", "team": team, "id": f"ent-{i}", "name": f"Entity {i}"},
            {
                "kind": "evidence",
                "team": team,
                "id": f"ev-{i}",
                "source": f"src-{i}",
                "content": f"Document {i} reports that kinase {i % 7} binds receptor {i % 5}.",
            },
            {
                "kind": "relationship",
                "team": team,
                "id": f"rel-{i}",
                "subject": f"ent-{i}",
                "predicate": "has_abstract",
                "object_value": f"document {i}",
                "owner": "reader",
                "supports": [{"id": f"sup-{i}", "evidence": f"ev-{i}"}],
            },
        ]
    return out


async def _load(
    writes: WriteService,
    lines: list[dict[str, Any]],
    team: str,
    *,
    concurrency: int,
    batch_size: int = 8,
    index_after: bool = False,
) -> loader.LoadReport:
    records = loader.parse(loader.split_lines(_retarget(lines, team)))
    report = await loader.load(
        writes,
        records,
        batch_size=batch_size,
        actor=Actor.operator(),
        concurrency=concurrency,
        index_after=index_after,
    )
    if report.deferred:
        built = await vector_indexes.build_pending(
            writes.db,
            await vector_indexes.pending(writes.db, report.deferred),
            maintenance_work_mem_mb=64,
            workers=0,
        )
        assert not built.failed
    return report


async def _counters(conn: Conn, team: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for table, key in _COUNTERS.items():
        if key is None:
            rows = await conn.fetch(
                f"SELECT m.kind, sum(c.changes) AS n FROM {table} c "
                "JOIN memory_spaces m ON m.team_id = c.team_id AND m.id = c.space_id "
                "WHERE c.team_id = $1 GROUP BY 1 ORDER BY 1",
                team,
            )
        else:
            rows = await conn.fetch(
                f"SELECT m.kind, c.{key}, sum(c.df) AS df, max(c.max_tf) AS tf FROM {table} c "
                "JOIN memory_spaces m ON m.team_id = c.team_id AND m.id = c.space_id "
                "WHERE c.team_id = $1 GROUP BY 1, 2 ORDER BY 1, 2",
                team,
            )
        out[table] = [tuple(r.values()) for r in rows]
    return out


def _aligned(docs: int) -> list[dict[str, Any]]:
    """``_generated`` with three more entities before the documents, so that with
    batches of 8 each document's four records share a batch."""
    lines = _generated(docs)
    extra = [
        {"kind": "entity", "team": "T", "id": f"extra{i}", "name": f"Extra {i}"} for i in range(3)
    ]
    return lines[:4] + extra + lines[4:]


def _relationships_last(docs: int) -> list[dict[str, Any]]:
    """``_documents`` with each kind together: sources, entities, evidence, then the
    relationships (without supports, so that they name no evidence in flight),
    whose first two batches (the team's first relationship vectors: its
    projection is made then) are in flight together."""
    lines = [
        {**r, "supports": []} if r["kind"] == "relationship" else r for r in _documents("T", docs)
    ]
    return lines[:2] + sorted(
        lines[2:],
        key=lambda r: ["source", "entity", "evidence", "relationship"].index(r["kind"]),
    )


@pytest.mark.parametrize(
    "shape",
    [
        "generated",
        "generated, aligned",
        "documents",
        "documents, index after",
        "relationships last",
    ],
)
async def test_batches_in_flight_write_the_same_rows(
    writes: WriteService, admin_conn: Conn, shape: str
) -> None:
    # "generated" has every record shape of the set-based path and a support at the
    # end; its documents straddle batches of 8, so each batch refers to the one
    # before and none may overlap. "aligned" and "documents" have batches that
    # refer to nothing in flight.
    lines = {
        "generated": _generated(30),
        "generated, aligned": _aligned(30),
        "relationships last": _relationships_last(16),
    }.get(shape, _documents("T", 24))
    index_after = shape.endswith("index after")
    one, two = unique("serial"), unique("pipelined")
    serial = await _load(writes, lines, one, concurrency=1, index_after=index_after)
    piped = await _load(writes, lines, two, concurrency=2, index_after=index_after)
    assert serial.overlapped == 0
    if shape == "generated":
        assert piped.overlapped == 0, "a batch that names one in flight waits for it"
    else:
        assert piped.overlapped > 0, "batches really were in flight together"
    assert piped.created == serial.created
    assert piped.batches == serial.batches
    old_rows, new_rows = await _rows(admin_conn, one), await _rows(admin_conn, two)
    for table in _TABLES:
        assert new_rows[table] == old_rows[table], table
    assert new_rows["evidence_embeddings"], "the comparison saw vectors"
    assert await _counters(admin_conn, two) == await _counters(admin_conn, one)


async def test_system_times_follow_the_file_one_per_batch(
    writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("times")
    lines = _documents("T", 40)
    report = await _load(writes, lines, team, concurrency=2)
    assert report.overlapped > 0
    times = {
        (r["kind"], r["client_id"]): r["recorded_at"]
        for r in await admin_conn.fetch(
            "SELECT kind, client_id, recorded_at FROM write_log WHERE team_id = $1", team
        )
    }
    in_file_order = [times[(r["kind"], team if r["kind"] == "team" else r["id"])] for r in lines]
    assert in_file_order == sorted(in_file_order), "a later line was stamped earlier"
    assert len(set(in_file_order)) == report.batches, "one system time per batch"


async def test_a_refusal_keeps_earlier_batches_and_writes_nothing_after_it(
    writes: WriteService, admin_conn: Conn
) -> None:
    lines = _documents("T", 20)
    # document 9's relationship (batch 5 of 8 records, after the two space
    # records' batch) names an owner that does not exist: the set-based path
    # falls back, and the record-at-a-time path refuses the line.
    bad = 2 + 9 * 4 + 3
    lines[bad] = {**lines[bad], "owner": "nobody"}
    outcomes = []
    for concurrency in (1, 2):
        team = unique("refused")
        with pytest.raises(loader.LoadError) as caught:
            await _load(writes, lines, team, concurrency=concurrency)
        error = caught.value.errors[0]
        written = await admin_conn.fetch(
            "SELECT id FROM evidence WHERE team_id = $1 ORDER BY id", team
        )
        logged = await admin_conn.fetchval(
            "SELECT count(*) FROM write_log WHERE team_id = $1", team
        )
        outcomes.append(
            (
                error.line,
                error.field,
                error.code,
                error.message.replace(team, "T"),
                caught.value.committed,
                str(caught.value).replace(team, "T"),
                [r["id"] for r in written],
                logged,
            )
        )
    assert outcomes[1] == outcomes[0]
    line, field, _code, _message, committed, _text, evidence, logged = outcomes[1]
    assert (line, field) == (bad + 1, "owner")
    # the space batch (2 records) and four batches of two documents: documents 0-7
    assert committed == 2 + 8 * 4 == logged
    assert evidence == sorted(f"ev-{i}" for i in range(8))


async def test_a_pipelined_rerun_writes_nothing_and_says_so(
    writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("rerun")
    lines = _documents("T", 16)
    first = await _load(writes, lines, team, concurrency=2)
    before = await _rows(admin_conn, team)
    second = await _load(writes, lines, team, concurrency=2)
    assert second.overlapped > 0
    assert sum(second.created.values()) == 0
    assert sum(second.unchanged.values()) == sum(first.created.values()) == len(lines)
    assert await _rows(admin_conn, team) == before


async def test_lanes_write_distinct_counter_shards_and_leave_the_pool_room(
    db: Database, dsn: str
) -> None:
    async with bulk_store.writer_lanes(db, 2) as lanes:
        assert len(lanes) == 2
        # each batch's transaction claims its own shard first thing (db/0160),
        # whatever the lanes' server processes: both in flight at once
        async with lanes[0].transaction(), lanes[1].transaction():
            shards = {await store_writes.claim_counter_shard(lane) for lane in lanes}
        assert len(shards) == 2
    small = await Database.open(dsn, min_size=1, max_size=3)
    try:
        # two lanes would leave one connection for the statistics refresh and the
        # next batch's look-ups, which run meanwhile: no lanes, one batch at a time
        async with bulk_store.writer_lanes(small, 2) as lanes:
            assert lanes == []
        async with small.acquire():
            async with small.acquire():
                async with small.acquire():
                    pass  # the pool is whole again
    finally:
        await small.close()


async def test_a_batch_gives_way_to_the_batch_before_it_waiting_for_its_locks(
    writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("yield")
    await _load(writes, _documents("T", 0), team, concurrency=1)
    records = loader.parse(loader.split_lines(_retarget(_documents("T", 2)[2:], team)))
    async with writes.writer_lanes(2) as (before_lane, lane):
        # "the batch before": a transaction on the other lane that will wait for
        # the idempotency claim this batch takes on its first record
        pending: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        turn = Turn(lane, pending, before_lane.get_server_pid())
        batch: asyncio.Task[Any] = asyncio.create_task(  # noqa: RUF006 - awaited below
            writes.apply([r for _, r in records], Actor.operator(), turn=turn)
        )
        await turn.began.wait()
        for _ in range(500):  # until the batch has claimed its IDs and copied its rows
            copied = await admin_conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE pid = $1 "
                "AND relation = 'relationships'::regclass",
                lane.get_server_pid(),
            )
            if copied:
                break
            await asyncio.sleep(0.02)
        tx = before_lane.transaction()
        await tx.start()
        try:
            claim = asyncio.create_task(
                before_lane.execute(
                    "INSERT INTO write_log (team_id, kind, client_id, payload_sha256, "
                    "recorded_by) VALUES ($1, 'source', 'src-0', sha256('x'), 'test') "
                    "ON CONFLICT DO NOTHING",
                    team,
                )
            )
            with pytest.raises(TurnYielded):
                await asyncio.wait_for(batch, timeout=30)
            await asyncio.wait_for(claim, timeout=30)  # no longer blocked
        finally:
            await tx.rollback()
    written = await admin_conn.fetchval(
        "SELECT count(*) FROM write_log WHERE team_id = $1 AND kind <> 'team' "
        "AND kind <> 'principal'",
        team,
    )
    assert written == 0, "the batch that gave way wrote nothing"


async def test_a_batch_after_a_refused_one_is_rolled_back(
    writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("after")
    await _load(writes, _documents("T", 0), team, concurrency=1)
    records = loader.parse(loader.split_lines(_retarget(_documents("T", 2)[2:], team)))
    async with writes.writer_lanes(2) as (before_lane, lane):
        refused: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        refused.set_result(False)
        with pytest.raises(PreviousRefused):
            await writes.apply(
                [r for _, r in records],
                Actor.operator(),
                turn=Turn(lane, refused, before_lane.get_server_pid()),
            )
    assert await admin_conn.fetchval("SELECT count(*) FROM evidence WHERE team_id = $1", team) == 0


async def test_a_file_changed_while_batches_are_in_flight_keeps_what_came_before(
    writes: WriteService, admin_conn: Conn
) -> None:
    bad = 2 + 14 * 4  # document 14's source: the first line of the 8th batch of 8 records
    outcomes = []
    for concurrency in (1, 2):
        team = unique("changed")
        lines = loader.split_lines(_retarget(_documents("T", 20), team))
        loader.check(lines)
        changed = [*lines[:bad], '{"kind": "source"}', *lines[bad + 1 :]]
        with pytest.raises(loader.LoadError) as caught:
            await loader.load(
                writes,
                loader.stream(changed),
                batch_size=8,
                actor=Actor.operator(),
                concurrency=concurrency,
            )
        assert "changed while it was loaded" in caught.value.message
        written = await admin_conn.fetch(
            "SELECT id FROM evidence WHERE team_id = $1 ORDER BY id", team
        )
        outcomes.append((caught.value.errors[0].line, [r["id"] for r in written]))
    assert outcomes[1] == outcomes[0]
    # the stream stops while it reads the batch before the changed line's (a batch
    # ends when the next record is read): documents 0-11 are written, in flight or not
    assert outcomes[1] == (bad + 1, sorted(f"ev-{i}" for i in range(12)))


async def _inversions(conn: Conn, lines: list[dict[str, Any]], team: str) -> list[tuple[int, str]]:
    """(index, ID) of each line stamped earlier than the line before it."""
    times = {
        (r["kind"], r["client_id"]): r["recorded_at"]
        for r in await conn.fetch(
            "SELECT kind, client_id, recorded_at FROM write_log WHERE team_id = $1", team
        )
    }
    order = [times[(r["kind"], team if r["kind"] == "team" else r["id"])] for r in lines]
    return [(i, lines[i]["id"]) for i in range(1, len(order)) if order[i] < order[i - 1]]


async def test_a_batch_applied_record_by_record_keeps_its_place_in_system_time(
    writes: WriteService, admin_conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch holding the same record twice (accepted) cannot take the set-based
    path: it is applied again record by record, in a second transaction. The
    batch after it must not keep an earlier system time. The second transaction
    is made to begin after the next batch's (as happens on a busy machine) by
    holding the fallback until that batch's transaction has begun."""
    team = unique("fallback")
    lines = _documents("T", 40)
    for k in range(2, 20, 2):  # every other batch of 8 (documents 2k and 2k+1)
        first, second = 2 + 2 * k * 4, 2 + (2 * k + 1) * 4
        lines[second + 1] = dict(lines[first + 1])  # one entity record twice
        lines[second + 3] = {**lines[second + 3], "subject": lines[first + 1]["id"]}

    turns: list[Turn] = []

    class _Noted(Turn):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            turns.append(self)

    original = bulk_writes.apply_run

    async def held_fallback(conn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await original(conn, *args, **kwargs)
        except bulk_writes.Fallback:
            mine = max(i for i, t in enumerate(turns) if t.lane is conn)
            for _ in range(100):  # the next batch, on the other lane, has begun
                following = [t for t in turns[mine + 1 :] if t.lane is not conn]
                if following and following[0].began.is_set():
                    break
                await asyncio.sleep(0.02)
            raise

    monkeypatch.setattr(loader, "Turn", _Noted)
    monkeypatch.setattr(bulk_writes, "apply_run", held_fallback)
    report = await _load(writes, lines, team, concurrency=2)
    assert report.overlapped > 0
    assert not await _inversions(admin_conn, lines, team), "a later line was stamped earlier"


async def test_three_lanes_keep_system_times_in_file_order_after_a_batch_gives_way(
    embedder: EmbeddingProvider, admin_conn: Conn, dsn: str
) -> None:
    """Three batches in flight: another session holds the claim of the first record
    of the load's second batch, so the third gives way, and is applied again
    after the fourth has begun; the fourth must give way too. (A pool of its own,
    roomy and fresh, so that three lanes are found beside the connections
    :data:`gateway.store.bulk_writes.LANE_KEEP_FREE` keeps: the session's pool
    may hold too few.)"""
    db = await Database.open(dsn, min_size=1, max_size=16)
    try:
        await _three_lanes(WriteService(db, embedder), admin_conn, dsn)
    finally:
        await db.close()


async def _three_lanes(writes: WriteService, admin_conn: Conn, dsn: str) -> None:
    team = unique("three")
    lines = _documents("T", 60)
    await _load(writes, lines[:2], team, concurrency=1)
    rest = lines[2:]
    blocked = rest[8]  # the first batch runs alone; this opens the second
    blocker = await asyncpg.connect(dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(
            "INSERT INTO write_log (team_id, kind, client_id, payload_sha256, recorded_by) "
            "VALUES ($1, $2, $3, sha256('x'), 'test')",
            team,
            blocked["kind"],
            blocked["id"],
        )

        async def release() -> None:
            await asyncio.sleep(2.0)
            await tx.rollback()

        released = asyncio.create_task(release())
        report = await _load(writes, rest, team, concurrency=3)
        await released
    finally:
        await blocker.close()
    assert report.lanes == 3
    assert not await _inversions(admin_conn, rest, team), "a later line was stamped earlier"


async def test_two_transactions_make_a_new_teams_projection_at_once(
    db: Database, writes: WriteService
) -> None:
    """A new team's relationship projection is made by the first write that needs it
    (``active_projection``, gateway/store/writes.py); two batches in flight may
    both need it. The first transaction makes it and has not committed; the
    second asks meanwhile, finds none, and its insert waits on the first's key.
    Once the first commits, the second gets generation 1 (ON CONFLICT DO NOTHING,
    then a read). With a plain INSERT it failed on the key (23505), which the
    loader's fallback to the record-at-a-time path then hid: the rows came out
    the same, so the row comparisons above could not tell."""
    team = unique("proj")
    await load_jsonl(writes, jsonl([{"kind": "team", "id": team, "name": "Projection"}]))
    async with db.pool.acquire() as first, db.pool.acquire() as second:
        async with db.pool.acquire() as watcher:
            model = await watcher.fetchval("SELECT name FROM embedding_models")
            if model is None:  # a store that has never held a vector
                model = writes.embedder.model
                await watcher.execute(
                    "INSERT INTO embedding_models (name, dimensions) VALUES ($1, $2)",
                    model,
                    writes.embedder.dimensions,
                )
            held = first.transaction()
            await held.start()
            open_ = True
            try:
                assert await store_writes.active_projection(first, team, model) == 1
                waiting = second.transaction()
                await waiting.start()
                try:
                    task = asyncio.create_task(store_writes.active_projection(second, team, model))
                    blockers: list[int] = []
                    for _ in range(1000):
                        blockers = await bulk_store.lock_blockers(watcher, second.get_server_pid())
                        if blockers or task.done():
                            break
                        await asyncio.sleep(0.01)
                    assert blockers == [first.get_server_pid()], blockers
                    await held.commit()
                    open_ = False
                    assert await task == 1
                finally:
                    await waiting.rollback()
            finally:
                if open_:  # after a failed assertion
                    await held.rollback()


async def test_a_batch_on_a_lost_lane_fails_as_on_a_pooled_connection(
    db: Database, writes: WriteService
) -> None:
    """A batch of a pipelined load runs on a lane (a connection the load holds), not
    through Database.admin; a lost connection must still come out as the
    gateway's DATABASE_UNAVAILABLE, as it does for a batch on a pooled
    connection, not as the driver's own exception (which the CLI would show as a
    traceback). The lane's server process is ended before the batch begins."""
    team = unique("lost")
    records = [r for _, r in loader.parse(loader.split_lines(jsonl(_documents(team, 2))))]
    async with db.pool.acquire() as lane, db.pool.acquire() as killer:
        await killer.fetchval("SELECT pg_terminate_backend($1)", lane.get_server_pid())
        with pytest.raises(DatabaseUnavailable):
            await writes.apply(records, Actor.operator(), turn=Turn(lane, None, None))
