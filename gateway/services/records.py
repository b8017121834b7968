"""The write records: one typed model per kind of change that memory accepts.

The loader reads them from JSON Lines and the GraphQL mutations build them from
their inputs, so both go through one validation and one write service. Every
record carries a client-supplied ``id``: the same record twice is a no-op, the
same ``id`` with other content is refused. ``docs/loading.md`` documents each
field; a test checks that every kind below is documented there.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

ClientId = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", strict=True)
]
TokenId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{2,63}$")]
SpaceRef = Annotated[
    str, StringConstraints(pattern=r"^(shared|private:[A-Za-z0-9][A-Za-z0-9._:-]{0,127})$")
]
Reason = Annotated[str, StringConstraints(max_length=2000)]
Predicate = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]


# Kinds whose insert creates a memory space, and with it the space's two vector
# partitions (db/0001's trigger, attached since db/0102). Creating them clones
# the vector tables' foreign keys, which takes SHARE ROW EXCLUSIVE on evidence,
# relationships, embedding_models and relationship_projections until the
# transaction commits: every team's writes of evidence and relationships wait
# for it (reads do not). So the loader writes these records in short batches of
# their own (gateway.services.loader.batches), which wait briefly for their
# locks and retry (gateway.services.writes.WriteService.apply).
SPACE_KINDS = frozenset({"team", "principal"})


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


# A point in time with its offset, normalised to UTC: the same instant written
# with another offset is the same content for idempotency.
Instant = Annotated[AwareDatetime, AfterValidator(_utc)]

SHARED = "shared"
_PRIVATE_PREFIX = "private:"


def private_owner(space: str) -> str | None:
    """The owning principal of a ``private:<id>`` space reference, else None."""
    return space[len(_PRIVATE_PREFIX) :] if space.startswith(_PRIVATE_PREFIX) else None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)

    def payload_sha256(self) -> bytes:
        """Hash of the record's canonical JSON: what idempotency compares. A supplied
        ``embedding`` is derived from the content, not content: it is left out, so
        a record hashes as it did before vectors could be supplied."""
        data = self.model_dump(mode="json", exclude={"embedding"})
        body = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).digest()


# A vector computed elsewhere by the store's model (docs/loading.md, "Supplied
# embeddings"): its length and the model are checked against the file's
# embedding_model line and the store when the file is loaded.
SuppliedEmbedding = Annotated[list[float], Field(min_length=1, max_length=4096)]


class _TeamRecord(_Record):
    team: ClientId
    id: ClientId


# --- tenants -----------------------------------------------------------------


class TeamRecord(_Record):
    kind: Literal["team"]
    id: ClientId
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]


class PrincipalRecord(_TeamRecord):
    kind: Literal["principal"]
    type: Literal["person", "agent"] = "person"
    display_name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    private_space: bool = True


class TokenRecord(_Record):
    """A bearer token for a principal. Give ``secret`` (43 url-safe base64
    characters, the token is then ``rgt_<id>_<secret>``) or its ``secret_sha256``."""

    kind: Literal["token"]
    team: ClientId
    id: TokenId
    principal: ClientId
    binding: Literal["private", "shared_only"] = "private"
    secret: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{43}$")] | None = None
    secret_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    label: Annotated[str, StringConstraints(max_length=200)] | None = None
    expires_at: Instant | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> TokenRecord:
        if (self.secret is None) == (self.secret_sha256 is None):
            raise ValueError("give exactly one of 'secret' and 'secret_sha256'")
        return self


# --- sources, evidence, entities ---------------------------------------------


class SourceRecord(_TeamRecord):
    kind: Literal["source"]
    space: SpaceRef = SHARED
    type: Literal["document", "conversation", "tool", "person"]
    title: Annotated[str, StringConstraints(min_length=1, max_length=500)]
    uri: Annotated[str, StringConstraints(max_length=2000)] | None = None
    authority: Literal["unverified", "low", "medium", "high", "authoritative"] = "medium"
    created_at: Instant | None = None


class EntityRecord(_TeamRecord):
    kind: Literal["entity"]
    space: SpaceRef = SHARED
    name: Annotated[str, StringConstraints(min_length=1, max_length=300)]
    type: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,39}$")] = "thing"
    aliases: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=300)]],
        Field(max_length=50),
    ] = []


class Occurrence(_Record):
    """A quoted span [start, end) of the evidence text (character offsets)."""

    id: ClientId
    start: Annotated[int, Field(ge=0)]
    end: Annotated[int, Field(ge=1)]
    quote: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Occurrence:
        if self.end <= self.start:
            raise ValueError("'end' must be greater than 'start'")
        return self


class Mention(_Record):
    entity: ClientId
    occurrence: ClientId | None = None


class EvidenceRecord(_TeamRecord):
    """A text fragment of a source; it lives in its source's space."""

    kind: Literal["evidence"]
    source: ClientId
    content: Annotated[str, StringConstraints(min_length=1, max_length=20000)]
    observed_at: Instant | None = None
    occurrences: Annotated[list[Occurrence], Field(max_length=200)] = []
    mentions: Annotated[list[Mention], Field(max_length=200)] = []
    embedding: SuppliedEmbedding | None = None

    @model_validator(mode="after")
    def _spans_inside(self) -> EvidenceRecord:
        seen: set[str] = set()
        for i, occ in enumerate(self.occurrences):
            if occ.id in seen:
                raise ValueError(f"occurrences[{i}].id '{occ.id}' is repeated")
            seen.add(occ.id)
            if occ.end > len(self.content):
                raise ValueError(
                    f"occurrences[{i}].end {occ.end} is past the end of the content "
                    f"({len(self.content)} characters)"
                )
            if occ.quote is not None and self.content[occ.start : occ.end] != occ.quote:
                raise ValueError(f"occurrences[{i}].quote is not the content at [start, end)")
        entities = [m.entity for m in self.mentions]
        if len(entities) != len(set(entities)):
            raise ValueError("an entity is mentioned twice")
        for i, m in enumerate(self.mentions):
            if m.occurrence is not None and m.occurrence not in seen:
                raise ValueError(
                    f"mentions[{i}].occurrence '{m.occurrence}' is not an occurrence here"
                )
        return self


# --- relationships and supports ----------------------------------------------


class SupportSpec(_Record):
    """Evidence that supports a relationship, optionally citing a span."""

    id: ClientId
    evidence: ClientId
    occurrence: ClientId | None = None
    quote: str | None = None
    start: Annotated[int, Field(ge=0)] | None = None
    end: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _span(self) -> SupportSpec:
        given = [self.start is not None, self.end is not None]
        if any(given) and not all(given):
            raise ValueError("give both 'start' and 'end', or neither")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError("'end' must be greater than 'start'")
        if self.quote is not None and self.start is None:
            raise ValueError("a 'quote' needs 'start' and 'end'")
        return self


class RelationshipRecord(_TeamRecord):
    kind: Literal["relationship"]
    space: SpaceRef = SHARED
    subject: ClientId
    predicate: Predicate
    object: ClientId | None = None
    object_value: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = None
    object_unit: Annotated[str, StringConstraints(min_length=1, max_length=50)] | None = None
    polarity: Literal["positive", "negative"] = "positive"
    valid_from: Instant | None = None
    valid_to: Instant | None = None
    owner: ClientId | None = None
    semantic_group: Annotated[str, StringConstraints(min_length=1, max_length=300)] | None = None
    supports: Annotated[list[SupportSpec], Field(max_length=200)] = []
    embedding: SuppliedEmbedding | None = None

    @model_validator(mode="after")
    def _shape(self) -> RelationshipRecord:
        if (self.object is None) == (self.object_value is None):
            raise ValueError("give exactly one of 'object' (an entity) and 'object_value'")
        if self.object_unit is not None and self.object_value is None:
            raise ValueError("'object_unit' goes with 'object_value'")
        if self.valid_from and self.valid_to and self.valid_from >= self.valid_to:
            raise ValueError("'valid_to' must be after 'valid_from'")
        ids = [s.id for s in self.supports]
        if len(ids) != len(set(ids)):
            raise ValueError("a support id is repeated")
        return self

    def default_group_key(self) -> str:
        """Separately authored statements of the same meaning share this key."""
        obj = (
            f"entity:{self.object}"
            if self.object is not None
            else f"value:{_fold(self.object_value or '')}|{self.object_unit or ''}"
        )
        basis = f"{self.subject}|{self.predicate}|{obj}|{self.polarity}"
        return "sg:" + hashlib.sha256(basis.encode()).hexdigest()[:32]


def render_statement(
    subject: str, predicate: str, obj: str, unit: str | None, polarity: str
) -> str:
    """A readable sentence for a relationship; its search text and vector come from it."""
    verb = predicate.replace("_", " ")
    tail = f"{obj} {unit}" if unit else obj
    if polarity == "negative":
        return f"not: {subject} {verb} {tail}"
    return f"{subject} {verb} {tail}"


def _fold(value: str) -> str:
    return re.sub(r"\s+", " ", value.strip().casefold())


class SupportRecord(_TeamRecord):
    """A support added to an existing relationship."""

    kind: Literal["support"]
    relationship: ClientId
    evidence: ClientId
    occurrence: ClientId | None = None
    quote: str | None = None
    start: Annotated[int, Field(ge=0)] | None = None
    end: Annotated[int, Field(ge=1)] | None = None

    def spec(self) -> SupportSpec:
        return SupportSpec(
            id=self.id,
            evidence=self.evidence,
            occurrence=self.occurrence,
            quote=self.quote,
            start=self.start,
            end=self.end,
        )

    @model_validator(mode="after")
    def _span(self) -> SupportRecord:
        self.spec()
        return self


class SupportDecisionRecord(_TeamRecord):
    kind: Literal["support_decision"]
    support: ClientId
    decision: Literal["revoke", "reinstate"]
    reason: Reason | None = None


# --- lifecycle -----------------------------------------------------------------


class SourceLifecycleRecord(_TeamRecord):
    kind: Literal["source_lifecycle"]
    source: ClientId
    status: Literal["active", "withdrawn"]
    reason: Reason | None = None


class EvidenceLifecycleRecord(_TeamRecord):
    kind: Literal["evidence_lifecycle"]
    evidence: ClientId
    status: Literal["active", "quarantined", "withdrawn"]
    reason: Reason | None = None


class RelationshipTransitionRecord(_TeamRecord):
    kind: Literal["relationship_transition"]
    relationship: ClientId
    status: Literal["active", "superseded", "retracted"]
    superseded_by: ClientId | None = None
    reason: Reason | None = None

    @model_validator(mode="after")
    def _superseded(self) -> RelationshipTransitionRecord:
        if self.superseded_by is not None and self.status != "superseded":
            raise ValueError("'superseded_by' goes with status 'superseded'")
        if self.superseded_by == self.relationship:
            raise ValueError("a relationship cannot supersede itself")
        return self


# --- conflicts -------------------------------------------------------------------


class ConflictPositionSpec(_Record):
    id: ClientId
    label: Annotated[str, StringConstraints(min_length=1, max_length=500)]
    relationships: Annotated[list[ClientId], Field(min_length=1, max_length=100)]


class ConflictCaseRecord(_TeamRecord):
    kind: Literal["conflict_case"]
    space: SpaceRef = SHARED
    question: Annotated[str, StringConstraints(min_length=1, max_length=2000)]
    positions: Annotated[list[ConflictPositionSpec], Field(min_length=2, max_length=20)]
    reason: Reason | None = None

    @model_validator(mode="after")
    def _distinct(self) -> ConflictCaseRecord:
        ids = [p.id for p in self.positions]
        if len(ids) != len(set(ids)):
            raise ValueError("a position id is repeated")
        rels = [r for p in self.positions for r in p.relationships]
        if len(rels) != len(set(rels)):
            raise ValueError("a relationship stands in more than one position")
        return self


class ConflictResolutionRecord(_TeamRecord):
    kind: Literal["conflict_resolution"]
    case: ClientId
    preferred_position: ClientId
    reason: Reason | None = None


class ConflictReopeningRecord(_TeamRecord):
    kind: Literal["conflict_reopening"]
    case: ClientId
    reason: Reason | None = None


class EvidenceConflictPositionSpec(_Record):
    id: ClientId
    label: Annotated[str, StringConstraints(min_length=1, max_length=500)]
    evidence: ClientId
    occurrence: ClientId


class EvidenceConflictRecord(_TeamRecord):
    kind: Literal["evidence_conflict"]
    space: SpaceRef = SHARED
    question: Annotated[str, StringConstraints(min_length=1, max_length=2000)]
    positions: Annotated[list[EvidenceConflictPositionSpec], Field(min_length=2, max_length=20)]

    @model_validator(mode="after")
    def _distinct(self) -> EvidenceConflictRecord:
        ids = [p.id for p in self.positions]
        if len(ids) != len(set(ids)):
            raise ValueError("a position id is repeated")
        occ = [(p.evidence, p.occurrence) for p in self.positions]
        if len(occ) != len(set(occ)):
            raise ValueError("an occurrence is cited by more than one position")
        return self


# --- hypotheses and spaces -------------------------------------------------------


class HypothesisRecord(_TeamRecord):
    """A proposed connection in the shared space; never support for anything."""

    kind: Literal["hypothesis"]
    statement: Annotated[str, StringConstraints(min_length=1, max_length=2000)]
    origin: Annotated[str, StringConstraints(min_length=1, max_length=100)] = "dreaming"
    proposed_by: ClientId | None = None
    relationships: Annotated[list[ClientId], Field(max_length=100)] = []
    evidence: Annotated[list[ClientId], Field(max_length=100)] = []

    @model_validator(mode="after")
    def _distinct(self) -> HypothesisRecord:
        if len(self.relationships) != len(set(self.relationships)):
            raise ValueError("a relationship is listed twice")
        if len(self.evidence) != len(set(self.evidence)):
            raise ValueError("an evidence is listed twice")
        return self


class HypothesisFeedbackRecord(_TeamRecord):
    kind: Literal["hypothesis_feedback"]
    hypothesis: ClientId
    decision: Literal["confirm", "reject", "mark_stale", "reopen"]
    note: Reason | None = None


class SpaceResetRecord(_TeamRecord):
    """Start a new generation of a space: everything written before is hidden."""

    kind: Literal["space_reset"]
    space: SpaceRef
    reason: Reason | None = None


Record = Annotated[
    TeamRecord
    | PrincipalRecord
    | TokenRecord
    | SourceRecord
    | EntityRecord
    | EvidenceRecord
    | RelationshipRecord
    | SupportRecord
    | SupportDecisionRecord
    | SourceLifecycleRecord
    | EvidenceLifecycleRecord
    | RelationshipTransitionRecord
    | ConflictCaseRecord
    | ConflictResolutionRecord
    | ConflictReopeningRecord
    | EvidenceConflictRecord
    | HypothesisRecord
    | HypothesisFeedbackRecord
    | SpaceResetRecord,
    Field(discriminator="kind"),
]

RECORD_KINDS: tuple[str, ...] = (
    "team",
    "principal",
    "token",
    "source",
    "entity",
    "evidence",
    "relationship",
    "support",
    "support_decision",
    "source_lifecycle",
    "evidence_lifecycle",
    "relationship_transition",
    "conflict_case",
    "conflict_resolution",
    "conflict_reopening",
    "evidence_conflict",
    "hypothesis",
    "hypothesis_feedback",
    "space_reset",
)


def record_team(record: Any) -> str:
    """The team a record writes into (a team record is its own team)."""
    return str(record.id if record.kind == "team" else record.team)
