"""SQL of the persisted-query store (db/0008_persisted_queries.sql, per team since
db/0020_persisted_queries_per_team.sql)."""

from __future__ import annotations

from gateway.store.connection import Conn

# A hit refreshes last_used_at at most once a minute, so hot operations do not
# write on every request; the bound is least-recently-used at that grain.
_GET = """
WITH hit AS (
    SELECT team_id, sha256, document, last_used_at FROM persisted_queries
    WHERE team_id = $1 AND sha256 = $2
), touched AS (
    UPDATE persisted_queries p SET last_used_at = clock_timestamp()
    FROM hit WHERE p.team_id = hit.team_id AND p.sha256 = hit.sha256
      AND hit.last_used_at < clock_timestamp() - interval '1 minute'
)
SELECT document FROM hit
"""

# ``xmax = 0``: the row was inserted, not updated (PostgreSQL's usual upsert tell).
_PUT = """
INSERT INTO persisted_queries (team_id, sha256, document, principal_id) VALUES ($1, $2, $3, $4)
ON CONFLICT (team_id, sha256) DO UPDATE SET last_used_at = clock_timestamp()
RETURNING xmax = 0 AS inserted
"""

# Only the registering team's own entries are trimmed: no team, and no
# anonymous caller (who never registers), can push out another team's.
_TRIM = """
DELETE FROM persisted_queries WHERE team_id = $1 AND sha256 IN (
    SELECT sha256 FROM persisted_queries WHERE team_id = $1
    ORDER BY last_used_at DESC, sha256 OFFSET $2
)
"""


async def get(conn: Conn, team_id: str, sha256: str) -> str | None:
    document: str | None = await conn.fetchval(_GET, team_id, sha256)
    return document


async def put(
    conn: Conn, team_id: str, principal_id: str, sha256: str, document: str, *, max_entries: int
) -> None:
    """Store a team's operation, then drop the team's least recently used past
    ``max_entries``. Registering a kept document again only refreshes its last use
    (one statement: the team's count did not grow, so there is nothing to trim)."""
    async with conn.transaction():
        inserted = await conn.fetchval(_PUT, team_id, sha256, document, principal_id)
        if inserted:
            await conn.execute(_TRIM, team_id, max_entries)


async def count(conn: Conn, team_id: str | None = None) -> int:
    if team_id is None:
        n: int = await conn.fetchval("SELECT count(*) FROM persisted_queries")
    else:
        n = await conn.fetchval(
            "SELECT count(*) FROM persisted_queries WHERE team_id = $1", team_id
        )
    return n
