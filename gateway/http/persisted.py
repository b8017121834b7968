"""Persisted queries: Automatic Persisted Queries and an allow-list mode.

APQ (the protocol of Apollo clients): a request may carry
``extensions.persistedQuery = {"version": 1, "sha256Hash": H}``. With the
document, the gateway checks that H is its SHA-256 and, once the document has
validated and if the caller is authenticated, keeps it for the caller's team;
without it, the gateway runs the document the caller's team kept under H, or
answers ``PERSISTED_QUERY_NOT_FOUND`` so that the client sends it again with
the document. Works over GET too.

The store is the ``persisted_queries`` table, so every worker and every
replica shares it, bounded per team to ``RECALL_PERSISTED_QUERY_MAX_ENTRIES``
(least recently used out; a team only ever pushes out its own entries),
documents up to ``RECALL_PERSISTED_QUERY_MAX_BYTES``, with a small
per-process cache in front. Anonymous callers never write to it: their
documents run, and are not kept.

Replicas (several processes behind a load balancer) agree because the table
decides: a document sent with its hash is registered every time (a client
sends it only after some process answered ``PERSISTED_QUERY_NOT_FOUND``, so
skipping it because this process still had it would leave the others without
it), and a process serves a hash from its own cache for at most
``LOCAL_CACHE_TTL_S``; then it reads the table again, which refreshes the
entry's last use there (so the least-recently-used bound sees use on every
replica) or finds it trimmed.

Allow-list mode runs only the operations of a manifest (a JSON object
``{sha256: document}`` built from the clients' code), by hash or by document:
anything else is ``PERSISTED_QUERY_NOT_ALLOWED``, so an attacker cannot send
an operation of their own at all.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from strawberry.http import GraphQLRequestData

from gateway.errors import ConfigurationError, GatewayError
from gateway.http.errors import REQUEST_ERROR, RequestRejected
from gateway.services.auth import Principal
from gateway.store import persisted as store
from gateway.store.database import Database

_HASH = re.compile(r"^[0-9a-f]{64}$")
_LOCAL_CACHE = 1000
LOCAL_CACHE_TTL_S = 60.0
"""How long a process serves a hash from its own cache before it reads the shared
table again: the grain at which the table's last use is refreshed (store.get)."""

Mode = Literal["off", "apq", "allowlist"]


def sha256(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()


def load_manifest(path: Path) -> dict[str, str]:
    """The allow-list: every key must be the SHA-256 of its document."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the persisted query manifest: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigurationError("the persisted query manifest must be a JSON object")
    manifest: dict[str, str] = {}
    for key, document in raw.items():
        if not isinstance(document, str) or sha256(document) != key:
            raise ConfigurationError(
                f"manifest entry {key[:16]}... is not the SHA-256 of its document"
            )
        manifest[key] = document
    return manifest


@dataclass(frozen=True, slots=True)
class Registration:
    """A document to keep for ``principal``'s team once it has validated."""

    principal: Principal
    sha256: str
    document: str


def _rejected(code: str, message: str) -> RequestRejected:
    return RequestRejected(REQUEST_ERROR, code, message)


class PersistedQueries:
    """Resolves the document of a request under the configured mode."""

    def __init__(
        self,
        db: Database,
        mode: Mode,
        *,
        max_entries: int,
        max_bytes: int = 32_768,
        manifest: dict[str, str] | None = None,
    ) -> None:
        if mode == "allowlist" and manifest is None:
            raise ConfigurationError(
                "RECALL_PERSISTED_QUERIES=allowlist needs RECALL_PERSISTED_QUERY_MANIFEST"
            )
        self.db = db
        self.mode = mode
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.manifest = manifest or {}
        # (team, hash) -> (document, monotonic time it was read from or written to the table)
        self._cache: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()

    def _remember(self, key: tuple[str, str], document: str) -> None:
        self._cache[key] = (document, time.monotonic())
        self._cache.move_to_end(key)
        while len(self._cache) > _LOCAL_CACHE:
            self._cache.popitem(last=False)

    def _cached(self, key: tuple[str, str]) -> str | None:
        hit = self._cache.get(key)
        if hit is None:
            return None
        document, at = hit
        if time.monotonic() - at > LOCAL_CACHE_TTL_S:
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return document

    @staticmethod
    def _hash_of(request: GraphQLRequestData) -> str | None:
        extension = (request.extensions or {}).get("persistedQuery")
        if extension is None:
            return None
        if not isinstance(extension, dict) or extension.get("version") != 1:
            raise _rejected("PERSISTED_QUERY_INVALID", "persistedQuery must have version 1")
        given = extension.get("sha256Hash")
        if not isinstance(given, str) or not _HASH.match(given):
            raise _rejected("PERSISTED_QUERY_INVALID", "sha256Hash must be 64 lowercase hex digits")
        return given

    async def resolve(
        self,
        request: GraphQLRequestData,
        principal: Principal | None,
        unavailable: GatewayError | None = None,
    ) -> tuple[GraphQLRequestData, Registration | None]:
        """The request with its document filled in (or a ``RequestRejected``), and
        the registration to make once the document has validated, if any.

        Entries belong to the caller's team: a hash is looked up there only, and
        only an authenticated caller registers. An anonymous caller's document
        runs, and is never stored. ``unavailable`` is why the caller could not be
        checked (the database is down): a lookup then fails with it instead of
        a misleading "not found"."""
        wanted = self._hash_of(request)
        if self.mode == "off":
            if wanted is not None:
                raise _rejected("PERSISTED_QUERY_NOT_SUPPORTED", "PersistedQueryNotSupported")
            return request, None
        if self.mode == "allowlist":
            return self._allowed(request, wanted), None
        if wanted is None:
            return request, None
        if request.query is not None:
            if sha256(request.query) != wanted:
                raise _rejected(
                    "PERSISTED_QUERY_HASH_MISMATCH", "sha256Hash is not the hash of the query"
                )
            fits = len(request.query.encode()) <= self.max_bytes
            if principal is None or not fits:
                return request, None
            return request, Registration(principal, wanted, request.query)
        if principal is None:
            if unavailable is not None:
                raise unavailable
            raise _rejected("PERSISTED_QUERY_NOT_FOUND", "PersistedQueryNotFound")
        key = (principal.team_id, wanted)
        document = self._cached(key)
        if document is None:
            async with self.db.admin() as conn:
                document = await store.get(conn, principal.team_id, wanted)
            if document is None:
                raise _rejected("PERSISTED_QUERY_NOT_FOUND", "PersistedQueryNotFound")
            self._remember(key, document)
        return replace(request, query=document), None

    async def register(self, registration: Registration) -> None:
        """Keep a document that validated, for its caller's team (bounded per team)."""
        principal = registration.principal
        async with self.db.admin() as conn:
            await store.put(
                conn,
                principal.team_id,
                principal.principal_id,
                registration.sha256,
                registration.document,
                max_entries=self.max_entries,
            )
        self._remember((principal.team_id, registration.sha256), registration.document)

    def _allowed(self, request: GraphQLRequestData, wanted: str | None) -> GraphQLRequestData:
        key = (
            wanted
            if wanted is not None
            else (sha256(request.query) if request.query is not None else None)
        )
        if key is None:
            return request  # no document at all: the view's "missing query" error
        document = self.manifest.get(key)
        if document is None or (request.query is not None and request.query != document):
            raise RequestRejected(
                403, "PERSISTED_QUERY_NOT_ALLOWED", "only registered operations may run"
            )
        return replace(request, query=document)
