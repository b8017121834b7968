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

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.services import loader
from gateway.services.auth import authenticate
from gateway.services.mutations import MutationService, remember_items
from gateway.services.writes import Actor, RecordError, WriteService
from gateway.store import database
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
        self.recorder = recorder
        self.calls: list[tuple[list[str], list[str]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def embed(self, texts: Sequence[str]) -> Any:
        self.calls.append((list(texts), list(self.recorder.statements)))
        return await self.inner.embed(texts)


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
                    {"id": f"sup-{suffix}", "evidence": f"ev-{suffix}", "occurrence": f"occ-{suffix}"}
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
        mutations = MutationService(WriteService(db, watched))  # type: ignore[arg-type]
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


async def test_a_reset_in_the_batch_forgets_what_the_batch_knew(writes: WriteService) -> None:
    """The operator's batch, record by record: evidence, then a reset of its space,
    then a relationship of the new generation supported by that evidence. The
    reset made the evidence invisible, so the support is refused as it always was,
    although the batch itself wrote the evidence a moment before."""
    team = unique("rt-reset")
    await load_jsonl(writes, jsonl(team_records(team)))
    lines = [
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
