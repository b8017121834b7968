"""SQL of a load that builds a space's vector index after its rows (``load --index-after``).

Each space's vectors live in its own partition of ``evidence_embeddings`` and
``relationship_embeddings`` (db/0001), each with an HNSW index. Inserting
vectors one by one into a growing graph costs about ten times what building
the same graph from the finished table costs (25,000 vectors: 266.5 s of inserts
against 21.6 s for ``CREATE INDEX``). So a load into an *empty* space may detach
the space's two partitions, drop their (empty) HNSW indexes, copy its vectors
into the detached tables, and at the end build each index and attach the table
again; PostgreSQL adopts the matching index instead of building another.

The state is kept in ``vector_deferrals`` (db/0083), changed in the same
transaction as the DDL it records, so it survives a crash as it stands: a
space with a row there has its vector tables detached (or one of them, while a
build is half done). Only those tables are ever built and attached. A load
that dies leaves either an attached partition or a detached table holding
every committed vector, never something between, and :func:`build_and_attach`
can finish the work later.

Locks. ``DETACH PARTITION`` takes ACCESS EXCLUSIVE on the parent, which every
team's recall reads. :func:`detach` therefore runs in a transaction of its own,
not in a loader batch, and waits at most :data:`DETACH_LOCK_TIMEOUT` for the
parents (a waiting ACCESS EXCLUSIVE request queues every new reader behind
it); the caller retries. ``ATTACH`` takes only SHARE UPDATE EXCLUSIVE on the
parent. A per-space advisory lock (:func:`try_hold_filling`, shared, held by
each load filling the space for its lifetime; :func:`try_hold_building`,
exclusive, held by a build) keeps a build from attaching a space that a
running load is still filling.

The loader runs as the owner of the tables (it copies rows under row-level
security, which only the owner may), so detaching, attaching and building
indexes need no other privilege. The application role has no grant on a
partition itself: a detached table is unreadable to it.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from gateway.store.connection import Conn

if TYPE_CHECKING:  # the database module imports this one (through migrations)
    from gateway.store.database import Database

VECTOR_TABLES = ("evidence_embeddings", "relationship_embeddings")

# How long a detach may wait for the parents' lock before it gives up and the
# caller retries: every recall queues behind a waiting ACCESS EXCLUSIVE request.
DETACH_LOCK_TIMEOUT = "100ms"

# First key of the per-space advisory locks (the second is the space's hash);
# an arbitrary constant, unlike the migration runner's and reembed's keys.
_SPACE_LOCK = 720_261_083

# (team, space, kind, owner) of the spaces of vector_deferrals, for messages.
_DEFERRED_SPACES = (
    "SELECT d.team_id, d.space_id, s.kind, s.owner_principal_id FROM vector_deferrals d "
    "JOIN memory_spaces s ON s.team_id = d.team_id AND s.id = d.space_id "
    "ORDER BY d.team_id, d.space_id"
)


FINISH = "recall-gateway build-vector-indexes"


def pending_message(spaces: list[DeferredSpace]) -> str:
    """Names the spaces whose vectors wait, and the command that finishes them."""
    shown = ", ".join(str(s) for s in spaces[:5])
    more = f" and {len(spaces) - 5} more" if len(spaces) > 5 else ""
    return (
        f"the vectors of {len(spaces)} space(s) wait in detached tables for their index "
        f"({shown}{more}): run '{FINISH}' first (it skips a space a running "
        "'load --index-after' still fills: let that load end)"
    )


def partition_name(parent: str, space: UUID) -> str:
    """The name db/0001's trigger gives the space's partition of ``parent``."""
    return f"{parent}_{space.hex}"


@dataclass(frozen=True, slots=True)
class Deferred:
    """A detached vector table waiting for its index: its parent, space and rows."""

    parent: str
    table: str
    space: UUID
    rows: int


@dataclass(frozen=True, slots=True)
class DeferredSpace:
    """A space whose vectors wait in detached tables, named as users name it."""

    team: str
    space: UUID
    ref: str  # "shared" or "private:<owner>"

    def __str__(self) -> str:
        return f"space '{self.ref}' of team '{self.team}'"


class Detach(enum.Enum):
    """What :func:`detach` found."""

    DETACHED = "detached"  # by this call or an earlier one
    HAS_VECTORS = "has_vectors"  # a partition holds vectors readers find: nothing changed
    REEMBED_RUNNING = "reembed_running"  # a re-embed would miss detached vectors


async def _is_partition(conn: Conn, table: str) -> bool | None:
    """Whether ``table`` is attached; None when there is no such table."""
    value = await conn.fetchval(
        "SELECT c.relispartition FROM pg_class c WHERE c.oid = to_regclass($1)", table
    )
    return None if value is None else bool(value)


async def attached_state(conn: Conn, space: UUID) -> tuple[bool, bool]:
    """(both partitions attached, either holds vectors), without a lock: the caller
    decides from it whether a detach is worth trying (:func:`detach` checks again
    under the lock)."""
    attached, full = True, False
    for parent in VECTOR_TABLES:
        table = partition_name(parent, space)
        state = await _is_partition(conn, table)
        if state is None:
            raise LookupError(f"no vector table {table}")
        attached = attached and state
        if state and await conn.fetchval(f'SELECT EXISTS (SELECT 1 FROM "{table}")'):
            full = True
    return attached, full


async def wait_briefly_for_locks(conn: Conn) -> None:
    """For the rest of the caller's transaction, wait at most
    :data:`DETACH_LOCK_TIMEOUT` for any lock (asyncpg's LockNotAvailableError
    then: retry). For a transaction that creates spaces, whose partitions take
    SHARE UPDATE EXCLUSIVE on the parents and, for their foreign keys, SHARE ROW
    EXCLUSIVE on the tables they reference (db/0102): a request waiting for
    either queues the sessions it conflicts with (writers of evidence and
    relationships, a detach) behind it."""
    await conn.execute("SELECT set_config('lock_timeout', $1, true)", DETACH_LOCK_TIMEOUT)


async def detach(conn: Conn, team: str, space: UUID) -> Detach:
    """In the caller's transaction, which should hold nothing else: detach the
    space's vector partitions if they are attached and empty, drop their (empty)
    HNSW indexes and record the deferral. The parents' lock is taken first, with
    :data:`DETACH_LOCK_TIMEOUT` (asyncpg's LockNotAvailableError when it runs
    out: retry), so the checks that follow (still attached, still empty, no
    re-embed running) and the detach see one state that no writer can change."""
    await conn.execute("SELECT set_config('lock_timeout', $1, true)", DETACH_LOCK_TIMEOUT)
    await conn.execute(
        "LOCK TABLE evidence_embeddings, relationship_embeddings IN ACCESS EXCLUSIVE MODE"
    )
    if await reembed_running(conn):
        return Detach.REEMBED_RUNNING
    tables = []
    for parent in VECTOR_TABLES:
        table = partition_name(parent, space)
        attached = await _is_partition(conn, table)
        if attached is None:
            raise LookupError(f"no vector table {table}")
        if attached:
            if await conn.fetchval(f'SELECT EXISTS (SELECT 1 FROM "{table}")'):
                return Detach.HAS_VECTORS
            tables.append((parent, table))
    for parent, table in tables:
        await conn.execute(f'ALTER TABLE {parent} DETACH PARTITION "{table}"')
        for name in await _hnsw_indexes(conn, table):
            await conn.execute(f'DROP INDEX "{name}"')
    await conn.execute(
        "INSERT INTO vector_deferrals (team_id, space_id) VALUES ($1, $2) "
        "ON CONFLICT (team_id, space_id) DO NOTHING",
        team,
        space,
    )
    return Detach.DETACHED


async def reembed_running(conn: Conn) -> bool:
    """Whether a re-embed run is under way (or interrupted: it resumes), which
    would neither see nor re-embed vectors held in detached tables."""
    return bool(
        await conn.fetchval("SELECT EXISTS (SELECT 1 FROM reembed_runs WHERE status = 'running')")
    )


async def deferred_spaces(conn: Conn) -> list[DeferredSpace]:
    """Every space whose vectors wait in detached tables, for refusals' messages."""
    if not await conn.fetchval("SELECT to_regclass('vector_deferrals') IS NOT NULL"):
        return []  # a store older than db/0083 (the migration runner asks first)
    return [
        DeferredSpace(
            r["team_id"],
            r["space_id"],
            "shared" if r["kind"] == "shared" else f"private:{r['owner_principal_id']}",
        )
        for r in await conn.fetch(_DEFERRED_SPACES)
    ]


# The vector tables that a `load --index-after` from before db/0083 detached:
# named like a space's partition, a plain table (not a partition), of a space that
# has no partition of that parent any more, with the parent's columns and a
# primary key (what DETACH PARTITION leaves; a copy made with CREATE TABLE ... AS
# has no constraint), and not yet recorded in vector_deferrals.
_UNRECORDED = """
SELECT DISTINCT s.team_id, s.id AS space_id
FROM memory_spaces s
CROSS JOIN unnest($1::text[]) AS p(parent)
JOIN pg_class c ON c.oid = to_regclass(quote_ident(p.parent || '_' || replace(s.id::text, '-', '')))
WHERE c.relkind = 'r' AND NOT c.relispartition
  AND NOT EXISTS (SELECT 1 FROM vector_deferrals d WHERE d.team_id = s.team_id AND d.space_id = s.id)
  AND NOT EXISTS (
      SELECT 1 FROM pg_inherits i JOIN pg_class pc ON pc.oid = i.inhrelid
      WHERE i.inhparent = to_regclass(p.parent)
        AND pg_get_expr(pc.relpartbound, pc.oid) = format('FOR VALUES IN (%L)', s.id))
  AND EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'p')
  AND (SELECT array_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attname)
         FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
    = (SELECT array_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attname)
         FROM pg_attribute a WHERE a.attrelid = to_regclass(p.parent) AND a.attnum > 0
          AND NOT a.attisdropped)
ORDER BY 1, 2
"""


async def record_unrecorded(conn: Conn) -> list[DeferredSpace]:
    """In the caller's transaction: record in ``vector_deferrals`` the spaces whose
    vector tables a ``load --index-after`` detached before db/0083 existed (that
    load kept no record: the catalogue was its state). Without the row nothing
    would ever build and attach them, the space would refuse every write
    (VECTOR_INDEX_PENDING, no partition) and a migration would change the parents
    without them. Only tables that cannot be anything else are taken (see
    ``_UNRECORDED``); a store older than db/0083 records nothing (its table is
    made by that migration, and the runner asks again after it)."""
    if not await conn.fetchval("SELECT to_regclass('vector_deferrals') IS NOT NULL"):
        return []
    rows = await conn.fetch(_UNRECORDED, list(VECTOR_TABLES))
    for r in rows:
        await conn.execute(
            "INSERT INTO vector_deferrals (team_id, space_id) VALUES ($1, $2) "
            "ON CONFLICT (team_id, space_id) DO NOTHING",
            r["team_id"],
            r["space_id"],
        )
    recorded = {(r["team_id"], r["space_id"]) for r in rows}
    return [s for s in await deferred_spaces(conn) if (s.team, s.space) in recorded]


async def space_reference(conn: Conn, space: UUID) -> tuple[str, str]:
    """(team, ``shared`` or ``private:<owner>``) of a space, for messages."""
    row = await conn.fetchrow(
        "SELECT team_id, kind, owner_principal_id FROM memory_spaces WHERE id = $1", space
    )
    if row is None:
        raise LookupError(f"no space {space}")
    ref = "shared" if row["kind"] == "shared" else f"private:{row['owner_principal_id']}"
    return row["team_id"], ref


async def _hnsw_indexes(conn: Conn, table: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = to_regclass($1) "
        "AND a.amname = 'hnsw' ORDER BY c.relname",
        table,
    )
    return [r["relname"] for r in rows]


async def deferred(conn: Conn, spaces: set[UUID] | None = None) -> list[Deferred]:
    """The detached vector tables of the recorded deferrals (of ``spaces`` only,
    when given), with their row counts, in a stable order (by space, evidence
    first). Counting a large table takes longer than a request may, so the
    caller's transaction has no statement timeout here."""
    out: list[Deferred] = []
    if not await conn.fetchval("SELECT to_regclass('vector_deferrals') IS NOT NULL"):
        return out  # a store older than db/0083
    await conn.execute("SELECT set_config('statement_timeout', '0', true)")
    for row in await conn.fetch("SELECT space_id FROM vector_deferrals ORDER BY space_id"):
        space: UUID = row["space_id"]
        if spaces is not None and space not in spaces:
            continue
        for parent in VECTOR_TABLES:
            table = partition_name(parent, space)
            if await _is_partition(conn, table) is False:
                count = await conn.fetchval(f'SELECT count(*) FROM "{table}"')
                out.append(Deferred(parent, table, space, int(count)))
    return out


async def try_hold_filling(conn: Conn, space: UUID) -> bool:
    """Session-level, shared: a load fills the space (several loads may). False
    while a build holds the space."""
    return bool(
        await conn.fetchval(
            "SELECT pg_try_advisory_lock_shared($1, hashtext($2::uuid::text))", _SPACE_LOCK, space
        )
    )


async def release_filling(conn: Conn, space: UUID) -> None:
    await conn.execute(
        "SELECT pg_advisory_unlock_shared($1, hashtext($2::uuid::text))", _SPACE_LOCK, space
    )


async def try_hold_building(conn: Conn, space: UUID) -> bool:
    """Session-level, exclusive: a build of the space. False while a load fills it
    (or another build runs)."""
    return bool(
        await conn.fetchval(
            "SELECT pg_try_advisory_lock($1, hashtext($2::uuid::text))", _SPACE_LOCK, space
        )
    )


async def release_building(conn: Conn, space: UUID) -> None:
    await conn.execute(
        "SELECT pg_advisory_unlock($1, hashtext($2::uuid::text))", _SPACE_LOCK, space
    )


async def build_and_attach(
    conn: Conn, item: Deferred, *, maintenance_work_mem_mb: int, workers: int
) -> bool:
    """In one transaction (the caller's, holding the space's build lock): build
    the parent's HNSW index on the detached table with the build's memory and
    parallel workers, attach it, and close the deferral once both tables are
    attached. False (nothing done) when the table is attached already. A crash
    before the commit leaves the table detached, as before; a client that
    vanishes (killed) stops the server's build within a second
    (``client_connection_check_interval``) instead of leaving it running."""
    if await _is_partition(conn, item.table) is not False:
        return False
    await conn.execute(
        "SELECT set_config('maintenance_work_mem', $1, true), "
        "set_config('max_parallel_maintenance_workers', $2, true), "
        "set_config('statement_timeout', '0', true), "
        "set_config('client_connection_check_interval', '1s', true)",
        f"{maintenance_work_mem_mb}MB",
        str(workers),
    )
    for name, definition in await _parent_hnsw(conn, item.parent):
        index = f"{item.table}_{name.removeprefix(item.parent + '_')}"[:63]
        using = definition.split(" USING ", 1)[1]
        await conn.execute(f'CREATE INDEX IF NOT EXISTS "{index}" ON "{item.table}" USING {using}')
    await conn.execute(
        f"ALTER TABLE {item.parent} ATTACH PARTITION \"{item.table}\" FOR VALUES IN ('{item.space}')"
    )
    await close_deferral(conn, item.space)
    return True


async def close_deferral(conn: Conn, space: UUID) -> None:
    """Forget the space's deferral once both its vector tables are attached. Run by
    each build (:func:`build_and_attach`), and again once two builds of the space
    that ran at once have both committed: each saw the other's table detached."""
    still = [
        t
        for t in (partition_name(p, space) for p in VECTOR_TABLES)
        if await _is_partition(conn, t) is False
    ]
    if not still:
        await conn.execute("DELETE FROM vector_deferrals WHERE space_id = $1", space)


@contextlib.asynccontextmanager
async def spare_connection(db: Database, keep_free: int = 1) -> AsyncIterator[Conn | None]:
    """A second pooled connection for a build that runs beside another, or None when
    the pool has no room for it beyond ``keep_free`` (the progress watcher's):
    never waits for a busy one."""
    pool = db.pool
    room = pool.get_max_size() - (pool.get_size() - pool.get_idle_size()) - keep_free
    if room < 1:
        yield None
        return
    try:
        conn: Conn = await pool.acquire(timeout=0.2)
    except TimeoutError:
        yield None
        return
    try:
        yield conn
    finally:
        await pool.release(cast(Any, conn))


async def reattach_if_empty(conn: Conn, space: UUID) -> bool:
    """In the caller's transaction, which should hold nothing else: undo a detach
    whose tables never received a vector (the batch it was made for was refused).
    Each detached table is locked first, waiting at most
    :data:`DETACH_LOCK_TIMEOUT` (asyncpg's LockNotAvailableError: retry), so that
    no load can copy vectors in between the check and the attach; then its (empty)
    HNSW index is built, the table attached and the deferral closed, as
    :func:`build_and_attach` does. False, and nothing changed, when a table holds
    rows (another load filled it: the space stays deferred)."""
    await conn.execute("SELECT set_config('lock_timeout', $1, true)", DETACH_LOCK_TIMEOUT)
    detached = [
        (parent, partition_name(parent, space))
        for parent in VECTOR_TABLES
        if await _is_partition(conn, partition_name(parent, space)) is False
    ]
    for _parent, table in detached:
        await conn.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
        if await conn.fetchval(f'SELECT EXISTS (SELECT 1 FROM "{table}")'):
            return False
    for parent, table in detached:
        await build_and_attach(
            conn, Deferred(parent, table, space, 0), maintenance_work_mem_mb=64, workers=0
        )
    await conn.execute("DELETE FROM vector_deferrals WHERE space_id = $1", space)
    return True


async def _parent_hnsw(conn: Conn, parent: str) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT c.relname, pg_get_indexdef(c.oid) AS ddl FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam "
        "WHERE i.indrelid = to_regclass($1) AND a.amname = 'hnsw' ORDER BY c.relname",
        parent,
    )
    return [(r["relname"], r["ddl"]) for r in rows]


async def index_build_progress(conn: Conn, table: str) -> int | None:
    """Tuples the running ``CREATE INDEX`` on ``table`` has put into its graph
    (pgvector reports them in ``pg_stat_progress_create_index``), or None."""
    value = await conn.fetchval(
        "SELECT tuples_done FROM pg_stat_progress_create_index WHERE relid = to_regclass($1)",
        table,
    )
    return None if value is None else int(value)
