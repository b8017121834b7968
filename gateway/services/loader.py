"""The JSON Lines loader: every line one record (see ``docs/loading.md``).

The whole input is parsed and validated before anything is written, so a typo
on the last line writes nothing. Then records are applied in batches, one
transaction each; a batch that the database refuses (an unknown reference, an
ID reused with other content) is rolled back whole, and the error names its
line and field. Earlier batches stay committed, and loading the same file again
is safe: records already applied are skipped by their IDs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections import Counter, deque
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
from gateway.services import bulk_writes
from gateway.services.records import SPACE_KINDS, Record
from gateway.services.vector_indexes import Deferral
from gateway.services.writes import (
    Actor,
    BatchResult,
    RecordError,
    Turn,
    TurnYielded,
    WriteService,
)

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
    overlapped: int = 0
    """Batches started while the batch before them was still in flight."""
    lanes: int = 0
    """Connections the load's batches ran on side by side (0: one at a time)."""


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
    concurrency: int = 1,
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
    spaces stay held until it releases them).

    ``concurrency`` above 1 lets up to that many batches be in flight at once,
    each in its own transaction on a connection of its own, so that the
    database works on one batch while the next is sent (and on two cores, on
    both): see :class:`_Loading` for which batches may overlap and how each
    keeps its own all-or-nothing, its place in the file's order and its system
    time."""
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
                    concurrency=concurrency,
                )
            except LoadError as exc:
                exc.deferred = list(own.spaces)
                raise
    actor = actor or Actor.operator()
    report = LoadReport()
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if isinstance(records, list):
        for line, item in records:
            if isinstance(item, EmbeddingModelLine):
                await check_embedding_model(service, line, item)
    chunks = batches(records, batch_size)
    if concurrency > 1 and set_based and actor.is_operator:
        async with service.writer_lanes(concurrency) as lanes:
            report.lanes = len(lanes)
            await _Loading(service, actor, report, progress, embed_ahead, deferral, lanes).run(
                chunks
            )
    else:
        await _Loading(service, actor, report, progress, embed_ahead, deferral, []).run(
            chunks, set_based=set_based
        )
    if deferral is not None:
        report.deferred = list(deferral.spaces)
    return report


Chunk = list[tuple[int, Any]]
Key = tuple[str, str, str]


def _keys(chunk: Chunk) -> tuple[set[Key], set[Key]]:
    """What a batch of set-based records creates, and what it refers to, by
    (team, kind, id)."""
    made: set[Key] = set()
    named: set[Key] = set()
    for _, r in chunk:
        made.add((r.team, r.kind, r.id))
        if r.kind == "evidence":
            named.add((r.team, "source", r.source))
            named.update((r.team, "entity", m.entity) for m in r.mentions)
        elif r.kind == "relationship":
            named.add((r.team, "entity", r.subject))
            if r.object is not None:
                named.add((r.team, "entity", r.object))
            named.update((r.team, "evidence", sup.evidence) for sup in r.supports)
    return made, named


@dataclass
class _Flight:
    """A batch in flight: its task, and whether it has committed (see Turn)."""

    chunk: Chunk
    lane: Any
    task: asyncio.Task[BatchResult]
    committed: asyncio.Future[bool]
    made: set[Key]
    turn: Turn


class _Loading:
    """The batches of one load, applied in file order.

    With lanes (``concurrency`` above 1), a batch may start while the batch
    before it is still in flight, when each of these holds:

    - every record of it goes through the set-based path (sources, entities,
      evidence, relationships; no record that changes, or creates a space, or
      that this path leaves to the record-at-a-time one);
    - it creates no ID, and refers to no source, entity or evidence, that a
      batch in flight creates: what it checks against is committed, so every
      check sees what it would see one batch at a time;
    - a batch of such records has already been written, alone (so the tables
      it filled have planner statistics, and what a first write makes once,
      the team's relationship projection, is made).

    Any other batch waits until the batches in flight have committed. A batch
    in flight starts its transaction after the one before it has started its
    own (system times follow the file), and commits only after that one has
    committed: so batches commit in file order, a refusal stops the load with
    every earlier batch committed and nothing of the refused one or any later
    one written, and the error names its line as before. A batch whose
    predecessor waits for one of its locks gives way (rolled back, then
    applied again after that batch), and so does one whose predecessor
    committed a transaction that began after its own (a fallback to the
    record-at-a-time path, a retry): system times follow the file in every
    path (see Turn)."""

    def __init__(
        self,
        service: WriteService,
        actor: Actor,
        report: LoadReport,
        progress: Callable[[int], None] | None,
        embed_ahead: bool,
        deferral: Deferral | None,
        lanes: list[Any],
    ) -> None:
        self.service = service
        self.actor = actor
        self.report = report
        self.progress = progress
        self.embed_ahead = embed_ahead
        self.deferral = deferral
        self.lanes = lanes
        self.flying: deque[_Flight] = deque()
        self.ahead = False
        self.planned = False

    async def run(self, chunks: Iterator[Chunk], *, set_based: bool = True) -> None:
        try:
            chunk = await self._next(chunks)
            while chunk is not None:
                if self._may_overlap(chunk):
                    while len(self.flying) >= len(self.lanes) or any(
                        _gave_way(f) for f in self.flying
                    ):
                        # A batch that gave way is applied again before any later
                        # batch begins; one already in flight behind it gives way
                        # in turn (Turn.started): system times stay in file order.
                        await self._land(last=False)
                    await self._launch(chunk)
                    chunk = await self._next(chunks)
                    continue
                while self.flying:
                    await self._land(last=False)
                result = await self._apply(chunk, set_based=set_based)
                following = await self._next(chunks)
                await self._account(chunk, result, last=following is None)
                chunk = following
            while self.flying:
                await self._land(last=len(self.flying) == 1)
        except BaseException as exc:
            await self._abandon(stop=not isinstance(exc, LoadError))
            raise

    async def _next(self, chunks: Iterator[Chunk]) -> Chunk | None:
        """The next batch of the stream. A file that changed since it was checked
        stops the load there, after the batches in flight have committed (one
        batch at a time, they had committed before the next was read)."""
        try:
            return next(chunks, None)
        except LoadError:
            while self.flying:
                await self._land(last=False)
            raise

    async def _abandon(self, *, stop: bool) -> None:
        """The load ends early. After a refusal the batches still in flight roll
        back at their turn to commit (the one before them did not); after anything
        else (an interruption, a lost server) they are stopped."""
        for flight in self.flying:
            _settle_as(flight.committed, False)
            if stop:
                flight.task.cancel()
        for flight in self.flying:
            with contextlib.suppress(BaseException):
                await flight.task
        self.flying.clear()

    def _may_overlap(self, chunk: Chunk) -> bool:
        if len(self.lanes) < 2 or not self.planned:
            return False
        if not all(bulk_writes.eligible(r) for _, r in chunk):
            return False
        made, named = _keys(chunk)
        return not any((made | named) & flight.made for flight in self.flying)

    async def _launch(self, chunk: Chunk) -> None:
        busy = {id(f.lane) for f in self.flying}
        lane = next(c for c in self.lanes if id(c) not in busy)
        before = self.flying[-1] if self.flying else None
        turn = Turn(
            lane,
            before.committed if before is not None else None,
            before.lane.get_server_pid() if before is not None else None,
            before.turn if before is not None else None,
        )
        committed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        flight = _Flight(
            chunk,
            lane,
            asyncio.create_task(
                self.service.apply(
                    [r for _, r in chunk],
                    self.actor,
                    set_based=True,
                    embed_ahead=self.ahead,
                    deferral=self.deferral,
                    turn=turn,
                )
            ),
            committed,
            _keys(chunk)[0],
            turn,
        )
        flight.task.add_done_callback(lambda t: _settle(committed, t))
        self.flying.append(flight)
        task = flight.task
        if len(self.flying) > 1:
            self.report.overlapped += 1
        # The next batch starts its transaction after this one has (or has ended).
        began = asyncio.create_task(turn.began.wait())
        try:
            await asyncio.wait({task, began}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            began.cancel()

    async def _land(self, *, last: bool) -> None:
        """Wait for the oldest batch in flight to commit, and count it."""
        flight = self.flying[0]
        try:
            try:
                result = await flight.task
            except TurnYielded:
                # Every batch before it has committed: apply it again, on its own lane.
                again = Turn(flight.lane, None, None)
                result = await self.service.apply(
                    [r for _, r in flight.chunk],
                    self.actor,
                    set_based=True,
                    embed_ahead=self.ahead,
                    deferral=self.deferral,
                    turn=again,
                )
                # The batch behind it (in flight, begun earlier) compares with this.
                flight.turn.started = again.started
        except RecordError as exc:
            _settle_as(flight.committed, False)
            raise self._refusal(flight.chunk, exc) from exc
        except BaseException:
            _settle_as(flight.committed, False)
            raise
        _settle_as(flight.committed, True)
        self.flying.popleft()
        await self._account(flight.chunk, result, last=last)

    async def _apply(self, chunk: Chunk, *, set_based: bool) -> BatchResult:
        try:
            return await self.service.apply(
                [r for _, r in chunk],
                self.actor,
                set_based=set_based,
                embed_ahead=self.ahead,
                deferral=self.deferral,
            )
        except RecordError as exc:
            raise self._refusal(chunk, exc) from exc

    def _refusal(self, chunk: Chunk, exc: RecordError) -> LoadError:
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
        committed = self.report.records
        return LoadError(
            [error],
            committed,
            f"{error}; lines {chunk[0][0]}-{chunk[-1][0]} were not written "
            f"({committed} earlier record(s) are committed; loading again skips them)",
        )

    async def _account(self, chunk: Chunk, result: BatchResult, *, last: bool) -> None:
        report = self.report
        report.batches += 1
        report.records += len(chunk)
        report.created.update(result.created)
        report.unchanged.update(result.unchanged)
        if result.created["evidence"] or result.unchanged["evidence"]:
            # Only a batch that held evidence tells whether the load is creating
            # it: a batch of team and principal records (or of sources alone)
            # keeps the overlap as it was, rather than turning it off for the
            # batch after it.
            self.ahead = self.embed_ahead and result.created["evidence"] > 0
        if self.progress is not None:
            self.progress(len(chunk))
        # After the count: the batch is committed whatever happens here. The
        # last batch's refresh is the load's own, at autovacuum's thresholds
        # (counting the last batches, which the doubling rule may not): one
        # refresh, not a batch's and then the load's.
        if last and report.created:
            await self.service.analyze_unplanned_tables(load_end=True)
        elif not last and result.created:
            await self.service.analyze_unplanned_tables()
        # The first batch of sources, entities, evidence or relationships runs
        # alone: the tables it wrote then have planner statistics (refreshed just
        # above), and what a first write makes once (the team's relationship
        # projection, the store's model) is made, before batches overlap.
        self.planned = self.planned or any(
            result.created[k] or result.unchanged[k] for k in bulk_writes.BULK_KINDS
        )


def _settle(committed: asyncio.Future[bool], task: asyncio.Task[BatchResult]) -> None:
    """A batch's task has ended: it committed, or was refused; one that gave way
    (TurnYielded) is settled when the loader has applied it again."""
    if task.cancelled():
        _settle_as(committed, False)
    elif task.exception() is None:
        _settle_as(committed, True)
    elif not isinstance(task.exception(), TurnYielded):
        _settle_as(committed, False)


def _gave_way(flight: _Flight) -> bool:
    task = flight.task
    return task.done() and not task.cancelled() and isinstance(task.exception(), TurnYielded)


def _settle_as(committed: asyncio.Future[bool], value: bool) -> None:
    if not committed.done():
        committed.set_result(value)


def _message(msg: str) -> str:
    return msg.removeprefix("Value error, ")
