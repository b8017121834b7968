"""SQL of the set-based write path: a run of records in a handful of statements.

The record-at-a-time path (``gateway/store/writes.py``) sends about five
statements per record; a bulk load then waits on round trips, not on the
database. Here a run's idempotency claims are one statement and its rows go in
with one ``COPY`` per table. The checks that decide *whether* a row may be
written stay in the service (``gateway/services/bulk_writes.py``); the database
still enforces its constraints and triggers on every copied row, and any
refusal aborts the whole transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gateway.store.connection import Conn

_CLAIM = """
INSERT INTO write_log (team_id, kind, client_id, payload_sha256, recorded_by)
SELECT t.team_id, t.kind, t.client_id, t.digest, $5
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[])
     AS t(team_id, kind, client_id, digest)
ON CONFLICT DO NOTHING
RETURNING team_id, kind, client_id, recorded_at
"""

_CLAIMED = """
SELECT w.team_id, w.kind, w.client_id, w.payload_sha256, w.recorded_at
FROM write_log w
JOIN unnest($1::text[], $2::text[], $3::text[]) AS t(team_id, kind, client_id)
  ON w.team_id = t.team_id AND w.kind = t.kind AND w.client_id = t.client_id
"""

ClaimKey = tuple[str, str, str]


async def claim_writes(
    conn: Conn, claims: Sequence[tuple[str, str, str, bytes]], by: str
) -> dict[ClaimKey, tuple[bool, bytes, datetime]]:
    """Register (team, kind, id, digest) claims at once. For each key: whether this
    statement registered it (new), the digest it holds and the system time of the
    write that holds it. Keys must be distinct (the caller checks)."""
    if not claims:
        return {}
    teams, kinds, ids, digests = (list(c) for c in zip(*claims, strict=True))
    new = {
        (r["team_id"], r["kind"], r["client_id"]): r["recorded_at"]
        for r in await conn.fetch(_CLAIM, teams, kinds, ids, digests, by)
    }
    out: dict[ClaimKey, tuple[bool, bytes, datetime]] = {}
    for key, digest in zip(zip(teams, kinds, ids, strict=True), digests, strict=True):
        if key in new:
            out[key] = (True, digest, new[key])
    if len(out) < len(claims):
        rest = [key for key in zip(teams, kinds, ids, strict=True) if key not in out]
        t, k, i = (list(c) for c in zip(*rest, strict=True))
        for r in await conn.fetch(_CLAIMED, t, k, i):
            out[(r["team_id"], r["kind"], r["client_id"])] = (
                False,
                bytes(r["payload_sha256"]),
                r["recorded_at"],
            )
    return out


async def allow_statement_time(conn: Conn, ms: int) -> None:
    """Raise the transaction's statement timeout to ``ms``: one COPY carries what
    hundreds of statements carried, each of which had the whole timeout."""
    await conn.execute("SELECT set_config('statement_timeout', $1, true)", f"{ms}ms")


async def existing_principals(conn: Conn, team: str, ids: Sequence[str]) -> set[str]:
    rows = await conn.fetch(
        "SELECT id FROM principals WHERE team_id = $1 AND id = ANY($2::text[])", team, list(ids)
    )
    return {r["id"] for r in rows}


# The tables a run writes, in an order that satisfies their foreign keys, with
# the columns given (the rest take their defaults: recorded_at is the
# transaction's time, as on the record-at-a-time path).
COPY_TABLES: dict[str, tuple[str, ...]] = {
    "sources": (
        "team_id",
        "id",
        "space_id",
        "generation",
        "kind",
        "title",
        "uri",
        "authority",
        "created_at",
        "recorded_by",
    ),
    "source_lifecycle_events": (
        "team_id",
        "space_id",
        "source_id",
        "event_id",
        "status",
        "reason",
        "recorded_by",
    ),
    "entities": (
        "team_id",
        "id",
        "space_id",
        "generation",
        "name",
        "kind",
        "aliases",
        "recorded_by",
    ),
    "evidence": (
        "team_id",
        "id",
        "space_id",
        "generation",
        "source_id",
        "content",
        "content_sha256",
        "observed_at",
        "recorded_by",
    ),
    "evidence_lifecycle_events": (
        "team_id",
        "space_id",
        "evidence_id",
        "event_id",
        "status",
        "reason",
        "recorded_by",
    ),
    "evidence_occurrences": (
        "team_id",
        "space_id",
        "evidence_id",
        "id",
        "quote",
        "span_start",
        "span_end",
    ),
    "evidence_entity_mentions": (
        "team_id",
        "space_id",
        "evidence_id",
        "entity_id",
        "occurrence_id",
    ),
    "relationships": (
        "team_id",
        "id",
        "space_id",
        "generation",
        "subject_entity_id",
        "predicate",
        "object_entity_id",
        "object_value",
        "object_unit",
        "polarity",
        "valid_from",
        "valid_to",
        "owner_principal_id",
        "semantic_group_key",
        "statement",
        "recorded_by",
    ),
    "relationship_status_events": (
        "team_id",
        "space_id",
        "relationship_id",
        "event_id",
        "status",
        "superseded_by",
        "reason",
        "recorded_by",
    ),
    "supports": (
        "team_id",
        "id",
        "space_id",
        "evidence_id",
        "relationship_id",
        "occurrence_id",
        "quote",
        "span_start",
        "span_end",
        "recorded_by",
    ),
    "support_decisions": (
        "team_id",
        "space_id",
        "support_id",
        "decision_id",
        "decision",
        "reason",
        "recorded_by",
    ),
    "evidence_embeddings": (
        "team_id",
        "space_id",
        "evidence_id",
        "model",
        "dimensions",
        "embedding",
    ),
    "relationship_embeddings": (
        "team_id",
        "space_id",
        "relationship_id",
        "projection_generation",
        "model",
        "dimensions",
        "embedding",
    ),
}


async def copy_rows(
    conn: Conn, table: str, rows: Sequence[tuple[Any, ...]], *, into: str | None = None
) -> None:
    """``COPY`` the rows into one of :data:`COPY_TABLES` (binary, one round trip), or
    into ``into``, a table of the same columns (a detached vector partition)."""
    if not rows:
        return
    await conn.copy_records_to_table(into or table, records=rows, columns=list(COPY_TABLES[table]))


# Tables of the gateway's schema whose planner statistics no longer describe
# them, analysed in one round trip:
#  - referenced by a foreign key, holding rows but no statistics yet (never
#    analysed, or analysed while empty): see analyze_unplanned;
#  - grown a lot since their statistics were taken: at least twice the pages
#    (and GROWN_PAGES more) than when last analysed or vacuumed, or more rows
#    changed since the last analysis than it counted (and GROWN_ROWS more). The
#    pages are read from the file's size, so a load that has just committed
#    counts at once; the changed rows come from the cumulative statistics, which
#    a session reports up to a second or more after its commit, so they catch
#    what the next batch's refresh sees. Autovacuum waits for 10 % more rows and
#    comes round once a minute; the refresh is for the growth that makes plans
#    wrong (a store loaded small, then large), not for fine statistics.
# It never waits on another session's lock: ANALYZE (SKIP_LOCKED) skips a table
# whose lock is held (a transaction that creates a space holds a conflicting
# lock on evidence and relationships until it commits, a loader's batch through
# its embedding) with a server warning, and the next batch tries again; the
# short lock_timeout bounds the AccessShareLock that pg_relation_size takes
# (only an ACCESS EXCLUSIVE holder, a migration or an ALTER, blocks it; the
# refresh then fails fast and is logged, see
# WriteService.analyze_unplanned_tables). ANALYZE of a table the connecting
# role may not analyse is skipped by the server with a warning, not an error.
GROWN_PAGES = 16
"""Pages (of 8 kB) a table must have grown by, besides doubling, before the
refresh analyses it again: small tables are cheap to plan wrongly."""

GROWN_ROWS = 1000
"""Rows changed since the last analysis, besides as many as it counted."""

_ANALYZE_UNPLANNED = f"""
DO $$
DECLARE
    t regclass;
BEGIN
    PERFORM set_config('lock_timeout', '100ms', true);
    FOR t IN
        SELECT c.oid::regclass
        FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
        WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
          AND (
              (c.reltuples <= 0
               AND c.oid IN (SELECT confrelid FROM pg_constraint WHERE contype = 'f')
               AND pg_relation_size(c.oid) > 0)
              OR pg_relation_size(c.oid) / current_setting('block_size')::bigint
                 >= 2 * c.relpages::bigint + {GROWN_PAGES}
              OR coalesce(s.n_mod_since_analyze, 0)
                 >= greatest(c.reltuples, 0)::bigint + {GROWN_ROWS}
          )
        ORDER BY c.oid
    LOOP
        EXECUTE format('ANALYZE (SKIP_LOCKED) %s', t);
    END LOOP;
END $$
"""


async def analyze_unplanned(conn: Conn) -> None:
    """Give the referenced tables planner statistics once they have rows.

    Every inserted row's foreign-key check looks its parent up by key, e.g. a
    posting's evidence by (team_id, space_id, id). Without statistics the
    planner may cost another index led by (team_id, space_id), such as
    evidence_space (team_id, space_id, generation), like that unique key and
    check through it with the id a mere filter: each check then reads the whole
    space, and a first load into a new store grows quadratically until
    autovacuum analyses the table. docs/data-model.md ("Planner statistics on a
    new store") states when that plan was seen and when it was not. With
    statistics the unique key wins.

    It also analyses tables that have grown a lot since their statistics (see
    :data:`GROWN_PAGES`). A recall plans its statements once per connection
    (``force_generic_plan``, gateway/services/recall.py) and keeps the plan until
    a table it reads is analysed: a plan made while the store was small (the
    hydration reading a whole space instead of looking its ids up) would
    otherwise outlive a large load until autovacuum analysed the table. ANALYZE
    invalidates the plans that read the table, in every session.
    """
    await conn.execute(_ANALYZE_UNPLANNED)
