"""Token lookup: the one tenant-independent read, done before the team is known."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from gateway.store.connection import Conn

_CALLER_SQL = """
SELECT t.secret_sha256, t.binding, t.expires_at, t.revoked_at,
       p.team_id, tm.name AS team_name, p.id AS principal_id, p.display_name, p.kind,
       (SELECT s.id FROM memory_spaces s
         WHERE s.team_id = p.team_id AND s.kind = 'shared') AS shared_space_id,
       (SELECT s.id FROM memory_spaces s
         WHERE s.team_id = p.team_id AND s.kind = 'private'
           AND s.owner_principal_id = p.id) AS private_space_id
FROM api_tokens t
JOIN principals p ON p.team_id = t.team_id AND p.id = t.principal_id
JOIN teams tm ON tm.id = p.team_id
WHERE t.id = $1
"""


@dataclass(frozen=True, slots=True)
class TokenRow:
    secret_sha256: bytes
    binding: str
    expires_at: datetime | None
    revoked_at: datetime | None
    team_id: str
    team_name: str
    principal_id: str
    display_name: str
    kind: str
    shared_space_id: UUID
    private_space_id: UUID | None


async def find_token(conn: Conn, token_id: str) -> TokenRow | None:
    row = await conn.fetchrow(_CALLER_SQL, token_id)
    return TokenRow(**dict(row)) if row else None


async def revoke_token(conn: Conn, token_id: str) -> datetime | None:
    """Revoke a token; its revocation time (the earlier one when it already was
    revoked), or None when there is no such token."""
    revoked: datetime | None = await conn.fetchval(
        "WITH now_revoked AS (UPDATE api_tokens SET revoked_at = now() "
        "WHERE id = $1 AND revoked_at IS NULL RETURNING revoked_at) "
        "SELECT revoked_at FROM now_revoked "
        "UNION ALL SELECT revoked_at FROM api_tokens WHERE id = $1 AND revoked_at IS NOT NULL",
        token_id,
    )
    return revoked


@dataclass(frozen=True, slots=True)
class TokenListing:
    """What an operator may see of a token: never its secret nor its hash."""

    id: str
    team_id: str
    principal_id: str
    binding: str
    label: str | None
    recorded_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


async def list_tokens(
    conn: Conn, team: str | None = None, principal: str | None = None
) -> list[TokenListing]:
    rows = await conn.fetch(
        "SELECT id, team_id, principal_id, binding, label, recorded_at, expires_at, revoked_at "
        "FROM api_tokens WHERE ($1::text IS NULL OR team_id = $1) "
        "AND ($2::text IS NULL OR principal_id = $2) "
        "ORDER BY team_id, principal_id, recorded_at, id",
        team,
        principal,
    )
    return [TokenListing(**dict(r)) for r in rows]
