"""Error responses made outside GraphQL execution, shaped like GraphQL ones.

A request refused before it reaches the executor (bad JSON, batching off, a
persisted-query miss, a passed deadline) still answers ``{"errors": [...]}``
with a stable ``extensions.code``, never strawberry's plain-text reason.
"""

from __future__ import annotations

import json

from starlette.responses import Response

GRAPHQL_RESPONSE_JSON = "application/graphql-response+json"
JSON = "application/json"


REQUEST_ERROR = 0
"""A ``RequestRejected`` status meaning "a GraphQL request error": 400 with
``application/graphql-response+json``, 200 with ``application/json``."""


class RequestRejected(Exception):
    """Refuse the request with ``status`` (or ``REQUEST_ERROR``) and an error coded ``code``."""

    def __init__(
        self, status: int, code: str, message: str, extra: dict[str, object] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra or {}


# strawberry raises HTTPException with a reason only: give each a code.
_REASON_CODES = {
    "Batching is not enabled": "BATCHING_DISABLED",
    "Too many operations": "BATCH_TOO_LARGE",
}
_STATUS_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "REQUEST_TOO_LARGE"}


def code_for(status: int, reason: str) -> str:
    return _REASON_CODES.get(reason) or _STATUS_CODES.get(status, "BAD_REQUEST")


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    media_type: str = JSON,
    extra: dict[str, object] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = {"errors": [{"message": message, "extensions": {"code": code, **(extra or {})}}]}
    return Response(json.dumps(body), status_code=status, media_type=media_type, headers=headers)
