"""The gateway's exception hierarchy, written down in one place.

Every expected failure carries a stable ``code``; the GraphQL layer turns it into
``extensions.code`` and the CLI into a one-line message. Anything that is not a
``GatewayError`` is unexpected and is masked before it reaches a client.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every expected failure. ``code`` is stable and documented."""

    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigurationError(GatewayError):
    """The gateway cannot run with the settings it was given."""

    code = "CONFIGURATION_ERROR"


class DatabaseUnavailable(GatewayError):
    """PostgreSQL cannot be reached or is not ready."""

    code = "DATABASE_UNAVAILABLE"


class MigrationError(GatewayError):
    """The schema cannot be brought to the current version."""

    code = "MIGRATION_ERROR"


class Unauthenticated(GatewayError):
    """No bearer token, or one that is unknown, revoked or expired."""

    code = "UNAUTHENTICATED"


class Forbidden(GatewayError):
    """The caller is known but may not do this."""

    code = "FORBIDDEN"


class NotFound(GatewayError):
    """Missing, or not readable by the caller: the two look exactly alike."""

    code = "NOT_FOUND"


class InvalidInput(GatewayError):
    """Input that is malformed or out of range. ``field`` names the offending input."""

    code = "BAD_USER_INPUT"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class IdempotencyConflict(GatewayError):
    """A client-supplied ID was used before with different content."""

    code = "IDEMPOTENCY_CONFLICT"


class EmbeddingError(GatewayError):
    """The embedding provider failed or returned something unusable."""

    code = "EMBEDDING_UNAVAILABLE"


class EmbeddingMalformed(EmbeddingError):
    """The provider answered, but not with usable vectors (count, shape, values)."""


class EmbeddingMismatch(GatewayError):
    """Vectors of a different model or dimension than the store holds: refused."""

    code = "EMBEDDING_MODEL_MISMATCH"


class RequestTimeout(GatewayError):
    """The request's deadline passed (``RECALL_REQUEST_TIMEOUT_MS``); its work was cancelled."""

    code = "REQUEST_TIMEOUT"


class SpaceHasVectors(GatewayError):
    """``load --index-after`` met a space whose vectors readers can already find."""

    code = "SPACE_HAS_VECTORS"


class VectorIndexPending(GatewayError):
    """A write met a space whose vectors wait for ``load --index-after`` to index them."""

    code = "VECTOR_INDEX_PENDING"
