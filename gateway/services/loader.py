"""The JSON Lines loader: every line one record (see ``docs/loading.md``).

The whole input is parsed and validated before anything is written, so a typo
on the last line writes nothing. Then records are applied in batches, one
transaction each; a batch that the database refuses (an unknown reference, an
ID reused with other content) is rolled back whole, and the error names its
line and field. Earlier batches stay committed, and loading the same file again
is safe: records already applied are skipped by their IDs.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)

from gateway.errors import GatewayError
from gateway.services.records import SPACE_KINDS, Record
from gateway.services.vector_indexes import Deferral
from gateway.services.writes import Actor, RecordError, WriteService

_ADAPTER: TypeAdapter[Any] = TypeAdapter(Record)
MAX_REPORTED_ERRORS = 20
EMBEDDING_MODEL = "embedding_model"


class EmbeddingModelLine(BaseModel):
    """Not a record: the file's statement of the model its supplied vectors come
    from. Checked against the gateway's provider and the store before any write."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["embedding_model"]
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    dimensions: Annotated[int, Field(ge=1, le=4096)]


_DIRECTIVE: TypeAdapter[EmbeddingModelLine] = TypeAdapter(EmbeddingModelLine)


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    field: str | None
    message: str
    code: str = "BAD_USER_INPUT"

    def __str__(self) -> str:
        where = f", field '{self.field}'" if self.field else ""
        return f"line {self.line}{where}: {self.message}"


class LoadError(GatewayError):
    """The input was refused. ``errors`` lists the lines; ``committed`` says how
    many records were written before the refusal (0 when validation failed)."""

    code = "LOAD_REFUSED"

    def __init__(self, errors: list[LineError], committed: int, detail: str) -> None:
        super().__init__(detail)
        self.errors = errors
        self.committed = committed
        # Spaces a ``load --index-after`` left detached before it was refused.
        self.deferred: list[UUID] = []


@dataclass
class LoadReport:
    records: int = 0
    batches: int = 0
    created: Counter[str] = field(default_factory=Counter)
    unchanged: Counter[str] = field(default_factory=Counter)
    deferred: list[UUID] = field(default_factory=list)
    """Spaces whose vectors this load (``index_after``) left for the index build."""


def _loc(loc: tuple[int | str, ...]) -> str | None:
    parts: list[str] = []
    for item in loc[1:] if loc and isinstance(loc[0], str) and loc[0].islower() else loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or None


def split_lines(text: str) -> list[str]:
    """Lines of JSON Lines input: split on newline only. ``str.splitlines`` would
    also split inside records at U+2028 and other separators that JSON allows raw."""
    return text.split("\n")


# Kinds that change something earlier records made. Each starts a new batch when
# its batch already holds records that create things, so that the change gets a
# later system time than what it changes and earlier `knownAt` views exist.
CHANGE_KINDS = frozenset(
    {
        "support_decision",
        "source_lifecycle",
        "evidence_lifecycle",
        "relationship_transition",
        "conflict_resolution",
        "conflict_reopening",
        "hypothesis_feedback",
        "space_reset",
    }
)


# Records that create spaces (:data:`gateway.services.records.SPACE_KINDS`) are
# written in batches of their own, at most SPACE_BATCH_SIZE records each, so that
# the locks their partitions take (see there) are held for a few inserts, never
# while a batch embeds texts or copies vectors.
SPACE_BATCH_SIZE = 20


def batches(records: Iterable[tuple[int, Any]], batch_size: int) -> Iterator[list[tuple[int, Any]]]:
    """Cut records into transactions of at most ``batch_size``, before a change
    that follows creations (see :data:`CHANGE_KINDS`), and around records that
    create spaces (see :data:`gateway.services.records.SPACE_KINDS`). Lazy: a
    streamed file is read one batch ahead, never whole. ``embedding_model`` lines
    are skipped."""
    current: list[tuple[int, Any]] = []
    creates = False
    spaces = False
    for item in records:
        if isinstance(item[1], EmbeddingModelLine):
            continue
        is_change = item[1].kind in CHANGE_KINDS
        is_space = item[1].kind in SPACE_KINDS
        if current and (
            len(current) >= (min(batch_size, SPACE_BATCH_SIZE) if spaces else batch_size)
            or (is_change and creates)
            or is_space != spaces
        ):
            yield current
            current, creates = [], False
        current.append(item)
        creates = creates or not is_change
        spaces = is_space
    if current:
        yield current


@dataclass(frozen=True, slots=True)
class Checked:
    """What a validated file holds: its records, and the model its vectors name."""

    records: int
    embedding_model: tuple[int, EmbeddingModelLine] | None


def parse(lines: Iterable[str | bytes]) -> list[tuple[int, Any]]:
    """Validate every line; raises :class:`LoadError` listing the bad ones."""
    errors: list[LineError] = []
    parsed = list(_parse(lines, errors))
    if errors:
        raise LoadError(errors, 0, f"{len(errors)} invalid line(s); nothing was written")
    return parsed


def check(lines: Iterable[str | bytes]) -> Checked:
    """Validate every line keeping none of them: the first pass over a file that is
    then streamed (:func:`stream`), so that memory does not grow with the file while
    a bad line anywhere still stops the load before anything is written."""
    errors: list[LineError] = []
    count, model = 0, None
    for number, item in _parse(lines, errors):
        if isinstance(item, EmbeddingModelLine):
            model = (number, item)
        else:
            count += 1
    if errors:
        raise LoadError(errors, 0, f"{len(errors)} invalid line(s); nothing was written")
    return Checked(count, model)


def stream(lines: Iterable[str | bytes]) -> Iterator[tuple[int, Any]]:
    """The records of a file that :func:`check` accepted, parsed as they are read.
    A line that fails now means the file changed since: the load stops there."""
    errors: list[LineError] = []
    for item in _parse(lines, errors):
        if errors:
            break
        yield item
    if errors:
        raise LoadError(errors, 0, f"{errors[0]}: the input changed while it was loaded")


def _parse(lines: Iterable[str | bytes], errors: list[LineError]) -> Iterator[tuple[int, Any]]:
    """The valid lines as (line number, record); the invalid ones go to ``errors``
    (at most :data:`MAX_REPORTED_ERRORS`, then it stops)."""
    declared: EmbeddingModelLine | None = None
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.append(LineError(number, None, f"not valid UTF-8 (byte {exc.start + 1})"))
                if len(errors) >= MAX_REPORTED_ERRORS:
                    return
                continue
        text = raw.strip()
        if not text:
            continue
        try:
            # Most lines are valid records: one parse (pydantic's) settles them.
            # Anything else takes the checks below, which name what is wrong; they
            # parse again (a valid record's JSON is valid for json.loads too).
            record = _ADAPTER.validate_json(text)
        except ValidationError:
            pass
        else:
            problem = _embedding_problem(getattr(record, "embedding", None), declared)
            if problem is not None:
                errors.append(LineError(number, "embedding", problem))
                if len(errors) >= MAX_REPORTED_ERRORS:
                    return
            else:
                yield number, record
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            errors.append(
                LineError(number, None, f"not valid JSON ({exc.msg} at column {exc.colno})")
            )
            data = None
        except RecursionError:
            # json.loads recurses once per level of nesting: a line of a few
            # thousand brackets would otherwise escape as a stack trace, with no
            # line number (no record nests deeper than a vector's one list).
            errors.append(LineError(number, None, "not valid JSON (nested too deeply)"))
            data = None
        if data is not None and not isinstance(data, dict):
            errors.append(LineError(number, None, "a record must be a JSON object"))
        elif isinstance(data, dict) and data.get("kind") == EMBEDDING_MODEL:
            try:
                line = _DIRECTIVE.validate_json(text)
            except ValidationError as exc:
                for err in exc.errors(include_url=False):
                    field = ".".join(str(part) for part in err["loc"]) or None
                    errors.append(LineError(number, field, _message(err["msg"])))
            else:
                if declared is not None:
                    errors.append(LineError(number, "kind", "the embedding model is named twice"))
                else:
                    declared = line
                    yield number, line
        elif isinstance(data, dict):
            try:
                # JSON-mode validation: timestamps must be strings, not numbers.
                record = _ADAPTER.validate_json(text)
            except ValidationError as exc:
                for err in exc.errors(include_url=False):
                    loc = tuple(err["loc"])
                    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
                        errors.append(LineError(number, "kind", _kind_message(data)))
                    else:
                        # the discriminator's tag is the first element of loc
                        errors.append(LineError(number, _loc(loc), _message(err["msg"])))
            else:
                problem = _embedding_problem(getattr(record, "embedding", None), declared)
                if problem is not None:
                    errors.append(LineError(number, "embedding", problem))
                else:
                    yield number, record
        if len(errors) >= MAX_REPORTED_ERRORS:
            return


def _embedding_problem(
    vector: list[float] | None, declared: EmbeddingModelLine | None
) -> str | None:
    if vector is None:
        return None
    if declared is None:
        return (
            "a supplied vector needs an 'embedding_model' line earlier in the file "
            "naming the model and dimensions it was made with"
        )
    if len(vector) != declared.dimensions:
        return (
            f"{len(vector)} numbers; the file's embedding model "
            f"'{declared.model}' makes {declared.dimensions}"
        )
    if not all(map(math.isfinite, vector)) or not any(vector):
        return "the vector must hold finite numbers, not all zero"
    return None


def _kind_message(data: dict[str, Any]) -> str:
    from gateway.services.records import RECORD_KINDS

    kind = data.get("kind")
    known = ", ".join(RECORD_KINDS)
    if kind is None:
        return f"missing; one of: {known}"
    return f"unknown kind {kind!r}; one of: {known}"


async def check_embedding_model(service: WriteService, line: int, item: EmbeddingModelLine) -> None:
    """Refuse a file whose supplied vectors are not of the gateway's and store's model."""
    problem = await service.supplied_model_problem(item.model, item.dimensions)
    if problem is not None:
        error = LineError(line, "model", problem, "EMBEDDING_MODEL_MISMATCH")
        raise LoadError([error], 0, f"{error}; nothing was written")


async def load(
    service: WriteService,
    records: Iterable[tuple[int, Any]],
    *,
    batch_size: int,
    actor: Actor | None = None,
    progress: Callable[[int], None] | None = None,
    set_based: bool = True,
    embed_ahead: bool = True,
    index_after: bool = False,
    deferral: Deferral | None = None,
) -> LoadReport:
    """Apply parsed records in batches of ``batch_size``; ``progress`` gets record counts.
    A list's ``embedding_model`` line is checked first; a stream's must have been
    checked by the caller (:func:`check`, then :func:`check_embedding_model`).
    ``set_based=False`` keeps every record on the record-at-a-time path (a test
    compares the two). Once a batch has created evidence, the next batches'
    evidence texts are embedded while their writes run (``embed_ahead``): the
    model then works while the database does. A re-run creates nothing, so it
    embeds nothing. A batch without evidence (one of :data:`SPACE_BATCH_SIZE`
    space records, say) leaves that choice as the batch before it made it.
    ``index_after`` keeps the vectors of the spaces it writes
    (empty ones only) in detached tables; the caller then builds their indexes
    (:func:`gateway.services.vector_indexes.build_pending`, for the spaces in
    ``report.deferred``). The load holds those spaces against other builds while
    it runs; a caller that builds at the end passes its own ``deferral`` (the
    spaces stay held until it releases them)."""
    if index_after and deferral is None:
        async with Deferral(service.db) as own:
            try:
                return await load(
                    service,
                    records,
                    batch_size=batch_size,
                    actor=actor,
                    progress=progress,
                    set_based=set_based,
                    embed_ahead=embed_ahead,
                    deferral=own,
                )
            except LoadError as exc:
                exc.deferred = list(own.spaces)
                raise
    actor = actor or Actor.operator()
    report = LoadReport()
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if isinstance(records, list):
        for line, item in records:
            if isinstance(item, EmbeddingModelLine):
                await check_embedding_model(service, line, item)
    ahead = False
    chunks = batches(records, batch_size)
    following = next(chunks, None)
    while following is not None:
        chunk = following
        try:
            result = await service.apply(
                [r for _, r in chunk],
                actor,
                set_based=set_based,
                embed_ahead=ahead,
                deferral=deferral,
            )
        except RecordError as exc:
            if exc.index >= 0:
                line = chunk[exc.index][0]
                error = LineError(line, exc.field, exc.cause.message, exc.code)
            else:
                line = chunk[0][0]
                error = LineError(
                    line,
                    None,
                    f"batch of lines {chunk[0][0]}-{chunk[-1][0]}: {exc.message}",
                    exc.code,
                )
            raise LoadError(
                [error],
                report.records,
                f"{error}; lines {chunk[0][0]}-{chunk[-1][0]} were not written "
                f"({report.records} earlier record(s) are committed; loading again skips them)",
            ) from exc
        report.batches += 1
        report.records += len(chunk)
        report.created.update(result.created)
        report.unchanged.update(result.unchanged)
        if result.created["evidence"] or result.unchanged["evidence"]:
            # Only a batch that held evidence tells whether the load is creating
            # it: a batch of team and principal records (or of sources alone)
            # keeps the overlap as it was, rather than turning it off for the
            # batch after it.
            ahead = embed_ahead and result.created["evidence"] > 0
        if progress is not None:
            progress(len(chunk))
        # After the count: the batch is committed whatever happens here. The
        # last batch's refresh is the load's own, at autovacuum's thresholds
        # (counting the last batches, which the doubling rule may not): one
        # refresh, not a batch's and then the load's.
        following = next(chunks, None)
        if following is None and report.created:
            await service.analyze_unplanned_tables(load_end=True)
        elif following is not None and result.created:
            await service.analyze_unplanned_tables()
    if deferral is not None:
        report.deferred = list(deferral.spaces)
    return report


def _message(msg: str) -> str:
    return msg.removeprefix("Value error, ")
