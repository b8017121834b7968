"""The per-request context that resolvers read: who is calling, and the services."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import DatabaseUnavailable, GatewayError, Unauthenticated
from gateway.services.auth import Principal


def _retrieve(task: asyncio.Task[Principal]) -> None:
    """A lookup nobody awaited (the request ended before a field needed the
    caller) leaves no "exception was never retrieved" behind."""
    if not task.cancelled():
        task.exception()


@dataclass
class RequestContext:
    request: Any
    response: Any
    services: Any
    request_id: str
    principal: Principal | None = None
    auth_error: GatewayError | None = None
    loaders: dict[str, Any] = field(default_factory=dict)
    # The bearer token's lookup, started with the request and awaited by the first
    # field that needs the caller (:meth:`caller`), so that it runs while the
    # document is parsed, validated and its arguments coerced.
    lookup: asyncio.Task[Principal] | None = None

    def look_up(self, authenticate: Coroutine[Any, Any, Principal]) -> None:
        """Start the token's lookup (``authenticate``); :meth:`caller` awaits it.

        The lookup is the same as before, one per request and never cached: a
        revoked token is refused from the next request on, and every refusal is
        the one ``authenticate`` raises. Nothing that depends on the caller runs
        before it has ended: a field that needs the caller awaits it first."""
        self.lookup = asyncio.ensure_future(authenticate)
        self.lookup.add_done_callback(_retrieve)

    async def settle(self) -> None:
        """Wait for the token's lookup, if one was started, and keep its outcome
        (the caller, or the refusal that the first field needing it raises). Any
        number of fields may wait for it at once: each awaits the same lookup."""
        lookup = self.lookup
        if lookup is None:
            return
        try:
            principal = await asyncio.shield(lookup)
        except (Unauthenticated, DatabaseUnavailable) as exc:
            # Raised by the first field that needs the caller: a database that is
            # down answers DATABASE_UNAVAILABLE, not a 500.
            self.auth_error = exc
        else:
            self.principal = principal
        self.lookup = None

    async def abandon(self) -> None:
        """The request is over: a lookup that no field waited for (a refused
        document, a field that needs no caller) is waited for now, so that no work
        of the request outlives it; its outcome is dropped."""
        lookup, self.lookup = self.lookup, None
        if lookup is not None and not lookup.done():
            # neither raises the lookup's refusal nor stops it if this request is
            # being cancelled (its connection goes back to the pool when it ends)
            await asyncio.wait({lookup})

    async def caller(self) -> Principal:
        """The caller, once the token's lookup has ended (see :meth:`require_principal`)."""
        await self.settle()
        return self.require_principal()

    def require_principal(self) -> Principal:
        """The caller, or the UNAUTHENTICATED error (and HTTP 401) when there is none.

        With the lookup still running this is a bug of the calling resolver (it
        must await :meth:`caller`): it fails, never answers as if anonymous."""
        if self.lookup is not None:
            raise RuntimeError("the caller's token lookup has not ended: await caller()")
        if self.principal is None:
            if self.auth_error is not None and not isinstance(self.auth_error, Unauthenticated):
                raise self.auth_error  # e.g. DATABASE_UNAVAILABLE: not the caller's fault
            if self.response is not None:
                self.response.status_code = 401
                self.response.headers["WWW-Authenticate"] = 'Bearer realm="recall-gateway"'
            raise self.auth_error or Unauthenticated(
                "a valid bearer token is required (Authorization: Bearer <token>)"
            )
        return self.principal
