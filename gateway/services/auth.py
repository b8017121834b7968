"""Who is calling: a bearer token becomes a :class:`Principal` with its readable spaces.

Every refusal has the same message and code, so a caller learns nothing about
which part of a token was wrong. Tokens are looked up on every request, with
no cache in the process: a revoked token is refused by every worker from the
next request on (``recall-gateway tokens revoke``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from gateway import tokens
from gateway.errors import NotFound, Unauthenticated
from gateway.store import auth as store
from gateway.store.database import Database

_REFUSED = "a valid bearer token is required (missing, malformed, unknown, expired or revoked)"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. Space IDs are internal: they never leave the gateway."""

    team_id: str
    team_name: str
    principal_id: str
    display_name: str
    kind: str
    token_id: str
    binding: str
    shared_space_id: UUID
    private_space_id: UUID | None

    @property
    def readable_space_ids(self) -> tuple[UUID, ...]:
        if self.private_space_id is not None:
            return (self.shared_space_id, self.private_space_id)
        return (self.shared_space_id,)

    @property
    def space_kinds(self) -> tuple[str, ...]:
        return ("shared", "private") if self.private_space_id is not None else ("shared",)


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if any."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return ""
    return value.strip()


async def authenticate(db: Database, raw: str) -> Principal:
    parsed = tokens.parse_token(raw)
    if parsed is None:
        raise Unauthenticated(_REFUSED)
    # one read outside any transaction, no session state: no reset statement after it
    async with db.acquire(stateless=True) as conn:
        row = await store.find_token(conn, parsed.token_id)
    if row is None or not tokens.secret_matches(row.secret_sha256, parsed):
        raise Unauthenticated(_REFUSED)
    now = datetime.now(UTC)
    if row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= now):
        raise Unauthenticated(_REFUSED)
    private = row.private_space_id if row.binding == "private" else None
    return Principal(
        team_id=row.team_id,
        team_name=row.team_name,
        principal_id=row.principal_id,
        display_name=row.display_name,
        kind=row.kind,
        token_id=parsed.token_id,
        binding=row.binding,
        shared_space_id=row.shared_space_id,
        private_space_id=private,
    )


async def list_tokens(
    db: Database, team: str | None = None, principal: str | None = None
) -> list[store.TokenListing]:
    """Every token (of a team, of a principal), without secrets: for operators."""
    async with db.admin(readonly=True) as conn:
        return await store.list_tokens(conn, team, principal)


async def revoke(db: Database, token_id: str) -> datetime:
    """Revoke a token at once; revoking it again is a no-op returning the first time."""
    async with db.admin() as conn:
        revoked = await store.revoke_token(conn, token_id)
    if revoked is None:
        raise NotFound(f"no token '{token_id}'")
    return revoked
