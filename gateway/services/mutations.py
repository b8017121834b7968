"""The GraphQL mutations' side of the one write path (docs/writes.md).

Why this module exists: a mutation must write exactly what the same loader
record would write, so it only turns the caller's input into the loader's
records (``gateway/services/records.py``) and hands them to the
:class:`~gateway.services.writes.WriteService` with the caller as the actor.
Everything that makes a write safe (authorisation, visibility of references,
transitions, idempotency, history, embeddings before commit, one transaction)
happens there, once.

What it adds: spaces are named by kind (``shared``/``private``), never by an
internal ID, and become the caller's own space; errors name the input path of
the field at fault (``evidence[1].occurrences[0].end``), not the record's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gateway.errors import GatewayError, InvalidInput
from gateway.services import records as rec
from gateway.services.auth import Principal
from gateway.services.writes import Actor, Receipt, RecordError, WriteService

_ADAPTER: TypeAdapter[Any] = TypeAdapter(rec.Record)

# Limits of one remember call: one transaction, embeddings computed before it returns.
MAX_REMEMBER_EVIDENCE = 20
MAX_REMEMBER_ENTITIES = 50
MAX_REMEMBER_RELATIONSHIPS = 20


class MutationError(GatewayError):
    """A refused mutation: the write service's code, with the input path at fault."""

    def __init__(self, message: str, code: str, field: str | None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field


@dataclass(frozen=True, slots=True)
class Item:
    """One record to write: its kind and fields in the loader's vocabulary (without
    ``team``), where it sits in the mutation's input, and input names that differ
    from the record's (record field -> input field)."""

    kind: str
    data: Mapping[str, Any]
    path: str = ""
    names: Mapping[str, str] = field(default_factory=dict)


def space_ref(principal: Principal, kind: str) -> str:
    """``shared`` or the caller's own ``private:<id>``: a principal can only name its
    own private space, so no input can point into another principal's."""
    if kind == "shared":
        return rec.SHARED
    if kind == "private":
        return f"private:{principal.principal_id}"
    raise InvalidInput(f"unknown space kind '{kind}'", field="space")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _input_path(item: Item, record_field: str | None) -> str | None:
    """The input path of a record's field: prefix, renamed and camelCased segments."""
    if not record_field:
        return item.path or None
    parts = []
    for segment in record_field.split("."):
        name, bracket, index = segment.partition("[")
        name = item.names.get(name, _camel(name))
        parts.append(name + (bracket + index if bracket else ""))
    tail = ".".join(parts)
    if tail.startswith("/"):  # a name given from the input's root
        return tail[1:]
    return f"{item.path}.{tail}" if item.path else tail


def _loc(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class MutationService:
    """Builds records from mutation input and applies them as the caller."""

    def __init__(self, writes: WriteService) -> None:
        self.writes = writes

    def build(self, principal: Principal, items: Sequence[Item]) -> list[Any]:
        """The records, validated by the same models as the loader's lines."""
        records = []
        for item in items:
            data = {k: v for k, v in item.data.items() if v is not None}
            data.update(kind=item.kind, team=principal.team_id)
            try:
                records.append(_ADAPTER.validate_python(data))
            except ValidationError as exc:
                err = exc.errors(include_url=False)[0]
                # the first element of loc is the discriminator's tag
                where = _loc(tuple(err["loc"])[1:]) or None
                raise InvalidInput(
                    err["msg"].removeprefix("Value error, "), field=_input_path(item, where)
                ) from None
        return records

    async def apply(self, principal: Principal, items: Sequence[Item]) -> list[Receipt]:
        """Write all items in one transaction as the caller; all or nothing."""
        records = self.build(principal, items)
        actor = Actor.for_principal(
            principal.team_id,
            principal.principal_id,
            private_bound=principal.private_space_id is not None,
            space_ids=principal.readable_space_ids,
        )
        try:
            result = await self.writes.apply(records, actor)
        except RecordError as exc:
            item = items[exc.index] if exc.index >= 0 else None
            path = _input_path(item, exc.field) if item is not None else None
            raise MutationError(exc.cause.message, exc.code, path) from exc
        return result.receipts


def remember_items(principal: Principal, data: Mapping[str, Any]) -> list[Item]:
    """The records of one remember call, in dependency order: source, entities,
    evidence, relationships (with their supports)."""
    space = space_ref(principal, data.get("space") or "shared")
    source, source_id = data.get("source"), data.get("source_id")
    evidence = list(data.get("evidence") or [])
    entities = list(data.get("entities") or [])
    relationships = list(data.get("relationships") or [])
    for name, values, maximum in (
        ("evidence", evidence, MAX_REMEMBER_EVIDENCE),
        ("entities", entities, MAX_REMEMBER_ENTITIES),
        ("relationships", relationships, MAX_REMEMBER_RELATIONSHIPS),
    ):
        if len(values) > maximum:
            raise InvalidInput(f"{name} takes at most {maximum} items per call", field=name)
    if source is not None and source_id is not None:
        raise InvalidInput("give either 'source' (new) or 'sourceId' (existing)", field="sourceId")
    if evidence and source is None and source_id is None:
        raise InvalidInput("evidence needs 'source' (new) or 'sourceId' (existing)", field="source")
    if not (source or evidence or entities or relationships):
        raise InvalidInput("nothing to remember", field="evidence")
    items: list[Item] = []
    top_space = {"space": "/space"}  # one space for the whole call
    if source is not None:
        items.append(Item("source", {**source, "space": space}, "source", top_space))
        source_id = source.get("id")
    items += [
        Item("entity", {**e, "space": space}, f"entities[{i}]", top_space)
        for i, e in enumerate(entities)
    ]
    source_name = "/source.id" if data.get("source") is not None else "/sourceId"
    items += [
        Item("evidence", {**e, "source": source_id}, f"evidence[{i}]", {"source": source_name})
        for i, e in enumerate(evidence)
    ]
    items += [
        Item("relationship", {**r, "space": space}, f"relationships[{i}]", top_space)
        for i, r in enumerate(relationships)
    ]
    return items
