"""SQL of a load that builds a space's vector index after its rows (``load --index-after``).

Each space's vectors live in its own partition of ``evidence_embeddings`` and
``relationship_embeddings`` (db/0001), each with an HNSW index. Inserting
vectors one by one into a growing graph costs about ten times what building
the same graph from the finished table costs (25,000 vectors: 266.5 s of inserts
against 21.6 s for ``CREATE INDEX``). So a load into an *empty* space may detach
the space's two partitions, drop their (empty) HNSW indexes, copy its vectors
into the detached tables, and at the end build each index and attach the table
again; PostgreSQL adopts the matching index instead of building another.

The state lives in the catalogue only, so it survives a crash as it stands: a
vector table of a space that is not a partition is *deferred*. Each step is
transactional (a batch's detach commits with its rows; an index build commits
with its attach), so a load that dies leaves either an attached partition or
a detached table holding every committed vector, never something between, and
:func:`build_and_attach` can finish the work later.

The loader runs as the owner of the tables (it copies rows under row-level
security, which only the owner may), so detaching, attaching and building
indexes need no other privilege. The application role has no grant on a
partition itself: a detached table is unreadable to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from uuid import UUID

from gateway.store.connection import Conn

VECTOR_TABLES = ("evidence_embeddings", "relationship_embeddings")

_DEFERRED = re.compile(r"^(evidence_embeddings|relationship_embeddings)_([0-9a-f]{32})$")


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


async def _is_partition(conn: Conn, table: str) -> bool | None:
    """Whether ``table`` is attached; None when there is no such table."""
    value = await conn.fetchval(
        "SELECT c.relispartition FROM pg_class c WHERE c.oid = to_regclass($1)", table
    )
    return None if value is None else bool(value)


async def defer_space(conn: Conn, space: UUID) -> bool:
    """Inside a loader batch's transaction, before it stores the space's vectors:
    detach the space's vector partitions if they are attached and empty. Returns
    False (having changed nothing the caller keeps: it must roll back) when a
    partition already holds vectors, which readers can find and which must not
    vanish from their vector list. Already deferred: nothing to do.

    ``DETACH PARTITION`` locks the parent tables until the batch commits, as the
    creation of a space's partitions does; it happens once per space."""
    for parent in VECTOR_TABLES:
        table = partition_name(parent, space)
        attached = await _is_partition(conn, table)
        if attached is None:
            raise LookupError(f"no vector table {table}")
        if not attached:
            continue
        # Detach first: its lock keeps any other writer out between the check and
        # the detach, and the caller's rollback undoes it when the check fails.
        await conn.execute(f'ALTER TABLE {parent} DETACH PARTITION "{table}"')
        if await conn.fetchval(f'SELECT EXISTS (SELECT 1 FROM "{table}")'):
            return False
        for name in await _hnsw_indexes(conn, table):
            await conn.execute(f'DROP INDEX "{name}"')
    return True


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


async def deferred(conn: Conn) -> list[Deferred]:
    """Every detached vector table of this schema, with its row count, in a
    stable order (evidence first, then relationships, by space)."""
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_class c "
        "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' "
        "AND NOT c.relispartition "
        "AND c.relname ~ '^(evidence|relationship)_embeddings_[0-9a-f]{32}$' "
        "ORDER BY c.relname"
    )
    out: list[Deferred] = []
    for row in rows:
        match = _DEFERRED.match(row["relname"])
        if match is None:  # pragma: no cover - the query matched the same pattern
            continue
        count = await conn.fetchval(f'SELECT count(*) FROM "{row["relname"]}"')
        out.append(Deferred(match.group(1), row["relname"], UUID(hex=match.group(2)), count))
    return out


async def is_deferred(conn: Conn, space: UUID) -> bool:
    """Whether the space's vectors are held in detached tables."""
    for parent in VECTOR_TABLES:
        if await _is_partition(conn, partition_name(parent, space)) is False:
            return True
    return False


async def build_and_attach(
    conn: Conn, item: Deferred, *, maintenance_work_mem_mb: int, workers: int
) -> None:
    """In one transaction (the caller's): build the parent's HNSW index on the
    detached table with the build's memory and parallel workers, then attach it.
    A crash before the commit leaves the table detached, as before."""
    await conn.execute(
        "SELECT set_config('maintenance_work_mem', $1, true), "
        "set_config('max_parallel_maintenance_workers', $2, true), "
        "set_config('statement_timeout', '0', true)",
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
