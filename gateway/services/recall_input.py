"""The validated input of one recall (SPEC section 3).

Every bound is checked and reported, never clamped: a caller that asks for
``limit: 500`` learns that 50 is the maximum instead of silently getting 50.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.errors import InvalidInput

WELL_FORMED_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
"""What any ID of memory may be: the pattern the loader's and the mutations'
records hold (services/records.py). Use it with ``fullmatch``: with ``match``,
``$`` also lets a trailing newline through, which the records' pattern refuses."""
ID_FORM = "1 to 128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
"""The pattern in words, for refusals: "not a well-formed ID" alone tells a caller nothing."""

MAX_QUERY_CHARS = 2000
MAX_KNOWN_IDS = 500
MAX_EXPAND_ENTITIES = 20


@dataclass(frozen=True, slots=True)
class Bound:
    default: int
    minimum: int
    maximum: int


# (default, minimum, maximum); a minimum of 0 means "0 disables this frontier".
LIMITS: dict[str, Bound] = {
    "limit": Bound(10, 1, 50),
    "relationshipLimit": Bound(5, 0, 20),
    "communityLimit": Bound(3, 0, 10),
    "communityRelationshipLimit": Bound(5, 1, 20),
    "hypothesisLimit": Bound(5, 0, 20),
}


@dataclass(frozen=True, slots=True)
class RecallRequest:
    query: str | None
    limit: int
    relationship_limit: int
    community_limit: int
    community_relationship_limit: int
    hypothesis_limit: int
    valid_at: datetime | None
    known_at: datetime | None
    known_evidence_ids: tuple[str, ...]
    known_relationship_ids: tuple[str, ...]
    expand_from_entity_ids: tuple[str, ...]

    @property
    def temporal(self) -> bool:
        return self.valid_at is not None or self.known_at is not None


def _bounded(name: str, value: int | None) -> int:
    bound = LIMITS[name]
    if value is None:
        return bound.default
    if not bound.minimum <= value <= bound.maximum:
        zero = " (0 disables it)" if bound.minimum == 0 else ""
        raise InvalidInput(
            f"{name} must be between {bound.minimum} and {bound.maximum}{zero}; got {value}",
            field=name,
        )
    return value


def _ids(name: str, values: Sequence[str] | None, maximum: int) -> tuple[str, ...]:
    if not values:
        return ()
    if len(values) > maximum:
        raise InvalidInput(f"{name} takes at most {maximum} IDs; got {len(values)}", field=name)
    for i, value in enumerate(values):
        if not WELL_FORMED_ID.fullmatch(value):
            raise InvalidInput(f"{name}[{i}] is not a well-formed ID ({ID_FORM})", field=name)
    return tuple(dict.fromkeys(values))


def _instant(name: str, value: datetime | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(
            f"{name} needs a time zone (for example 2026-01-31T12:00:00Z)", field=name
        )
    return value.astimezone(UTC)


def validate(
    *,
    query: str | None,
    limit: int | None = None,
    relationship_limit: int | None = None,
    community_limit: int | None = None,
    community_relationship_limit: int | None = None,
    hypothesis_limit: int | None = None,
    valid_at: datetime | None = None,
    known_at: datetime | None = None,
    known_evidence_ids: Sequence[str] | None = None,
    known_relationship_ids: Sequence[str] | None = None,
    expand_from_entity_ids: Sequence[str] | None = None,
    now: datetime | None = None,
) -> RecallRequest:
    now = now or datetime.now(UTC)
    if query is not None:
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidInput(f"query is longer than {MAX_QUERY_CHARS} characters", field="query")
        if not query.strip():
            raise InvalidInput("query is blank; leave it out or give words", field="query")
        if "\x00" in query:
            raise InvalidInput("query contains a NUL character", field="query")
    entities = _ids("expandFromEntityIds", expand_from_entity_ids, MAX_EXPAND_ENTITIES)
    if query is None and not entities:
        raise InvalidInput("give a query, expandFromEntityIds, or both", field="query")
    known = _instant("knownAt", known_at, now)
    if known is not None and known > now:
        raise InvalidInput(
            "knownAt is in the future: the system cannot know it yet", field="knownAt"
        )
    return RecallRequest(
        query=query,
        limit=_bounded("limit", limit),
        relationship_limit=_bounded("relationshipLimit", relationship_limit),
        community_limit=_bounded("communityLimit", community_limit),
        community_relationship_limit=_bounded(
            "communityRelationshipLimit", community_relationship_limit
        ),
        hypothesis_limit=_bounded("hypothesisLimit", hypothesis_limit),
        valid_at=_instant("validAt", valid_at, now),
        known_at=known,
        known_evidence_ids=_ids("knownEvidenceIds", known_evidence_ids, MAX_KNOWN_IDS),
        known_relationship_ids=_ids("knownRelationshipIds", known_relationship_ids, MAX_KNOWN_IDS),
        expand_from_entity_ids=entities,
    )
