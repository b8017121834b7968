"""SQL of community snapshots: reading the shared graph, writing runs, reading them back.

The builder (gateway/services/communities.py) reads the team's current shared
relationship graph in one repeatable-read transaction, so that the graph, the
change counter it records and the validity horizon are one consistent state;
it writes a run row first (``running``), then the communities, members and the
final status. A recall reads the newest finished run with the current change
counter and the communities that touch its anchor groups in one statement.
Every statement names the team and the shared space.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from gateway.store.connection import Conn
from gateway.store.related import eligible_relationship

# --- the builder's reads --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GraphState:
    space_id: UUID
    generation: int
    changes: int  # graph change counter of the space
    watermark: datetime | None  # last counted change
    valid_until: datetime | None  # next validity boundary of a relationship after now
    now: datetime


_STATE = """
SELECT s.id AS space_id, now() AS now,
       (SELECT max(g.generation) FROM space_generations g
         WHERE g.team_id = s.team_id AND g.space_id = s.id) AS generation,
       (SELECT coalesce(sum(c.changes), 0) FROM graph_change_counters c
         WHERE c.team_id = s.team_id AND c.space_id = s.id) AS changes,
       (SELECT max(c.changed_at) FROM graph_change_counters c
         WHERE c.team_id = s.team_id AND c.space_id = s.id) AS watermark
FROM memory_spaces s
WHERE s.team_id = $1 AND s.kind = 'shared'
"""

_HORIZON = """
SELECT min(x.at) FROM (
    SELECT r.valid_from AS at FROM relationships r
     WHERE r.team_id = $1 AND r.space_id = $2 AND r.generation = $3 AND r.valid_from > $4
    UNION ALL
    SELECT r.valid_to FROM relationships r
     WHERE r.team_id = $1 AND r.space_id = $2 AND r.generation = $3 AND r.valid_to > $4
) x
"""


async def graph_state(conn: Conn, team: str) -> GraphState | None:
    """The shared space's generation, change counter and validity horizon; None: no team."""
    row = await conn.fetchrow(_STATE, team)
    if row is None:
        return None
    horizon = await conn.fetchval(_HORIZON, team, row["space_id"], row["generation"], row["now"])
    return GraphState(
        space_id=row["space_id"],
        generation=row["generation"],
        changes=int(row["changes"]),
        watermark=row["watermark"],
        valid_until=horizon,
        now=row["now"],
    )


@dataclass(frozen=True, slots=True)
class GraphRelationship:
    id: str
    group: str
    predicate: str
    subject_id: str
    object_id: str | None
    evidence_ids: tuple[str, ...]  # evidence with an eligible support path to it


_GRAPH = """
WITH rel AS MATERIALIZED (
    SELECT r.id, r.semantic_group_key, r.predicate, r.subject_entity_id, r.object_entity_id
    FROM relationships r
    WHERE r.team_id = $1::text AND r.space_id = $2::uuid AND {eligible}
)
SELECT rel.id, rel.semantic_group_key, rel.predicate, rel.subject_entity_id,
       rel.object_entity_id,
       coalesce((
           SELECT array_agg(DISTINCT s.evidence_id::text ORDER BY s.evidence_id::text)
           FROM supports s
           JOIN evidence e ON e.team_id = $1::text AND e.space_id = $2::uuid AND e.id = s.evidence_id
           WHERE s.team_id = $1::text AND s.space_id = $2::uuid AND s.relationship_id = rel.id
             AND s.recorded_at <= $4::timestamptz
             AND e.generation = $3::integer AND e.recorded_at <= $4::timestamptz
             AND {decision} IN ('grant', 'reinstate')
             AND {ev_status} = 'active' AND {src_status} = 'active'
       ), '{{}}') AS evidence_ids
FROM rel
"""


def _latest(table: str, fk: str, col: str, alias: str, ref: str) -> str:
    return (
        f"(SELECT {alias}.{col} FROM {table} {alias} "
        f"WHERE {alias}.team_id = $1::text AND {alias}.{fk} = {ref} "
        f"AND {alias}.recorded_at <= $4::timestamptz "
        f"ORDER BY {alias}.recorded_at DESC, {alias}.seq DESC LIMIT 1)"
    )


_GRAPH_SQL = _GRAPH.format(
    eligible=eligible_relationship(
        "r", "$1::text", "$2::uuid", "$3::integer", "$4::timestamptz", "$4::timestamptz"
    ),
    decision=_latest("support_decisions", "support_id", "decision", "sd", "s.id"),
    ev_status=_latest("evidence_lifecycle_events", "evidence_id", "status", "le", "e.id"),
    src_status=_latest("source_lifecycle_events", "source_id", "status", "ls", "e.source_id"),
)


_GROUP_KEYS_SQL = "SELECT r.semantic_group_key FROM relationships r WHERE " + eligible_relationship(
    "r", "$1::text", "$2::uuid", "$3::integer", "$4::timestamptz", "$4::timestamptz"
)


async def count_groups_upto(conn: Conn, team: str, state: GraphState, limit: int) -> int:
    """The number of semantic groups eligible now, counted only up to ``limit``.

    Why a cursor and a count in Python rather than ``count(DISTINCT ...)`` or
    ``DISTINCT ... LIMIT``: the statement has no sort or aggregate, so every plan
    of it streams, and reading stops as soon as ``limit`` groups are seen; a
    hashed DISTINCT would check the eligibility of every relationship of the
    space first. Must run inside a transaction (the builder's snapshot).
    """
    seen: set[str] = set()
    cursor = conn.cursor(
        _GROUP_KEYS_SQL, team, state.space_id, state.generation, state.now, prefetch=1000
    )
    async for row in cursor:
        seen.add(row["semantic_group_key"])
        if len(seen) >= limit:
            break
    return len(seen)


# Rows per round trip of the graph's cursor: the server checks at most this many
# relationships beyond the point where the builder stops reading.
GRAPH_BATCH = 1000


async def shared_graph(
    conn: Conn, team: str, state: GraphState
) -> AsyncIterator[GraphRelationship]:
    """Every relationship of the shared space eligible now, with its supporting
    evidence, streamed in no particular order.

    A cursor with no sort: the relationships are checked and their support paths
    read only as the builder asks for them, so that a builder that stops at its
    edge limit has not read the whole graph (whose read outlasted the statement
    timeout at 100,000 relationships per space). The materialised CTE is still
    evaluated lazily, row by row as the cursor reads it. Must run inside the
    builder's transaction (its snapshot).
    """
    cursor = conn.cursor(
        _GRAPH_SQL, team, state.space_id, state.generation, state.now, prefetch=GRAPH_BATCH
    )
    async for r in cursor:
        yield GraphRelationship(
            id=r["id"],
            group=r["semantic_group_key"],
            predicate=r["predicate"],
            subject_id=r["subject_entity_id"],
            object_id=r["object_entity_id"],
            evidence_ids=tuple(r["evidence_ids"]),
        )


async def entity_names(conn: Conn, team: str, space_id: UUID, ids: Sequence[str]) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT e.id, e.name FROM entities e "
        "WHERE e.team_id = $1 AND e.space_id = $2 AND e.id = ANY ($3::text[])",
        team,
        space_id,
        list(ids),
    )
    return {r["id"]: r["name"] for r in rows}


# --- the builder's writes ---------------------------------------------------------------


async def start_run(conn: Conn, team: str, space_id: UUID, algorithm: str, seed: int) -> UUID:
    run_id: UUID = await conn.fetchval(
        "INSERT INTO community_runs (team_id, space_id, status, algorithm, seed) "
        "VALUES ($1, $2, 'running', $3, $4) RETURNING id",
        team,
        space_id,
        algorithm,
        seed,
    )
    return run_id


@dataclass(frozen=True, slots=True)
class NewCommunity:
    ordinal: int
    summary: str
    top_entities: tuple[str, ...]
    top_predicates: tuple[str, ...]
    group_count: int
    relationship_count: int
    members: tuple[tuple[str, str], ...]  # (semantic group, relationship ID)


async def finish_run(
    conn: Conn,
    team: str,
    run_id: UUID,
    *,
    status: str,
    state: GraphState,
    node_count: int,
    edge_count: int,
    fingerprint: str | None,
    communities: Sequence[NewCommunity] = (),
    error: str | None = None,
) -> None:
    """Write the communities and members (if any) and the run's final status."""
    if communities:
        await conn.executemany(
            "INSERT INTO communities (team_id, run_id, ordinal, summary, top_entities, "
            "top_predicates, group_count, relationship_count) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            [
                (
                    team,
                    run_id,
                    c.ordinal,
                    c.summary,
                    list(c.top_entities),
                    list(c.top_predicates),
                    c.group_count,
                    c.relationship_count,
                )
                for c in communities
            ],
        )
        await conn.copy_records_to_table(
            "community_members",
            records=[
                (team, run_id, c.ordinal, group, rid)
                for c in communities
                for group, rid in c.members
            ],
            columns=["team_id", "run_id", "ordinal", "semantic_group_key", "relationship_id"],
        )
    await conn.execute(
        "UPDATE community_runs SET status = $3, node_count = $4, edge_count = $5, "
        "graph_fingerprint = $6, graph_watermark = $7, graph_changes = $8, valid_until = $9, "
        "error = $10, finished_at = clock_timestamp() WHERE team_id = $1 AND id = $2",
        team,
        run_id,
        status,
        node_count,
        edge_count,
        fingerprint,
        state.watermark,
        state.changes,
        state.valid_until,
        error,
    )


async def fail_run(conn: Conn, team: str, run_id: UUID, error: str) -> None:
    await conn.execute(
        "UPDATE community_runs SET status = 'failed', error = $3, finished_at = clock_timestamp() "
        "WHERE team_id = $1 AND id = $2",
        team,
        run_id,
        error[:2000],
    )


# --- the recall's read ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotCommunity:
    ordinal: int
    summary: str
    top_entities: tuple[str, ...]
    top_predicates: tuple[str, ...]
    relationship_count: int
    members: tuple[tuple[str, str], ...]  # (group, relationship ID), group then ID order


@dataclass(frozen=True, slots=True)
class Snapshot:
    run_id: UUID | None  # None: no finished run
    status: str | None
    current: bool  # built from the graph as it is now
    communities: tuple[SnapshotCommunity, ...]  # those touching the anchor groups


_SNAPSHOT = """
WITH run AS MATERIALIZED (
    SELECT cr.id, cr.status, cr.graph_changes, cr.valid_until
    FROM community_runs cr
    WHERE cr.team_id = $1 AND cr.space_id = $2 AND cr.status <> 'running'
    ORDER BY cr.started_at DESC, cr.id
    LIMIT 1
),
touched AS MATERIALIZED (
    SELECT DISTINCT m.ordinal
    FROM run JOIN community_members m
      ON m.team_id = $1 AND m.run_id = run.id AND m.semantic_group_key = ANY ($3::text[])
    WHERE run.status = 'succeeded'
)
SELECT run.id, run.status,
       run.graph_changes IS NOT DISTINCT FROM (
           SELECT coalesce(sum(c.changes), 0) FROM graph_change_counters c
            WHERE c.team_id = $1 AND c.space_id = $2)
       AND (run.valid_until IS NULL OR now() < run.valid_until) AS current,
       (SELECT json_agg(json_build_object(
                   'ordinal', c.ordinal, 'summary', c.summary, 'top_entities', c.top_entities,
                   'top_predicates', c.top_predicates,
                   'relationship_count', c.relationship_count,
                   'members', (SELECT json_agg(json_build_array(m.semantic_group_key,
                                                                m.relationship_id)
                                               ORDER BY m.semantic_group_key COLLATE "C",
                                                        m.relationship_id COLLATE "C")
                               FROM community_members m
                               WHERE m.team_id = $1 AND m.run_id = run.id
                                 AND m.ordinal = c.ordinal))
               ORDER BY c.ordinal)
        FROM communities c
        WHERE c.team_id = $1 AND c.run_id = run.id AND c.ordinal IN (SELECT ordinal FROM touched)
       ) AS communities
FROM (SELECT 1) one LEFT JOIN run ON true
"""


async def snapshot(conn: Conn, team: str, space_id: UUID, anchors: Sequence[str]) -> Snapshot:
    """The newest finished run of the shared space, whether it is current, and its
    communities that contain any of the ``anchors`` semantic groups."""
    row = await conn.fetchrow(_SNAPSHOT, team, space_id, list(anchors))
    if row is None or row["id"] is None:
        return Snapshot(None, None, False, ())
    found = json.loads(row["communities"]) if row["communities"] else []
    return Snapshot(
        run_id=row["id"],
        status=row["status"],
        current=bool(row["current"]),
        communities=tuple(
            SnapshotCommunity(
                ordinal=c["ordinal"],
                summary=c["summary"],
                top_entities=tuple(c["top_entities"]),
                top_predicates=tuple(c["top_predicates"]),
                relationship_count=c["relationship_count"],
                members=tuple((g, r) for g, r in c["members"] or []),
            )
            for c in found
        ),
    )


async def team_ids(conn: Conn) -> list[str]:
    """Every team with a shared space (operator work: the builder without --team)."""
    rows = await conn.fetch(
        "SELECT s.team_id FROM memory_spaces s WHERE s.kind = 'shared' ORDER BY s.team_id COLLATE \"C\""
    )
    return [r["team_id"] for r in rows]
