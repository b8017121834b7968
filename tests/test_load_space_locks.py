"""What a load's batches cost other sessions: the vector tables' lock, on the real
PostgreSQL.

Creating a space creates its two vector partitions (``CREATE TABLE ... PARTITION
OF``), which takes ACCESS EXCLUSIVE on ``evidence_embeddings`` and
``relationship_embeddings``, the tables every team's recall reads. The loader
writes records that create spaces in short batches of their own that wait at
most 100 ms at a time for that lock, so another team's recall never waits for a
new space's first batch of memory to be embedded and written. A batch is held
open here by an embedding provider that waits for the test (a barrier), never
by sleeping.

``load --index-after`` into an existing empty space detaches the space's tables
before its first batch, in a transaction of its own; that batch is applied once
(the sequence of its lifecycle events shows every insert, rolled back or not).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.embeddings.base import Vectors
from gateway.services import loader, lock_waits
from gateway.services.writes import WriteService
from gateway.store.database import Database

from .conftest import unique
from .test_index_after import _build, _parsed, _records, _space, _state
from .test_index_after_safety import _evidence_only, _long_reader, _recall, _setup_only


class Barrier:
    """An embedding provider that, at its first call, says so and waits for the
    test before answering: the loader's batch stays open (its transaction holds
    whatever it has taken) for as long as the test wants."""

    def __init__(self, inner: EmbeddingProvider) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def dimensions(self) -> int:
        return self.inner.dimensions

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.entered.set()
        await self.release.wait()
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        return None


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


@contextlib.asynccontextmanager
async def _batch_held_open(
    writes: WriteService, barrier: Barrier, lines: list[dict[str, Any]], *, index_after: bool
) -> AsyncIterator[asyncio.Task[loader.LoadReport]]:
    """A load whose first batch of memory waits at the barrier, inside its
    transaction; released (and the load awaited) when the block ends."""
    held = WriteService(writes.db, barrier)
    task = asyncio.create_task(
        loader.load(held, _parsed(lines), batch_size=50, index_after=index_after)
    )
    entered = asyncio.create_task(barrier.entered.wait())
    try:
        await asyncio.wait({task, entered}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # raises what the load raised
            pytest.fail("the load never embedded")
        yield task
    finally:
        barrier.release.set()
        entered.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await entered


async def _writes_in_progress(conn: asyncpg.Connection) -> int:
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
    admin_conn: asyncpg.Connection,
    dsn: str,
    index_after: bool,
) -> None:
    from .test_recall import token

    other = unique("lockother")
    await loader.load(writes, _parsed(_records(other, embedder.model, docs=3)), batch_size=50)
    tok = await token(writes, other, "ann")

    team = unique("locknew")
    barrier = Barrier(embedder)
    async with _batch_held_open(writes, barrier, _new_team(team), index_after=index_after) as load:
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


async def _events_sequence(conn: asyncpg.Connection) -> int:
    """How many evidence lifecycle events were ever inserted, committed or rolled
    back: an identity sequence is never rolled back."""
    value = await conn.fetchval(
        "SELECT coalesce(last_value, 0) FROM pg_sequences "
        "WHERE sequencename = 'evidence_lifecycle_events_seq_seq'"
    )
    return int(value)


async def test_the_first_batch_into_an_existing_space_is_applied_once(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: asyncpg.Connection
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


async def test_a_space_batch_gives_way_to_readers_and_gives_up_cleanly(
    writes: WriteService,
    embedder: EmbeddingProvider,
    admin_conn: asyncpg.Connection,
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long reader holds the vector tables: the batch creating a team waits 100
    ms at a time, so other readers are served meanwhile, and after its tries the
    load is refused with DATABASE_UNAVAILABLE, nothing written."""
    from .test_index_after_safety import _reader_is_served

    monkeypatch.setattr(lock_waits, "ATTEMPTS", 4)
    team = unique("lockgive")
    with pytest.raises(loader.LoadError) as caught:
        async with _long_reader(db):
            load = asyncio.create_task(
                loader.load(writes, _parsed(_new_team(team)), batch_size=50)
            )
            for _ in range(500):  # until the batch asks for the parents' lock
                if load.done() or await admin_conn.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted "
                    "AND mode = 'AccessExclusiveLock' "
                    "AND relation = 'evidence_embeddings'::regclass"
                ):
                    break
                await asyncio.sleep(0.01)
            assert await _reader_is_served(db), "a reader queued behind the new space"
            await load
    error = caught.value.errors[0]
    assert error.code == "DATABASE_UNAVAILABLE"
    assert "nothing was written" in error.message and "4 tries" in error.message
    assert error.line == 1
    assert caught.value.committed == 0
    assert await admin_conn.fetchval("SELECT count(*) FROM teams WHERE id = $1", team) == 0
    # the same load once the reader is gone
    report = await loader.load(writes, _parsed(_new_team(team)), batch_size=50)
    assert report.created["team"] == 1 and report.created["evidence"] == 3
