"""What a ``remember`` sends, and when its texts are embedded.

A ``remember`` costs about the longer of its statements and its embeddings
(docs/writes.md): the evidence texts start embedding before the transaction;
a relationship's text, known only once its entities are read, starts as soon
as it is rendered, while the rest of the transaction goes on (before, it
waited for the last insert). The statements leave out what the call itself
already knows: a space looked up once per call, the caller's own principal
(its token was just looked up with it), and the evidence and occurrences of
the same call that a support names. Rows are those the earlier path wrote:
the vectors stored are the provider's for each text alone, bit for bit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from gateway.embeddings import EmbeddingProvider, Vectors
from gateway.services import loader
from gateway.services import writes as writes_service
from gateway.services.auth import authenticate
from gateway.services.mutations import MutationError, MutationService, remember_items
from gateway.services.writes import Actor, RecordError, WriteService
from gateway.store import database
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token


class _Recording(database.StatementCounter):
    """The pool's statement counter, also keeping each statement's text."""

    def __init__(self) -> None:
        super().__init__()
        self.statements: list[str] = []

    def __call__(self, record: object) -> None:
        before = self.count
        super().__call__(record)
        if self.count != before:
            self.statements.append(str(getattr(record, "query", "")))


class _Watched:
    """The session's embedder, noting each call's texts and the statements that had
    been answered when it was made."""

    def __init__(self, inner: EmbeddingProvider, recorder: _Recording) -> None:
        self.inner = inner
        self.model = inner.model
        self.dimensions = inner.dimensions
        self.recorder = recorder
        self.calls: list[tuple[list[str], list[str]]] = []

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append((list(texts), list(self.recorder.statements)))
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        """The session's embedder outlives the test: nothing to close here."""


def _remember(suffix: str) -> dict[str, Any]:
    """Two new entities, an evidence with an occurrence, and a relationship between
    the entities supported by that occurrence: everything in the shared space."""
    content = f"The nightly export job {suffix} runs on the ingest cluster."
    start = content.index("ingest cluster")
    return {
        "space": "shared",
        "source_id": "src-handbook",
        "entities": [
            {"id": f"job-{suffix}", "name": f"Export job {suffix}", "type": "job"},
            {"id": f"ingest-{suffix}", "name": "Ingest cluster", "type": "system"},
        ],
        "evidence": [
            {
                "id": f"ev-{suffix}",
                "content": content,
                "occurrences": [
                    {"id": f"occ-{suffix}", "start": start, "end": start + len("ingest cluster")}
                ],
            }
        ],
        "relationships": [
            {
                "id": f"rel-{suffix}",
                "subject": f"job-{suffix}",
                "predicate": "runs_on",
                "object": f"ingest-{suffix}",
                "supports": [
                    {
                        "id": f"sup-{suffix}",
                        "evidence": f"ev-{suffix}",
                        "occurrence": f"occ-{suffix}",
                    }
                ],
            }
        ],
    }


async def test_remember_embeds_its_relationship_early_and_sends_no_needless_statement(
    dsn: str, writes: WriteService, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relationship's text goes to the provider before the support is inserted
    (it used to wait for every insert); no statement reads back the call's own
    evidence or occurrences, the caller's principal, or a space twice; and the
    stored vectors are the provider's for each text alone, bit for bit."""
    team = unique("rt")
    await load_jsonl(writes, jsonl(team_records(team)))
    raw = await token(writes, team, "alice")
    monkeypatch.setattr(database, "StatementCounter", _Recording)
    db = await Database.open(dsn, min_size=1, max_size=2)
    try:
        recorder = db.counter
        assert isinstance(recorder, _Recording)
        watched = _Watched(embedder, recorder)
        mutations = MutationService(WriteService(db, watched))
        principal = await authenticate(db, raw)
        recorder.statements.clear()
        data = _remember("a")
        receipts = await mutations.apply(principal, remember_items(principal, data))
        assert all(r.created for r in receipts), receipts
        sent = recorder.statements

        statement = "Export job a runs on Ingest cluster"
        calls = {tuple(texts): before for texts, before in watched.calls}
        assert (statement,) in calls, watched.calls
        assert not any("INSERT INTO supports" in s for s in calls[(statement,)]), (
            "the relationship's text was embedded only after its support was inserted"
        )
        assert not any("FROM evidence_occurrences" in s for s in sent), sent
        assert not any("FROM evidence o" in s for s in sent), sent
        assert not any("FROM principals" in s for s in sent), sent
        assert sum("FROM memory_spaces s\n" in s for s in sent) == 1, sent

        async with db.acquire() as conn:
            stored = {
                "evidence": await conn.fetchval(
                    "SELECT embedding FROM evidence_embeddings WHERE team_id = $1 "
                    "AND evidence_id = 'ev-a'",
                    team,
                ),
                "relationship": await conn.fetchval(
                    "SELECT embedding FROM relationship_embeddings WHERE team_id = $1 "
                    "AND relationship_id = 'rel-a'",
                    team,
                ),
            }
            kept = await conn.fetchval(
                "SELECT statement FROM relationships WHERE team_id = $1 AND id = 'rel-a'", team
            )
        assert kept == statement
        alone = {
            "evidence": (await embedder.embed([data["evidence"][0]["content"]]))[0],
            "relationship": (await embedder.embed([statement]))[0],
        }
        for kind, vector in stored.items():
            assert np.array_equal(vector.to_numpy(), alone[kind]), kind
    finally:
        await db.close()


async def _stored_vectors(db: Database, team: str, ev: str, rel: str) -> dict[str, Any]:
    async with db.acquire() as conn:
        return {
            "evidence": await conn.fetchval(
                "SELECT embedding FROM evidence_embeddings WHERE team_id = $1 AND evidence_id = $2",
                team,
                ev,
            ),
            "relationship": await conn.fetchval(
                "SELECT embedding FROM relationship_embeddings WHERE team_id = $1 "
                "AND relationship_id = $2",
                team,
                rel,
            ),
        }


@pytest.mark.parametrize("entities", ["existing", "in the call"])
async def test_the_relationships_text_is_embedded_before_the_evidence_is_written(
    dsn: str,
    writes: WriteService,
    embedder: EmbeddingProvider,
    monkeypatch: pytest.MonkeyPatch,
    entities: str,
) -> None:
    """The relationship's text is handed to the write's embedding lane before any
    record's insert, with the first claim's answer: when its entities exist the
    claim reads their names (the statement count is unchanged); when the call
    creates them, the names are the call's, and the claim coming back new says
    the call is not a re-run (a re-run sends nothing: the next test). The lane
    keeps one call in flight, so the provider gets the text when the evidence's
    call ends, which the inserts may precede (tests/test_write_lane.py tests
    that rule). The relationship's own checks run as before, and the stored
    vectors are the provider's for each text alone, bit for bit."""
    team = unique("rt-foresee")
    await load_jsonl(writes, jsonl(team_records(team)))
    raw = await token(writes, team, "alice")
    monkeypatch.setattr(database, "StatementCounter", _Recording)
    db = await Database.open(dsn, min_size=1, max_size=2)
    try:
        recorder = db.counter
        assert isinstance(recorder, _Recording)
        watched = _Watched(embedder, recorder)
        mutations = MutationService(WriteService(db, watched))
        principal = await authenticate(db, raw)
        handed: list[tuple[tuple[str, ...], list[str]]] = []
        add = writes_service._Lane.add

        def noted_add(lane: writes_service._Lane, *texts: str) -> None:
            # noted once the loop's pending callbacks ran: the statement answered
            # just before is recorded by one of them (asyncpg's query loggers)
            asyncio.get_running_loop().call_soon(
                lambda: handed.append((texts, list(recorder.statements)))
            )
            add(lane, *texts)

        monkeypatch.setattr(writes_service._Lane, "add", noted_add)
        recorder.statements.clear()
        if entities == "existing":
            data, statement = _bench_like("f"), "Billing service reviewed by Payments team"
            ev, rel = "ev-f", "rel-f"
        else:
            data, statement = _remember("g"), "Export job g runs on Ingest cluster"
            ev, rel = "ev-g", "rel-g"
        receipts = await mutations.apply(principal, remember_items(principal, data))
        assert all(r.created for r in receipts), receipts
        sent = list(recorder.statements)

        assert [statement] in [texts for texts, _ in watched.calls], watched.calls
        # the first hand-over (the record's own rendering hands it again, unsent)
        before = next(before for texts, before in handed if statement in texts)
        assert not [s for s in before if "INSERT INTO" in s and "write_log" not in s], before
        claims = [s for s in before if "INSERT INTO write_log" in s]
        assert len(claims) == 1, before
        if entities == "existing":
            assert len(sent) == 10, sent  # the names ride with the first claim
        stored = await _stored_vectors(db, team, ev, rel)
        alone = {
            "evidence": (await embedder.embed([data["evidence"][0]["content"]]))[0],
            "relationship": (await embedder.embed([statement]))[0],
        }
        for kind, vector in stored.items():
            assert np.array_equal(vector.to_numpy(), alone[kind]), kind
    finally:
        await db.close()


class _Held(_Watched):
    """The embedder of :class:`_Watched`, holding every call with ``text`` until
    released (a call nothing waits for then never ends before the request does)."""

    def __init__(self, inner: EmbeddingProvider, recorder: _Recording, text: str) -> None:
        super().__init__(inner, recorder)
        self.text = text
        self.release = asyncio.Event()

    async def embed(self, texts: Sequence[str]) -> Any:
        if self.text in texts:
            self.calls.append((list(texts), list(self.recorder.statements)))
            await self.release.wait()
            return await self.inner.embed(texts)
        return await super().embed(texts)


async def test_a_text_embedded_ahead_that_its_record_did_not_need_is_not_waited_for(
    dsn: str, writes: WriteService, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new evidence with a relationship written before (same content): the
    relationship's text is embedded ahead, but its record turns out to be a
    re-run; the call stores the evidence's vector and ends without waiting for
    that embedding. A whole re-run embeds no relationship text at all."""
    team = unique("rt-unneeded")
    await load_jsonl(writes, jsonl(team_records(team)))
    raw = await token(writes, team, "alice")
    monkeypatch.setattr(database, "StatementCounter", _Recording)
    db = await Database.open(dsn, min_size=1, max_size=2)
    statement = "Billing service reviewed by Payments team"
    recorder = db.counter
    assert isinstance(recorder, _Recording)
    held = _Held(embedder, recorder, statement)
    try:
        first = _bench_like("u")
        principal = await authenticate(db, raw)
        await MutationService(WriteService(db, embedder)).apply(
            principal, remember_items(principal, first)
        )
        mutations = MutationService(WriteService(db, held))
        second = _bench_like("v")
        second["relationships"] = first["relationships"]  # the same relationship again
        receipts = await asyncio.wait_for(
            mutations.apply(principal, remember_items(principal, second)), timeout=60
        )
        assert [(r.kind, r.id, r.created) for r in receipts] == [
            ("evidence", "ev-v", True),
            ("relationship", "rel-u", False),
        ]
        assert [texts for texts, _ in held.calls].count([statement]) == 1, held.calls
        stored = await _stored_vectors(db, team, "ev-v", "rel-u")
        alone = (await embedder.embed([second["evidence"][0]["content"]]))[0]
        assert np.array_equal(stored["evidence"].to_numpy(), alone)

        held.calls.clear()
        again = await mutations.apply(principal, remember_items(principal, second))
        assert not any(r.created for r in again)
        assert [statement] not in [texts for texts, _ in held.calls], held.calls
    finally:
        held.release.set()
        await db.close()


async def test_a_whole_rerun_naming_its_entities_in_the_call_embeds_no_relationship_text(
    dsn: str, writes: WriteService, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call whose relationship's entities are records of the call itself, sent
    again (an agent's retry with the same IDs): nothing is written, and its
    relationship's text is not sent to the provider again (a remote provider
    bills for it; the local model's lane would queue the next request behind it).
    Before, the text started embedding before any claim, as soon as the names
    were known from the call (review of 2026-12-05, M3)."""
    team = unique("rt-rerun")
    await load_jsonl(writes, jsonl(team_records(team)))
    raw = await token(writes, team, "alice")
    monkeypatch.setattr(database, "StatementCounter", _Recording)
    db = await Database.open(dsn, min_size=1, max_size=2)
    recorder = db.counter
    assert isinstance(recorder, _Recording)
    watched = _Watched(embedder, recorder)
    try:
        principal = await authenticate(db, raw)
        mutations = MutationService(WriteService(db, watched))
        data = _remember("g")
        evidence_text = data["evidence"][0]["content"]
        first = await mutations.apply(principal, remember_items(principal, data))
        assert first and all(r.created for r in first)
        relationship_texts = {t for texts, _ in watched.calls for t in texts} - {evidence_text}
        assert relationship_texts, watched.calls

        watched.calls.clear()
        again = await mutations.apply(principal, remember_items(principal, data))
        assert again and not any(r.created for r in again)
        await asyncio.sleep(0.2)  # a call started and not awaited would be noted by now
        sent = {t for texts, _ in watched.calls for t in texts}
        assert not sent & relationship_texts, watched.calls
    finally:
        await db.close()


async def test_a_reset_in_the_batch_forgets_what_the_batch_knew(writes: WriteService) -> None:
    """The operator's batch, record by record: evidence, then a reset of its space,
    then a relationship of the new generation supported by that evidence. The
    reset made the evidence invisible, so the support is refused as it always was,
    although the batch itself wrote the evidence a moment before."""
    team = unique("rt-reset")
    await load_jsonl(writes, jsonl(team_records(team)))
    lines: list[dict[str, Any]] = [
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-old",
            "source": "src-handbook",
            "content": "Billing retries nightly.",
        },
        {"kind": "space_reset", "team": team, "id": "reset-1", "space": "shared"},
        {"kind": "entity", "team": team, "id": "billing-2", "name": "Billing", "type": "system"},
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-new",
            "owner": "alice",
            "subject": "billing-2",
            "predicate": "retries",
            "object_value": "nightly",
            "supports": [{"id": "sup-old", "evidence": "ev-old"}],
        },
    ]
    records = [r for _, r in loader.parse(loader.split_lines(jsonl(lines)))]
    with pytest.raises(RecordError) as refused:
        await writes.apply(records, Actor.operator(), set_based=False)
    assert (refused.value.index, refused.value.field, refused.value.code) == (
        3,
        "supports[0].evidence",
        "NOT_FOUND",
    )


# --- round trips per call, rows, refusals (db/writes merged statements) -------------


def _bench_like(suffix: str, **change: Any) -> dict[str, Any]:
    """The call of benchmarks/remember_bench.py: an evidence of an existing source with
    one occurrence and one mention of an existing entity, and a relationship between
    two existing entities supported by that occurrence. ``change`` replaces fields of
    the evidence (``ev_*``), the relationship (``rel_*``), its support (``sup_*``) or
    the call."""
    content = f"Note {suffix}: the payments team reviewed the billing service today."
    start = content.index("payments team")
    evidence: dict[str, Any] = {
        "id": f"ev-{suffix}",
        "content": content,
        "occurrences": [{"id": f"occ-{suffix}", "start": start, "end": start + 13}],
        "mentions": [{"entity": "payments-team", "occurrence": f"occ-{suffix}"}],
    }
    support: dict[str, Any] = {
        "id": f"sup-{suffix}",
        "evidence": f"ev-{suffix}",
        "occurrence": f"occ-{suffix}",
    }
    relationship: dict[str, Any] = {
        "id": f"rel-{suffix}",
        "subject": "billing",
        "predicate": "reviewed_by",
        "object": "payments-team",
        "supports": [support],
    }
    data: dict[str, Any] = {"source_id": "src-handbook", "evidence": [evidence]}
    data["relationships"] = [relationship]
    for key, value in change.items():
        part, _, name = key.partition("_")
        target = {"ev": evidence, "rel": relationship, "sup": support}.get(part)
        if target is None:
            data[key] = value
        else:
            target[name] = value
    return data


async def _mutations(writes: WriteService, team: str, who: str = "alice") -> Any:
    raw = await token(writes, team, who)
    return MutationService(writes), await authenticate(writes.db, raw)


async def test_a_remember_sends_ten_statements_and_a_rerun_five(
    dsn: str, writes: WriteService, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark's call: BEGIN, the tenant settings, the evidence's claim with
    its source and mentioned entity (and the relationship's entities' names, the
    store's model and the team's projection), the evidence with its lifecycle
    event, its occurrence with its mention, the relationship's claim with its
    entities, the relationship with its status event, the support with its
    decision, both vectors, COMMIT: 10 statements (21 before; 11 when the model
    and projection were read in a statement of their own). The same call again
    writes nothing: BEGIN, settings, two claims, COMMIT (7 before, when a replay
    read the earlier claim in a statement of its own)."""
    team = unique("rt-count")
    await load_jsonl(writes, jsonl(team_records(team)))
    raw = await token(writes, team, "alice")
    monkeypatch.setattr(database, "StatementCounter", _Recording)
    db = await Database.open(dsn, min_size=1, max_size=2)
    try:
        recorder = db.counter
        assert isinstance(recorder, _Recording)
        mutations = MutationService(WriteService(db, embedder))
        principal = await authenticate(db, raw)
        sent: list[list[str]] = []
        for _ in range(2):
            recorder.statements.clear()
            receipts = await mutations.apply(principal, remember_items(principal, _bench_like("n")))
            sent.append(list(recorder.statements))
            assert [r.kind for r in receipts] == ["evidence", "relationship"]
        first, again = sent
        assert len(first) == 10, first
        assert len(again) == 5, again
        assert all(r.created is False for r in receipts)
        # nothing read in a statement of its own that the claims carry
        for table in ("sources", "entities", "memory_spaces", "write_log", "embedding_models"):
            alone = [s for s in first + again if s.lstrip().startswith("SELECT") and table in s]
            assert not alone, alone
    finally:
        await db.close()


def _base(team: str) -> list[dict[str, Any]]:
    """A team, its principals, a source and two entities, without the team's ID in
    any text (the rows of two teams are compared)."""
    return [
        {"kind": "team", "id": team, "name": "Rows"},
        {"kind": "principal", "team": team, "id": "alice", "display_name": "Alice"},
        {"kind": "principal", "team": team, "id": "bob", "display_name": "Bob"},
        {"kind": "source", "team": team, "id": "src-handbook", "type": "document", "title": "H"},
        {"kind": "entity", "team": team, "id": "billing", "name": "Billing service"},
        {"kind": "entity", "team": team, "id": "payments-team", "name": "Payments team"},
    ]


def _call() -> dict[str, Any]:
    """A remember of every shape the merged statements take: a new source, a new
    entity, an evidence with two occurrences and two mentions (one without an
    occurrence), a relationship to an entity with two supports (an occurrence, a
    span with its quote), one to a value with none."""
    content = "The payments team reviews the billing service and the ledger every week."
    a, b = content.index("payments team"), content.index("billing service")
    return {
        "source": {"id": "src-call", "type": "conversation", "title": "Call", "authority": "low"},
        "entities": [{"id": "ledger", "name": "Ledger", "type": "system", "aliases": ["gl"]}],
        "evidence": [
            {
                "id": "ev-call",
                "content": content,
                "occurrences": [
                    {"id": "occ-a", "start": a, "end": a + 13},
                    {"id": "occ-b", "start": b, "end": b + 15},
                ],
                "mentions": [
                    {"entity": "payments-team", "occurrence": "occ-a"},
                    {"entity": "ledger"},
                ],
            }
        ],
        "relationships": [
            {
                "id": "rel-call",
                "subject": "payments-team",
                "predicate": "reviews",
                "object": "billing",
                "supports": [
                    {"id": "sup-a", "evidence": "ev-call", "occurrence": "occ-a"},
                    {
                        "id": "sup-b",
                        "evidence": "ev-call",
                        "start": b,
                        "end": b + 15,
                        "quote": "billing service",
                    },
                ],
            },
            {
                "id": "rel-weekly",
                "subject": "ledger",
                "predicate": "reviewed_every",
                "object_value": "1",
                "object_unit": "week",
            },
        ],
    }


def _as_loader_lines(team: str, call: dict[str, Any]) -> list[dict[str, Any]]:
    """The same call as loader records (``owner``: the principal who remembers)."""
    lines: list[dict[str, Any]] = [{"kind": "source", "team": team, **call["source"]}]
    lines += [{"kind": "entity", "team": team, **e} for e in call["entities"]]
    lines += [
        {"kind": "evidence", "team": team, "source": call["source"]["id"], **e}
        for e in call["evidence"]
    ]
    lines += [
        {"kind": "relationship", "team": team, "owner": "alice", **r} for r in call["relationships"]
    ]
    return lines


async def test_remember_writes_the_rows_the_loaders_set_based_path_writes(
    writes: WriteService, admin_conn: Conn
) -> None:
    """Field by field, every table: a remember by alice against the same records
    loaded by the set-based path (gateway/services/bulk_writes.py, which shares no
    statement with the record-at-a-time path), apart from who recorded them."""
    from .test_load_paths import _TABLES, _rows

    loaded, remembered = unique("rows-l"), unique("rows-r")
    for team in (loaded, remembered):
        await load_jsonl(writes, jsonl(_base(team)))
    records = loader.parse(loader.split_lines(jsonl(_as_loader_lines(loaded, _call()))))
    await loader.load(writes, records, batch_size=50, actor=Actor.operator(), set_based=True)
    mutations, principal = await _mutations(writes, remembered)
    receipts = await mutations.apply(principal, remember_items(principal, _call()))
    assert [r.kind for r in receipts] == [
        "source",
        "entity",
        "evidence",
        "relationship",
        "relationship",
    ]
    assert all(r.created for r in receipts)

    by = await admin_conn.fetch(
        "SELECT DISTINCT recorded_by FROM write_log WHERE team_id = $1 AND recorded_at = $2",
        remembered,
        receipts[0].recorded_at,
    )
    assert [r["recorded_by"] for r in by] == ["principal:alice"]

    def who_aside(rows: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
        return {
            t: [
                {k: v for k, v in row.items() if k != "recorded_by"}
                for row in items
                if row.get("kind") != "token"  # alice's token, made for the call
            ]
            for t, items in rows.items()
        }

    want = who_aside(await _rows(admin_conn, loaded))
    got = who_aside(await _rows(admin_conn, remembered))
    for table in _TABLES:
        assert got[table] == want[table], table
    assert len(got["support_decisions"]) == 2 and len(got["evidence_entity_mentions"]) == 2
    assert len(got["relationship_embeddings"]) == 2
    # every row of the call carries the call's transaction time, its events too
    for table in (
        "evidence",
        "evidence_lifecycle_events",
        "evidence_occurrences",
        "evidence_entity_mentions",
        "relationships",
        "relationship_status_events",
        "supports",
        "support_decisions",
        "evidence_embeddings",
        "relationship_embeddings",
    ):
        times = await admin_conn.fetch(
            f"SELECT DISTINCT recorded_at FROM {table} WHERE team_id = $1 AND recorded_at >= $2",
            remembered,
            receipts[0].recorded_at,
        )
        assert [t["recorded_at"] for t in times] == [receipts[0].recorded_at], table


@pytest.mark.parametrize(
    ("change", "code", "field"),
    [
        ({"source_id": "src-none"}, "NOT_FOUND", "sourceId"),
        ({"source_id": "src-theirs"}, "NOT_FOUND", "sourceId"),
        ({"ev_mentions": [{"entity": "nobody"}]}, "NOT_FOUND", "evidence[0].mentions[0].entity"),
        ({"ev_mentions": [{"entity": "theirs"}]}, "NOT_FOUND", "evidence[0].mentions[0].entity"),
        ({"rel_subject": "nobody"}, "NOT_FOUND", "relationships[0].subject"),
        ({"rel_object": "theirs"}, "NOT_FOUND", "relationships[0].object"),
        ({"rel_object": "bobs-own"}, "NOT_FOUND", "relationships[0].object"),
        ({"sup_evidence": "ev-theirs"}, "NOT_FOUND", "relationships[0].supports[0].evidence"),
        ({"sup_occurrence": "occ-none"}, "NOT_FOUND", "relationships[0].supports[0].occurrence"),
        ({"ev_id": "ev-taken"}, "IDEMPOTENCY_CONFLICT", "evidence[0].id"),
        (
            {
                "ev_occurrences": [{"id": "occ-owner", "start": 0, "end": 4}],
                "ev_mentions": [],
                "sup_occurrence": None,
            },
            "BAD_USER_INPUT",
            "evidence[0]",
        ),
    ],
)
async def test_refusals_keep_their_codes_and_write_nothing(
    writes: WriteService, admin_conn: Conn, change: dict[str, Any], code: str, field: str
) -> None:
    """Bad references, including IDs of another team and of bob's private space
    (which look missing), a taken ID, a taken occurrence ID: the code and field of
    before, and not a row written; the same call without the fault then goes in."""
    from .test_load_paths import _rows

    team, other = unique("rt-bad"), unique("rt-other")
    await load_jsonl(writes, jsonl(team_records(team)))
    await load_jsonl(writes, jsonl(team_records(other)))
    await load_jsonl(
        writes,
        jsonl(
            [
                {
                    "kind": "source",
                    "team": other,
                    "id": "src-theirs",
                    "type": "document",
                    "title": "Theirs",
                },
                {"kind": "entity", "team": other, "id": "theirs", "name": "Theirs"},
                {
                    "kind": "evidence",
                    "team": other,
                    "id": "ev-theirs",
                    "source": "src-theirs",
                    "content": "Their text.",
                },
                {
                    "kind": "entity",
                    "team": team,
                    "id": "bobs-own",
                    "name": "Bob's",
                    "space": "private:bob",
                },
                {
                    "kind": "evidence",
                    "team": team,
                    "id": "ev-taken",
                    "source": "src-handbook",
                    "content": "Taken before.",
                },
            ]
        ),
    )
    mutations, principal = await _mutations(writes, team)
    before = await _rows(admin_conn, team)
    with pytest.raises(MutationError) as refused:
        await mutations.apply(principal, remember_items(principal, _bench_like("x", **change)))
    assert (refused.value.code, refused.value.field) == (code, field), refused.value.message
    assert await _rows(admin_conn, team) == before
    receipts = await mutations.apply(principal, remember_items(principal, _bench_like("x")))
    assert all(r.created for r in receipts)


async def test_a_claim_that_waited_for_the_same_id_reads_the_earlier_write(
    dsn: str, writes: WriteService
) -> None:
    """Two transactions claim one ID: the second waits for the first's row and,
    once it commits, finds it although its statement's snapshot began before
    (the one case where the earlier write is read in a statement of its own)."""
    import asyncio

    import asyncpg

    from gateway.store import writes as store

    team = unique("rt-wait")
    await load_jsonl(writes, jsonl(team_records(team)))
    first, second = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        one, two = first.transaction(), second.transaction()
        await one.start()
        await two.start()
        claimed = await store.claim_write(first, team, "entity", "e-race", bytes(32), "principal:a")
        assert claimed[0] == "new"
        waiting = asyncio.create_task(
            store.claim_write(
                second,
                team,
                "entity",
                "e-race",
                bytes(32),
                "principal:a",
                reads=[store.ReadVisible("entity", ("billing",))],
            )
        )
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await one.commit()
        claim, recorded_at, answers = await asyncio.wait_for(waiting, 10)
        assert (claim, recorded_at) == ("same", claimed[1])
        assert list(answers[0]) == ["billing"]
        other = await store.claim_write(
            second, team, "entity", "e-race", bytes([1] * 32), "principal:a"
        )
        assert other[0] == "different"
        await two.rollback()
    finally:
        await first.close()
        await second.close()
