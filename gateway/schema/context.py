"""The per-request context that resolvers read: who is calling, and the services."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError, Unauthenticated
from gateway.services.auth import Principal


@dataclass
class RequestContext:
    request: Any
    response: Any
    services: Any
    request_id: str
    principal: Principal | None = None
    auth_error: GatewayError | None = None
    loaders: dict[str, Any] = field(default_factory=dict)

    def require_principal(self) -> Principal:
        """The caller, or the UNAUTHENTICATED error (and HTTP 401) when there is none."""
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
