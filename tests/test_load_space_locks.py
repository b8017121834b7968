"""What a load's batches cost other sessions: the locks of a new space, on the real
PostgreSQL.

Creating a space creates its two vector partitions. Since db/0102 they are
attached (SHARE UPDATE EXCLUSIVE on ``evidence_embeddings`` and
``relationship_embeddings``, which readers pass), not made with ``CREATE TABLE
... PARTITION OF`` (ACCESS EXCLUSIVE); their cloned foreign keys still take SHARE
ROW EXCLUSIVE on the tables every team writes evidence and relationships to. The
loader writes records that create spaces in short batches of their own that
wait at most 100 ms at a time for their locks, so no other team waits for a new
space's first batch of memory to be embedded and written. A batch is held open
here by an embedding provider that waits for the test (a barrier), never by
sleeping.

``load --index-after`` into an existing empty space detaches the space's tables
before its first batch, in a transaction of its own; that batch is applied once
(the sequence of its lifecycle events shows every insert, rolled back or not).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.services import loader, lock_waits
from gateway.services.writes import Actor, WriteService
from gateway.store import vector_partitions
from gateway.store import writes as store
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import unique
from .held_loads import (
    OTHER_READ,
    WRITE_EVIDENCE,
    Barrier,
    batch_held_open,
    holding,
    served,
    until_queued,
)
from .test_index_after import _build, _parsed, _records, _space, _state
from .test_index_after_safety import _evidence_only, _recall, _setup_only


def _new_team(team: str) -> list[dict[str, Any]]:
    """A team, its principal and a first batch of memory whose vectors the provider
    computes (so the batch embeds inside its transaction)."""
    out: list[dict[str, Any]] = [
        {"kind": "team", "id": team, "name": "New team"},
        {"kind": "principal", "team": team, "id": "ann", "display_name": "Ann"},
        {"kind": "source", "team": team, "id": "s", "type": "document", "title": "Doc"},
        {"kind": "entity", "team": team, "id": "e", "name": "Engine"},
    ]
    for i in range(3):
        out.append(
            {
                "kind": "evidence",
                "team": team,
                "id": f"ev{i}",
                "source": "s",
                "content": f"Engine note {i}: the pump runs at {i} rpm.",
            }
        )
    return out


async def _writes_in_progress(conn: Conn) -> int:
    """Sessions other than this one with an open transaction that has written evidence."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE pid <> pg_backend_pid() AND granted "
            "AND mode = 'RowExclusiveLock' AND relation = 'evidence'::regclass"
        )
    )


@pytest.mark.parametrize("index_after", [False, True], ids=["default", "index-after"])
async def test_other_teams_recall_while_a_new_teams_first_batch_is_written(
    writes: WriteService,
    embedder: EmbeddingProvider,
    admin_conn: Conn,
    dsn: str,
    index_after: bool,
) -> None:
    from .test_recall import token

    other = unique("lockother")
    await loader.load(writes, _parsed(_records(other, embedder.model, docs=3)), batch_size=50)
    tok = await token(writes, other, "ann")

    team = unique("locknew")
    barrier = Barrier(embedder)
    async with batch_held_open(
        writes, barrier, _parsed(_new_team(team)), index_after=index_after
    ) as load:
        assert await _writes_in_progress(admin_conn) >= 1, "the batch is open and has written"
        # Reads wait at most the gateway's lock timeout (2 s) before a list is
        # dropped: a recall that queued behind the new space's lock says so.
        answer = await _recall(dsn, tok)
        assert answer["degradations"] == [], answer["degradations"]
        assert answer["searchStates"]["evidence"] == {"status": "COMPLETE", "complete": True}
        assert answer["results"]
        assert not load.done()
    report = await load
    assert report.created["evidence"] == 3
    space = await _space(admin_conn, team)
    if index_after:
        assert report.deferred == [space]
        await _build(writes.db)
    for _table, attached, methods in await _state(admin_conn, space):
        assert attached is True and "hnsw:True" in methods
    assert (
        await admin_conn.fetchval(
            "SELECT count(*) FROM evidence_embeddings WHERE team_id = $1", team
        )
        == 3
    )


async def _events_sequence(conn: Conn) -> int:
    """How many evidence lifecycle events were ever inserted, committed or rolled
    back: an identity sequence is never rolled back."""
    value = await conn.fetchval(
        "SELECT coalesce(last_value, 0) FROM pg_sequences "
        "WHERE sequencename = 'evidence_lifecycle_events_seq_seq'"
    )
    return int(value)


async def test_the_first_batch_into_an_existing_space_is_applied_once(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn
) -> None:
    team = unique("ixonce")
    await loader.load(writes, _parsed(_setup_only(team, embedder.model)), batch_size=50)
    space = await _space(admin_conn, team)
    before = await _events_sequence(admin_conn)
    report = await loader.load(
        writes, _parsed(_evidence_only(team, embedder.model)), batch_size=50, index_after=True
    )
    assert report.batches == 1 and report.created["evidence"] == 10
    assert report.deferred == [space]
    # 10 events committed, and no other insert of one ever ran (rolled back)
    assert await _events_sequence(admin_conn) - before == 10
    await _build(writes.db)
    for _table, attached, methods in await _state(admin_conn, space):
        assert attached is True and "hnsw:True" in methods


async def test_a_space_batch_gives_way_to_writers_and_gives_up_cleanly(
    writes: WriteService,
    embedder: EmbeddingProvider,
    admin_conn: Conn,
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long writer holds the evidence table: the batch creating a team (whose
    partitions' foreign keys need SHARE ROW EXCLUSIVE on it) waits 100 ms at a
    time, so other writers are served meanwhile, and after its tries the load is
    refused with DATABASE_UNAVAILABLE, nothing written."""
    monkeypatch.setattr(lock_waits, "ATTEMPTS", 4)
    team = unique("lockgive")
    with pytest.raises(loader.LoadError) as caught:
        async with holding(db, WRITE_EVIDENCE):
            load = asyncio.create_task(loader.load(writes, _parsed(_new_team(team)), batch_size=50))
            # until the batch asks for the lock
            await until_queued(admin_conn, "ShareRowExclusiveLock", ["evidence"], unless=load)
            assert await served(db, WRITE_EVIDENCE), "a writer queued behind the new space"
            await load
    error = caught.value.errors[0]
    assert error.code == "DATABASE_UNAVAILABLE"
    assert "nothing was written" in error.message and "4 tries" in error.message
    assert error.line == 1
    assert caught.value.committed == 0
    assert await admin_conn.fetchval("SELECT count(*) FROM teams WHERE id = $1", team) == 0
    # the same load once the writer is gone
    report = await loader.load(writes, _parsed(_new_team(team)), batch_size=50)
    assert report.created["team"] == 1 and report.created["evidence"] == 3


async def test_a_space_being_created_blocks_no_reader_of_the_vector_tables(
    db: Database, admin_conn: Conn
) -> None:
    """db/0102: the partitions of a new space are attached (SHARE UPDATE EXCLUSIVE
    on the parents), not created with PARTITION OF (ACCESS EXCLUSIVE), so a read
    of the parents is served while the creating transaction is still open. Writers
    of evidence still wait for it (the cloned foreign keys take SHARE ROW
    EXCLUSIVE), which is why the loader keeps space records in short batches."""
    team = unique("lockattach")
    async with db.pool.acquire() as conn, conn.transaction():
        await store.insert_team(conn, team, "Attached", "operator")
        await store.insert_principal(conn, team, "ann", "person", "Ann", True)
        held = await admin_conn.fetch(
            "SELECT relation::regclass::text AS parent, mode FROM pg_locks "
            "WHERE pid = $1 AND granted AND relation = ANY "
            "(ARRAY['evidence_embeddings'::regclass, 'relationship_embeddings'::regclass])",
            conn.get_server_pid(),
        )
        assert {r["parent"] for r in held} == {"evidence_embeddings", "relationship_embeddings"}
        assert "AccessExclusiveLock" not in {r["mode"] for r in held}
        assert await served(db, OTHER_READ), "a reader queued behind the new space"
    space = await _space(admin_conn, team)
    for _table, attached, methods in await _state(admin_conn, space):
        assert attached is True and "hnsw:True" in methods


async def _partition_shape(conn: Conn, table: str) -> dict[str, Any]:
    """What a vector partition is, with its space's ID taken out of every name:
    owner, privileges, row-level security, bound, columns (storage, defaults),
    constraints, indexes (and the parent index each belongs to), triggers."""

    def anon(text: Any) -> Any:  # a space's hex ID, whole or cut to fit a name
        return re.sub("[0-9a-f]{16,32}", "S", text) if isinstance(text, str) else text

    klass = await conn.fetchrow(
        "SELECT c.relowner::regrole::text AS owner, c.relacl::text AS acl, c.relrowsecurity, "
        "c.relforcerowsecurity, c.reloptions, c.relkind, c.relispartition, "
        "(SELECT inhparent::regclass::text FROM pg_inherits WHERE inhrelid = c.oid) AS parent "
        "FROM pg_class c WHERE c.oid = to_regclass($1)",
        table,
    )
    assert klass is not None
    columns = await conn.fetch(
        "SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "a.attstorage, a.attcompression, a.attislocal, a.attinhcount, "
        "pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a LEFT JOIN pg_attrdef d "
        "ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        table,
    )
    constraints = await conn.fetch(
        "SELECT conname, contype, pg_get_constraintdef(oid), convalidated, conislocal, "
        "coninhcount, conparentid <> 0 FROM pg_constraint WHERE conrelid = to_regclass($1)",
        table,
    )
    indexes = await conn.fetch(
        "SELECT pg_get_indexdef(i.indexrelid), i.indisvalid, i.indisprimary, c.reloptions, "
        "(SELECT inhparent::regclass::text FROM pg_inherits WHERE inhrelid = i.indexrelid) "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass($1)",
        table,
    )
    triggers = await conn.fetch(
        "SELECT tgfoid::regproc::text, tgtype, tgenabled, tgisinternal, "
        "tgconstrrelid::regclass::text, tgparentid <> 0 FROM pg_trigger "
        "WHERE tgrelid = to_regclass($1)",
        table,
    )
    policies = await conn.fetch(
        "SELECT polname FROM pg_policy WHERE polrelid = to_regclass($1)", table
    )
    return {
        "class": dict(klass),
        "columns": [tuple(r) for r in columns],
        "constraints": sorted(tuple(anon(v) for v in r) for r in constraints),
        "indexes": sorted(tuple(anon(v) for v in r) for r in indexes),
        "triggers": sorted(tuple(r) for r in triggers),
        "policies": [tuple(r) for r in policies],
    }


async def test_a_new_spaces_partitions_are_what_partition_of_made(
    db: Database, admin_conn: Conn
) -> None:
    """The attached partitions of db/0102 against those db/0001's CREATE TABLE ...
    PARTITION OF made (for a space made up here, rolled back): the same owner,
    privileges, row-level security, columns, constraints, indexes (HNSW with the
    parent's options, attached to the parent's) and triggers."""
    team = unique("lockshape")
    async with db.pool.acquire() as conn:
        async with conn.transaction():
            await store.insert_team(conn, team, "Shape", "operator")
        space = await _space(admin_conn, team)
        other = uuid.uuid4()
        tx = conn.transaction()
        await tx.start()
        try:
            for parent in vector_partitions.VECTOR_TABLES:
                table = vector_partitions.partition_name(parent, other)
                await conn.execute(
                    f"CREATE TABLE {table} PARTITION OF {parent} FOR VALUES IN ('{other}')"
                )
                await conn.execute(f"ALTER TABLE {table} ALTER COLUMN embedding SET STORAGE PLAIN")
            for parent in vector_partitions.VECTOR_TABLES:
                made = await _partition_shape(conn, vector_partitions.partition_name(parent, space))
                reference = await _partition_shape(
                    conn, vector_partitions.partition_name(parent, other)
                )
                assert made == reference
                assert made["class"]["relispartition"] is True
                assert any("hnsw" in str(i[0]) for i in made["indexes"])
        finally:
            await tx.rollback()


def _count_tries(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the tries of every batch (each one a transaction of its own)."""
    tries = [0]
    original = WriteService._apply_either

    async def counted(self: WriteService, *args: Any, **kwargs: Any) -> Any:
        tries[0] += 1
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(WriteService, "_apply_either", counted)
    return tries


async def test_a_space_batch_that_gets_its_locks_after_a_few_tries_is_written_once(
    writes: WriteService,
    embedder: EmbeddingProvider,
    admin_conn: Conn,
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer holding the evidence table ends while the space batch retries:
    the batch then succeeds, and its rows (and spaces) exist once."""
    tries = _count_tries(monkeypatch)
    team = unique("lockfree")
    lines = _new_team(team)
    async with holding(db, WRITE_EVIDENCE):
        load = asyncio.create_task(loader.load(writes, _parsed(lines), batch_size=50))
        for _ in range(1000):  # until the space batch has timed out at least twice
            if load.done() or tries[0] >= 3:
                break
            await asyncio.sleep(0.01)
        assert not load.done() and tries[0] >= 3
    report = await load
    assert report.created["team"] == 1 and report.created["principal"] == 1
    assert report.created["evidence"] == 3
    spaces = await admin_conn.fetch("SELECT id FROM memory_spaces WHERE team_id = $1", team)
    assert len(spaces) == 2  # shared and ann's private space, once each
    for row in spaces:
        for _table, attached, methods in await _state(admin_conn, row["id"]):
            assert attached is True and "hnsw:True" in methods
    assert await admin_conn.fetchval("SELECT count(*) FROM teams WHERE id = $1", team) == 1


async def test_a_space_batch_refused_for_its_content_is_tried_once(
    writes: WriteService, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a lock timeout or a deadlock is tried again: a team record refused by
    the database for what it says (the same ID with other content) is tried once
    and reported as such."""
    team = unique("lockonce")
    await loader.load(writes, _parsed(_new_team(team)), batch_size=50)
    tries = _count_tries(monkeypatch)
    changed = [{"kind": "team", "id": team, "name": "Another name"}]
    with pytest.raises(loader.LoadError) as caught:
        await loader.load(writes, _parsed(changed), batch_size=50)
    assert caught.value.errors[0].code == "IDEMPOTENCY_CONFLICT"
    assert tries[0] == 1


async def test_a_mixed_batch_is_applied_once_outside_the_retry_mode(
    writes: WriteService, admin_conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a batch of nothing but space records is retried with short lock waits:
    a direct caller's batch of a team and its memory would embed again on every
    try, so it is applied once, in one transaction, as before the space batches."""

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a mixed batch went to the retry mode of space batches")

    monkeypatch.setattr(WriteService, "_apply_creating_spaces", refused)
    tries = _count_tries(monkeypatch)
    team = unique("lockmixed")
    records = [r for _, r in _parsed(_new_team(team))]
    result = await writes.apply(records, Actor.operator())
    assert result.created["team"] == 1 and result.created["evidence"] == 3
    assert tries[0] == 1
