"""Bearer tokens: ``rgt_<id>_<secret>``.

The id finds the row; the secret (32 random bytes, url-safe base64) is only
ever stored as its SHA-256. A fast hash is enough because the secret is random
and long: there is nothing to brute-force that a slow hash would protect.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "rgt_"
SECRET_LENGTH = 43  # base64url of 32 bytes, unpadded
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{2,63}$")
_SECRET = re.compile(r"^[A-Za-z0-9_-]{43}$")


@dataclass(frozen=True, slots=True)
class ParsedToken:
    token_id: str
    secret: str

    @property
    def secret_sha256(self) -> bytes:
        return hash_secret(self.secret)


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def new_token_id() -> str:
    return "t-" + secrets.token_hex(8)


def format_token(token_id: str, secret: str) -> str:
    return f"{PREFIX}{token_id}_{secret}"


def parse_token(raw: str) -> ParsedToken | None:
    """The parts of a well-formed token, or None: callers treat both alike."""
    if not raw.startswith(PREFIX) or len(raw) < len(PREFIX) + SECRET_LENGTH + 4:
        return None
    body = raw[len(PREFIX) :]
    secret, sep, token_id = (
        body[-SECRET_LENGTH:],
        body[-SECRET_LENGTH - 1],
        body[: -SECRET_LENGTH - 1],
    )
    if sep != "_" or not _ID.match(token_id) or not _SECRET.match(secret):
        return None
    return ParsedToken(token_id, secret)


def secret_matches(stored_sha256: bytes, presented: ParsedToken) -> bool:
    return hmac.compare_digest(stored_sha256, presented.secret_sha256)
