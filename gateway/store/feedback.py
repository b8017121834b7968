"""SQL of recall events and recall feedback (``recall_events``, ``recall_event_items``,
``recall_feedback``, ``recall_feedback_items``).

A recall event is what one recall returned, written in one statement so that a
recall pays one round trip for it. Feedback may only cite what its event
returned; the lookups here answer only for the caller's own events, so another
principal's or another team's event is simply absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from gateway.store.connection import Conn

# Both inserts in one statement: the items' foreign key is checked at the end of
# the statement, when the event row of the same statement exists.
# The event's two CTEs apart from its selection, so that gateway/store/round_trips.py
# can send them with the answer's nested rows (an INSERT in a WITH must lead).
EVENT_CTES = """event AS (
    INSERT INTO recall_events (team_id, id, principal_id, token_id, query_sha256, space_kinds,
                               valid_at, known_at)
    VALUES ($1, $2, $3, $4, $5, $6::text[], $7, $8)
    RETURNING team_id, id, recorded_at
), items AS (
    INSERT INTO recall_event_items (team_id, recall_event_id, frontier, item_id, rank)
    SELECT event.team_id, event.id, i.frontier, i.item_id, i.rank
    FROM event, unnest($9::text[], $10::text[], $11::int[]) AS i (frontier, item_id, rank)
)"""

_INSERT_EVENT = f"WITH {EVENT_CTES}\nSELECT recorded_at FROM event\n"


@dataclass(frozen=True, slots=True)
class NewRecallEvent:
    team: str
    id: UUID
    principal: str
    token: str
    query_sha256: bytes | None
    space_kinds: Sequence[str]
    valid_at: datetime
    known_at: datetime
    # (frontier, item ID, rank), rank from 1 within its frontier
    items: Sequence[tuple[str, str, int]]


def event_args(e: NewRecallEvent) -> list[Any]:
    return [
        e.team,
        e.id,
        e.principal,
        e.token,
        e.query_sha256,
        list(e.space_kinds),
        e.valid_at,
        e.known_at,
        [i[0] for i in e.items],
        [i[1] for i in e.items],
        [i[2] for i in e.items],
    ]


async def insert_recall_event(conn: Conn, e: NewRecallEvent) -> datetime:
    """Write the event and its items in one statement; returns its system time."""
    recorded: datetime = await conn.fetchval(_INSERT_EVENT, *event_args(e))
    return recorded


_EVENT_ITEMS = """
SELECT e.id,
       coalesce(array_agg(i.frontier ORDER BY i.frontier, i.rank)
                FILTER (WHERE i.item_id IS NOT NULL), '{}') AS frontiers,
       coalesce(array_agg(i.item_id ORDER BY i.frontier, i.rank)
                FILTER (WHERE i.item_id IS NOT NULL), '{}') AS item_ids
FROM recall_events e
LEFT JOIN recall_event_items i ON i.team_id = e.team_id AND i.recall_event_id = e.id
WHERE e.team_id = $1 AND e.id = $2 AND e.principal_id = $3
  AND (e.token_id = $4 OR e.space_kinds <@ $5::text[])
GROUP BY e.id
"""


async def event_items(
    conn: Conn,
    team: str,
    event_id: UUID,
    principal: str,
    token: str,
    readable_kinds: Sequence[str],
) -> set[tuple[str, str]] | None:
    """What the caller's own event returned, as (frontier, item ID); None when the
    event is missing, not the caller's, or read spaces the caller's token cannot
    (the three look alike).

    The binding matters because the event's items are what its spaces held: a
    shared-only token of the principal whose private-bound token made the event
    would otherwise learn which private IDs it returned. So the event is citable
    by the token that made it, or by one that reads every kind of space it read."""
    row = await conn.fetchrow(_EVENT_ITEMS, team, event_id, principal, token, list(readable_kinds))
    if row is None:
        return None
    return set(zip(row["frontiers"], row["item_ids"], strict=True))


@dataclass(frozen=True, slots=True)
class StoredFeedback:
    recall_event_id: UUID
    principal: str
    payload_sha256: bytes
    recorded_at: datetime


async def find_feedback(conn: Conn, team: str, feedback_id: str) -> StoredFeedback | None:
    row = await conn.fetchrow(
        "SELECT recall_event_id, principal_id AS principal, payload_sha256, recorded_at "
        "FROM recall_feedback WHERE team_id = $1 AND id = $2",
        team,
        feedback_id,
    )
    return StoredFeedback(**dict(row)) if row else None


@dataclass(frozen=True, slots=True)
class NewFeedback:
    team: str
    id: str
    recall_event_id: UUID
    principal: str
    used: bool
    supported_answer: bool | None
    rating: int | None
    missing_context: str | None
    payload_sha256: bytes
    # (frontier, item ID, judgement, note)
    items: Sequence[tuple[str, str, str, str | None]]


_INSERT_FEEDBACK = """
WITH fb AS (
    INSERT INTO recall_feedback (team_id, id, recall_event_id, principal_id, used,
                                 supported_answer, rating, missing_context, payload_sha256)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT (team_id, id) DO NOTHING
    RETURNING team_id, id, recorded_at
), items AS (
    INSERT INTO recall_feedback_items (team_id, feedback_id, frontier, item_id, judgement, note)
    SELECT fb.team_id, fb.id, i.frontier, i.item_id, i.judgement, i.note
    FROM fb, unnest($10::text[], $11::text[], $12::text[], $13::text[])
             AS i (frontier, item_id, judgement, note)
)
SELECT recorded_at FROM fb
"""


async def insert_feedback(conn: Conn, f: NewFeedback) -> datetime | None:
    """Write feedback and its items in one statement; None when the ID was taken
    meanwhile (a concurrent submission), in which case nothing was written."""
    recorded: datetime | None = await conn.fetchval(
        _INSERT_FEEDBACK,
        f.team,
        f.id,
        f.recall_event_id,
        f.principal,
        f.used,
        f.supported_answer,
        f.rating,
        f.missing_context,
        f.payload_sha256,
        [i[0] for i in f.items],
        [i[1] for i in f.items],
        [i[2] for i in f.items],
        [i[3] for i in f.items],
    )
    return recorded
