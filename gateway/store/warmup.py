"""The statements of the start-up warm-up (gateway/services/warmup.py).

The server's files are read with ``pg_read_binary_file``, chunk by chunk, so that
the operating system's page cache holds them before the first recalls ask: a
cold store answers its first vector walks from random disk reads (about 8,000
blocks a walk at 100,000 vectors a space), while the same files read in order
come off the disk at its sequential speed. pg_prewarm, which would load them
into shared buffers instead, is not part of the embedded server's build; the
buffers fill from the page cache at the first recalls, cheaply.

``pg_read_binary_file`` needs a superuser (the embedded server's login) or a
role granted ``pg_read_server_files`` and ``EXECUTE`` on the function: a login
without them gets :class:`WarmUpRefused`, and the gateway runs cold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from gateway.store.connection import Conn

__all__ = [
    "RelationFile",
    "WarmUpRefused",
    "close",
    "connect",
    "effective_cache_bytes",
    "lock",
    "read_chunk",
    "relations",
    "segment_bytes",
    "shared_buffers_bytes",
]

# The store's relations (main forks; not the system catalogs, which every
# session reads anyway) in the order they are worth reading: the HNSW indexes of
# the vector partitions (every walk reads most of its graph, about 8,000 blocks
# at 100,000 vectors, at random), then the partitions' rows (a walk fetches the
# rows it returns), then every other table and index, smallest first (a
# recall reads a few pages of each table it hydrates from; a page of a small
# relation is likelier to be asked for than one of a large one, and the largest,
# the postings' indexes, come last). Partitioned parents ('p', 'I') have no files.
_RELATIONS = """
WITH hnsw AS (
    SELECT i.indexrelid AS index_oid, i.indrelid AS table_oid
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_am am ON am.oid = c.relam AND am.amname = 'hnsw'
),
relations AS (
    SELECT c.oid,
           CASE WHEN c.oid IN (SELECT index_oid FROM hnsw) THEN 0
                WHEN c.oid IN (SELECT table_oid FROM hnsw) THEN 1
                ELSE 2 END AS kind
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'i', 'm', 't') AND c.relpersistence = 'p'
      AND n.nspname NOT IN ('pg_catalog', 'information_schema')
      AND c.oid >= 16384  -- FirstNormalObjectId: not the catalogs' TOAST either
)
SELECT oid::regclass::text AS name, pg_relation_filepath(oid) AS path,
       pg_relation_size(oid) AS size
FROM relations
WHERE pg_relation_filepath(oid) IS NOT NULL AND pg_relation_size(oid) > 0
ORDER BY kind, CASE WHEN kind < 2 THEN -pg_relation_size(oid) ELSE pg_relation_size(oid) END, oid
"""

_SEGMENT_BYTES = """
SELECT (SELECT setting::bigint FROM pg_settings WHERE name = 'segment_size')
     * (SELECT setting::bigint FROM pg_settings WHERE name = 'block_size')
"""

_EFFECTIVE_CACHE_BYTES = """
SELECT (SELECT setting::bigint FROM pg_settings WHERE name = 'effective_cache_size')
     * (SELECT setting::bigint FROM pg_settings WHERE name = 'block_size')
"""

_SHARED_BUFFERS_BYTES = """
SELECT (SELECT setting::bigint FROM pg_settings WHERE name = 'shared_buffers')
     * (SELECT setting::bigint FROM pg_settings WHERE name = 'block_size')
"""

# missing_ok: a relation rewritten or dropped since it was listed is skipped.
_READ_CHUNK = "SELECT coalesce(length(pg_read_binary_file($1, $2, $3, true)), 0)"


async def connect(dsn: str, statement_timeout_ms: int) -> asyncpg.Connection:
    """The warm-up's own connection, outside the request pool: a warm-up takes
    seconds to minutes (and waits for another process's as long), and a pool
    connection held that long starved requests of a small pool (they timed out
    waiting for one). Same server settings as the pool's connections
    (gateway/store/database.py), bar the codecs, which its statements do not need."""
    return await asyncpg.connect(
        dsn,
        timeout=10,
        server_settings={
            "application_name": "recall-gateway warm-up",
            "statement_timeout": str(statement_timeout_ms),
        },
    )


async def close(conn: asyncpg.Connection) -> None:
    """Close the warm-up's connection (its session lock goes with it), also when
    the warm-up is cancelled in the middle of a statement: then the connection
    is cut, not waited for."""
    try:
        await conn.close(timeout=5)
    except asyncio.CancelledError:
        conn.terminate()
        raise
    except Exception:  # a connection cut mid-statement: nothing left to say to it
        conn.terminate()


class WarmUpRefused(Exception):
    """The login may not read the server's files."""


@dataclass(frozen=True)
class RelationFile:
    """A relation's main fork: its name, its path in the data directory, its size."""

    name: str
    path: str
    size: int


async def relations(conn: Conn) -> list[RelationFile]:
    """The store's relations in warm-up order (see ``_RELATIONS``)."""
    rows = await conn.fetch(_RELATIONS)
    return [RelationFile(r["name"], r["path"], int(r["size"])) for r in rows]


async def segment_bytes(conn: Conn) -> int:
    """The size of one file of a relation (1 GB unless the server was built otherwise)."""
    return int(await conn.fetchval(_SEGMENT_BYTES))


async def effective_cache_bytes(conn: Conn) -> int:
    """The server's effective_cache_size in bytes (the warm-up's default budget)."""
    return int(await conn.fetchval(_EFFECTIVE_CACHE_BYTES))


async def shared_buffers_bytes(conn: Conn) -> int:
    """The server's shared_buffers in bytes (memory the page cache cannot use)."""
    return int(await conn.fetchval(_SHARED_BUFFERS_BYTES))


async def read_chunk(conn: Conn, path: str, offset: int, length: int) -> int:
    """Read ``length`` bytes of the file at ``offset`` (server side; only the
    count comes back). Returns the bytes read (0 past the end or if the file
    is gone)."""
    try:
        return int(await conn.fetchval(_READ_CHUNK, path, offset, length))
    except asyncpg.InsufficientPrivilegeError as exc:
        raise WarmUpRefused(str(exc)) from exc


# One process warms a store at a time (several uvicorn workers, replicas of the
# gateway on one server): the others wait for it (on their own warm-up
# connection, not a pool's) instead of reading it at the same time. The lock
# only keeps runs apart: a process that gets the lock after another's warm-up
# (it waited, or it started late: a worker respawned) reads everything again,
# cheaply since the files are cached by then, because the lock cannot tell a
# warm-up that finished from one whose process died halfway.
LOCK_KEY = 0x7761726D  # "warm"


async def lock(conn: Conn, waiting: Callable[[], None] | None = None) -> bool:
    """Take the store's warm-up lock (session level), waiting for it as long as
    another process holds it (the statement timeout lifted for the wait). True
    if it was free at once; False if another process held it (which finished,
    or stopped halfway: it cannot be told here).
    ``waiting`` is called before the wait (so /readyz can say why it waits)."""
    if await conn.fetchval("SELECT pg_try_advisory_lock($1::bigint)", LOCK_KEY):
        return True
    if waiting is not None:
        waiting()
    await conn.execute("SET statement_timeout = 0")
    try:
        await conn.execute("SELECT pg_advisory_lock($1::bigint)", LOCK_KEY)
    finally:
        await conn.execute("RESET statement_timeout")
    return False
