"""The one write service behind the loader and the mutations.

A batch of records is applied in one transaction: each record is checked
(authorisation, references visible now, lifecycle transition allowed),
registered for idempotency, and inserted; the embeddings of the batch's new
evidence and relationships are computed together and stored before commit. Any
failure rolls the whole batch back and names the record and field at fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, cast
from uuid import UUID

import asyncpg
import numpy as np
import tenacity

from gateway.embeddings import EmbeddingProvider, validate_vectors
from gateway.embeddings.store_model import query_model
from gateway.errors import (
    DatabaseUnavailable,
    EmbeddingMismatch,
    Forbidden,
    GatewayError,
    IdempotencyConflict,
    InvalidInput,
    NotFound,
    SpaceHasVectors,
    VectorIndexPending,
)
from gateway.services import bulk_writes, lock_waits
from gateway.services import records as rec
from gateway.services.records import render_statement
from gateway.services.vector_indexes import Deferral
from gateway.store import bulk_writes as bulk_store
from gateway.store import vector_partitions
from gateway.store import writes as store
from gateway.store.connection import Conn
from gateway.store.database import Database

log = logging.getLogger("gateway.load")


@dataclass(frozen=True, slots=True)
class Actor:
    """Who writes. The operator (loader) may write any team; a principal only its own
    team's shared space and, with a private-bound token, its own private space."""

    label: str
    team: str | None = None
    principal: str | None = None
    private_bound: bool = False
    # The spaces a principal's write transaction may touch: row-level security
    # confines it to them, a second wall behind the checks of this service.
    space_ids: tuple[UUID, ...] = ()

    @classmethod
    def operator(cls) -> Actor:
        return cls(label="operator")

    @classmethod
    def for_principal(
        cls,
        team: str,
        principal: str,
        *,
        private_bound: bool,
        space_ids: Sequence[UUID] = (),
    ) -> Actor:
        return cls(
            label=f"principal:{principal}",
            team=team,
            principal=principal,
            private_bound=private_bound,
            space_ids=tuple(space_ids),
        )

    @property
    def is_operator(self) -> bool:
        return self.team is None


class RecordError(GatewayError):
    """A record of a batch was refused; nothing of the batch was written."""

    def __init__(self, index: int, field: str | None, cause: GatewayError) -> None:
        where = f"field '{field}': " if field else ""
        super().__init__(f"{where}{cause.message}")
        self.index = index
        self.field = field
        self.code = cause.code
        self.cause = cause


class _FieldError(Exception):
    def __init__(self, field: str | None, error: GatewayError) -> None:
        super().__init__(error.message)
        self.field = field
        self.error = error


def _fail(field: str | None, error: GatewayError) -> _FieldError:
    return _FieldError(field, error)


@dataclass(frozen=True, slots=True)
class Receipt:
    """The outcome of one record: written now (``created``) or an earlier write of
    the same record, and the system time of that write (usable as ``knownAt``)."""

    kind: str
    id: str
    created: bool
    recorded_at: datetime


@dataclass
class BatchResult:
    created: Counter[str] = field(default_factory=Counter)
    unchanged: Counter[str] = field(default_factory=Counter)
    receipts: list[Receipt] = field(default_factory=list)


# The width of the store's vector columns (db/0001_memory_model.sql).
STORE_DIMENSIONS = 384

_OPERATOR_ONLY = frozenset({"team", "principal", "token"})

_SOURCE_TRANSITIONS = {"active": {"withdrawn"}, "withdrawn": {"active"}}
_EVIDENCE_TRANSITIONS = {
    "active": {"quarantined", "withdrawn"},
    "quarantined": {"active", "withdrawn"},
    "withdrawn": {"active"},
}
_RELATIONSHIP_TRANSITIONS = {
    "active": {"superseded", "retracted"},
    "superseded": {"active", "retracted"},
    "retracted": {"active"},
}
_SUPPORT_TRANSITIONS = {"revoke": {"grant", "reinstate"}, "reinstate": {"revoke"}}
# Record kinds whose checks start with their space (``space`` field), and those
# that start with one visible row: (its kind, the record's field naming it).
_SPACE_FIRST = frozenset(
    {"source", "entity", "relationship", "conflict_case", "evidence_conflict", "space_reset"}
)
_TARGET_FIRST: dict[str, tuple[Any, str]] = {
    "source_lifecycle": ("source", "source"),
    "evidence_lifecycle": ("evidence", "evidence"),
    "support": ("relationship", "relationship"),
    "support_decision": ("support", "support"),
    "relationship_transition": ("relationship", "relationship"),
    "conflict_resolution": ("conflict_case", "case"),
    "conflict_reopening": ("conflict_case", "case"),
    "hypothesis_feedback": ("hypothesis", "hypothesis"),
}
# The row a record's checks read first, by kind: (its kind, the record's field).
# Every other row a record names is in that row's space (or the space it names).
_REPLAY_TARGET: dict[str, tuple[Any, str]] = {"evidence": ("source", "source"), **_TARGET_FIRST}
_HYPOTHESIS_STATUS = {
    "confirm": "confirmed",
    "reject": "rejected",
    "mark_stale": "stale",
    "reopen": "proposed",
}
# The status each hypothesis decision sets (docs/loading.md, docs/feedback.md).
HYPOTHESIS_STATUS = _HYPOTHESIS_STATUS


class _Lane:
    """A batch's texts embedded while its transaction goes on: one lane of
    provider calls for every text the batch embeds ahead of its vectors' insert.

    Which texts go ahead: a principal's evidence texts as the batch starts,
    before its transaction (they are in the records); the operator's only with
    ``embed_ahead`` (the loader asks for it only while a load is creating
    evidence: a re-run would send texts already stored). A principal's
    relationship texts once they are known: foreseen with the batch's first
    claim (:meth:`_Batch.foresee`) and rendered by the record's own checks.
    The rest, when the vectors are stored (:meth:`_Batch._vectors`).

    How they go: one call in flight at a time. A text added while no call is in
    flight starts one at once; texts added while one is in flight wait, and go
    together in one call when it ends, so that 20 relationships still make a
    few calls, not 20. Each text is sent once per attempt of the batch (an
    evidence text that is also a relationship's statement too; a batch applied
    again, after the set-based path's fallback or a lock's retry, has a lane of
    its own). Each text's vector is the provider's for that text: the local
    model's vector of a text does not depend on the other texts of its call
    (checked bit for bit on 150 pairs, docs/benchmarks.md), so the stored rows
    are those of a single call at the end.

    A call holding none of the texts the batch needs (an evidence or a
    relationship written before: a partial re-run) is not awaited: when a
    needed text waits behind it, it is stopped and the needed one starts. (A
    remote provider's request is then cut short; the local model's request
    thread finishes a run it has begun, so there the needed call still starts
    after it.) A refused batch (:meth:`close`) stops its calls, and no call's
    failure is left unretrieved."""

    OUTSTANDING = 1
    """Calls in flight at most (see the class). 2 (a second call queued in the
    provider behind the first) was measured against 1, interleaved, with no
    consistent difference at load 7-14 (docs/benchmarks.md, "The write's one
    embedding lane"), nor on a quieter machine once the two kinds took turns
    at going first (the 0.4-0.8 ms once seen for 2 was the benchmark's order:
    "Remember: the lane's A/B was the benchmark's order"): the simpler rule is
    kept. What 2 would spare is the event loop's hand-over between the two
    calls, 0.04-0.05 ms idle in the lane."""

    def __init__(self, embedder: EmbeddingProvider) -> None:
        self.embedder = embedder
        # The model its calls embed with (a provider that follows the store's
        # model, gateway/embeddings/following.py, says which the next call will
        # use): a batch whose provider moved since is refused, not stored with
        # vectors of two models (_Batch.embed_pending).
        self.model: str = query_model(embedder)
        self.waiting: list[str] = []
        self.calls: list[tuple[list[str], asyncio.Task[np.ndarray]]] = []
        self.started: set[str] = set()
        self.closed = False

    def add(self, *texts: str) -> None:
        """Embed ``texts`` (those not added yet): at once, or with the next call."""
        if self.closed:
            return
        fresh = [t for t in dict.fromkeys(texts) if t not in self.started and t not in self.waiting]
        if not fresh:
            return
        self.waiting.extend(fresh)
        if self._outstanding() < self.OUTSTANDING:
            self._start()

    def _outstanding(self) -> int:
        """Calls in flight (a call stopped counts no more, whatever the provider's
        thread still does with it)."""
        return sum(1 for _, task in self.calls if not task.done() and not task.cancelling())

    def _start(self) -> None:
        texts, self.waiting = self.waiting, []
        self.started.update(texts)
        task = asyncio.create_task(self.embedder.embed(texts))
        task.add_done_callback(self._ended)
        self.calls.append((texts, task))

    def _ended(self, task: asyncio.Task[np.ndarray]) -> None:
        """A call ended: its failure retrieved (raised to whoever needs its texts,
        never left unretrieved), and the waiting texts started after a success."""
        failed = task.cancelled() or task.exception() is not None
        if self.waiting and not failed and not self.closed:
            self._start()

    async def vectors(self, needed: Collection[str]) -> dict[str, np.ndarray]:
        """The ``needed`` texts (each added before), with their vectors (a
        provider's error on one of them is raised). Calls holding none of them
        are not awaited: when a needed text waits behind them, they are stopped
        and it starts at once."""
        wanted = set(needed)
        out: dict[str, np.ndarray] = {}
        done = 0
        while True:
            if done < len(self.calls):
                texts, task = self.calls[done]
                done += 1
                if wanted.intersection(texts):
                    out.update(zip(texts, await task, strict=True))
                continue
            if not wanted.intersection(self.waiting):
                return out
            for texts, task in self.calls:
                if not task.done() and not wanted.intersection(texts):
                    task.cancel()  # in flight, and none of its texts is needed
            self._start()

    def close(self) -> None:
        """Stop calls whose vectors are not needed (a refused batch, or a call
        nothing awaited), and start no other."""
        self.closed = True
        self.waiting.clear()
        for _, task in self.calls:
            task.cancel()


class _Batch:
    """State of one batch inside its transaction."""

    def __init__(
        self,
        conn: Conn,
        actor: Actor,
        embedder: EmbeddingProvider,
        lane: _Lane,
        *,
        deferral: Deferral | None = None,
    ) -> None:
        self.conn = conn
        self.actor = actor
        self.embedder = embedder
        # The batch's texts embedded ahead of their vectors' insert (see _Lane).
        self.lane = lane
        # ``load --index-after``: vectors go to the space's detached tables (only the
        # operator, who owns them; see gateway/store/vector_partitions.py).
        self.deferral = deferral if actor.is_operator else None
        self.evidence_texts: list[tuple[str, UUID, str, str]] = []
        self.relationship_texts: list[tuple[str, UUID, str, str]] = []
        # Vectors supplied by a loader file, by (kind, team, id): not embedded again.
        self.supplied: dict[tuple[str, str, str], Sequence[float]] = {}
        # A batch that creates spaces waits briefly for locks and is tried again
        # (WriteService.apply): a lock timeout leaves it as it is, not as a refusal.
        self.short_locks = False
        # Spaces looked up in this batch, by (team, owner): a space's ID, kind and
        # owner never change, and its generation only by a reset, which empties this.
        self.spaces: dict[tuple[str, str | None], store.Space] = {}
        # Evidence written by this batch, by (team, id): its space, text and
        # occurrences (ID -> quote, start, end), for supports of the same batch,
        # which then need not read them back. Emptied by a reset, like the spaces.
        self.written: dict[tuple[str, str], tuple[UUID, str, dict[str, tuple[str, int, int]]]] = {}
        # The lookups the current record's checks start with, answered with its
        # idempotency claim (:meth:`reads_of`), by (kind, team, IDs); emptied after
        # each record.
        self.ahead: dict[tuple[str, str, tuple[str, ...]], dict[str, store.Visible]] = {}
        # A principal's relationships whose texts are embedded before their turn
        # (:meth:`foresee`), the names the batch's entity records give, and the
        # lookup of the other names, sent with the batch's first claim.
        self.foreseen: list[rec.RelationshipRecord] = []
        self.names: dict[str, str] = {}
        self.foresight: store.ReadVisible | None = None
        # Every foreseen name is in the batch: the texts start embedding once a
        # claim of the principal's team comes back new (never for a whole re-run).
        self.foresee_on_claim = False
        # A principal's batch that will store vectors reads the store's model and
        # its team's projection with its first claim (:meth:`foresee`), not in a
        # statement of its own before the vectors are stored.
        self.model_read: store.ReadModel | None = None
        self.model_ahead: tuple[tuple[str, int] | None, int | None] | None = None
        self.stores_vectors = False
        self.asked_ahead = False  # the reads above rode with a claim already

    # --- lookups sent with the idempotency claim --------------------------------------

    def reads_of(self, record: Any) -> list[store.Read]:
        """The lookups ``record``'s checks start with, sent with its idempotency
        claim in one statement (a round trip less per record, each paid for by a
        ``remember``'s caller): its space when not known yet, the rows it names
        first. Only what its checks would read next, in the same transaction, with
        nothing written in between but the claim; what they find is checked by the
        same code as before (:meth:`visible`, :meth:`space`), so refusals are those
        of the separate statements."""
        kind, team = record.kind, rec.record_team(record)
        reads: list[store.Read] = []
        space_ref = getattr(record, "space", None) if kind in _SPACE_FIRST else None
        if kind == "hypothesis":
            space_ref = rec.SHARED
        if space_ref is not None:
            owner = rec.private_owner(space_ref)
            if (team, owner) not in self.spaces and self._space_allowed(owner):
                reads.append(store.ReadSpace(owner))
        if kind == "evidence":
            reads.append(store.ReadVisible("source", (record.source,)))
            if record.mentions:
                reads.append(store.ReadVisible("entity", tuple(m.entity for m in record.mentions)))
        elif kind == "relationship":
            names = [record.subject] + ([record.object] if record.object else [])
            reads.append(store.ReadVisible("entity", tuple(names)))
        elif kind in _TARGET_FIRST:
            target_kind, attr = _TARGET_FIRST[kind]
            reads.append(store.ReadVisible(target_kind, (getattr(record, attr),)))
        if team == self.actor.team and not self.asked_ahead:
            self.asked_ahead = True
            if self.foreseen:
                unnamed = self._unnamed()
                if unnamed:
                    self.foresight = store.ReadVisible("entity", unnamed)
                    reads.append(self.foresight)
                else:
                    self.foresee_on_claim = True
            if self.stores_vectors:
                self.model_read = store.ReadModel()
                reads.append(self.model_read)
        return reads

    # --- relationship texts embedded before their records' turn -----------------------

    def foresee(self, records: Sequence[Any]) -> None:
        """A principal's relationship texts start embedding before their records'
        turn: a text is its entities' names, which the batch's entity records give
        or the batch's first idempotency claim reads (:meth:`reads_of`), so the
        relationship's embedding no longer waits for the statements of the
        records before it (the evidence's). The local model's request lane runs
        one small call at a time: the relationship's call now queues behind the
        evidence's at once, where it could find the lane idle when those
        statements were slow (a loaded host). Nothing is checked or written from what is read
        here: the relationship's own checks read its entities as before, render
        its text again, and its vector comes from that text (the same text: the
        call already started is used; another: embedded then, as before). The
        texts start once the first claim of the principal's team comes back new
        (with the lookup of the names the batch does not give, riding on it), also
        when the batch names every entity itself: a first claim that finds an
        earlier write (a re-run: an agent's retry) drops the foresight, and nothing
        is sent to the provider for it.

        The same first claim reads the store's embedding model and the team's
        active projection for a batch that will store vectors, instead of a
        statement of its own before they are stored (:meth:`embed_pending`): one
        round trip fewer. No record of a principal's batch writes either table.
        Another transaction may register the model or make the projection after
        the read, as it could before between that read and the vectors' insert
        (which waited for the embeddings): making the projection tolerates a
        concurrent twin, and so does registering the model."""
        if self.actor.is_operator:
            return
        team = self.actor.team
        self.stores_vectors = any(r.kind in ("evidence", "relationship") for r in records)
        self.names = {
            r.id: r.name for r in records if r.kind == "entity" and rec.record_team(r) == team
        }
        self.foreseen = [
            r
            for r in records
            if r.kind == "relationship" and r.team == team and r.embedding is None
        ]

    def _unnamed(self) -> tuple[str, ...]:
        """The foreseen relationships' entities that the batch's records do not name."""
        ids = {i for r in self.foreseen for i in (r.subject, r.object) if i is not None}
        return tuple(sorted(ids - set(self.names)))

    def _render_foreseen(self, found: dict[str, store.Visible]) -> None:
        names = {**{k: v.extra["name"] for k, v in found.items()}, **self.names}
        texts = []
        for r in self.foreseen:
            obj = names.get(r.object) if r.object is not None else r.object_value
            if r.subject in names and obj is not None:
                texts.append(
                    render_statement(names[r.subject], r.predicate, obj, r.object_unit, r.polarity)
                )
        self.foreseen = []
        if texts:
            self.lane.add(*texts)

    def read_ahead(self, team: str, reads: Sequence[store.Read], answers: Sequence[Any]) -> None:
        """Keep what :meth:`reads_of`'s lookups found, for the record's checks
        (called only for a claim that came back new)."""
        if self.foresee_on_claim and team == self.actor.team:
            self.foresee_on_claim = False
            self._render_foreseen({})  # every name is in the batch
        for read, answer in zip(reads, answers, strict=True):
            if read is self.foresight:
                self._render_foreseen(answer)  # never the record's own checks'
            elif isinstance(read, store.ReadModel):
                self.model_ahead = answer
            elif isinstance(read, store.ReadSpace):
                if answer is not None:
                    self.spaces[(team, read.owner)] = answer
            else:
                self.ahead[(read.kind, team, read.ids)] = answer

    async def _find(
        self, kind: store.VisibleKind, team: str, ids: Sequence[str]
    ) -> dict[str, store.Visible]:
        """:func:`store.find_visible`, unless answered with the record's claim."""
        found = self.ahead.pop((kind, team, tuple(ids)), None)
        if found is None:
            found = await store.find_visible(self.conn, kind, team, ids)
        return found

    # --- checks shared by several kinds -------------------------------------------

    def _check_team(self, team: str) -> None:
        if not self.actor.is_operator and team != self.actor.team:
            raise _fail("team", NotFound(f"no team '{team}'"))

    def _space_allowed(self, owner: str | None) -> bool:
        if self.actor.is_operator or owner is None:
            return True
        return self.actor.private_bound and owner == self.actor.principal

    async def space(self, team: str, ref: str, field_name: str = "space") -> store.Space:
        owner = rec.private_owner(ref)
        space = self.spaces.get((team, owner)) if self._space_allowed(owner) else None
        if space is None and self._space_allowed(owner):
            space = await store.find_space(self.conn, team, owner)
            if space is not None:
                self.spaces[(team, owner)] = space
        if space is None:
            raise _fail(field_name, NotFound(f"no space '{ref}' in team '{team}'"))
        return space

    async def visible(
        self,
        kind: store.VisibleKind,
        team: str,
        ids: Sequence[str],
        field_name: str | Callable[[int], str],
        *,
        space_id: UUID | None = None,
    ) -> dict[str, store.Visible]:
        """The rows of ``ids``, each visible now and readable by the actor (and in
        ``space_id`` when given); the first that is not is reported as not found.
        ``field_name`` is the field, or a function of the list index giving it."""
        found = await self._find(kind, team, ids)
        for i, ident in enumerate(ids):
            row = found.get(ident)
            ok = row is not None and self._space_allowed(row.space_owner)
            if ok and space_id is not None and row is not None and row.space_id != space_id:
                ok = False
            if not ok:
                where = "" if space_id is None else " in this space"
                name = field_name(i) if callable(field_name) else field_name
                raise _fail(
                    name,
                    NotFound(f"no {kind.replace('_', ' ')} '{ident}' in team '{team}'{where}"),
                )
        return found

    async def one(
        self,
        kind: store.VisibleKind,
        team: str,
        ident: str,
        field_name: str,
        *,
        space_id: UUID | None = None,
    ) -> store.Visible:
        return (await self.visible(kind, team, [ident], field_name, space_id=space_id))[ident]

    async def check_replay(
        self, record: Any, reads: Sequence[store.Read], answers: Sequence[Any]
    ) -> None:
        """For a key used before (a replay, or the same key with other content):
        refuse a record that names memory the actor cannot read, as its first
        write would be refused (NOT_FOUND), before the replay's receipt or the
        conflict is answered. Either would tell a guess of the earlier write's
        exact content from a wrong one (the receipt, or IDEMPOTENCY_CONFLICT,
        against the NOT_FOUND of a fresh key). Only a token that is not
        private-bound is checked: a private-bound token reads every space its
        principal writes, and gets the conflict for another principal's key
        whatever the content. To any other token, a used key whose content names
        memory it cannot read, or nothing that exists, answers what that content
        under a fresh key answers (NOT_FOUND), whoever used the key; else the
        replay or the conflict. What the record names is the space it names, or the row its
        checks read first (``reads``, answered with the claim; every other row it
        names is in that row's space). A row of an earlier generation is still the
        same write's: looked up in any generation, as the tenancy shows it. That
        lookup is the one statement a refused replay costs more than a refused
        fresh key (the claim's read-ahead never holds a row the tenancy hides): it
        tells only that the key was used, which the conflict of a guess naming
        readable memory tells anyway."""
        if self.actor.is_operator or self.actor.private_bound:
            return
        team, kind = rec.record_team(record), record.kind
        space_ref = getattr(record, "space", None) if kind in _SPACE_FIRST else None
        if space_ref is not None and not self._space_allowed(rec.private_owner(space_ref)):
            await self.space(team, space_ref)  # not allowed: NOT_FOUND, no statement
        if kind not in _REPLAY_TARGET:
            return
        target_kind, attr = _REPLAY_TARGET[kind]
        ident = getattr(record, attr)
        for read, answer in zip(reads, answers, strict=True):
            if isinstance(read, store.ReadVisible) and read.kind == target_kind:
                row = answer.get(ident)
                # row-level security keeps unreadable rows out of the read-ahead;
                # the owner test holds should that wall be missing
                if row is not None and self._space_allowed(row.space_owner):
                    return
        exists, owner = await store.space_owner_of(self.conn, target_kind, team, ident)
        if not (exists and self._space_allowed(owner)):
            raise _fail(
                attr, NotFound(f"no {target_kind.replace('_', ' ')} '{ident}' in team '{team}'")
            )

    # --- the record kinds -------------------------------------------------------------

    async def team(self, r: rec.TeamRecord) -> None:
        await store.insert_team(self.conn, r.id, r.name, self.actor.label)

    async def principal(self, r: rec.PrincipalRecord) -> None:
        if not await store.team_exists(self.conn, r.team):
            raise _fail("team", NotFound(f"no team '{r.team}'"))
        await store.insert_principal(
            self.conn, r.team, r.id, r.type, r.display_name, r.private_space
        )

    async def token(self, r: rec.TokenRecord) -> None:
        if not await store.principal_exists(self.conn, r.team, r.principal):
            raise _fail("principal", NotFound(f"no principal '{r.principal}' in team '{r.team}'"))
        if await store.token_exists(self.conn, r.id):
            raise _fail("id", IdempotencyConflict(f"token id '{r.id}' is already in use"))
        digest = (
            hashlib.sha256(r.secret.encode()).digest()
            if r.secret is not None
            else bytes.fromhex(cast(str, r.secret_sha256))
        )
        await store.insert_token(
            self.conn, r.id, r.team, r.principal, digest, r.binding, r.label, r.expires_at
        )

    async def source(self, r: rec.SourceRecord) -> None:
        space = await self.space(r.team, r.space)
        await store.insert_source(
            self.conn,
            r.team,
            r.id,
            space,
            r.type,
            r.title,
            r.uri,
            r.authority,
            r.created_at,
            self.actor.label,
        )

    async def entity(self, r: rec.EntityRecord) -> None:
        space = await self.space(r.team, r.space)
        await store.insert_entity(
            self.conn, r.team, r.id, space, r.name, r.type, r.aliases, self.actor.label
        )

    async def evidence(self, r: rec.EvidenceRecord) -> None:
        source = await self.one("source", r.team, r.source, "source")
        if r.mentions:
            await self.visible(
                "entity",
                r.team,
                [m.entity for m in r.mentions],
                lambda i: f"mentions[{i}].entity",
                space_id=source.space_id,
            )
        occurrences = [(o.id, r.content[o.start : o.end], o.start, o.end) for o in r.occurrences]
        await store.insert_evidence(
            self.conn,
            r.team,
            r.id,
            source,
            r.content,
            hashlib.sha256(r.content.encode()).digest(),
            r.observed_at,
            occurrences,
            [(m.entity, m.occurrence) for m in r.mentions],
            self.actor.label,
        )
        self.evidence_texts.append((r.team, source.space_id, r.id, r.content))
        self.written[(r.team, r.id)] = (
            source.space_id,
            r.content,
            {o[0]: (o[1], o[2], o[3]) for o in occurrences},
        )
        if r.embedding is not None:
            self.supplied[("evidence", r.team, r.id)] = r.embedding

    async def relationship(self, r: rec.RelationshipRecord) -> None:
        space = await self.space(r.team, r.space)
        owner = r.owner
        if not self.actor.is_operator:
            if owner is not None and owner != self.actor.principal:
                raise _fail("owner", Forbidden("a principal authors relationships as itself"))
            owner = self.actor.principal
        elif owner is None:
            owner = space.owner
        if owner is None:
            raise _fail("owner", InvalidInput("a shared relationship needs an 'owner' principal"))
        if space.owner is not None and owner != space.owner:
            raise _fail("owner", Forbidden("a private relationship is owned by its space's owner"))
        # A principal writing as itself exists: its token was just looked up with it.
        if (self.actor.is_operator or owner != self.actor.principal) and not (
            await store.principal_exists(self.conn, r.team, owner)
        ):
            raise _fail("owner", NotFound(f"no principal '{owner}' in team '{r.team}'"))
        names = [r.subject] + ([r.object] if r.object else [])
        found = await self._find("entity", r.team, names)
        for fname, ident in (("subject", r.subject), ("object", r.object)):
            if ident is not None and (ident not in found or found[ident].space_id != space.id):
                raise _fail(fname, NotFound(f"no entity '{ident}' in this space"))
        statement = render_statement(
            found[r.subject].extra["name"],
            r.predicate,
            found[r.object].extra["name"] if r.object else cast(str, r.object_value),
            r.object_unit,
            r.polarity,
        )
        await store.insert_relationship(
            self.conn,
            store.NewRelationship(
                team=r.team,
                id=r.id,
                space=space,
                subject=r.subject,
                predicate=r.predicate,
                object_entity=r.object,
                object_value=r.object_value,
                object_unit=r.object_unit,
                polarity=r.polarity,
                valid_from=r.valid_from,
                valid_to=r.valid_to,
                owner=owner,
                group_key=r.semantic_group or r.default_group_key(),
                statement=statement,
            ),
            self.actor.label,
        )
        if not self.actor.is_operator and r.embedding is None:
            self.lane.add(statement)  # while the rest of the transaction goes on
        for i, spec in enumerate(r.supports):
            await self._support(r.team, spec, r.id, space.id, f"supports[{i}]")
        self.relationship_texts.append((r.team, space.id, r.id, statement))
        if r.embedding is not None:
            self.supplied[("relationship", r.team, r.id)] = r.embedding

    async def _support(
        self, team: str, spec: rec.SupportSpec, relationship_id: str, space_id: UUID, prefix: str
    ) -> None:
        written = self.written.get((team, spec.evidence))
        if written is not None and written[0] == space_id:
            # written by this batch, in this space: visible, with these occurrences
            content, occurrences = written[1], written[2]
        else:
            ev = await self.one(
                "evidence", team, spec.evidence, f"{prefix}.evidence", space_id=space_id
            )
            content, occurrences = ev.extra["content"], None
        quote, span = spec.quote, None
        if spec.occurrence is not None:
            occ = (
                {k: v for k, v in occurrences.items() if k == spec.occurrence}
                if occurrences is not None
                else await store.occurrences_of(self.conn, team, spec.evidence, [spec.occurrence])
            )
            if spec.occurrence not in occ:
                raise _fail(
                    f"{prefix}.occurrence",
                    NotFound(f"no occurrence '{spec.occurrence}' of evidence '{spec.evidence}'"),
                )
            occ_quote, start, end = occ[spec.occurrence]
            if spec.start is not None and (spec.start, spec.end) != (start, end):
                raise _fail(
                    f"{prefix}.start",
                    InvalidInput(
                        f"the span differs from occurrence '{spec.occurrence}' [{start}, {end}); "
                        "give the occurrence or a span, or both alike"
                    ),
                )
            if quote is not None and quote != occ_quote:
                raise _fail(f"{prefix}.quote", InvalidInput("the quote is not the occurrence's"))
            quote, span = occ_quote, (start, end)
        if spec.start is not None and spec.end is not None:
            if spec.end > len(content):
                raise _fail(
                    f"{prefix}.end", InvalidInput("the span is past the end of the evidence")
                )
            actual = content[spec.start : spec.end]
            if quote is not None and quote != actual:
                raise _fail(
                    f"{prefix}.quote",
                    InvalidInput("the quote is not the evidence text at [start, end)"),
                )
            quote, span = actual, (spec.start, spec.end)
        await store.insert_support(
            self.conn,
            team,
            spec.id,
            space_id,
            spec.evidence,
            relationship_id,
            spec.occurrence,
            quote,
            span,
            self.actor.label,
        )

    async def support(self, r: rec.SupportRecord) -> None:
        rel = await self.one("relationship", r.team, r.relationship, "relationship")
        await self._support(r.team, r.spec(), r.relationship, rel.space_id, "")

    async def support_decision(self, r: rec.SupportDecisionRecord) -> None:
        sup = await self.one("support", r.team, r.support, "support")
        current = sup.extra["decision"]
        if current not in _SUPPORT_TRANSITIONS[r.decision]:
            state = "revoked" if current == "revoke" else "granted"
            raise _fail("decision", InvalidInput(f"cannot {r.decision} a support that is {state}"))
        await store.insert_support_decision(
            self.conn, r.team, sup.space_id, r.support, r.id, r.decision, r.reason, self.actor.label
        )

    async def source_lifecycle(self, r: rec.SourceLifecycleRecord) -> None:
        await self._lifecycle("source", r.team, r.source, r, _SOURCE_TRANSITIONS)

    async def evidence_lifecycle(self, r: rec.EvidenceLifecycleRecord) -> None:
        await self._lifecycle("evidence", r.team, r.evidence, r, _EVIDENCE_TRANSITIONS)

    async def _lifecycle(
        self,
        kind: Literal["source", "evidence"],
        team: str,
        target: str,
        r: rec.SourceLifecycleRecord | rec.EvidenceLifecycleRecord,
        allowed: dict[str, set[str]],
    ) -> None:
        row = await self.one(kind, team, target, kind)
        self._transition(kind, row.extra["status"], r.status, allowed)
        await store.insert_lifecycle(
            self.conn, kind, team, row.space_id, target, r.id, r.status, r.reason, self.actor.label
        )

    async def relationship_transition(self, r: rec.RelationshipTransitionRecord) -> None:
        rel = await self.one("relationship", r.team, r.relationship, "relationship")
        self._transition("relationship", rel.extra["status"], r.status, _RELATIONSHIP_TRANSITIONS)
        if r.superseded_by is not None:
            await self.one(
                "relationship", r.team, r.superseded_by, "superseded_by", space_id=rel.space_id
            )
        await store.insert_relationship_status(
            self.conn,
            r.team,
            rel.space_id,
            r.relationship,
            r.id,
            r.status,
            r.superseded_by,
            r.reason,
            self.actor.label,
        )

    @staticmethod
    def _transition(what: str, current: str, new: str, allowed: dict[str, set[str]]) -> None:
        if new not in allowed.get(current, set()):
            raise _fail(
                "status", InvalidInput(f"the {what} is already {current}; cannot become {new}")
            )

    async def conflict_case(self, r: rec.ConflictCaseRecord) -> None:
        space = await self.space(r.team, r.space)
        for i, pos in enumerate(r.positions):
            prefix = f"positions[{i}].relationships"
            await self.visible(
                "relationship",
                r.team,
                pos.relationships,
                lambda j, prefix=prefix: f"{prefix}[{j}]",  # type: ignore[misc]
                space_id=space.id,
            )
        await store.insert_conflict_case(
            self.conn,
            r.team,
            r.id,
            space,
            r.question,
            [(p.id, p.label, p.relationships) for p in r.positions],
            r.reason,
            self.actor.label,
        )

    async def conflict_resolution(self, r: rec.ConflictResolutionRecord) -> None:
        case = await self.one("conflict_case", r.team, r.case, "case")
        if case.extra["state"] == "resolve":
            raise _fail("case", InvalidInput("the case is already resolved; reopen it first"))
        if r.preferred_position not in await store.positions_of(self.conn, r.team, r.case):
            raise _fail(
                "preferred_position",
                NotFound(f"no position '{r.preferred_position}' in case '{r.case}'"),
            )
        await store.insert_conflict_event(
            self.conn,
            r.team,
            case.space_id,
            r.case,
            r.id,
            "resolve",
            r.preferred_position,
            r.reason,
            self.actor.label,
        )

    async def conflict_reopening(self, r: rec.ConflictReopeningRecord) -> None:
        case = await self.one("conflict_case", r.team, r.case, "case")
        if case.extra["state"] != "resolve":
            raise _fail("case", InvalidInput("only a resolved case can be reopened"))
        await store.insert_conflict_event(
            self.conn,
            r.team,
            case.space_id,
            r.case,
            r.id,
            "reopen",
            None,
            r.reason,
            self.actor.label,
        )

    async def evidence_conflict(self, r: rec.EvidenceConflictRecord) -> None:
        space = await self.space(r.team, r.space)
        for i, pos in enumerate(r.positions):
            await self.one(
                "evidence", r.team, pos.evidence, f"positions[{i}].evidence", space_id=space.id
            )
            occ = await store.occurrences_of(self.conn, r.team, pos.evidence, [pos.occurrence])
            if pos.occurrence not in occ:
                raise _fail(
                    f"positions[{i}].occurrence",
                    NotFound(f"no occurrence '{pos.occurrence}' of evidence '{pos.evidence}'"),
                )
        await store.insert_evidence_conflict(
            self.conn,
            r.team,
            r.id,
            space,
            r.question,
            [(p.id, p.label, p.evidence, p.occurrence) for p in r.positions],
            self.actor.label,
        )

    async def hypothesis(self, r: rec.HypothesisRecord) -> None:
        space = await self.space(r.team, rec.SHARED)
        await self.visible(
            "relationship",
            r.team,
            r.relationships,
            lambda i: f"relationships[{i}]",
            space_id=space.id,
        )
        await self.visible(
            "evidence", r.team, r.evidence, lambda i: f"evidence[{i}]", space_id=space.id
        )
        proposed_by = r.proposed_by if self.actor.is_operator else self.actor.principal
        if proposed_by is not None and not await store.principal_exists(
            self.conn, r.team, proposed_by
        ):
            raise _fail("proposed_by", NotFound(f"no principal '{proposed_by}' in team '{r.team}'"))
        await store.insert_hypothesis(
            self.conn,
            r.team,
            r.id,
            space,
            r.statement,
            r.origin,
            proposed_by,
            r.relationships,
            r.evidence,
            self.actor.label,
        )

    async def hypothesis_feedback(self, r: rec.HypothesisFeedbackRecord) -> None:
        hyp = await self.one("hypothesis", r.team, r.hypothesis, "hypothesis")
        status = _HYPOTHESIS_STATUS[r.decision]
        if hyp.extra["status"] == status:
            raise _fail("decision", InvalidInput(f"the hypothesis is already {status}"))
        await store.insert_hypothesis_feedback(
            self.conn,
            r.team,
            hyp.space_id,
            r.hypothesis,
            r.id,
            r.decision,
            status,
            r.note,
            self.actor.label,
        )

    async def space_reset(self, r: rec.SpaceResetRecord) -> None:
        space = await self.space(r.team, r.space)
        await store.insert_space_generation(
            self.conn, r.team, space, r.id, r.reason, self.actor.label
        )
        # a new generation: what this batch knew of its spaces and evidence is stale
        self.spaces.clear()
        self.written.clear()

    # --- embeddings, before commit ------------------------------------------------------

    async def embed_pending(self) -> None:
        if not self.evidence_texts and not self.relationship_texts:
            return
        model, dims = self.embedder.model, self.embedder.dimensions
        if dims != STORE_DIMENSIONS:
            raise EmbeddingMismatch(
                f"the store holds {STORE_DIMENSIONS}-dimension vectors; the configured "
                f"provider '{model}' makes {dims}: configure it for {STORE_DIMENSIONS}"
            )
        # A principal's batch (one team): the model and the team's projection in one
        # statement, read while the texts may still be embedding, unless the
        # batch's first claim read them (:meth:`foresee`).
        mine = self.model_ahead
        if mine is None and self.actor.team is not None and self.deferral is None:
            mine = await store.embedding_model_and_projection(self.conn, self.actor.team)
        registered = mine[0] if mine is not None else await store.store_embedding_model(self.conn)
        if registered is None:
            await store.register_embedding_model(self.conn, model, dims)
        elif registered != (model, dims):
            raise EmbeddingMismatch(
                f"the store holds vectors of model '{registered[0]}' ({registered[1]} dimensions); "
                f"the configured provider makes '{model}' ({dims}): refusing to mix them"
            )
        if self.deferral is not None:
            await self._defer_spaces(self.deferral)
        try:
            # read while the texts may still be embedding, not after
            generations = (
                await self._generations(known=mine[1] if mine is not None else None)
                if self.relationship_texts and self.deferral is None
                else {}
            )
            vectors = await self._vectors(dims)
            if self.lane.model != model or self.embedder.model != model:
                raise _moved(model)  # some of the vectors may be another model's
            if self.deferral is not None:
                await self._store_deferred(vectors, model)
            else:
                await self._store_vectors(vectors, model, generations)
        except asyncpg.ForeignKeyViolationError as exc:
            # A vector's or a new projection's model is gone: the store was renamed
            # to another model (a reembed's switch) since it was read.
            if getattr(exc, "constraint_name", None) not in _MODEL_KEYS:
                raise
            raise _moved(model) from exc
        except asyncpg.CheckViolationError as exc:
            # db/0001 makes a space's partitions with the space; only a load with
            # --index-after, unfinished, leaves a space without them.
            if "no partition of relation" not in str(exc):
                raise
            raise VectorIndexPending(
                "the space's vectors wait for an unfinished 'load --index-after' to index "
                "them; nothing was written: retry after it ends, or run "
                "'recall-gateway build-vector-indexes'"
            ) from exc

    async def _generations(self, known: int | None = None) -> dict[str, int]:
        """Each team's active projection; ``known``: the actor's team's, already read."""
        generations: dict[str, int] = {}
        for team in {t[0] for t in self.relationship_texts}:
            if known is not None and team == self.actor.team:
                generations[team] = known
            else:
                generations[team] = await store.active_projection(
                    self.conn, team, self.embedder.model
                )
        return generations

    async def _store_vectors(
        self, vectors: np.ndarray, model: str, generations: dict[str, int]
    ) -> None:
        n = len(self.evidence_texts)
        if not self.actor.is_operator:
            # after the last embedding ends: one statement for every vector
            await store.insert_embeddings(
                self.conn,
                [t[:3] for t in self.evidence_texts],
                vectors[:n],
                [(t, s, r, generations[t]) for t, s, r, _ in self.relationship_texts],
                vectors[n:],
                model,
            )
            return
        if self.evidence_texts:
            await store.insert_evidence_embeddings(
                self.conn,
                [t[:3] for t in self.evidence_texts],
                vectors[:n],
                model,
                copy=self.actor.is_operator,
            )
        if self.relationship_texts:
            await store.insert_relationship_embeddings(
                self.conn,
                [(t, s, r, generations[t]) for t, s, r, _ in self.relationship_texts],
                vectors[n:],
                model,
                copy=self.actor.is_operator,
            )

    async def _defer_spaces(self, deferral: Deferral) -> None:
        """Before the batch's vectors are computed: each space they go to must be
        held by this load and detached. A space still attached is detached outside
        the batch, in a short transaction of its own (:meth:`Deferral.claim`):
        :class:`_DetachFirst` rolls the batch back for that, and
        :meth:`WriteService.apply` runs it again after. (A space is never created
        in the batch that stores its vectors: the loader writes space records in
        batches of their own, and since db/0102 creating one no longer holds the
        parents' ACCESS EXCLUSIVE lock that a detach in place could have used.)"""
        spaces = sorted(
            {t[:2] for t in self.evidence_texts} | {t[:2] for t in self.relationship_texts}
        )
        outside: list[tuple[str, UUID]] = []
        for team, space in spaces:
            attached, full = await vector_partitions.attached_state(self.conn, space)
            if attached and full:
                team, ref = await vector_partitions.space_reference(self.conn, space)
                raise SpaceHasVectors(
                    f"space '{ref}' of team '{team}' already holds vectors that recall finds; "
                    "--index-after loads only into spaces without vectors (load this file "
                    "without it)"
                )
            if not attached:
                await deferral.hold(space)
            else:
                outside.append((team, space))
        if outside:
            raise _DetachFirst(outside)

    async def _store_deferred(self, vectors: np.ndarray, model: str) -> None:
        """Copy the vectors into their spaces' detached tables (see _defer_spaces)."""
        n = len(self.evidence_texts)
        spaces = sorted(
            {t[1] for t in self.evidence_texts} | {t[1] for t in self.relationship_texts}
        )
        generations = await self._generations() if self.relationship_texts else {}
        for space in spaces:
            ev = [k for k, t in enumerate(self.evidence_texts) if t[1] == space]
            if ev:
                await store.insert_evidence_embeddings(
                    self.conn,
                    [self.evidence_texts[k][:3] for k in ev],
                    vectors[ev],
                    model,
                    copy=True,
                    into=vector_partitions.partition_name("evidence_embeddings", space),
                )
            rel = [k for k, t in enumerate(self.relationship_texts) if t[1] == space]
            if rel:
                await store.insert_relationship_embeddings(
                    self.conn,
                    [
                        (t, s, r, generations[t])
                        for t, s, r, _ in (self.relationship_texts[k] for k in rel)
                    ],
                    vectors[[n + k for k in rel]],
                    model,
                    copy=True,
                    into=vector_partitions.partition_name("relationship_embeddings", space),
                )

    async def _vectors(self, dims: int) -> np.ndarray:
        """Rows for the batch's evidence then relationships: supplied ones as given
        (checked and normalised like a provider's), the rest from the provider."""
        keys = [("evidence", t, i) for t, _, i, _ in self.evidence_texts] + [
            ("relationship", t, i) for t, _, i, _ in self.relationship_texts
        ]
        texts = [t[3] for t in self.evidence_texts] + [t[3] for t in self.relationship_texts]
        missing = [k for k, key in enumerate(keys) if key not in self.supplied]
        out = np.empty((len(keys), dims), dtype=np.float32)
        if missing:
            # those not embedded ahead go in one call (or join the lane's next)
            wanted = [texts[k] for k in missing]
            self.lane.add(*wanted)
            ready = await self.lane.vectors(wanted)
            for k in missing:
                out[k] = ready[texts[k]]
        given = [k for k, key in enumerate(keys) if key in self.supplied]
        if given:
            out[given] = validate_vectors([self.supplied[keys[k]] for k in given], len(given), dims)
        return out


@dataclass(frozen=True, slots=True)
class _Way:
    """How :meth:`WriteService.apply` writes one batch, handed down its steps as
    one value: through the set-based path where the records allow
    (``set_based``); the operator's evidence texts embedded as the transaction
    starts (``embed_ahead``); vectors into detached tables (``deferral``, for
    ``load --index-after``); every lock waited for 100 ms at most
    (``short_locks``, a batch that creates spaces, tried again on a timeout);
    and its place in a pipelined load (``turn``)."""

    set_based: bool
    embed_ahead: bool
    deferral: Deferral | None
    short_locks: bool = False
    turn: Turn | None = None


class Turn:
    """A batch's place in a pipelined load (:func:`gateway.services.loader.load`
    with ``concurrency`` above 1): its transaction runs on ``lane`` (a connection
    the load holds, see :func:`gateway.store.bulk_writes.writer_lanes`) while the
    batch before it may still be in flight on another; ``began`` is set once its
    transaction has begun (the loader starts the next batch only then, so that
    system times follow the file). Before it commits, the batch waits for
    ``previous`` (True once the batch before it has committed, False when that
    one was refused): batches commit in file order, and a batch after a refused
    one is rolled back (:class:`PreviousRefused`). ``previous_pid`` is the server
    process of the batch before: while waiting, a batch that holds a lock that
    batch waits for, or finds that batch waiting for a lock at all, rolls back
    and gives way (:class:`TurnYielded`) instead of waiting for a commit that
    could never come.

    ``started`` is the start (the system time) of the batch's latest
    transaction. A batch may need more than one (the set-based path falls back
    to the record-at-a-time one, a ``--index-after`` batch detaches a space
    first, the loader applies a batch that gave way again), and the later one
    can begin after the next batch's: ``previous_turn`` is the batch before's
    turn, and a batch whose predecessor's committed transaction started after
    its own gives way too, and is applied again after it. So system times
    follow the file in every path, with any number of lanes."""

    def __init__(
        self,
        lane: Conn,
        previous: asyncio.Future[bool] | None,
        previous_pid: int | None,
        previous_turn: Turn | None = None,
    ) -> None:
        self.lane = lane
        self.previous = previous
        self.previous_pid = previous_pid
        self.previous_turn = previous_turn
        self.began = asyncio.Event()
        self.started: datetime | None = None

    async def previous_committed(self) -> None:
        """Wait for the batch before (not holding a transaction of this one's)."""
        if self.previous is not None and not await asyncio.shield(self.previous):
            raise PreviousRefused

    async def wait_turn(self, conn: Conn) -> None:
        """Inside this batch's transaction, before its commit: wait for the batch
        before it, watching that batch's lock waits (see the class)."""
        previous = self.previous
        if previous is None:
            return
        waiting = 0
        while not previous.done():
            await asyncio.wait({previous}, timeout=TURN_CHECK_S)
            if previous.done() or self.previous_pid is None:
                break
            blockers = await bulk_store.lock_blockers(conn, self.previous_pid)
            if previous.done():  # it ended meanwhile: what it waited for is moot
                break
            if conn.get_server_pid() in blockers:
                raise TurnYielded
            # a wait on a third session that may itself wait for this batch
            waiting = waiting + 1 if blockers else 0
            if waiting >= TURN_PATIENCE:
                raise TurnYielded
        if not previous.result():
            raise PreviousRefused
        before = self.previous_turn
        if (
            before is not None
            and before.started is not None
            and self.started is not None
            and before.started > self.started
        ):
            # The batch before committed a transaction that began after this one:
            # committing now would stamp this batch earlier than that one.
            raise TurnYielded


TURN_CHECK_S = 0.05
"""How often a batch waiting for the batch before it checks that batch's lock waits."""

TURN_PATIENCE = 4
"""Checks in a row that find the batch before waiting for some lock, after which
the waiting batch gives way (rolls back, and is applied again after it)."""


class PreviousRefused(Exception):
    """The batch before this one in a pipelined load was refused: this one was
    rolled back (it would have committed after it), and wrote nothing."""


class TurnYielded(Exception):
    """A pipelined batch rolled back so as not to hold what the batch before it
    waits for; the loader applies it again once that batch has ended."""


class _DetachFirst(Exception):
    """The batch stores vectors into spaces to detach first, outside its transaction."""

    def __init__(self, spaces: list[tuple[str, UUID]]) -> None:
        super().__init__(spaces)
        self.spaces = spaces


# A batch rolled back for its spaces' detach runs again once they are detached.
_DETACH_ROUNDS = 3

# Refusals that say nothing about the record: a lock or statement timeout, a
# deadlock. Reported as DATABASE_UNAVAILABLE (retry), never as bad input.
_BUSY = (
    asyncpg.LockNotAvailableError,
    asyncpg.QueryCanceledError,
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
)

_POSTGRES_FIELD_HINTS = {
    "quote_matches_evidence": "quote",
}


class WriteService:
    """Applies records; shared by ``recall-gateway load`` and the GraphQL mutations."""

    def __init__(self, db: Database, embedder: EmbeddingProvider) -> None:
        self.db = db
        self.embedder = embedder
        self._told: set[str] = set()
        """Server warnings about the statistics refresh already logged."""

    async def analyze_unplanned_tables(self, *, load_end: bool = False) -> None:
        """After a loader batch: planner statistics for referenced tables that have
        rows but none yet, so that foreign-key checks stay lookups by key as a first
        load grows, and for tables that have grown a lot; with ``load_end``, after
        a load's last batch, for every table whose statistics miss about a tenth of
        it (:func:`gateway.store.bulk_writes.analyze_stale` says why)."""
        rule = bulk_store.AT_LOAD_END if load_end else bulk_store.AFTER_BATCH
        try:
            async with self.db.acquire() as conn:  # outside any transaction block
                skipped = await bulk_store.analyze_stale(
                    conn, rule, statement_timeout_ms=self.db.statement_timeout_ms
                )
        except (asyncpg.PostgresError, GatewayError) as exc:  # a timeout, a lost server
            # The batch is committed; statistics only make later batches faster,
            # and autovacuum takes them later anyway: never fail a load for them.
            log.warning("planner statistics not refreshed after a loader batch: %s", exc)
            return
        for message in skipped:
            if message.sqlstate == bulk_store.LOCK_NOT_AVAILABLE:  # the next refresh tries again
                log.info("planner statistics: %s", message.message)
            elif message.message not in self._told:
                # A table the login role may not analyse never will be: say it once
                # (docs/deploy.md, "Planner statistics and the login role").
                self._told.add(message.message)
                log.warning("planner statistics not refreshed: %s", message.message)

    def writer_lanes(self, count: int) -> contextlib.AbstractAsyncContextManager[list[Conn]]:
        """Connections for the batches of a pipelined load (see :class:`Turn`)."""
        return bulk_store.writer_lanes(self.db, count)

    async def supplied_model_problem(self, model: str, dimensions: int) -> str | None:
        """Why vectors of ``model`` cannot be stored as given, or None: they must be
        the configured provider's (recall embeds queries with it) and the store's."""
        mine = (self.embedder.model, self.embedder.dimensions)
        if (model, dimensions) != mine:
            return (
                f"the file's vectors are of model '{model}' ({dimensions} dimensions); "
                f"this gateway embeds with '{mine[0]}' ({mine[1]}): refusing to mix them"
            )
        async with self.db.admin(readonly=True) as conn:
            held = await store.store_embedding_model(conn)
        if held is not None and held != (model, dimensions):
            return (
                f"the store holds vectors of model '{held[0]}' ({held[1]} dimensions); "
                f"the file's are of '{model}' ({dimensions}): refusing to mix them"
            )
        return None

    async def apply(
        self,
        records: Sequence[Any],
        actor: Actor,
        *,
        set_based: bool = True,
        embed_ahead: bool = False,
        deferral: Deferral | None = None,
        turn: Turn | None = None,
    ) -> BatchResult:
        """Apply a batch in one transaction; raises :class:`RecordError` on the first refusal.

        The operator's runs of creation records go through the set-based path
        (:mod:`gateway.services.bulk_writes`) unless ``set_based`` is off; when
        that path cannot accept a run, the batch is applied again record by
        record, which reports the refusal exactly as it always has.
        ``embed_ahead`` embeds the operator's evidence texts while the writes
        run, as a principal's always are (see :class:`_Lane`).
        ``deferral`` (``load --index-after``; the operator only) stores the batch's
        vectors in their spaces' detached tables, indexed when the load ends
        (:mod:`gateway.services.vector_indexes`); a space still attached is
        detached between two tries of the batch, outside its transaction. A space
        detached for this batch is attached again when the batch is refused
        (:meth:`_undo_claims`): a refusal changes nothing other clients see.
        ``turn`` (the operator's set-based batches of a pipelined load) runs the
        transaction on the turn's connection and commits it only after the batch
        before it (see :class:`Turn`)."""
        if turn is not None and not (actor.is_operator and set_based):
            raise ValueError("only the operator's set-based batches take turns")
        way = _Way(set_based=set_based, embed_ahead=embed_ahead, deferral=deferral, turn=turn)
        if deferral is None or not actor.is_operator:
            return await self._apply_batch(records, actor, way, [])
        detached: list[UUID] = []
        try:
            return await self._apply_batch(records, actor, way, detached)
        except Exception:
            await self._undo_claims(deferral, detached)
            raise

    @staticmethod
    async def _undo_claims(deferral: Deferral, spaces: list[UUID]) -> None:
        """After a refused batch: attach again the spaces it detached, which hold no
        vector (its transaction was rolled back). Without this an existing empty
        space (or the space of a team an earlier batch created) would stay detached
        and refuse every plain write with VECTOR_INDEX_PENDING until someone ran
        the build, although the load wrote nothing into it."""
        for space in spaces:
            try:
                if not await deferral.unclaim(space):
                    log.warning("space %s stays detached after a refused batch", space)
            except (asyncpg.PostgresError, GatewayError, OSError) as exc:  # a lost server
                log.warning("space %s stays detached after a refused batch: %s", space, exc)

    async def _apply_batch(
        self, records: Sequence[Any], actor: Actor, way: _Way, detached: list[UUID]
    ) -> BatchResult:
        """``detached`` collects the spaces this batch detached (undone if it is refused)."""
        deferral = way.deferral
        if deferral is not None and actor.is_operator:
            try:
                await self._claim_ahead(records, deferral, detached, way.turn)
            except GatewayError as exc:
                raise RecordError(-1, None, exc) from exc
        for _ in range(_DETACH_ROUNDS):
            try:
                if actor.is_operator and all(r.kind in rec.SPACE_KINDS for r in records):
                    return await self._apply_creating_spaces(records, actor, way)
                return await self._apply_either(records, actor, way)
            except _DetachFirst as first:
                assert deferral is not None
                try:
                    for team, space in first.spaces:
                        if await deferral.claim(team, space):
                            detached.append(space)
                except GatewayError as exc:
                    raise RecordError(-1, None, exc) from exc
        raise RecordError(  # pragma: no cover - a claimed space stays detached
            -1, None, DatabaseUnavailable("the batch's spaces could not be detached; load again")
        )

    async def _claim_ahead(
        self,
        records: Sequence[Any],
        deferral: Deferral,
        detached: list[UUID],
        turn: Turn | None = None,
    ) -> None:
        """``load --index-after``: before the batch's transaction, detach the spaces
        its vectors will go to that are attached and still empty (each in a short
        transaction of its own, :meth:`Deferral.claim`), so that the batch is
        applied once. A space that holds vectors is left to the batch, which
        refuses it only if it writes vectors there (a re-run that writes nothing
        is no refusal); a space the prediction misses is still detached by the
        batch's own check (:class:`_DetachFirst`), at the cost of applying it
        twice. A pipelined batch (``turn``) that has a space to detach first waits
        for the batch before it to commit: a detach waits for the transactions
        writing the parents' rows, the one in flight among them."""
        for team, space in sorted(await self._vector_spaces(records, deferral.resolved)):
            if space in deferral.spaces:
                continue
            async with self.db.admin(readonly=True) as conn:
                attached, full = await vector_partitions.attached_state(conn, space)
            if attached and not full:
                if turn is not None:
                    await turn.previous_committed()
                if await deferral.claim(team, space):
                    detached.append(space)

    async def _vector_spaces(
        self, records: Sequence[Any], resolved: dict[tuple[str, str], UUID]
    ) -> set[tuple[str, UUID]]:
        """(team, space) of every existing space the batch's evidence and
        relationships would store vectors in: a relationship's own space, an
        evidence's source's (a source earlier in the batch, or one visible now).
        A reference that does not resolve is skipped: the batch refuses it.
        ``resolved`` keeps the load's (team, space reference) lookups: a space's
        ID never changes, so most batches of a load need no statement here."""
        refs: set[tuple[str, str]] = set()
        batch_sources: dict[tuple[str, str], str] = {}
        ask: dict[str, set[str]] = {}
        for r in records:
            if r.kind == "source":
                batch_sources[(r.team, r.id)] = r.space
            elif r.kind == "relationship":
                refs.add((r.team, r.space))
            elif r.kind == "evidence":
                ref = batch_sources.get((r.team, r.source))
                if ref is not None:
                    refs.add((r.team, ref))
                else:
                    ask.setdefault(r.team, set()).add(r.source)
        out = {(team, resolved[(team, ref)]) for team, ref in refs if (team, ref) in resolved}
        refs -= set(resolved)
        if not refs and not ask:
            return out
        async with self.db.admin(readonly=True) as conn:
            for team, ids in sorted(ask.items()):
                found = await store.find_visible(conn, "source", team, sorted(ids))
                out |= {(team, v.space_id) for v in found.values()}
            for team, ref in sorted(refs):
                space = await store.find_space(conn, team, rec.private_owner(ref))
                if space is not None:
                    resolved[(team, ref)] = space.id
                    out.add((team, space.id))
        return out

    async def _apply_creating_spaces(
        self, records: Sequence[Any], actor: Actor, way: _Way
    ) -> BatchResult:
        """A batch that creates spaces (the loader gives them batches of their own,
        :data:`gateway.services.records.SPACE_KINDS`): their partitions' foreign
        keys take SHARE ROW EXCLUSIVE on the tables every team writes evidence and
        relationships to, and a request waiting for it queues those writers behind
        it, so the batch waits at most 100 ms for any lock and is tried again,
        backing off, like the detach of ``load --index-after``
        (:mod:`gateway.services.lock_waits`). Only a batch of nothing but space
        records comes here (the loader's): a direct caller's mixed batch (a test,
        a benchmark) is applied once, as any batch, never embedded again on a
        retry; it holds those locks while it embeds, which the loader avoids."""
        try:
            async for attempt in lock_waits.retrying():
                with attempt:
                    return await self._apply_either(
                        records, actor, replace(way, embed_ahead=False, short_locks=True)
                    )
        except tenacity.RetryError:
            pass
        raise RecordError(
            -1,
            None,
            DatabaseUnavailable(
                "other sessions held locks this batch needs (the tables of vectors, "
                "evidence and relationships, or rows another load is writing): its spaces "
                f"could not be created after {lock_waits.ATTEMPTS} tries; nothing was "
                "written, and loading again is safe"
            ),
        )

    async def _apply_either(self, records: Sequence[Any], actor: Actor, way: _Way) -> BatchResult:
        """The batch through the set-based path if ``way`` allows it and any record
        is eligible, else (or when that path cannot accept it) record by record."""
        if way.set_based and actor.is_operator and any(bulk_writes.eligible(r) for r in records):
            try:
                return await self._apply(
                    records,
                    actor,
                    set_based=True,
                    embed_ahead=way.embed_ahead,
                    deferral=way.deferral,
                    short_locks=way.short_locks,
                    turn=way.turn,
                )
            except bulk_writes.Fallback:
                pass  # rolled back; the record-at-a-time path finds the refusal
        return await self._apply(
            records,
            actor,
            set_based=False,
            embed_ahead=way.embed_ahead,
            deferral=way.deferral,
            short_locks=way.short_locks,
            turn=way.turn,
        )

    async def _apply(
        self,
        records: Sequence[Any],
        actor: Actor,
        *,
        set_based: bool,
        embed_ahead: bool,
        deferral: Deferral | None,
        short_locks: bool = False,
        turn: Turn | None = None,
    ) -> BatchResult:
        result = BatchResult()
        # A write may wait for a lock held by a loader batch that is computing its
        # embeddings: bounded by the statement timeout, like the loader's own writes,
        # not by the short lock timeout that lets optional reads degrade quickly.
        transaction = (
            bulk_store.on_lane(self.db, turn.lane)
            if turn is not None
            else self.db.admin()
            if actor.is_operator or not actor.space_ids
            else self.db.tenant(
                cast(str, actor.team),
                actor.space_ids,
                readonly=False,
                lock_timeout="0",
                claim_counter_shard=True,
            )
        )
        lane = _Lane(self.embedder)
        if not actor.is_operator or embed_ahead:
            # The evidence texts start embedding at once, in the provider's
            # thread, while the transaction's checks and inserts wait on the
            # database: a ``remember`` then costs about the longer of the two, not
            # their sum. The loader asks for it only while a load is creating
            # evidence (:func:`gateway.services.loader.load`): a re-run would send
            # texts that are already stored.
            lane.add(*sorted(_evidence_texts(records)))
        try:
            async with transaction as conn:
                if turn is not None:
                    turn.started = await bulk_store.transaction_start(conn)
                    turn.began.set()
                batch = _Batch(conn, actor, self.embedder, lane, deferral=deferral)
                batch.foresee(records)
                if short_locks:
                    batch.short_locks = True
                    await vector_partitions.wait_briefly_for_locks(conn)
                try:
                    if actor.is_operator or not actor.space_ids:  # a tenant claimed on entering
                        await store.claim_counter_shard(conn)
                except _BUSY as exc:
                    if batch.short_locks and isinstance(exc, lock_waits.BUSY):
                        raise  # rolled back and tried again (_apply_creating_spaces)
                    raise RecordError(
                        -1,
                        None,
                        DatabaseUnavailable(
                            "every counter shard was held by other writers for longer than "
                            "the statement timeout; nothing was written, and retrying with "
                            "the same IDs is safe"
                        ),
                    ) from exc
                index = 0
                while index < len(records):
                    if set_based and bulk_writes.eligible(records[index]):
                        end = index
                        while end < len(records) and bulk_writes.eligible(records[end]):
                            end += 1
                        await self._apply_run(batch, records[index:end], result)
                        index = end
                        continue
                    record = records[index]
                    try:
                        created, recorded_at = await self._apply_one(batch, record)
                        if created:
                            result.created[record.kind] += 1
                        else:
                            result.unchanged[record.kind] += 1
                        result.receipts.append(
                            Receipt(record.kind, record.id, created, recorded_at)
                        )
                    except _FieldError as exc:
                        raise RecordError(index, exc.field, exc.error) from None
                    except _BUSY as exc:
                        if batch.short_locks and isinstance(exc, lock_waits.BUSY):
                            raise  # rolled back and tried again (_apply_creating_spaces)
                        raise RecordError(
                            index,
                            None,
                            DatabaseUnavailable(
                                "the database was too busy to take this write; nothing was "
                                "written, and retrying with the same IDs is safe"
                            ),
                        ) from exc
                    except asyncpg.PostgresError as exc:
                        raise RecordError(
                            index, _field_of(exc), InvalidInput(_db_message(exc))
                        ) from exc
                    index += 1
                try:
                    await batch.embed_pending()
                except GatewayError as exc:
                    raise RecordError(-1, None, exc) from exc
                except _BUSY as exc:
                    raise RecordError(
                        -1, None, DatabaseUnavailable("the database was too busy to store vectors")
                    ) from exc
                if turn is not None:
                    await turn.wait_turn(conn)
        finally:
            lane.close()  # a refused batch's calls stopped; a call nothing awaited too
        return result

    async def _apply_run(self, batch: _Batch, run: Sequence[Any], result: BatchResult) -> None:
        """A run of creation records, set-based; any doubt raises ``Fallback``."""
        try:
            outcome = await bulk_writes.apply_run(
                batch.conn,
                run,
                batch.actor.label,
                statement_timeout_ms=self.db.statement_timeout_ms,
            )
        except asyncpg.PostgresError as exc:
            raise bulk_writes.Fallback from exc
        for record, (created, recorded_at) in zip(run, outcome.receipts, strict=True):
            (result.created if created else result.unchanged)[record.kind] += 1
            result.receipts.append(Receipt(record.kind, record.id, created, recorded_at))
        batch.evidence_texts.extend(outcome.evidence_texts)
        batch.relationship_texts.extend(outcome.relationship_texts)
        batch.supplied.update(outcome.supplied)

    async def _apply_one(self, batch: _Batch, record: Any) -> tuple[bool, datetime]:
        team = rec.record_team(record)
        if record.kind == "team":
            if not batch.actor.is_operator:
                raise _fail("kind", Forbidden("only the operator creates teams"))
        else:
            batch._check_team(team)
        if getattr(record, "embedding", None) is not None and not batch.actor.is_operator:
            raise _fail("embedding", Forbidden("only the loader supplies vectors"))
        if record.kind in _OPERATOR_ONLY and not batch.actor.is_operator:
            raise _fail("kind", Forbidden(f"only the operator writes '{record.kind}' records"))
        reads = batch.reads_of(record)
        claim, recorded_at, answers = await store.claim_write(
            batch.conn,
            team,
            record.kind,
            record.id,
            record.payload_sha256(),
            batch.actor.label,
            any_writer=batch.actor.is_operator,
            reads=reads,
        )
        if claim == "same":
            await batch.check_replay(record, reads, answers)
            return False, recorded_at
        if claim == "different":
            await batch.check_replay(record, reads, answers)
            raise _fail(
                "id",
                IdempotencyConflict(
                    f"{record.kind} '{record.id}' was written before with different content"
                ),
            )
        batch.read_ahead(team, reads, answers)
        try:
            await getattr(batch, record.kind)(record)
        finally:
            batch.ahead.clear()  # this record's: never a later one's
        return True, recorded_at


# The foreign keys naming the store's model (db/0035), which a reembed's switch renames.
_MODEL_KEYS = frozenset(
    {
        "evidence_embeddings_model_fkey",
        "relationship_embeddings_model_fkey",
        "relationship_projections_model_fkey",
    }
)


def _moved(model: str) -> EmbeddingMismatch:
    """The refusal of a batch during which the store or the provider moved to
    another model (a ``reembed`` switched while its texts were embedding)."""
    return EmbeddingMismatch(
        f"the store or the embedding provider moved from model '{model}' to another while "
        "this write was embedding (a reembed switched models): nothing was written, and "
        "retrying with the same IDs is safe"
    )


def _evidence_texts(records: Sequence[Any]) -> set[str]:
    """The texts of the batch's evidence records whose vectors are not supplied."""
    return {
        r.content for r in records if r.kind == "evidence" and getattr(r, "embedding", None) is None
    }


def _field_of(exc: asyncpg.PostgresError) -> str | None:
    constraint = getattr(exc, "constraint_name", None)
    return _POSTGRES_FIELD_HINTS.get(constraint or "", getattr(exc, "column_name", None))


def _db_message(exc: asyncpg.PostgresError) -> str:
    """The database's refusal, without SQL or internal identifiers."""
    if isinstance(exc, asyncpg.UniqueViolationError):
        table = getattr(exc, "table_name", None) or "object"
        return f"an ID is already used in this team ({table.replace('_', ' ')})"
    if isinstance(exc, asyncpg.ForeignKeyViolationError):
        return "a referenced object does not exist"
    if isinstance(exc, asyncpg.CheckViolationError):
        if getattr(exc, "constraint_name", None) == "quote_matches_evidence":
            return "the quote does not match the evidence text at its span"
        return f"a value is out of range ({getattr(exc, 'constraint_name', 'check')})"
    return "the database refused the record"
