"""Set-based writes for runs of creation records: the loader's fast path.

A bulk load is mostly sources, entities, evidence and relationships with their
supports. Written one at a time, each record costs a claim, a lookup per
reference and an insert per row: about five round trips, so a load waits on
the network, not on the database. Here a run of such records costs one claim
statement, one lookup per kind of reference and one ``COPY`` per table.

The rule that keeps the answers identical: this path only ever *accepts*. It
writes a run only when every check of the record-at-a-time path
(``gateway/services/writes.py``) passes, evaluated against the same state
(the database before the run plus the records of the run on earlier lines).
Whenever a record would be refused, or its outcome depends on something this
path does not model, it raises :class:`Fallback`; the caller rolls the
transaction back and applies the batch record by record, which then reports
the refusal with its usual line, field, code and message. A database refusal
of a copied row (a reused occurrence or support ID, a quote that does not
match) aborts the transaction the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast
from uuid import UUID

from gateway.services import records as rec
from gateway.services.records import render_statement
from gateway.store import bulk_writes as bulk
from gateway.store import writes as store
from gateway.store.connection import Conn

BULK_KINDS = frozenset({"source", "entity", "evidence", "relationship"})


class Fallback(Exception):
    """The run cannot be shown acceptable set-wise; apply it record by record."""


def eligible(record: Any) -> bool:
    """Whether a record can go through this path (supports citing an occurrence
    by ID need its lookup per support, and stay on the record-at-a-time path)."""
    if record.kind not in BULK_KINDS:
        return False
    if record.kind == "relationship":
        return all(s.occurrence is None for s in record.supports)
    return True


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a referable object lives: enough to check a reference to it."""

    space_id: UUID
    generation: int
    text: str  # an entity's name or an evidence's content; empty otherwise
    line: int  # its index in the run; -1 when it was in the database already


@dataclass
class RunOutcome:
    """Per record of the run, in order: (created, system time of the write)."""

    receipts: list[tuple[bool, datetime]]
    evidence_texts: list[tuple[str, UUID, str, str]]
    relationship_texts: list[tuple[str, UUID, str, str]]
    supplied: dict[tuple[str, str, str], Sequence[float]]


class _Run:
    def __init__(self, conn: Conn, by: str) -> None:
        self.conn = conn
        self.by = by
        self.spaces: dict[tuple[str, str | None], store.Space] = {}
        # (kind, team, id) -> place, for sources, entities and evidence
        self.places: dict[tuple[str, str, str], _Place] = {}
        self.rows: dict[str, list[tuple[Any, ...]]] = {t: [] for t in bulk.COPY_TABLES}

    async def load_spaces(self, records: Sequence[Any]) -> None:
        for r in records:
            if r.kind in ("source", "entity", "relationship"):
                key = (r.team, rec.private_owner(r.space))
                if key not in self.spaces:
                    space = await store.find_space(self.conn, *key)
                    if space is None:
                        raise Fallback
                    self.spaces[key] = space

    async def load_places(self, records: Sequence[Any]) -> None:
        """The database's visible sources, entities and evidence that the run names
        and does not create itself."""
        created = {(r.kind, r.team, r.id) for r in records}
        wanted: dict[tuple[store.VisibleKind, str], set[str]] = {}

        def want(kind: store.VisibleKind, team: str, ident: str) -> None:
            if (kind, team, ident) not in created:
                wanted.setdefault((kind, team), set()).add(ident)

        for r in records:
            if r.kind == "evidence":
                want("source", r.team, r.source)
                for m in r.mentions:
                    want("entity", r.team, m.entity)
            elif r.kind == "relationship":
                want("entity", r.team, r.subject)
                if r.object is not None:
                    want("entity", r.team, r.object)
                for s in r.supports:
                    want("evidence", r.team, s.evidence)
        for (kind, team), ids in wanted.items():
            found = await store.find_visible(self.conn, kind, team, sorted(ids))
            for ident, row in found.items():
                text = ""
                if kind == "entity":
                    text = row.extra["name"]
                elif kind == "evidence":
                    text = row.extra["content"]
                self.places[(kind, team, ident)] = _Place(row.space_id, row.generation, text, -1)

    def place(self, kind: str, team: str, ident: str, line: int) -> _Place:
        """A visible object written before ``line``, or :class:`Fallback`."""
        found = self.places.get((kind, team, ident))
        if found is None or found.line >= line:
            raise Fallback
        return found

    # --- the kinds -----------------------------------------------------------------

    def source(self, line: int, r: rec.SourceRecord) -> None:
        space = self.spaces[(r.team, rec.private_owner(r.space))]
        self.rows["sources"].append(
            (
                r.team,
                r.id,
                space.id,
                space.generation,
                r.type,
                r.title,
                r.uri,
                r.authority,
                r.created_at,
                self.by,
            )
        )
        self.rows["source_lifecycle_events"].append(
            (r.team, space.id, r.id, None, "active", None, self.by)
        )
        self.places[("source", r.team, r.id)] = _Place(space.id, space.generation, "", line)

    def entity(self, line: int, r: rec.EntityRecord) -> None:
        space = self.spaces[(r.team, rec.private_owner(r.space))]
        self.rows["entities"].append(
            (r.team, r.id, space.id, space.generation, r.name, r.type, list(r.aliases), self.by)
        )
        self.places[("entity", r.team, r.id)] = _Place(space.id, space.generation, r.name, line)

    def evidence(self, line: int, r: rec.EvidenceRecord) -> None:
        source = self.place("source", r.team, r.source, line)
        for m in r.mentions:
            if self.place("entity", r.team, m.entity, line).space_id != source.space_id:
                raise Fallback
        self.rows["evidence"].append(
            (
                r.team,
                r.id,
                source.space_id,
                source.generation,
                r.source,
                r.content,
                hashlib.sha256(r.content.encode()).digest(),
                r.observed_at,
                self.by,
            )
        )
        self.rows["evidence_lifecycle_events"].append(
            (r.team, source.space_id, r.id, None, "active", None, self.by)
        )
        self.rows["evidence_occurrences"].extend(
            (r.team, source.space_id, r.id, o.id, r.content[o.start : o.end], o.start, o.end)
            for o in r.occurrences
        )
        self.rows["evidence_entity_mentions"].extend(
            (r.team, source.space_id, r.id, m.entity, m.occurrence) for m in r.mentions
        )
        self.places[("evidence", r.team, r.id)] = _Place(
            source.space_id, source.generation, r.content, line
        )

    def relationship(self, line: int, r: rec.RelationshipRecord, principals: set[str]) -> str:
        space = self.spaces[(r.team, rec.private_owner(r.space))]
        owner = r.owner if r.owner is not None else space.owner
        if owner is None or (space.owner is not None and owner != space.owner):
            raise Fallback
        if owner not in principals:
            raise Fallback
        subject = self.place("entity", r.team, r.subject, line)
        obj = self.place("entity", r.team, r.object, line) if r.object is not None else None
        if subject.space_id != space.id or (obj is not None and obj.space_id != space.id):
            raise Fallback
        statement = render_statement(
            subject.text,
            r.predicate,
            obj.text if obj is not None else cast(str, r.object_value),
            r.object_unit,
            r.polarity,
        )
        self.rows["relationships"].append(
            (
                r.team,
                r.id,
                space.id,
                space.generation,
                r.subject,
                r.predicate,
                r.object,
                r.object_value,
                r.object_unit,
                r.polarity,
                r.valid_from,
                r.valid_to,
                owner,
                r.semantic_group or r.default_group_key(),
                statement,
                self.by,
            )
        )
        self.rows["relationship_status_events"].append(
            (r.team, space.id, r.id, None, "active", None, None, self.by)
        )
        for spec in r.supports:
            ev = self.place("evidence", r.team, spec.evidence, line)
            if ev.space_id != space.id:
                raise Fallback
            quote, start, end = None, None, None
            if spec.start is not None and spec.end is not None:
                if spec.end > len(ev.text):
                    raise Fallback
                actual = ev.text[spec.start : spec.end]
                if spec.quote is not None and spec.quote != actual:
                    raise Fallback
                quote, start, end = actual, spec.start, spec.end
            self.rows["supports"].append(
                (r.team, spec.id, space.id, spec.evidence, r.id, None, quote, start, end, self.by)
            )
            self.rows["support_decisions"].append(
                (r.team, space.id, spec.id, None, "grant", None, self.by)
            )
        return statement


# The statement time a copied record may take, beyond the usual timeout: a COPY
# of a run replaces several statements per record, each with the full timeout.
STATEMENT_MS_PER_RECORD = 100


async def apply_run(
    conn: Conn, records: Sequence[Any], by: str, *, statement_timeout_ms: int
) -> RunOutcome:
    """Write a run of :func:`eligible` records of the operator, or raise :class:`Fallback`
    (the transaction must then be rolled back: rows may already be written)."""
    keys = [(r.team, r.kind, r.id) for r in records]
    if len(set(keys)) != len(keys):
        raise Fallback  # the same ID twice in a run: the second sees the first
    digests = [r.payload_sha256() for r in records]
    claims = await bulk.claim_writes(
        conn, [(*k, d) for k, d in zip(keys, digests, strict=True)], by
    )
    new: list[tuple[int, Any]] = []
    receipts: list[tuple[bool, datetime]] = []
    for i, (key, digest) in enumerate(zip(keys, digests, strict=True)):
        created, held, at = claims[key]
        if not created and held != digest:
            raise Fallback  # IDEMPOTENCY_CONFLICT, reported by the other path
        receipts.append((created, at))
        if created:
            new.append((i, records[i]))
    outcome = RunOutcome(receipts, [], [], {})
    if not new:
        return outcome
    run = _Run(conn, by)
    fresh = [r for _, r in new]
    await run.load_spaces(fresh)
    await run.load_places(fresh)
    owners: dict[str, set[str]] = {}
    for r in fresh:
        if r.kind == "relationship":
            space = run.spaces[(r.team, rec.private_owner(r.space))]
            owner = r.owner if r.owner is not None else space.owner
            if owner is not None:
                owners.setdefault(r.team, set()).add(owner)
    principals = {
        team: await bulk.existing_principals(conn, team, sorted(ids))
        for team, ids in owners.items()
    }
    for line, r in new:
        if r.kind == "source":
            run.source(line, r)
        elif r.kind == "entity":
            run.entity(line, r)
        elif r.kind == "evidence":
            run.evidence(line, r)
            outcome.evidence_texts.append(
                (r.team, run.places[("evidence", r.team, r.id)].space_id, r.id, r.content)
            )
            if r.embedding is not None:
                outcome.supplied[("evidence", r.team, r.id)] = r.embedding
        else:
            statement = run.relationship(line, r, principals.get(r.team, set()))
            space = run.spaces[(r.team, rec.private_owner(r.space))]
            outcome.relationship_texts.append((r.team, space.id, r.id, statement))
            if r.embedding is not None:
                outcome.supplied[("relationship", r.team, r.id)] = r.embedding
    budget = STATEMENT_MS_PER_RECORD * len(new)
    if budget > statement_timeout_ms:
        await bulk.allow_statement_time(conn, budget)
    await bulk.copy_planned(conn, run.rows)
    return outcome
