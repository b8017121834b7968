"""SQL of the set-based write path: a run of records in a handful of statements.

The record-at-a-time path (``gateway/store/writes.py``) sends about five
statements per record; a bulk load then waits on round trips, not on the
database. Here a run's idempotency claims are one statement and its rows go in
with one ``COPY`` per table. The checks that decide *whether* a row may be
written stay in the service (``gateway/services/bulk_writes.py``); the database
still enforces its constraints and triggers on every copied row, and any
refusal aborts the whole transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import asyncpg

from gateway.store.connection import Conn
from gateway.store.database import STORE_FAILURES, Database, translate

_CLAIM = """
INSERT INTO write_log (team_id, kind, client_id, payload_sha256, recorded_by)
SELECT t.team_id, t.kind, t.client_id, t.digest, $5
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[])
     AS t(team_id, kind, client_id, digest)
ON CONFLICT DO NOTHING
RETURNING team_id, kind, client_id, recorded_at
"""

_CLAIMED = """
SELECT w.team_id, w.kind, w.client_id, w.payload_sha256, w.recorded_at
FROM write_log w
JOIN unnest($1::text[], $2::text[], $3::text[]) AS t(team_id, kind, client_id)
  ON w.team_id = t.team_id AND w.kind = t.kind AND w.client_id = t.client_id
"""

ClaimKey = tuple[str, str, str]


async def claim_writes(
    conn: Conn, claims: Sequence[tuple[str, str, str, bytes]], by: str
) -> dict[ClaimKey, tuple[bool, bytes, datetime]]:
    """Register (team, kind, id, digest) claims at once. For each key: whether this
    statement registered it (new), the digest it holds and the system time of the
    write that holds it. Keys must be distinct (the caller checks)."""
    if not claims:
        return {}
    teams, kinds, ids, digests = (list(c) for c in zip(*claims, strict=True))
    new = {
        (r["team_id"], r["kind"], r["client_id"]): r["recorded_at"]
        for r in await conn.fetch(_CLAIM, teams, kinds, ids, digests, by)
    }
    out: dict[ClaimKey, tuple[bool, bytes, datetime]] = {}
    for key, digest in zip(zip(teams, kinds, ids, strict=True), digests, strict=True):
        if key in new:
            out[key] = (True, digest, new[key])
    if len(out) < len(claims):
        rest = [key for key in zip(teams, kinds, ids, strict=True) if key not in out]
        t, k, i = (list(c) for c in zip(*rest, strict=True))
        for r in await conn.fetch(_CLAIMED, t, k, i):
            out[(r["team_id"], r["kind"], r["client_id"])] = (
                False,
                bytes(r["payload_sha256"]),
                r["recorded_at"],
            )
    return out


async def allow_statement_time(conn: Conn, ms: int) -> None:
    """Raise the transaction's statement timeout to ``ms``: one COPY carries what
    hundreds of statements carried, each of which had the whole timeout."""
    await conn.execute("SELECT set_config('statement_timeout', $1, true)", f"{ms}ms")


async def existing_principals(conn: Conn, team: str, ids: Sequence[str]) -> set[str]:
    rows = await conn.fetch(
        "SELECT id FROM principals WHERE team_id = $1 AND id = ANY($2::text[])", team, list(ids)
    )
    return {r["id"] for r in rows}


# The tables a run writes, in an order that satisfies their foreign keys, with
# the columns given (the rest take their defaults: recorded_at is the
# transaction's time, as on the record-at-a-time path).
COPY_TABLES: dict[str, tuple[str, ...]] = {
    "sources": (
        "team_id",
        "id",
        "space_id",
        "generation",
        "kind",
        "title",
        "uri",
        "authority",
        "created_at",
        "recorded_by",
    ),
    "source_lifecycle_events": (
        "team_id",
        "space_id",
        "source_id",
        "event_id",
        "status",
        "reason",
        "recorded_by",
    ),
    "entities": (
        "team_id",
        "id",
        "space_id",
        "generation",
        "name",
        "kind",
        "aliases",
        "recorded_by",
    ),
    "evidence": (
        "team_id",
        "id",
        "space_id",
        "generation",
        "source_id",
        "content",
        "content_sha256",
        "observed_at",
        "recorded_by",
    ),
    "evidence_lifecycle_events": (
        "team_id",
        "space_id",
        "evidence_id",
        "event_id",
        "status",
        "reason",
        "recorded_by",
    ),
    "evidence_occurrences": (
        "team_id",
        "space_id",
        "evidence_id",
        "id",
        "quote",
        "span_start",
        "span_end",
    ),
    "evidence_entity_mentions": (
        "team_id",
        "space_id",
        "evidence_id",
        "entity_id",
        "occurrence_id",
    ),
    "relationships": (
        "team_id",
        "id",
        "space_id",
        "generation",
        "subject_entity_id",
        "predicate",
        "object_entity_id",
        "object_value",
        "object_unit",
        "polarity",
        "valid_from",
        "valid_to",
        "owner_principal_id",
        "semantic_group_key",
        "statement",
        "recorded_by",
    ),
    "relationship_status_events": (
        "team_id",
        "space_id",
        "relationship_id",
        "event_id",
        "status",
        "superseded_by",
        "reason",
        "recorded_by",
    ),
    "supports": (
        "team_id",
        "id",
        "space_id",
        "evidence_id",
        "relationship_id",
        "occurrence_id",
        "quote",
        "span_start",
        "span_end",
        "recorded_by",
    ),
    "support_decisions": (
        "team_id",
        "space_id",
        "support_id",
        "decision_id",
        "decision",
        "reason",
        "recorded_by",
    ),
    "evidence_embeddings": (
        "team_id",
        "space_id",
        "evidence_id",
        "model",
        "dimensions",
        "embedding",
    ),
    "relationship_embeddings": (
        "team_id",
        "space_id",
        "relationship_id",
        "projection_generation",
        "model",
        "dimensions",
        "embedding",
    ),
}


async def copy_rows(
    conn: Conn, table: str, rows: Sequence[tuple[Any, ...]], *, into: str | None = None
) -> None:
    """``COPY`` the rows into one of :data:`COPY_TABLES` (binary, one round trip), or
    into ``into``, a table of the same columns (a detached vector partition)."""
    if not rows:
        return
    await conn.copy_records_to_table(into or table, records=rows, columns=list(COPY_TABLES[table]))


# --- statistics inside a large batch ---------------------------------------------
#
# A key lookup by (team_id, space_id, id), as every foreign-key check of a
# copied row and the postings' guards (db/0115) make, is planned at its first
# use in a session. On a table without column statistics every equality is
# costed at the same default selectivity, so each index led by (team_id,
# space_id) looks as good as the unique key for a lookup of one row, and the
# planner takes the cheapest by size: a narrow one such as entities_space
# (team_id, space_id, generation) or relationships_object (team_id, space_id,
# object_entity_id), with the id as a mere filter. Each check then reads the
# whole space: a batch's checks grow with the square of the rows it puts into
# a space (docs/data-model.md, "Planner statistics on a new store", has the
# measurements). The refresh after a batch (analyze_stale) gives the next
# batches statistics; the batch that first fills a table, which may be large,
# is covered here. When a run copies more than PLANNED_PREFIX rows into some
# table, each table of it that a foreign key refers to and that has no column
# statistics gets its first PLANNED_PREFIX rows, then ANALYZE inside the
# batch's transaction (which counts the transaction's own new rows), then the
# rest; a table the run refers to without statistics is analysed first. The
# plans that read an analysed table are replaced at once in this session, so
# the bulk of the batch is checked by the unique key. Batches of at most
# PLANNED_PREFIX rows per table (the default 500 records make about 125) skip
# all of it: their checks are bounded by the prefix, and the refresh after the
# batch analyses what they filled.

PLANNED_PREFIX = 200
"""Rows per table above which a run first makes sure the tables it fills or refers
to have statistics; also the rows copied into such a table before it is analysed.
A check planned without statistics reads at most these rows of the batch."""

_UNPLANNED = """
SELECT c.relname::text AS name, c.relname = ANY($1::text[]) AS written
FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
  AND c.oid IN (
      SELECT f.confrelid FROM pg_constraint f
      WHERE f.contype = 'f'
        AND (f.confrelid::regclass::text = ANY($1::text[])
             OR f.conrelid::regclass::text = ANY($1::text[])))
  AND NOT EXISTS (SELECT 1 FROM pg_stats s
                  WHERE s.schemaname = 'public' AND s.tablename = c.relname)
"""


async def unplanned_tables(conn: Conn, tables: Sequence[str]) -> tuple[set[str], set[str]]:
    """Of ``tables`` (some of :data:`COPY_TABLES`) and the tables they refer to, those
    that a foreign key refers to and that have no column statistics, as (among
    ``tables``, referred to only). One statement."""
    rows = await conn.fetch(_UNPLANNED, list(tables))
    return (
        {r["name"] for r in rows if r["written"]},
        {r["name"] for r in rows if not r["written"]},
    )


async def analyze_in_batch(conn: Conn, tables: Sequence[str]) -> None:
    """ANALYZE the tables inside the caller's transaction, counting its own new rows.
    Never waits on another session: a table whose lock is held (autovacuum's or
    another batch's analysis) is skipped, and any other lock (pg_statistic's) is
    waited for at most :data:`ANALYZE_LOCK_TIMEOUT`, after which the batch goes on
    without the statistics (a savepoint keeps the transaction usable)."""
    if not tables:
        return
    try:
        async with conn.transaction():
            before = await conn.fetchval(
                "SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)",
                ANALYZE_LOCK_TIMEOUT,
            )
            await conn.execute(f"ANALYZE (SKIP_LOCKED) {', '.join(tables)}")
            await conn.execute("SELECT set_config('lock_timeout', $1, true)", before)
    except asyncpg.exceptions.LockNotAvailableError:
        pass  # rolled back to the savepoint, lock_timeout with it


async def copy_planned(conn: Conn, tables: dict[str, list[tuple[Any, ...]]]) -> None:
    """``COPY`` each table's rows, in the order given (that of :data:`COPY_TABLES`),
    with statistics before the bulk of a large run's foreign-key checks (see
    :data:`PLANNED_PREFIX`): one catalog query when a table gets more than that
    many rows, and an ANALYZE inside the transaction only where a table has no
    statistics at all."""
    if max((len(rows) for rows in tables.values()), default=0) <= PLANNED_PREFIX:
        for table, rows in tables.items():
            await copy_rows(conn, table, rows)
        return
    fills, refers = await unplanned_tables(conn, [t for t, rows in tables.items() if rows])
    await analyze_in_batch(conn, sorted(refers))
    for table, rows in tables.items():
        if table not in fills:
            await copy_rows(conn, table, rows)
            continue
        await copy_rows(conn, table, rows[:PLANNED_PREFIX])
        await analyze_in_batch(conn, [table])
        await copy_rows(conn, table, rows[PLANNED_PREFIX:])


# Tables of the gateway's schema whose planner statistics no longer describe
# them (see Staleness for the rules):
#  - holding rows but no statistics yet (never analysed, or analysed while
#    empty): after a batch only those referenced by a foreign key, see
#    analyze_stale; at the end of a load every such table;
#  - grown a lot since their statistics were taken: by pages (read from the
#    file's size, so a load that has just committed counts at once) or by rows
#    changed since the last analysis (from the cumulative statistics, which a
#    session reports up to a second or more after its commit, so they catch what
#    the next refresh sees). Autovacuum waits for 10 % more rows and comes round
#    once a minute; the batch rule is for the growth that makes plans wrong (a
#    store loaded small, then large), the end-of-load rule counts the last
#    batches about as autovacuum would.
# The tables are picked by one call of planner_stale_tables (db/0120): a table
# whose size cannot be read within its 100 ms lock timeout (another session
# holds ACCESS EXCLUSIVE on it: a migration, an ALTER, a detach) is left out,
# and the others are still picked. Then one statement, ANALYZE (SKIP_LOCKED) of
# all of them, sent outside any transaction block: PostgreSQL then analyses each
# table in a transaction of its own (checked on PostgreSQL 18: each table's
# pg_statistic rows carry another transaction's xmin; inside a transaction block
# they would share one), so each ANALYZE's lock is held while that one table is
# sampled, and the plans it invalidates are replaced as soon as it is done, not
# when the last table is. It never waits on another session's lock for a table:
# SKIP_LOCKED skips a table whose lock is held (a transaction that creates a
# space holds a conflicting lock on evidence and relationships until it commits,
# a loader's batch through its embedding) with a server warning, and the next
# refresh tries again; the connection's lock_timeout bounds any other wait (an
# index or pg_statistic locked by another session), which fails the statement:
# the tables analysed before it keep their statistics, the failure is logged (see
# WriteService.analyze_unplanned_tables). ANALYZE of a table the connecting role
# may not analyse is skipped by the server with a warning, not an error; those
# warnings are returned to the caller, which logs them.
GROWN_PAGES = 16
"""Pages (of 8 kB) a table must have grown by, besides doubling, before a
batch's refresh analyses it again: small tables are cheap to plan wrongly."""

GROWN_ROWS = 1000
"""Rows changed since the last analysis, besides as many as it counted."""


@dataclass(frozen=True, slots=True)
class Staleness:
    """When a table's statistics are stale enough to analyse it: pages on disk at
    least ``pages_factor`` times those last counted plus ``extra_pages``, or rows
    changed since the last analysis at least ``rows_factor`` times the rows it
    counted plus ``extra_rows``, or rows and no statistics at all (only for tables
    a foreign key references, unless ``every_unplanned``)."""

    pages_factor: float
    extra_pages: int
    rows_factor: float
    extra_rows: int
    every_unplanned: bool


AFTER_BATCH = Staleness(2.0, GROWN_PAGES, 1.0, GROWN_ROWS, every_unplanned=False)
"""After each loader batch: doubling, so that a load analyses each table about
log2(final size / first size) times."""

AT_LOAD_END = Staleness(1.1, 1, 0.1, 50, every_unplanned=True)
"""After a load's last batch (instead of :data:`AFTER_BATCH`): autovacuum's own
analyse threshold (10 % of the rows plus 50), so that the last batches are
counted and no table the load filled is left without statistics."""

LOCK_NOT_AVAILABLE = "55P03"
"""The SQLSTATE of the server's warning for a table ANALYZE (SKIP_LOCKED) skipped
because another session held its lock."""

ANALYZE_LOCK_TIMEOUT = "100ms"
"""How long the refresh's ANALYZE waits for a lock that SKIP_LOCKED does not
cover (an index's, pg_statistic's) before it gives up."""


async def stale_tables(conn: Conn, rule: Staleness) -> list[str]:
    """The tables of the gateway's schema that ``rule`` says to analyse (names
    as ``regclass`` prints them, quoted where needed); one statement."""
    rows = await conn.fetch(
        "SELECT t FROM planner_stale_tables($1, $2, $3, $4, $5) AS t",
        rule.pages_factor,
        rule.extra_pages,
        rule.rows_factor,
        rule.extra_rows,
        rule.every_unplanned,
    )
    return [r[0] for r in rows]


async def analyze_tables(conn: Conn, tables: Sequence[str], *, statement_timeout_ms: int) -> None:
    """ANALYZE (SKIP_LOCKED) the tables (names from :func:`stale_tables`) in one
    statement outside a transaction block, so that each table is analysed in a
    transaction of its own. ``conn`` must not be in a transaction. The statement
    gets ``statement_timeout_ms`` per table (one statement per table had that
    much each) and :data:`ANALYZE_LOCK_TIMEOUT`; both are set on the session
    and reset afterwards."""
    await conn.execute(
        "SELECT set_config('lock_timeout', $1, false), set_config('statement_timeout', $2, false)",
        ANALYZE_LOCK_TIMEOUT,
        f"{statement_timeout_ms * len(tables)}ms",
    )
    try:
        await conn.execute(f"ANALYZE (SKIP_LOCKED) {', '.join(tables)}")
    finally:
        await conn.execute("RESET lock_timeout; RESET statement_timeout")


async def analyze_stale(
    conn: Conn, rule: Staleness = AFTER_BATCH, *, statement_timeout_ms: int = 5000
) -> list[asyncpg.exceptions.PostgresLogMessage]:
    """Give the tables whose statistics ``rule`` finds stale new statistics, one
    table per transaction; return the server's warnings (tables it skipped:
    locked, or not the connecting role's to analyse). One statement, four when
    something is analysed (the selection; the session's timeouts, ANALYZE, their
    reset).

    Every inserted row's foreign-key check looks its parent up by key, e.g. a
    posting's evidence by (team_id, space_id, id). Without statistics the
    planner may cost another index led by (team_id, space_id), such as
    evidence_space (team_id, space_id, generation), like that unique key and
    check through it with the id a mere filter: each check then reads the whole
    space, and a first load into a new store grows quadratically until
    autovacuum analyses the table. docs/data-model.md ("Planner statistics on a
    new store") states when that plan was seen and when it was not. With
    statistics the unique key wins.

    It also analyses tables that have grown a lot since their statistics (see
    :class:`Staleness`). A recall plans its statements once per connection
    (``force_generic_plan``, gateway/services/recall.py) and keeps the plan until
    a table it reads is analysed: a plan made while the store was small (the
    hydration reading a whole space instead of looking its ids up) would
    otherwise outlive a large load until autovacuum analysed the table. ANALYZE
    invalidates the plans that read the table, in every session.
    """
    warnings: list[asyncpg.exceptions.PostgresLogMessage] = []

    def note(_conn: object, message: asyncpg.exceptions.PostgresLogMessage) -> None:
        warnings.append(message)

    tables = await stale_tables(conn, rule)
    if not tables:
        return warnings
    conn.add_log_listener(note)
    try:
        await analyze_tables(conn, tables, statement_timeout_ms=statement_timeout_ms)
    finally:
        conn.remove_log_listener(note)
    return warnings


# --- lanes of a pipelined load --------------------------------------------------

LANE_WAIT_S = 0.2
"""How long :func:`writer_lanes` waits for each pooled connection it takes."""

LANE_KEEP_FREE = 2
"""Pool connections :func:`writer_lanes` leaves to the rest of a load: the
statistics refresh after a batch and the next batch's look-ups run meanwhile."""


@contextlib.asynccontextmanager
async def writer_lanes(db: Database, count: int) -> AsyncIterator[list[Conn]]:
    """Up to ``count`` pooled connections for the batches of a pipelined load, held
    until the block ends. Any connections will do: each batch's transaction claims
    a counter shard no other transaction holds before it writes (db/0160,
    :func:`gateway.store.writes.claim_counter_shard`), so two batches in flight
    never upsert the same counter rows whatever their server processes. (Before
    db/0160 the shard was the process's, ``pg_backend_pid() % 8``, and lanes had
    to be picked of distinct shards.) Only what the pool can give beyond
    :data:`LANE_KEEP_FREE` is taken, never waiting long for a busy connection;
    fewer than two lanes is none (the load then runs one batch at a time)."""
    pool = db.pool
    room = pool.get_max_size() - (pool.get_size() - pool.get_idle_size()) - LANE_KEEP_FREE
    count = min(count, room)
    lanes: list[Conn] = []
    try:
        for _ in range(count if count >= 2 else 0):
            try:
                conn: Conn = await pool.acquire(timeout=LANE_WAIT_S)
            except TimeoutError:
                break
            lanes.append(conn)
        if len(lanes) < 2:
            for lane in lanes:
                await pool.release(cast(Any, lane))
            lanes.clear()
        yield lanes
    finally:
        for held in lanes:
            await pool.release(cast(Any, held))


@contextlib.asynccontextmanager
async def on_lane(db: Database, lane: Conn) -> AsyncIterator[Conn]:
    """A transaction as the connecting (owner) role on a lane of :func:`writer_lanes`,
    with the driver's failures translated as :meth:`Database.admin` translates them
    (a lost connection or server: ``DatabaseUnavailable``; a statement timeout:
    ``RequestTimeout``), so that a batch on a lane fails as one on a pooled
    connection does, not with the driver's own exception."""
    try:
        async with lane.transaction():
            yield lane
    except STORE_FAILURES as exc:
        db.note(exc)
        translated = translate(exc)
        if translated is exc:
            raise
        raise translated from exc


async def lock_blockers(conn: Conn, pid: int) -> list[int]:
    """The server processes that the backend ``pid`` is waiting for a lock of."""
    return list(await conn.fetchval("SELECT pg_blocking_pids($1)", pid))


async def transaction_start(conn: Conn) -> datetime:
    """The start of the current transaction: the system time (``now()``) every row
    it writes is stamped with."""
    return cast(datetime, await conn.fetchval("SELECT now()"))
