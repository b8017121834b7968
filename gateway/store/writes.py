"""SQL of the write path: lookups of what a record refers to, and the inserts.

Every lookup answers only for rows that are *visible now*: in the named team and
in the current generation of their space. Anything else is absent, so a write
can never attach to hidden or foreign material. Lifecycle state is read from the
latest event (recorded_at, then seq), the same rule the read path uses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import numpy as np
from pgvector import Vector

from gateway.store.bulk_writes import copy_rows
from gateway.store.connection import Conn
from gateway.store.placement import Placer

# --- idempotency -------------------------------------------------------------

Claim = Literal["new", "same", "different"]


@dataclass(frozen=True, slots=True)
class ReadVisible:
    """A :func:`find_visible` to send with a claim (:func:`claim_write`)."""

    kind: VisibleKind
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReadSpace:
    """A :func:`find_space` to send with a claim (:func:`claim_write`)."""

    owner: str | None


@dataclass(frozen=True, slots=True)
class ReadModel:
    """An :func:`embedding_model_and_projection` of the claim's team, to send with
    a claim (:func:`claim_write`)."""


Read = ReadVisible | ReadSpace | ReadModel

_CLAIM = """
WITH claim AS (
    INSERT INTO write_log (team_id, kind, client_id, payload_sha256, recorded_by)
    VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING recorded_at
)
SELECT (SELECT recorded_at FROM claim) AS claimed,
       w.payload_sha256, w.recorded_by, w.recorded_at{reads}
FROM (SELECT 1) AS one
LEFT JOIN write_log w ON w.team_id = $1 AND w.kind = $2 AND w.client_id = $3
"""

_PRIOR = (
    "SELECT payload_sha256, recorded_by, recorded_at FROM write_log "
    "WHERE team_id = $1 AND kind = $2 AND client_id = $3"
)


async def claim_write(
    conn: Conn,
    team: str,
    kind: str,
    client_id: str,
    digest: bytes,
    by: str,
    *,
    any_writer: bool = False,
    reads: Sequence[Read] = (),
) -> tuple[Claim, datetime, list[Any]]:
    """Register a client-supplied write, or say how it compares with the earlier one,
    with the system time of the write that holds the ID. A replay counts as the same
    only from the same writer (or ``any_writer``, the operator): otherwise another
    principal could confirm the exact content of a write it may not read.

    ``reads``: the lookups the record's checks start with (the visible rows of
    some IDs, a space), answered in the same statement as the claim, in order
    (the rows of a :class:`ReadVisible` as :func:`find_visible` gives them, a
    :class:`ReadSpace`'s space or None, a :class:`ReadModel`'s model and
    projection as :func:`embedding_model_and_projection` gives them). Each round trip of a ``remember`` is
    paid for by its caller; the reads see what the claim's next statement would
    have seen (the claim writes nothing they read). A replay or a conflict
    ignores them. The earlier write is read in the same statement; only when it
    committed while the claim waited for it (invisible to the statement's
    snapshot) is it read again in a statement of its own."""
    placer = Placer()
    place_claim = placer.part([team, kind, client_id, digest, by])
    claim = place_claim(_CLAIM)
    # A lookup's $1 is the team, bound once with the claim; its $2 after the claim's.
    same_team = {1: place_claim("$1")}
    columns = []
    for i, read in enumerate(reads):
        if isinstance(read, ReadSpace):
            sql = placer.part([team, read.owner], same_team)(_SPACE)
        elif isinstance(read, ReadModel):
            sql = placer.part([team], same_team)(_MODEL_AND_PROJECTION)
        else:
            sql = placer.part([team, list(read.ids)], same_team)(_visible_sql(read.kind))
        columns.append(f",\n       (SELECT coalesce(json_agg(v), '[]') FROM ({sql}) v) AS read_{i}")
    row = await conn.fetchrow(claim.replace("{reads}", "".join(columns)), *placer.args)
    assert row is not None
    answers: list[Any] = []
    for i, read in enumerate(reads):
        found = json.loads(row[f"read_{i}"])
        if isinstance(read, ReadSpace):
            answers.append(Space(**{**found[0], "id": UUID(found[0]["id"])}) if found else None)
        elif isinstance(read, ReadModel):
            answers.append(_model_and_projection(found[0]))
        else:
            answers.append(_visible_rows(found))
    if row["claimed"] is not None:
        return "new", row["claimed"], answers
    stored = (
        row
        if row["recorded_at"] is not None
        else await conn.fetchrow(_PRIOR, team, kind, client_id)
    )
    assert stored is not None  # write_log rows are never deleted
    same = stored["payload_sha256"] == digest and (any_writer or stored["recorded_by"] == by)
    return ("same" if same else "different"), stored["recorded_at"], answers


# --- counter shards ------------------------------------------------------------


async def claim_counter_shard(conn: Conn) -> int:
    """Claim, for the rest of the transaction, the shard of the per-space counters
    that its triggers will write (db/0160): one no other transaction holds, so two
    writers never wait on each other's counter rows (the deadlock of two writers
    of two spaces in opposite orders). Called first thing in a write transaction,
    while it holds no other lock: the only wait it can meet (every shard held) then
    waits for nothing that waits for it. The triggers claim by themselves for
    writers that did not (the owner's direct SQL)."""
    return int(await conn.fetchval("SELECT recall_stats_shard()"))


# --- spaces --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Space:
    id: UUID
    kind: str
    owner: str | None
    generation: int


_SPACE = """
SELECT s.id, s.kind, s.owner_principal_id AS owner,
       (SELECT max(g.generation) FROM space_generations g
         WHERE g.team_id = s.team_id AND g.space_id = s.id) AS generation
FROM memory_spaces s
WHERE s.team_id = $1 AND s.owner_principal_id IS NOT DISTINCT FROM $2
"""


async def find_space(conn: Conn, team: str, owner: str | None) -> Space | None:
    """The team's shared space (owner None) or a principal's private space."""
    row = await conn.fetchrow(_SPACE, team, owner)
    return Space(**dict(row)) if row else None


async def insert_team(conn: Conn, team: str, name: str, by: str) -> None:
    await conn.execute("INSERT INTO teams (id, name) VALUES ($1, $2)", team, name)
    await conn.execute("INSERT INTO memory_spaces (team_id, kind) VALUES ($1, 'shared')", team)


async def team_exists(conn: Conn, team: str) -> bool:
    return bool(await conn.fetchval("SELECT true FROM teams WHERE id = $1", team))


async def principal_exists(conn: Conn, team: str, principal: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT true FROM principals WHERE team_id = $1 AND id = $2", team, principal
        )
    )


async def insert_principal(
    conn: Conn,
    team: str,
    principal: str,
    kind: str,
    display_name: str,
    private_space: bool,
) -> None:
    await conn.execute(
        "INSERT INTO principals (team_id, id, kind, display_name) VALUES ($1, $2, $3, $4)",
        team,
        principal,
        kind,
        display_name,
    )
    if private_space:
        await conn.execute(
            "INSERT INTO memory_spaces (team_id, kind, owner_principal_id) VALUES ($1, 'private', $2)",
            team,
            principal,
        )


async def token_exists(conn: Conn, token_id: str) -> bool:
    return bool(await conn.fetchval("SELECT true FROM api_tokens WHERE id = $1", token_id))


async def insert_token(
    conn: Conn,
    token_id: str,
    team: str,
    principal: str,
    secret_sha256: bytes,
    binding: str,
    label: str | None,
    expires_at: datetime | None,
) -> None:
    await conn.execute(
        "INSERT INTO api_tokens (id, team_id, principal_id, secret_sha256, binding, label, expires_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7)",
        token_id,
        team,
        principal,
        secret_sha256,
        binding,
        label,
        expires_at,
    )


async def insert_space_generation(
    conn: Conn, team: str, space: Space, reset_id: str, reason: str | None, by: str
) -> int:
    generation = space.generation + 1
    await conn.execute(
        "INSERT INTO space_generations (team_id, space_id, generation, reset_id, reason, recorded_by) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        team,
        space.id,
        generation,
        reset_id,
        reason,
        by,
    )
    return generation


# --- visible objects -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Visible:
    """A row that a write may refer to, with the state the write needs."""

    id: str
    space_id: UUID
    space_owner: str | None
    generation: int
    extra: dict[str, Any]


_CURRENT_GENERATION = """(SELECT max(g.generation) FROM space_generations g
                          WHERE g.team_id = o.team_id AND g.space_id = o.space_id)"""

_LATEST = """(SELECT e.{col} FROM {events} e
              WHERE e.team_id = o.team_id AND e.{fk} = o.id
              ORDER BY e.recorded_at DESC, e.seq DESC LIMIT 1)"""


def _latest(events: str, fk: str, col: str) -> str:
    return _LATEST.format(events=events, fk=fk, col=col)


_EXTRA: dict[str, tuple[str, str]] = {
    "source": ("sources", _latest("source_lifecycle_events", "source_id", "status") + " AS status"),
    "evidence": (
        "evidence",
        "o.content, "
        + _latest("evidence_lifecycle_events", "evidence_id", "status")
        + " AS status",
    ),
    "entity": ("entities", "o.name"),
    "relationship": (
        "relationships",
        "o.statement, "
        + _latest("relationship_status_events", "relationship_id", "status")
        + " AS status",
    ),
    "conflict_case": (
        "conflict_cases",
        _latest("conflict_case_events", "case_id", "event") + " AS state",
    ),
    "hypothesis": (
        "hypotheses",
        _latest("hypothesis_feedback", "hypothesis_id", "status") + " AS status",
    ),
}

_VISIBLE = """
SELECT o.id, o.space_id, s.owner_principal_id AS space_owner, o.generation{extra}
FROM {table} o
JOIN memory_spaces s ON s.team_id = o.team_id AND s.id = o.space_id
WHERE o.team_id = $1 AND o.id = ANY($2::text[]) AND o.generation = {current}
"""

_VISIBLE_SUPPORT = """
SELECT o.id, o.space_id, s.owner_principal_id AS space_owner, ev.generation,
       o.evidence_id, o.relationship_id,
       (SELECT d.decision FROM support_decisions d
         WHERE d.team_id = o.team_id AND d.support_id = o.id
         ORDER BY d.recorded_at DESC, d.seq DESC LIMIT 1) AS decision
FROM supports o
JOIN evidence ev ON ev.team_id = o.team_id AND ev.id = o.evidence_id
JOIN relationships r ON r.team_id = o.team_id AND r.id = o.relationship_id
JOIN memory_spaces s ON s.team_id = o.team_id AND s.id = o.space_id
WHERE o.team_id = $1 AND o.id = ANY($2::text[])
  AND ev.generation = (SELECT max(g.generation) FROM space_generations g
                        WHERE g.team_id = o.team_id AND g.space_id = o.space_id)
  AND r.generation = ev.generation
"""

VisibleKind = Literal[
    "source", "evidence", "entity", "relationship", "conflict_case", "hypothesis", "support"
]


async def find_visible(
    conn: Conn, kind: VisibleKind, team: str, ids: Sequence[str]
) -> dict[str, Visible]:
    """Rows of ``kind`` by ID that are visible now; absent IDs are simply missing."""
    if not ids:
        return {}
    rows = await conn.fetch(_visible_sql(kind), team, list(ids))
    return _visible_rows([dict(row) for row in rows])


async def space_owner_of(
    conn: Conn, kind: VisibleKind, team: str, ident: str
) -> tuple[bool, str | None]:
    """Whether a row of ``kind`` has this ID in any generation, and the owner of
    its space (None: the shared space), as the caller's tenancy lets it read
    rows. For a replay's check (``gateway.services.writes``): a row that an
    earlier generation holds is still the same write's, while a row of a space
    the caller cannot read is not there for it."""
    table = "supports" if kind == "support" else _EXTRA[kind][0]
    row = await conn.fetchrow(
        f"SELECT s.owner_principal_id FROM {table} o "
        "JOIN memory_spaces s ON s.team_id = o.team_id AND s.id = o.space_id "
        "WHERE o.team_id = $1 AND o.id = $2",
        team,
        ident,
    )
    return (False, None) if row is None else (True, row["owner_principal_id"])


def _visible_sql(kind: VisibleKind) -> str:
    if kind == "support":
        return _VISIBLE_SUPPORT
    table, extra = _EXTRA[kind]
    return _VISIBLE.format(table=table, extra=", " + extra, current=_CURRENT_GENERATION)


def _visible_rows(rows: Sequence[dict[str, Any]]) -> dict[str, Visible]:
    """Rows of :func:`_visible_sql`, from asyncpg or as JSON (a UUID as text)."""
    found: dict[str, Visible] = {}
    for data in rows:
        data = dict(data)
        ident = data.pop("id")
        space_id = data.pop("space_id")
        found[ident] = Visible(
            id=ident,
            space_id=space_id if isinstance(space_id, UUID) else UUID(space_id),
            space_owner=data.pop("space_owner"),
            generation=data.pop("generation"),
            extra=data,
        )
    return found


async def occurrences_of(
    conn: Conn, team: str, evidence_id: str, ids: Sequence[str]
) -> dict[str, tuple[str, int, int]]:
    rows = await conn.fetch(
        "SELECT id, quote, span_start, span_end FROM evidence_occurrences "
        "WHERE team_id = $1 AND evidence_id = $2 AND id = ANY($3::text[])",
        team,
        evidence_id,
        list(ids),
    )
    return {r["id"]: (r["quote"], r["span_start"], r["span_end"]) for r in rows}


async def positions_of(conn: Conn, team: str, case_id: str) -> set[str]:
    rows = await conn.fetch(
        "SELECT id FROM conflict_positions WHERE team_id = $1 AND case_id = $2", team, case_id
    )
    return {r["id"] for r in rows}


# --- inserts -----------------------------------------------------------------------


async def insert_source(
    conn: Conn,
    team: str,
    source_id: str,
    space: Space,
    kind: str,
    title: str,
    uri: str | None,
    authority: str,
    created_at: datetime | None,
    by: str,
) -> None:
    await conn.execute(
        "INSERT INTO sources (team_id, id, space_id, generation, kind, title, uri, authority, "
        "created_at, recorded_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        team,
        source_id,
        space.id,
        space.generation,
        kind,
        title,
        uri,
        authority,
        created_at,
        by,
    )
    await insert_lifecycle(conn, "source", team, space.id, source_id, None, "active", None, by)


_LIFECYCLE: dict[str, tuple[str, str]] = {
    "source": ("source_lifecycle_events", "source_id"),
    "evidence": ("evidence_lifecycle_events", "evidence_id"),
}


async def insert_lifecycle(
    conn: Conn,
    kind: Literal["source", "evidence"],
    team: str,
    space_id: UUID,
    target: str,
    event_id: str | None,
    status: str,
    reason: str | None,
    by: str,
) -> None:
    table, fk = _LIFECYCLE[kind]
    await conn.execute(
        f"INSERT INTO {table} (team_id, space_id, {fk}, event_id, status, reason, recorded_by) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7)",
        team,
        space_id,
        target,
        event_id,
        status,
        reason,
        by,
    )


async def insert_entity(
    conn: Conn,
    team: str,
    entity_id: str,
    space: Space,
    name: str,
    kind: str,
    aliases: Sequence[str],
    by: str,
) -> None:
    await conn.execute(
        "INSERT INTO entities (team_id, id, space_id, generation, name, kind, aliases, recorded_by) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        team,
        entity_id,
        space.id,
        space.generation,
        name,
        kind,
        list(aliases),
        by,
    )


_EVIDENCE = """
WITH ev AS (
    INSERT INTO evidence (team_id, id, space_id, generation, source_id, content,
                          content_sha256, observed_at, recorded_by)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    RETURNING team_id, space_id, id, recorded_by
)
INSERT INTO evidence_lifecycle_events (team_id, space_id, evidence_id, event_id, status,
                                       reason, recorded_by)
SELECT team_id, space_id, id, NULL, 'active', NULL, recorded_by FROM ev
"""

# Occurrences and mentions of one evidence. Not in the evidence's statement: the
# occurrences' quote trigger reads the evidence row, which a sibling part of the
# same statement would not see yet. The occurrences go in first (the mentions read
# their count), so a refusal names the table it always named; the mentions' foreign
# key to an occurrence is checked at the end of the statement.
_OCCURRENCES_AND_MENTIONS = """
WITH occ AS (
    INSERT INTO evidence_occurrences (team_id, space_id, evidence_id, id, quote,
                                      span_start, span_end)
    SELECT $1, $2, $3, o.id, o.quote, o.span_start, o.span_end
    FROM unnest($4::text[], $5::text[], $6::int[], $7::int[])
         WITH ORDINALITY AS o(id, quote, span_start, span_end, n)
    ORDER BY o.n
    RETURNING 1
)
INSERT INTO evidence_entity_mentions (team_id, space_id, evidence_id, entity_id, occurrence_id)
SELECT $1, $2, $3, m.entity_id, m.occurrence_id
FROM (SELECT count(*) FROM occ) AS occurrences_first,
     unnest($8::text[], $9::text[]) WITH ORDINALITY AS m(entity_id, occurrence_id, n)
ORDER BY m.n
"""


async def insert_evidence(
    conn: Conn,
    team: str,
    evidence_id: str,
    source: Visible,
    content: str,
    content_sha256: bytes,
    observed_at: datetime | None,
    occurrences: Sequence[tuple[str, str, int, int]],
    mentions: Sequence[tuple[str, str | None]],
    by: str,
) -> None:
    """The evidence with its first lifecycle event (``active``) in one statement, and
    its occurrences and mentions in a second one (none without either): each
    round trip of a ``remember`` is paid for by its caller (docs/writes.md)."""
    await conn.execute(
        _EVIDENCE,
        team,
        evidence_id,
        source.space_id,
        source.generation,
        source.id,
        content,
        content_sha256,
        observed_at,
        by,
    )
    if occurrences or mentions:
        await conn.execute(
            _OCCURRENCES_AND_MENTIONS,
            team,
            source.space_id,
            evidence_id,
            [o[0] for o in occurrences],
            [o[1] for o in occurrences],
            [o[2] for o in occurrences],
            [o[3] for o in occurrences],
            [m[0] for m in mentions],
            [m[1] for m in mentions],
        )


async def insert_evidence_embeddings(
    conn: Conn,
    rows: Sequence[tuple[str, UUID, str]],
    vectors: np.ndarray,
    model: str,
    *,
    copy: bool = False,
    into: str | None = None,
) -> None:
    """``copy``: one binary COPY (the owner only: COPY refuses tables under row-level
    security for the application role), else one pipelined INSERT per row.
    ``into``: copy into that table (the space's detached partition) instead."""
    dims = int(vectors.shape[1])
    if not copy:
        await conn.executemany(
            "INSERT INTO evidence_embeddings (team_id, space_id, evidence_id, model, dimensions, "
            "embedding) VALUES ($1, $2, $3, $4, $5, $6)",
            [(t, s, e, model, dims, vectors[i]) for i, (t, s, e) in enumerate(rows)],
        )
        return
    await copy_rows(
        conn,
        "evidence_embeddings",
        [(t, s, e, model, dims, vectors[i]) for i, (t, s, e) in enumerate(rows)],
        into=into,
    )


_EMBEDDINGS = """
WITH ev AS (
    INSERT INTO evidence_embeddings (team_id, space_id, evidence_id, model, dimensions,
                                     embedding)
    SELECT e.team_id, e.space_id, e.evidence_id, $4, $5, e.embedding
    FROM unnest($1::text[], $2::uuid[], $3::text[], $6::vector[])
         WITH ORDINALITY AS e(team_id, space_id, evidence_id, embedding, n)
    ORDER BY e.n
)
INSERT INTO relationship_embeddings (team_id, space_id, relationship_id,
                                     projection_generation, model, dimensions, embedding)
SELECT r.team_id, r.space_id, r.relationship_id, r.generation, $4, $5, r.embedding
FROM unnest($7::text[], $8::uuid[], $9::text[], $10::int[], $11::vector[])
     WITH ORDINALITY AS r(team_id, space_id, relationship_id, generation, embedding, n)
ORDER BY r.n
"""


async def insert_embeddings(
    conn: Conn,
    evidence: Sequence[tuple[str, UUID, str]],
    evidence_vectors: np.ndarray,
    relationships: Sequence[tuple[str, UUID, str, int]],
    relationship_vectors: np.ndarray,
    model: str,
) -> None:
    """The vectors of a principal's batch, evidence and relationships, in one
    statement: they are stored after the last embedding ends, so this statement is
    on the critical path of every ``remember`` (the owner's loader copies
    instead, :func:`insert_evidence_embeddings`). Each vector is wrapped: asyncpg
    would take a bare array for one more dimension of the ``vector[]``."""
    dims = int((evidence_vectors if len(evidence) else relationship_vectors).shape[1])
    await conn.execute(
        _EMBEDDINGS,
        [t for t, _, _ in evidence],
        [s for _, s, _ in evidence],
        [e for _, _, e in evidence],
        model,
        dims,
        [Vector(v) for v in evidence_vectors[: len(evidence)]],
        [t for t, _, _, _ in relationships],
        [s for _, s, _, _ in relationships],
        [r for _, _, r, _ in relationships],
        [g for _, _, _, g in relationships],
        [Vector(v) for v in relationship_vectors[: len(relationships)]],
    )


@dataclass(frozen=True, slots=True)
class NewRelationship:
    team: str
    id: str
    space: Space
    subject: str
    predicate: str
    object_entity: str | None
    object_value: str | None
    object_unit: str | None
    polarity: str
    valid_from: datetime | None
    valid_to: datetime | None
    owner: str
    group_key: str
    statement: str


_RELATIONSHIP = """
WITH rel AS (
    INSERT INTO relationships (team_id, id, space_id, generation, subject_entity_id,
                               predicate, object_entity_id, object_value, object_unit, polarity,
                               valid_from, valid_to, owner_principal_id, semantic_group_key,
                               statement, recorded_by)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
    RETURNING team_id, space_id, id, recorded_by
)
INSERT INTO relationship_status_events (team_id, space_id, relationship_id, event_id, status,
                                        superseded_by, reason, recorded_by)
SELECT team_id, space_id, id, NULL, 'active', NULL, NULL, recorded_by FROM rel
"""


async def insert_relationship(conn: Conn, r: NewRelationship, by: str) -> None:
    """The relationship with its first status event (``active``), one statement."""
    await conn.execute(
        _RELATIONSHIP,
        r.team,
        r.id,
        r.space.id,
        r.space.generation,
        r.subject,
        r.predicate,
        r.object_entity,
        r.object_value,
        r.object_unit,
        r.polarity,
        r.valid_from,
        r.valid_to,
        r.owner,
        r.group_key,
        r.statement,
        by,
    )


async def insert_relationship_status(
    conn: Conn,
    team: str,
    space_id: UUID,
    relationship_id: str,
    event_id: str | None,
    status: str,
    superseded_by: str | None,
    reason: str | None,
    by: str,
) -> None:
    await conn.execute(
        "INSERT INTO relationship_status_events (team_id, space_id, relationship_id, event_id, "
        "status, superseded_by, reason, recorded_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        team,
        space_id,
        relationship_id,
        event_id,
        status,
        superseded_by,
        reason,
        by,
    )


async def active_projection(conn: Conn, team: str, model: str) -> int:
    """The team's active relationship projection generation, made on first use.
    Two transactions making it at once (two batches of a pipelined load, two
    writes into a new team) both get it: the second waits for the first's row
    and then reads it, instead of failing on its key."""
    active = (
        "SELECT generation FROM relationship_projections WHERE team_id = $1 AND status = 'active'"
    )
    generation = await conn.fetchval(active, team)
    if generation is not None:
        return int(generation)
    made = await conn.fetchval(
        "INSERT INTO relationship_projections (team_id, generation, model, status, activated_at) "
        "VALUES ($1, 1, $2, 'active', now()) ON CONFLICT DO NOTHING RETURNING generation",
        team,
        model,
    )
    if made is None:
        generation = await conn.fetchval(active, team)
        if generation is None:  # generation 1 exists, not active: refused as before
            await conn.execute(
                "INSERT INTO relationship_projections (team_id, generation, model, status, "
                "activated_at) VALUES ($1, 1, $2, 'active', now())",
                team,
                model,
            )
        return int(generation)
    return 1


async def insert_relationship_embeddings(
    conn: Conn,
    rows: Sequence[tuple[str, UUID, str, int]],
    vectors: np.ndarray,
    model: str,
    *,
    copy: bool = False,
    into: str | None = None,
) -> None:
    """As :func:`insert_evidence_embeddings`."""
    dims = int(vectors.shape[1])
    if not copy:
        await conn.executemany(
            "INSERT INTO relationship_embeddings (team_id, space_id, relationship_id, "
            "projection_generation, model, dimensions, embedding) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7)",
            [(t, s, r, g, model, dims, vectors[i]) for i, (t, s, r, g) in enumerate(rows)],
        )
        return
    await copy_rows(
        conn,
        "relationship_embeddings",
        [(t, s, r, g, model, dims, vectors[i]) for i, (t, s, r, g) in enumerate(rows)],
        into=into,
    )


_SUPPORT = """
WITH sup AS (
    INSERT INTO supports (team_id, id, space_id, evidence_id, relationship_id, occurrence_id,
                          quote, span_start, span_end, recorded_by)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    RETURNING team_id, space_id, id, recorded_by
)
INSERT INTO support_decisions (team_id, space_id, support_id, decision_id, decision, reason,
                               recorded_by)
SELECT team_id, space_id, id, NULL, 'grant', NULL, recorded_by FROM sup
"""


async def insert_support(
    conn: Conn,
    team: str,
    support_id: str,
    space_id: UUID,
    evidence_id: str,
    relationship_id: str,
    occurrence_id: str | None,
    quote: str | None,
    span: tuple[int, int] | None,
    by: str,
) -> None:
    """The support with its first decision (``grant``), one statement."""
    await conn.execute(
        _SUPPORT,
        team,
        support_id,
        space_id,
        evidence_id,
        relationship_id,
        occurrence_id,
        quote,
        span[0] if span else None,
        span[1] if span else None,
        by,
    )


async def insert_support_decision(
    conn: Conn,
    team: str,
    space_id: UUID,
    support_id: str,
    decision_id: str | None,
    decision: str,
    reason: str | None,
    by: str,
) -> None:
    await conn.execute(
        "INSERT INTO support_decisions (team_id, space_id, support_id, decision_id, decision, "
        "reason, recorded_by) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        team,
        space_id,
        support_id,
        decision_id,
        decision,
        reason,
        by,
    )


async def insert_conflict_case(
    conn: Conn,
    team: str,
    case_id: str,
    space: Space,
    question: str,
    positions: Sequence[tuple[str, str, Sequence[str]]],
    reason: str | None,
    by: str,
) -> None:
    await conn.execute(
        "INSERT INTO conflict_cases (team_id, id, space_id, generation, question, recorded_by) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        team,
        case_id,
        space.id,
        space.generation,
        question,
        by,
    )
    await conn.executemany(
        "INSERT INTO conflict_positions (team_id, space_id, case_id, id, label) "
        "VALUES ($1, $2, $3, $4, $5)",
        [(team, space.id, case_id, pid, label) for pid, label, _ in positions],
    )
    await conn.executemany(
        "INSERT INTO conflict_position_relationships (team_id, space_id, case_id, position_id, "
        "relationship_id) VALUES ($1, $2, $3, $4, $5)",
        [(team, space.id, case_id, pid, rel) for pid, _, rels in positions for rel in rels],
    )
    await insert_conflict_event(conn, team, space.id, case_id, None, "open", None, reason, by)


async def insert_conflict_event(
    conn: Conn,
    team: str,
    space_id: UUID,
    case_id: str,
    event_id: str | None,
    event: str,
    preferred_position: str | None,
    reason: str | None,
    by: str,
) -> None:
    await conn.execute(
        "INSERT INTO conflict_case_events (team_id, space_id, case_id, event_id, event, "
        "preferred_position_id, reason, recorded_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        team,
        space_id,
        case_id,
        event_id,
        event,
        preferred_position,
        reason,
        by,
    )


async def insert_evidence_conflict(
    conn: Conn,
    team: str,
    conflict_id: str,
    space: Space,
    question: str,
    positions: Sequence[tuple[str, str, str, str]],
    by: str,
) -> None:
    await conn.execute(
        "INSERT INTO evidence_conflicts (team_id, id, space_id, generation, question, recorded_by) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        team,
        conflict_id,
        space.id,
        space.generation,
        question,
        by,
    )
    await conn.executemany(
        "INSERT INTO evidence_conflict_positions (team_id, space_id, conflict_id, id, label, "
        "evidence_id, occurrence_id) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        [(team, space.id, conflict_id, *p) for p in positions],
    )


async def insert_hypothesis(
    conn: Conn,
    team: str,
    hypothesis_id: str,
    space: Space,
    statement: str,
    origin: str,
    proposed_by: str | None,
    relationships: Sequence[str],
    evidence: Sequence[str],
    by: str,
) -> None:
    await conn.execute(
        "INSERT INTO hypotheses (team_id, id, space_id, generation, statement, origin, "
        "proposed_by, recorded_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        team,
        hypothesis_id,
        space.id,
        space.generation,
        statement,
        origin,
        proposed_by,
        by,
    )
    if relationships:
        await conn.executemany(
            "INSERT INTO hypothesis_relationships (team_id, space_id, hypothesis_id, "
            "relationship_id) VALUES ($1, $2, $3, $4)",
            [(team, space.id, hypothesis_id, r) for r in relationships],
        )
    if evidence:
        await conn.executemany(
            "INSERT INTO hypothesis_evidence (team_id, space_id, hypothesis_id, evidence_id) "
            "VALUES ($1, $2, $3, $4)",
            [(team, space.id, hypothesis_id, e) for e in evidence],
        )
    await insert_hypothesis_feedback(
        conn, team, space.id, hypothesis_id, None, "propose", "proposed", None, by
    )


async def insert_hypothesis_feedback(
    conn: Conn,
    team: str,
    space_id: UUID,
    hypothesis_id: str,
    feedback_id: str | None,
    decision: str,
    status: str,
    note: str | None,
    by: str,
) -> None:
    await conn.execute(
        "INSERT INTO hypothesis_feedback (team_id, space_id, hypothesis_id, feedback_id, decision, "
        "status, note, recorded_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        team,
        space_id,
        hypothesis_id,
        feedback_id,
        decision,
        status,
        note,
        by,
    )


# --- embedding model registry --------------------------------------------------------


async def store_embedding_model(conn: Conn) -> tuple[str, int] | None:
    row = await conn.fetchrow("SELECT name, dimensions FROM embedding_models")
    return (row["name"], row["dimensions"]) if row else None


async def embedding_model_and_projection(
    conn: Conn, team: str
) -> tuple[tuple[str, int] | None, int | None]:
    """:func:`store_embedding_model` and the team's active projection generation
    (None when there is none yet: :func:`active_projection` makes it), one
    statement for the two reads every write of relationships makes."""
    row = await conn.fetchrow(_MODEL_AND_PROJECTION, team)
    assert row is not None
    return _model_and_projection(dict(row))


_MODEL_AND_PROJECTION = (
    "SELECT m.name, m.dimensions, (SELECT p.generation FROM relationship_projections p "
    "WHERE p.team_id = $1 AND p.status = 'active') AS generation "
    "FROM (SELECT NULL) AS one LEFT JOIN embedding_models m ON true"
)


def _model_and_projection(row: dict[str, Any]) -> tuple[tuple[str, int] | None, int | None]:
    """A row of :data:`_MODEL_AND_PROJECTION`, from asyncpg or as JSON."""
    model = (row["name"], row["dimensions"]) if row["name"] is not None else None
    return model, row["generation"]


async def register_embedding_model(conn: Conn, name: str, dimensions: int) -> None:
    await conn.execute(
        "INSERT INTO embedding_models (name, dimensions) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        name,
        dimensions,
    )
