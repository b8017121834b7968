"""SQL of the persisted-query store (db/0008_persisted_queries.sql)."""

from __future__ import annotations

from gateway.store.connection import Conn

# A hit refreshes last_used_at at most once a minute, so hot operations do not
# write on every request; the bound is least-recently-used at that grain.
_GET = """
WITH hit AS (
    SELECT sha256, document, last_used_at FROM persisted_queries WHERE sha256 = $1
), touched AS (
    UPDATE persisted_queries p SET last_used_at = clock_timestamp()
    FROM hit WHERE p.sha256 = hit.sha256
      AND hit.last_used_at < clock_timestamp() - interval '1 minute'
)
SELECT document FROM hit
"""

_PUT = """
INSERT INTO persisted_queries (sha256, document) VALUES ($1, $2)
ON CONFLICT (sha256) DO UPDATE SET last_used_at = clock_timestamp()
"""

_TRIM = """
DELETE FROM persisted_queries WHERE sha256 IN (
    SELECT sha256 FROM persisted_queries ORDER BY last_used_at DESC, sha256 OFFSET $1
)
"""


async def get(conn: Conn, sha256: str) -> str | None:
    document: str | None = await conn.fetchval(_GET, sha256)
    return document


async def put(conn: Conn, sha256: str, document: str, *, max_entries: int) -> None:
    """Store an operation, then drop the least recently used past ``max_entries``."""
    await conn.execute(_PUT, sha256, document)
    await conn.execute(_TRIM, max_entries)


async def count(conn: Conn) -> int:
    n: int = await conn.fetchval("SELECT count(*) FROM persisted_queries")
    return n
