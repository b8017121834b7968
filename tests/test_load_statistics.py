"""The planner-statistics refresh after a loader batch, against other sessions' locks.

After a batch that created rows, the loader analyses referenced tables that hold
rows but no statistics (gateway.store.bulk_writes.analyze_stale). It must
never wait on another session's lock (a transaction creating a space holds one
on evidence and relationships until it commits) and never fail a load: the
batch is committed before it runs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.services import bulk_writes, loader
from gateway.services.writes import Actor, WriteService
from gateway.store import bulk_writes as bulk_store
from gateway.store import recall as recall_store
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl
from .test_load_paths import _generated, _retarget, _rows

_REFRESH_FAILED = "planner statistics not refreshed"

_AUTOVACUUM_OFF = (
    "DO $$ DECLARE t regclass; BEGIN FOR t IN SELECT oid FROM pg_class "
    "WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' LOOP "
    "EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = off)', t); "
    "END LOOP; END $$"
)
"""For a test's own store: no analysis but the loader's."""


async def _planned(conn: Conn, tables: tuple[str, ...]) -> dict[str, bool]:
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
    """Another session holds EXCLUSIVE on pg_statistic, which every ANALYZE must
    write its statistics into (SKIP_LOCKED covers only the analysed table's own
    lock): the refresh's ANALYZE gives up at its lock timeout and fails. The load
    still reports every record, its rows are there, and the loader logs a
    warning."""
    caplog.set_level(logging.WARNING, logger="gateway.load")
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    holder = await asyncpg.connect(fresh_dsn)
    team = unique("fail")
    try:
        writes = WriteService(db, embedder)
        lock = holder.transaction()
        await lock.start()
        await holder.execute("LOCK TABLE pg_statistic IN EXCLUSIVE MODE")
        text = _retarget(_generated(6), team)
        report = await load_jsonl(writes, text, batch_size=25)
        await lock.rollback()
        async with db.pool.acquire() as conn:
            stored = await conn.fetchval("SELECT count(*) FROM evidence WHERE team_id = $1", team)
            planned = await _planned(conn, ("evidence",))
    finally:
        await holder.close()
        await db.close()
    # the team and principal in a batch of their own, then 25 and the rest
    assert report.records == len(text.splitlines()) and report.batches == 3
    assert stored == 6
    assert planned == {"evidence": False}
    failed = [r for r in caplog.records if _REFRESH_FAILED in r.getMessage()]
    assert failed and all(r.levelno == logging.WARNING for r in failed)


async def test_a_table_locked_exclusively_is_left_out_and_the_others_are_analysed(
    fresh_dsn: str, embedder: EmbeddingProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session holds ACCESS EXCLUSIVE on entities (a migration, an ALTER,
    the detach of 'load --index-after' take this lock), whose size the refresh
    must read. That one table is left out, without failing the refresh: the
    other tables the batch left without statistics are analysed, nothing is
    logged as a failure, and a refresh after the lock is gone analyses entities
    too. (A review found one such table failing the whole refresh.)"""
    caplog.set_level(logging.WARNING, logger="gateway.load")
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    holder = await asyncpg.connect(fresh_dsn)
    tables = ("sources", "entities", "evidence", "relationships")
    try:
        writes = WriteService(db, embedder)
        async with db.pool.acquire() as conn:
            await conn.execute(_AUTOVACUUM_OFF)
        records = loader.parse(loader.split_lines(_retarget(_generated(12), unique("lock"))))
        await writes.apply([r for _, r in records], Actor.operator())  # no refresh
        lock = holder.transaction()
        await lock.start()
        await holder.execute("LOCK TABLE entities IN ACCESS EXCLUSIVE MODE")
        await writes.analyze_unplanned_tables()
        await lock.rollback()
        async with db.pool.acquire() as conn:
            during = await _planned(conn, tables)
        await writes.analyze_unplanned_tables()
        async with db.pool.acquire() as conn:
            after = await _planned(conn, tables)
    finally:
        await holder.close()
        await db.close()
    assert during == {"sources": True, "entities": False, "evidence": True, "relationships": True}
    assert after == dict.fromkeys(tables, True)
    assert not [r for r in caplog.records if _REFRESH_FAILED in r.getMessage()]


_CHECK = (
    "SELECT 1 FROM ONLY evidence x WHERE team_id = $1 AND space_id = $2 AND id = $3 "
    "FOR KEY SHARE OF x"
)


async def _check_plan(conn: Conn, table: str = "evidence") -> str:
    """The generic plan of a foreign-key check of a row of ``table`` (by default a
    posting's of its evidence)."""
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        check = _CHECK.replace("ONLY evidence", f"ONLY {table}")
        await conn.execute(f"PREPARE fk_check(client_id, uuid, client_id) AS {check}")
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


def _documents(team: str, count: int) -> list[Any]:
    """Parsed records of a team, its reader and ``count`` documents of the load
    benchmark's shape (a source, an entity, an evidence and a relationship that
    the evidence supports), all in the shared space."""
    lines: list[dict[str, Any]] = [
        {"kind": "team", "id": team, "name": "One big batch"},
        {"kind": "principal", "team": team, "id": "reader", "display_name": "Reader"},
    ]
    for i in range(count):
        lines += [
            {"kind": "source", "team": team, "id": f"s{i}", "type": "document", "title": f"D{i}"},
            {"kind": "entity", "team": team, "id": f"e{i}", "name": f"Document {i}"},
            {
                "kind": "evidence",
                "team": team,
                "id": f"ev{i}",
                "source": f"s{i}",
                "content": f"Document {i} says that service {i} answers within {i + 3} ms.",
            },
            {
                "kind": "relationship",
                "team": team,
                "id": f"r{i}",
                "subject": f"e{i}",
                "predicate": "has_abstract",
                "object_value": f"document {i}",
                "owner": "reader",
                "supports": [{"id": f"sup{i}", "evidence": f"ev{i}"}],
            },
        ]
    return [r for _, r in loader.parse(loader.split_lines(jsonl(lines)))]


_GUARD_LOOKUP = (
    "SELECT count(l.found) FROM (SELECT DISTINCT team_id, space_id, {doc}_id AS id "
    "FROM {doc}_terms) n LEFT JOIN LATERAL (SELECT true AS found FROM {table} x "
    "WHERE x.team_id = n.team_id AND x.space_id = n.space_id AND x.id = n.id "
    "FOR KEY SHARE OF x) l ON true"
)
"""The lookup of db/0115's guard of new postings, over the postings written so far."""

_NARROW = (
    "entities_space",
    "evidence_space",
    "relationships_group",
    "relationships_subject",
    "relationships_object",
)
"""The indexes led by (team_id, space_id) that a check planned without statistics
took instead of the unique key."""


async def test_a_large_first_batch_is_checked_by_the_whole_key(
    fresh_dsn: str, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first batch much larger than PLANNED_PREFIX into a new store (no
    statistics; autovacuum off, and no refresh: one run, inside its transaction).
    Before the change, every foreign-key check of a relationship's subject read
    the whole space through entities_space (and a 90,000-relationship COPY was
    still running after 28 minutes). Now the tables are analysed inside the
    batch after their first rows: the lookups of a foreign-key check and of the
    postings' guard go by the whole key, and the narrow indexes were read only
    for the first PLANNED_PREFIX rows of a table (the guard's lookups of the
    prefix, at most prefix x prefix entries each for evidence and
    relationships), not for every row of the batch."""
    prefix = 40
    monkeypatch.setattr(bulk_store, "PLANNED_PREFIX", prefix)
    records = _documents(unique("key"), 4 * prefix)
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    try:
        writes = WriteService(db, embedder)
        async with db.pool.acquire() as conn:
            await conn.execute(_AUTOVACUUM_OFF)
        await writes.apply([r for r in records if not bulk_writes.eligible(r)], Actor.operator())
        async with db.pool.acquire() as conn:
            batch = conn.transaction()
            await batch.start()
            try:
                await bulk_writes.apply_run(
                    conn,
                    [r for r in records if bulk_writes.eligible(r)],
                    "operator",
                    statement_timeout_ms=60_000,
                )
                narrow = await conn.fetchval(
                    "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(oid)), 0) "
                    "FROM pg_class WHERE relname = ANY($1::text[])",
                    list(_NARROW),
                )
                checks = {
                    table: await _check_plan(conn, table)
                    for table in ("sources", "entities", "evidence", "relationships", "supports")
                }
                guards = {}
                for doc, table in (("evidence", "evidence"), ("relationship", "relationships")):
                    rows = await conn.fetch(
                        "EXPLAIN (COSTS OFF) " + _GUARD_LOOKUP.format(doc=doc, table=table)
                    )
                    guards[table] = "\n".join(r[0] for r in rows)
            finally:
                await batch.rollback()
    finally:
        await db.close()
    for table, plan in {**checks, **guards}.items():
        # by an index on the whole key (or, for a table this small, a plain scan);
        # never a narrow index with the id a filter
        assert not any(f"using {index} " in plan for index in _NARROW), (table, plan)
        if "Index Scan" in plan:
            assert "id" in plan.split("Index Cond")[1].split("\n")[0], (table, plan)
    # without the in-batch statistics: 160 x 160 for the subjects alone
    assert narrow <= 2 * prefix * prefix, narrow


async def _eligible_plan(reader: Database, team: str, name: str = "eligible") -> str:
    """The generic plan, with its estimates, of the recall's hydration statement
    (``ELIGIBLE_SQL``) as a recall's transaction plans it: the tenant role,
    ``force_generic_plan``, and the statement prepared once per connection
    (``reader`` has one), so that a later call explains the plan the connection
    keeps, unless something invalidated it. A ``name`` not used before: a plan
    made now."""
    async with reader.unit(team, [], plan_cache_mode="force_generic_plan") as unit:
        async with unit.step() as conn:
            prepared = await conn.fetchval(
                "SELECT count(*) FROM pg_prepared_statements WHERE name = $1", name
            )
            if not prepared:
                await conn.execute(f"PREPARE {name} AS {recall_store.ELIGIBLE_SQL}")
            # a generic plan does not depend on the values (the team is a safe literal)
            rows = await conn.fetch(
                f"EXPLAIN EXECUTE {name}('{team}', ARRAY['ev1'], "
                "ARRAY[gen_random_uuid()], now(), now())"
            )
    return "\n".join(r[0] for r in rows)


async def test_a_load_that_grows_a_small_store_replaces_its_generic_plans(
    fresh_dsn: str, embedder: EmbeddingProvider
) -> None:
    """A recall's statements run under force_generic_plan, and a generic plan made
    while the store was small (planned for a few rows: at 5 rows of evidence and
    200,000 more unanalysed, a review measured a join's kept sequential scan at 337
    ms against 35 ms with a custom plan) stays until something ANALYZEs a table it reads. A first small
    load gives evidence statistics; a later, much larger load must analyse the
    tables that grew, which also invalidates the plans connections keep, rather
    than leave them to autovacuum (off here, as when it has not come round yet).
    Without the refresh's growth rule, evidence keeps its 5-row statistics and the
    kept plan its 5-row estimates, unlike a plan made after the load."""
    team = unique("grow")
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    reader = await Database.open(fresh_dsn, min_size=1, max_size=1)
    try:
        writes = WriteService(db, embedder)
        async with db.pool.acquire() as conn:  # this test's own store: no analysis but ours
            await conn.execute(
                "DO $$ DECLARE t regclass; BEGIN FOR t IN SELECT oid FROM pg_class "
                "WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' LOOP "
                "EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = off)', t); "
                "END LOOP; END $$"
            )
        await load_jsonl(writes, _retarget(_generated(5), team))
        async with db.pool.acquire() as conn:
            small = await conn.fetchval("SELECT reltuples FROM pg_class WHERE relname = 'evidence'")
        before = await _eligible_plan(reader, team)
        # then a load of other teams' documents, as a store's second, larger load
        # (one team alone would keep the team's predicate unselective)
        grow = "".join(_retarget(_generated(100), unique("more")) for _ in range(8))
        await load_jsonl(writes, grow, batch_size=500)
        async with db.pool.acquire() as conn:
            grown = await conn.fetchval("SELECT reltuples FROM pg_class WHERE relname = 'evidence'")
        after = await _eligible_plan(reader, team)
        now = await _eligible_plan(reader, team, "made_now")
    finally:
        await reader.close()
        await db.close()
    assert 0 < small < 10, small
    # analysed during the load (without the refresh: 5). This relies on the
    # pages rule for evidence (first met at 18 pages; the table reaches about 37):
    # 800 new rows never reach the rows rule's 5 + 1,000. If evidence rows shrank
    # a lot (their content moved elsewhere), grow the load to keep that margin.
    assert grown >= 100, grown
    # the plan the connection kept is the plan it would make now, from the
    # statistics of the grown store (kept from the small store, its estimates
    # would be those of 5 rows)
    assert after == now, f"kept:\n{after}\n\nmade now:\n{now}"
    assert after != before


async def test_each_table_is_analysed_in_a_transaction_of_its_own(
    fresh_dsn: str, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ANALYZE holds SHARE UPDATE EXCLUSIVE on its table until its transaction
    ends, and a transaction creating a space needs a conflicting lock on evidence
    and relationships: a refresh of several tables must not keep the first one
    locked while it samples the next. Another connection holds pg_statistic,
    which each table's ANALYZE writes into after sampling the table, so the
    refresh stops there table after table; each time, that connection reads
    pg_locks: the refresh's session holds the lock of the table it is analysing
    and of no other. Afterwards, each table's statistics were written by a
    transaction of its own (their rows' xmin)."""
    # the watcher takes its time: no lock timeout while the refresh waits for it
    monkeypatch.setattr(bulk_store, "ANALYZE_LOCK_TIMEOUT", "60s")
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    observer = await asyncpg.connect(fresh_dsn)
    seen: list[list[str]] = []
    try:
        writes = WriteService(db, embedder)
        async with db.pool.acquire() as conn:
            await conn.execute(_AUTOVACUUM_OFF)
        records = loader.parse(loader.split_lines(_retarget(_generated(30), unique("one"))))
        await writes.apply([r for _, r in records], Actor.operator())  # no refresh
        async with db.pool.acquire() as conn:
            stale = await bulk_store.stale_tables(conn, bulk_store.AFTER_BATCH)
        hold = observer.transaction()
        await hold.start()
        await observer.execute("LOCK TABLE pg_statistic IN EXCLUSIVE MODE")
        refresh = asyncio.create_task(writes.analyze_unplanned_tables())
        while not refresh.done():
            waiting = await observer.fetchval(
                "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.relation = 'pg_statistic'::regclass AND l.mode = 'RowExclusiveLock' "
                "AND NOT l.granted AND a.datname = current_database() "
                "AND a.application_name = 'recall-gateway'"
            )
            if waiting is None:
                await asyncio.sleep(0.005)
                continue
            held = await observer.fetch(
                "SELECT relation::regclass::text FROM pg_locks WHERE pid = $1 "
                "AND locktype = 'relation' AND mode = 'ShareUpdateExclusiveLock' AND granted",
                waiting,
            )
            seen.append(sorted(r[0] for r in held))
            # let this table's ANALYZE finish, and stop the next one at the same place
            await hold.commit()
            hold = observer.transaction()
            await hold.start()
            await observer.execute("LOCK TABLE pg_statistic IN EXCLUSIVE MODE")
        await hold.commit()
        await refresh
        async with db.pool.acquire() as conn:
            planned = await _planned(conn, tuple(stale))
            writers = await conn.fetch(
                "SELECT starelid::regclass::text AS t, array_agg(DISTINCT xmin::text) AS x "
                "FROM pg_statistic WHERE starelid::regclass::text = ANY($1::text[]) GROUP BY 1",
                stale,
            )
    finally:
        await observer.close()
        await db.close()
    assert len(stale) >= 3, stale  # sources, evidence, relationships at least
    assert all(planned.values()), planned  # each was analysed
    # stopped at the first table at least (the lock was taken before the refresh)
    assert len(seen) >= 2, seen
    assert all(len(held) == 1 and held[0] in stale for held in seen), seen
    # one table after another: a table's ANALYZE may stop more than once (it
    # writes pg_statistic for its columns, then for each expression index), but
    # once the next table is locked the earlier one is never seen again
    order = [held[0] for k, held in enumerate(seen) if k == 0 or held != seen[k - 1]]
    assert len(set(order)) == len(order), seen
    xmins = {r["t"]: r["x"] for r in writers}
    assert all(len(x) == 1 for x in xmins.values()), xmins
    assert len({x[0] for x in xmins.values()}) == len(xmins) == len(stale), xmins


async def test_a_load_ends_with_statistics_of_every_table_it_filled(
    fresh_dsn: str, embedder: EmbeddingProvider
) -> None:
    """The refresh after each batch analyses a table again only once it has
    doubled, and only referenced tables when they have no statistics: the end of
    a load refreshes once more, as autovacuum would (10 % of the rows plus 50),
    so that no table the load filled is left unanalysed (the lifecycle events,
    which no foreign key references) and none is counted at half its size."""
    team = unique("end")
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    try:
        writes = WriteService(db, embedder)
        async with db.pool.acquire() as conn:
            await conn.execute(_AUTOVACUUM_OFF)
        await load_jsonl(writes, _retarget(_generated(200), team), batch_size=50)
        async with db.pool.acquire() as conn:
            stale = await conn.fetch(
                "SELECT relname, reltuples, relpages, pg_relation_size(oid) / 8192 AS pages "
                "FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' "
                "AND pg_relation_size(oid) > 0 "
                "AND (reltuples < 0 OR pg_relation_size(oid) / 8192 > 1.1 * relpages + 1)"
            )
            lifecycle = await conn.fetchval(
                "SELECT count(*) FROM evidence_lifecycle_events WHERE team_id = $1", team
            )
    finally:
        await db.close()
    assert lifecycle > 0  # the load filled a table no foreign key references
    assert [dict(r) for r in stale] == []


async def test_a_login_role_that_may_not_analyse_is_told_once(
    fresh_dsn: str, embedder: EmbeddingProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """A login role that owns no table (and has no MAINTAIN grant) cannot analyse:
    the server skips each table with a warning. The loader says so in its log,
    once per table however many refreshes run, instead of silently doing
    nothing."""
    caplog.set_level(logging.WARNING, logger="gateway.load")
    role = unique("visitor").replace("-", "_")
    owner = await asyncpg.connect(fresh_dsn)
    try:
        writes = WriteService(await Database.open(fresh_dsn, min_size=1, max_size=1), embedder)
        records = loader.parse(loader.split_lines(_retarget(_generated(6), unique("told"))))
        await writes.apply([r for _, r in records], Actor.operator())  # unanalysed rows
        await writes.db.close()
        await owner.execute(f"CREATE ROLE {role} LOGIN")
        visitor_dsn = fresh_dsn.replace("postgres@", f"{role}@", 1)
        assert visitor_dsn != fresh_dsn, fresh_dsn
        visitor = await Database.open(visitor_dsn, min_size=1, max_size=1)
        try:
            refused = WriteService(visitor, embedder)
            await refused.analyze_unplanned_tables()
            await refused.analyze_unplanned_tables()
        finally:
            await visitor.close()
        planned = await _planned(owner, ("evidence",))
    finally:
        await owner.close()
    told = [r.getMessage() for r in caplog.records if _REFRESH_FAILED in r.getMessage()]
    assert planned == {"evidence": False}
    assert any('"evidence"' in m for m in told), told
    assert len(told) == len(set(told)), told  # once per table, not per refresh


class _Refreshes(WriteService):
    """The real service, noting each refresh the loader asks for."""

    def __init__(self, db: Database, embedder: EmbeddingProvider) -> None:
        super().__init__(db, embedder)
        self.refreshes: list[bool] = []

    async def analyze_unplanned_tables(self, *, load_end: bool = False) -> None:
        self.refreshes.append(load_end)
        await super().analyze_unplanned_tables(load_end=load_end)


async def test_the_last_batch_refreshes_once_at_the_load_end_thresholds(
    db: Database, embedder: EmbeddingProvider
) -> None:
    """After each batch that wrote rows the loader refreshes the statistics; after
    the last one, that refresh is the load's own (autovacuum's thresholds), not
    the batch's followed by the load's. A load that writes nothing refreshes
    nothing, and one whose last batch writes nothing still ends with the load's
    refresh."""
    team = unique("once")
    text = _retarget(_generated(30), team)
    service = _Refreshes(db, embedder)
    first = await load_jsonl(service, text, batch_size=25)
    assert first.batches >= 4 and first.created
    assert service.refreshes == [False] * (first.batches - 1) + [True]

    service.refreshes.clear()
    again = await load_jsonl(service, text, batch_size=25)
    assert again.created.total() == 0 and service.refreshes == []

    # a new team's records first, then every record of the first load again: the
    # last batches write nothing
    service.refreshes.clear()
    mixed = await load_jsonl(service, _retarget(_generated(5), unique("new")) + text, batch_size=25)
    assert mixed.created and mixed.unchanged
    assert service.refreshes[-1] is True and service.refreshes.count(True) == 1
    assert len(service.refreshes) < mixed.batches


async def test_a_run_copied_in_two_parts_writes_the_rows_of_one_copy(
    fresh_dsn: str, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-batch analysis copies each table without statistics in two statements
    (its first PLANNED_PREFIX rows, then the rest): every row, posting and
    counter is the same as one COPY of the table writes (tests/test_load_paths.py's
    comparison). The same file, in one batch each, into two teams of a new store:
    first with a prefix of 7 (tables without statistics: split, and analysed
    inside the batch), then with no split at all."""
    lines = _generated(30)
    split, whole = unique("split"), unique("whole")
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    try:
        writes = WriteService(db, embedder)
        async with db.pool.acquire() as conn:
            await conn.execute(_AUTOVACUUM_OFF)
        for team, prefix in ((split, 7), (whole, 1_000_000)):
            monkeypatch.setattr(bulk_store, "PLANNED_PREFIX", prefix)
            parsed = loader.parse(loader.split_lines(_retarget(lines, team)))
            await writes.apply([r for _, r in parsed], Actor.operator())  # no refresh
            if team == split:
                async with db.pool.acquire() as conn:
                    planned = await _planned(conn, ("sources", "entities", "evidence"))
        async with db.pool.acquire() as conn:
            rows = {team: await _rows(conn, team) for team in (split, whole)}
    finally:
        await db.close()
    assert planned == {"sources": True, "entities": True, "evidence": True}  # split, analysed
    assert rows[split]["evidence_terms"] and rows[split]["relationships"]
    assert rows[split] == rows[whole]
