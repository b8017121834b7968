"""The loader embeds a batch's evidence while the batch's writes run, once a load
is creating evidence: the same vectors, no text embedded twice, and a re-run
embeds nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.embeddings import EmbeddingProvider, Vectors
from gateway.services import loader
from gateway.services.writes import Actor, WriteService
from gateway.store.database import Database

from .conftest import unique
from .factories import jsonl


class Counting:
    """The real provider, counting the texts it is asked to embed."""

    def __init__(self, inner: EmbeddingProvider) -> None:
        self.inner = inner
        self.model = inner.model
        self.dimensions = inner.dimensions
        self.calls: list[list[str]] = []

    @property
    def texts(self) -> list[str]:
        return [t for call in self.calls for t in call]

    def mixed_calls(self) -> int:
        """Calls holding evidence and relationship texts together (made at commit)."""
        return sum(
            1
            for call in self.calls
            if any(t.startswith("Document ") for t in call)
            and not all(t.startswith("Document ") for t in call)
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(list(texts))
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        """The shared provider is closed by its fixture."""


def _records(team: str, docs: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"kind": "team", "id": team, "name": "Ahead"},
        {"kind": "principal", "team": team, "id": "ann", "display_name": "Ann"},
    ]
    for i in range(docs):
        out += [
            {"kind": "source", "team": team, "id": f"s{i}", "type": "document", "title": f"D{i}"},
            {"kind": "entity", "team": team, "id": f"e{i}", "name": f"Service {i}"},
            {
                "kind": "evidence",
                "team": team,
                "id": f"ev{i}",
                "source": f"s{i}",
                "content": f"Document {i}: the service number {i} reports to the hub "
                + "every few minutes " * (i % 7),
            },
            {
                "kind": "relationship",
                "team": team,
                "id": f"r{i}",
                "subject": f"e{i}",
                "predicate": "reports_to",
                "object_value": f"hub {i}",
                "owner": "ann",
                "supports": [{"id": f"sup{i}", "evidence": f"ev{i}"}],
            },
        ]
    return out


async def _load(service: WriteService, text: str, embed_ahead: bool) -> loader.LoadReport:
    return await loader.load(
        service,
        loader.parse(loader.split_lines(text)),
        batch_size=20,
        actor=Actor.operator(),
        embed_ahead=embed_ahead,
    )


async def _vectors(db: Database, team: str) -> dict[str, np.ndarray]:
    async with db.admin(readonly=True) as conn:
        rows = await conn.fetch(
            "SELECT evidence_id, embedding FROM evidence_embeddings WHERE team_id = $1", team
        )
    return {r["evidence_id"]: r["embedding"].to_numpy() for r in rows}


async def test_embedding_ahead_stores_the_same_vectors_and_embeds_each_text_once(
    db: Database, embedder: EmbeddingProvider
) -> None:
    ahead_team, plain_team = unique("ahead"), unique("plain")
    ahead, plain = Counting(embedder), Counting(embedder)
    await _load(WriteService(db, ahead), jsonl(_records(ahead_team, 25)), embed_ahead=True)
    await _load(WriteService(db, plain), jsonl(_records(plain_team, 25)), embed_ahead=False)

    ahead_vectors, plain_vectors = await _vectors(db, ahead_team), await _vectors(db, plain_team)
    assert len(ahead_vectors) == 25 and ahead_vectors.keys() == plain_vectors.keys()
    for key, vector in ahead_vectors.items():
        assert float(vector @ plain_vectors[key]) >= 0.9999, key
    # the same texts, each once: embedded ahead means not embedded again at commit
    assert sorted(ahead.texts) == sorted(plain.texts)
    evidence = [t for t in ahead.texts if t.startswith("Document ")]
    assert len(evidence) == len(set(evidence)) == 25
    # without: every batch embeds its evidence with its relationships at commit;
    # with: only the first batch does, the later ones' evidence went ahead alone
    assert plain.mixed_calls() >= 5
    assert ahead.mixed_calls() == 1


async def test_a_rerun_embeds_nothing(db: Database, embedder: EmbeddingProvider) -> None:
    team = unique("again")
    text = jsonl(_records(team, 25))
    await _load(WriteService(db, embedder), text, embed_ahead=True)
    counting = Counting(embedder)
    report = await _load(WriteService(db, counting), text, embed_ahead=True)
    assert report.created.total() == 0 and report.unchanged["evidence"] == 25
    assert counting.texts == []


def _shape(call: list[str]) -> str:
    """What one embedding call held: evidence texts, relationship texts, or both."""
    evidence = [t.startswith("Document ") for t in call]
    return "both" if any(evidence) and not all(evidence) else "evidence" if all(evidence) else "rel"


async def test_a_batch_of_principals_between_two_batches_keeps_the_overlap(
    db: Database, embedder: EmbeddingProvider
) -> None:
    """A principal in the middle of a file is written in a batch of its own (it
    creates a space), which creates no evidence. The batch after it must still
    embed its evidence ahead, in a call of its own as its transaction starts,
    and its relationships at commit; not everything together at commit, as a
    load does before it has created any evidence. (A review found the overlap
    turned off for the batch after every principal.)"""
    team = unique("keep")
    records = _records(team, 10)
    bob = {"kind": "principal", "team": team, "id": "bob", "display_name": "Bob"}
    records = [*records[:18], bob, *records[18:]]  # after the 4th document
    counting = Counting(embedder)
    report = await _load(WriteService(db, counting), jsonl(records), embed_ahead=True)
    # team and ann; documents 0-3; bob; documents 4-8; document 9
    assert report.batches == 5 and report.created["evidence"] == 10
    # the first batch of documents embeds at commit (nothing created yet); each
    # later one ahead, the one after bob's batch too
    assert [_shape(call) for call in counting.calls] == [
        "both",
        "evidence",
        "rel",
        "evidence",
        "rel",
    ]
