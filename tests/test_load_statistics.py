"""The planner-statistics refresh after a loader batch, against other sessions' locks.

After a batch that created rows, the loader analyses referenced tables that hold
rows but no statistics (gateway.store.bulk_writes.analyze_unplanned). It must
never wait on another session's lock (a transaction creating a space holds one
on evidence and relationships until it commits) and never fail a load: the
batch is committed before it runs.
"""

from __future__ import annotations

import logging

import asyncpg
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.services import loader
from gateway.services.writes import Actor, WriteService
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .test_load_paths import _generated, _retarget

_REFRESH_FAILED = "planner statistics not refreshed"


async def _planned(conn: asyncpg.Connection, tables: tuple[str, ...]) -> dict[str, bool]:
    """Whether each table has planner statistics (a row count and column stats)."""
    rows = await conn.fetch(
        "SELECT c.relname, c.reltuples > 0 AND EXISTS (SELECT 1 FROM pg_stats s "
        "WHERE s.schemaname = 'public' AND s.tablename = c.relname) AS planned "
        "FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace "
        "AND c.relname = ANY($1::text[])",
        list(tables),
    )
    return {r["relname"]: r["planned"] for r in rows}


async def test_a_held_lock_skips_that_table_and_the_load_does_not_wait(
    fresh_dsn: str, embedder: EmbeddingProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session holds SHARE UPDATE EXCLUSIVE on sources (the lock an ANALYZE
    or a VACUUM takes; it lets the loader insert). The refresh skips sources
    without waiting or failing (no warning from the loader: a wait would end in
    the statement or lock timeout, which is logged), analyses the other tables,
    and the first batch after the lock is gone analyses sources too."""
    caplog.set_level(logging.WARNING, logger="gateway.load")
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    holder = await asyncpg.connect(fresh_dsn)
    try:
        writes = WriteService(db, embedder)
        lock = holder.transaction()
        await lock.start()
        await holder.execute("LOCK TABLE sources IN SHARE UPDATE EXCLUSIVE MODE")
        text = _retarget(_generated(12), unique("skip"))
        report = await load_jsonl(writes, text, batch_size=25)
        async with db.pool.acquire() as conn:
            during = await _planned(conn, ("sources", "evidence", "relationships"))
        await lock.rollback()
        second = await load_jsonl(writes, _retarget(_generated(4), unique("skip")))
        async with db.pool.acquire() as conn:
            after = await _planned(conn, ("sources",))
    finally:
        await holder.close()
        await db.close()
    assert report.records == len(text.splitlines()) and not report.unchanged
    assert second.created
    assert during == {"sources": False, "evidence": True, "relationships": True}
    assert after == {"sources": True}
    assert not [r for r in caplog.records if _REFRESH_FAILED in r.getMessage()]


async def test_a_failed_refresh_is_logged_and_the_load_completes(
    fresh_dsn: str, embedder: EmbeddingProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session holds ACCESS EXCLUSIVE on a referenced table the load never
    touches (reembed_runs; a migration or an ALTER takes this lock). The refresh
    must look at that table's size and cannot, so it fails: the load still reports
    every record, its rows are there, and the loader logs a warning."""
    caplog.set_level(logging.WARNING, logger="gateway.load")
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    holder = await asyncpg.connect(fresh_dsn)
    team = unique("fail")
    try:
        writes = WriteService(db, embedder)
        lock = holder.transaction()
        await lock.start()
        await holder.execute("LOCK TABLE reembed_runs IN ACCESS EXCLUSIVE MODE")
        text = _retarget(_generated(6), team)
        report = await load_jsonl(writes, text, batch_size=25)
        await lock.rollback()
        async with db.pool.acquire() as conn:
            stored = await conn.fetchval("SELECT count(*) FROM evidence WHERE team_id = $1", team)
    finally:
        await holder.close()
        await db.close()
    # the team and principal in a batch of their own, then 25 and the rest
    assert report.records == len(text.splitlines()) and report.batches == 3
    assert stored == 6
    failed = [r for r in caplog.records if _REFRESH_FAILED in r.getMessage()]
    assert failed and all(r.levelno == logging.WARNING for r in failed)


_CHECK = (
    "SELECT 1 FROM ONLY evidence x WHERE team_id = $1 AND space_id = $2 AND id = $3 "
    "FOR KEY SHARE OF x"
)


async def _check_plan(conn: asyncpg.Connection) -> str:
    """The generic plan of a posting's foreign-key check of its evidence."""
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE fk_check(client_id, uuid, client_id) AS {_CHECK}")
        try:
            rows = await conn.fetch(
                "EXPLAIN (COSTS OFF) EXECUTE fk_check('t', gen_random_uuid(), 'e')"
            )
        finally:
            await conn.execute("DEALLOCATE fk_check")
    return "\n".join(r[0] for r in rows)


async def test_without_statistics_the_check_scans_the_space_and_the_refresh_fixes_it(
    fresh_dsn: str, embedder: EmbeddingProvider
) -> None:
    """The refresh's reason (docs/data-model.md, "Planner statistics on a new
    store"): a batch written without it leaves evidence without statistics, and
    the check is planned through another (team_id, space_id, ...) index with the
    id a filter; after the loader's refresh it is a lookup on the whole key."""
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    try:
        writes = WriteService(db, embedder)
        async with db.pool.acquire() as conn:  # this test's own store: no analysis but ours
            await conn.execute("ALTER TABLE evidence SET (autovacuum_enabled = off)")
        records = loader.parse(loader.split_lines(_retarget(_generated(30), unique("plan"))))
        await writes.apply([r for _, r in records], Actor.operator())
        async with db.pool.acquire() as conn:
            # more rows in the same spaces, as a larger first batch would write
            # (INSERT, like COPY, leaves the table without statistics)
            columns = await conn.fetchval(
                "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) "
                "FROM pg_attribute WHERE attrelid = 'evidence'::regclass AND attnum > 0 "
                "AND NOT attisdropped AND attname <> 'id'"
            )
            await conn.execute(
                f"INSERT INTO evidence (id, {columns}) SELECT id || '-' || g, {columns} "
                "FROM evidence, generate_series(1, 40) AS g"
            )
            before = await _check_plan(conn)
            await writes.analyze_unplanned_tables()
            after = await _check_plan(conn)
    finally:
        await db.close()
    assert "Filter" in before and "id" in before.split("Filter")[1], before
    assert "Filter" not in after and "id" in after.split("Index Cond")[1], after
