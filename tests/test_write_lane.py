"""The write service's one embedding lane (gateway/services/writes.py, ``_Lane``).

A batch's texts go to the provider ahead of their vectors' insert through one
lane: the evidence texts as the batch starts (a principal's always, the
loader's with ``embed_ahead``), a principal's relationship texts once known.
What these tests hold it to, against the real PostgreSQL and the real model
(wrapped to watch and hold its calls): each text goes to the provider once per
batch, a call holding none of the texts the batch needs is not awaited, a
refused batch leaves no call running, one call is in flight at a time, and the
stored vectors are the provider's for each text alone, bit for bit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.embeddings.base import Vectors
from gateway.services.auth import authenticate
from gateway.services.mutations import MutationError, MutationService, remember_items
from gateway.services.writes import WriteService
from gateway.store import writes as store
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token

STATEMENT = "Billing service reviewed by Payments team"
"""The text the store renders for ``billing reviewed_by payments-team``."""


class _Watched:
    """The real provider; each call's texts noted, the calls in flight counted, and
    every call holding one of ``hold`` kept waiting until ``release`` is set."""

    def __init__(self, inner: EmbeddingProvider, hold: Sequence[str] = ()) -> None:
        self.inner = inner
        self.model = inner.model
        self.dimensions = inner.dimensions
        self.hold = set(hold)
        self.release = asyncio.Event()
        self.calls: list[list[str]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.stopped = 0

    @property
    def texts(self) -> list[str]:
        return [t for call in self.calls for t in call]

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(list(texts))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hold.intersection(texts):
                await self.release.wait()
            return await self.inner.embed(texts)
        except asyncio.CancelledError:
            self.stopped += 1
            raise
        finally:
            self.in_flight -= 1

    async def aclose(self) -> None:
        """The shared provider is closed by its fixture."""


def _call(suffix: str, content: str | None = None, **relationship: Any) -> dict[str, Any]:
    """An evidence with an occurrence of the payments team, and a relationship
    between two existing entities supported by it."""
    text = content or f"Note {suffix}: the payments team reviewed the billing service today."
    start = text.index("Payments team" if content else "payments team")
    return {
        "source_id": "src-handbook",
        "evidence": [
            {
                "id": f"ev-{suffix}",
                "content": text,
                "occurrences": [{"id": f"occ-{suffix}", "start": start, "end": start + 13}],
            }
        ],
        "relationships": [
            {
                "id": f"rel-{suffix}",
                "subject": "billing",
                "predicate": "reviewed_by",
                "object": "payments-team",
                "supports": [
                    {
                        "id": f"sup-{suffix}",
                        "evidence": f"ev-{suffix}",
                        "occurrence": f"occ-{suffix}",
                    }
                ],
                **relationship,
            }
        ],
    }


async def _principal(writes: WriteService, prefix: str) -> tuple[str, Any]:
    team = unique(prefix)
    await load_jsonl(writes, jsonl(team_records(team)))
    raw = await token(writes, team, "alice")
    return team, await authenticate(writes.db, raw)


async def _vector(db: Database, table: str, team: str, ident: str) -> np.ndarray:
    column = "evidence_id" if table == "evidence_embeddings" else "relationship_id"
    async with db.admin(readonly=True) as conn:
        stored = await conn.fetchval(
            f"SELECT embedding FROM {table} WHERE team_id = $1 AND {column} = $2", team, ident
        )
    assert stored is not None, (table, ident)
    return np.asarray(stored.to_numpy())


async def _settle(watched: _Watched) -> None:
    """Let the event loop run what a cancellation or a finished call left to do."""
    for _ in range(50):
        if watched.in_flight == 0:
            return
        await asyncio.sleep(0.01)


async def test_a_text_an_evidence_and_a_relationship_share_goes_to_the_provider_once(
    writes: WriteService, embedder: EmbeddingProvider
) -> None:
    """An evidence whose text is its relationship's statement: one lane for both,
    so the text is embedded once (two lanes, one for evidence texts and one for
    relationship texts, sent it twice), and both rows store the provider's
    vector of that text alone."""
    team, principal = await _principal(writes, "lane-once")
    watched = _Watched(embedder)
    mutations = MutationService(WriteService(writes.db, watched))
    receipts = await mutations.apply(principal, remember_items(principal, _call("a", STATEMENT)))
    assert [r.created for r in receipts] == [True, True]
    assert watched.texts.count(STATEMENT) == 1, watched.calls
    alone = (await embedder.embed([STATEMENT]))[0]
    for table, ident in (("evidence_embeddings", "ev-a"), ("relationship_embeddings", "rel-a")):
        assert np.array_equal(await _vector(writes.db, table, team, ident), alone), table


async def test_an_evidence_written_before_is_not_waited_for(
    writes: WriteService, embedder: EmbeddingProvider
) -> None:
    """The call's evidence was written before (the same ID and text: an agent's
    retry that adds a relationship). Its text went to the provider as the batch
    started, but no vector of it is needed: the call stores the new
    relationship's vector and ends without waiting for that embedding (it used
    to wait for every evidence text sent ahead), and the call is stopped."""
    team, principal = await _principal(writes, "lane-unneeded")
    first = _call("u")
    await MutationService(writes).apply(principal, remember_items(principal, first))
    evidence_text = first["evidence"][0]["content"]
    watched = _Watched(embedder, hold=[evidence_text])
    mutations = MutationService(WriteService(writes.db, watched))
    second = _call("u")
    second["relationships"][0]["id"] = "rel-again"
    second["relationships"][0]["supports"][0]["id"] = "sup-again"
    try:
        receipts = await asyncio.wait_for(
            mutations.apply(principal, remember_items(principal, second)), timeout=30
        )
        assert [(r.kind, r.id, r.created) for r in receipts] == [
            ("evidence", "ev-u", False),
            ("relationship", "rel-again", True),
        ]
        await _settle(watched)
        assert watched.in_flight == 0 and watched.stopped == 1, watched.calls
        assert [evidence_text] in watched.calls
        stored = await _vector(writes.db, "relationship_embeddings", team, "rel-again")
        assert np.array_equal(stored, (await embedder.embed([STATEMENT]))[0])
    finally:
        watched.release.set()


@pytest.mark.parametrize("refused_at", ["evidence", "support"])
async def test_a_refused_batch_leaves_no_call_running(
    writes: WriteService, embedder: EmbeddingProvider, refused_at: str
) -> None:
    """Every provider call held: the evidence's (started with the batch) and the
    relationship's (started once the first claim came back new). A refusal at the
    evidence (its mention names no entity) or at the relationship's support
    (no such occurrence) stops them: none is running once the call has failed,
    and nothing is written."""
    team, principal = await _principal(writes, "lane-refused")
    data = _call("r")
    if refused_at == "evidence":
        data["evidence"][0]["mentions"] = [{"entity": "nobody"}]
    else:
        data["relationships"][0]["supports"][0]["occurrence"] = "occ-none"
    content = data["evidence"][0]["content"]
    watched = _Watched(embedder, hold=[content, STATEMENT])
    mutations = MutationService(WriteService(writes.db, watched))
    try:
        with pytest.raises(MutationError) as refused:
            await asyncio.wait_for(
                mutations.apply(principal, remember_items(principal, data)), timeout=30
            )
        assert refused.value.code == "NOT_FOUND"
        await _settle(watched)
        assert watched.calls, "the texts went ahead"
        assert watched.in_flight == 0, watched.calls
        assert watched.stopped == len(watched.calls), watched.calls
    finally:
        watched.release.set()
    async with writes.db.admin(readonly=True) as conn:
        assert not await conn.fetchval(
            "SELECT count(*) FROM write_log WHERE team_id = $1 AND client_id LIKE '%-r'", team
        )


async def test_the_lane_holds_one_call_in_flight_and_sends_later_texts_together(
    embedder: EmbeddingProvider,
) -> None:
    """The lane's rule itself, on the real model: a text starts a call at once
    when none is in flight; texts added while one is in flight wait, and go
    together in one call; a text is sent once however often it is added; a call
    holding none of the needed texts is stopped when they wait behind it, never
    awaited, and no second call runs beside it (review L4: the old lane started
    one beside it); the vectors are the provider's for each text alone."""
    from gateway.services.writes import _Lane

    watched = _Watched(embedder, hold=["first"])
    lane = _Lane(watched)
    try:
        lane.add("first")
        lane.add("second", "first")
        lane.add("third")
        await asyncio.sleep(0.2)
        assert watched.calls == [["first"]] and watched.in_flight == 1
        needed = ["second", "third"]
        got = await asyncio.wait_for(lane.vectors(needed), timeout=30)
        await _settle(watched)
    finally:
        watched.release.set()
        lane.close()
    assert watched.calls == [["first"], ["second", "third"]]
    assert watched.stopped == 1  # "first", needed by nothing, stopped
    assert watched.most_in_flight == 1
    assert sorted(got) == sorted(needed)
    for text in needed:
        assert np.array_equal(got[text], (await embedder.embed([text]))[0]), text


@pytest.mark.parametrize("projection", ["the team's", "none yet"])
async def test_a_model_switch_while_the_texts_embed_refuses_the_write(
    fresh_dsn: str,
    embedder: EmbeddingProvider,
    projection: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store's model and the team's projection are read with the call's first
    claim, and the vectors stored after the last embedding: a ``reembed`` that
    switches the store to another model in between (it renames the model row,
    db/0035) leaves the call's vectors naming a model the store no longer holds.
    The call is refused as a model mismatch, nothing written, and a retry goes
    in (it was an INTERNAL error, a foreign key's): with the team's relationship
    projection made before, and for the team's first relationship, whose
    projection the call makes (naming the model read)."""
    db = await Database.open(fresh_dsn, min_size=1, max_size=3)
    try:
        writes = WriteService(db, embedder)
        team = unique("lane-switch")
        records = team_records(team)
        if projection == "none yet":
            records = [r for r in records if r["kind"] != "relationship"]
        await load_jsonl(writes, jsonl(records))
        principal = await authenticate(db, await token(writes, team, "alice"))
        async with db.admin() as conn:
            made = await conn.fetchval(
                "SELECT count(*) FROM relationship_projections WHERE team_id = $1", team
            )
        assert made == (1 if projection == "the team's" else 0)
        data = _call("s")
        claim_write = store.claim_write
        switched: list[bool] = []

        async def first_claim_then_switch(*args: Any, **kwargs: Any) -> Any:
            answer = await claim_write(*args, **kwargs)
            if not switched:  # the call's first claim has read the model: switch now
                switched.append(True)
                async with db.admin() as conn:  # the switch of a reembed, in short
                    await conn.execute(
                        "UPDATE embedding_models SET name = 'other-model' WHERE name = $1",
                        embedder.model,
                    )
            return answer

        monkeypatch.setattr(store, "claim_write", first_claim_then_switch)
        task = asyncio.create_task(
            MutationService(writes).apply(principal, remember_items(principal, data))
        )
        with pytest.raises(MutationError) as refused:
            await asyncio.wait_for(task, timeout=30)
        assert refused.value.code == "EMBEDDING_MODEL_MISMATCH", refused.value.message
        async with db.admin() as conn:
            assert not await conn.fetchval(
                "SELECT count(*) FROM write_log WHERE team_id = $1 AND client_id LIKE '%-s'", team
            )
            await conn.execute(
                "UPDATE embedding_models SET name = $1 WHERE name = 'other-model'", embedder.model
            )
        assert switched
        monkeypatch.setattr(store, "claim_write", claim_write)
        receipts = await MutationService(writes).apply(principal, remember_items(principal, data))
        assert all(r.created for r in receipts)
    finally:
        await db.close()


class _Following(_Watched):
    """A provider that follows the store's model (gateway/embeddings/following.py
    in short): ``model`` and ``next_model`` name the model it embeds with now; the
    test moves it (the vectors stay the real model's: what matters is the label)."""

    def __init__(self, inner: EmbeddingProvider) -> None:
        super().__init__(inner)
        self.current = inner.model

    @property
    def model(self) -> str:
        return self.current

    @model.setter
    def model(self, value: str) -> None:
        self.current = value

    @property
    def next_model(self) -> str:
        return self.current


async def test_a_provider_that_moved_model_while_the_texts_embed_refuses_the_write(
    fresh_dsn: str, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The evidence's text starts embedding as the call starts, with the store's
    model of then; a reembed switches the store and the gateway's provider
    follows before the call's first claim, which reads the new model. Storing
    the evidence's vector (the old model's) under the new model's name would mix
    two models silently: the call is refused as a model mismatch, nothing
    written (before, it was stored)."""
    db = await Database.open(fresh_dsn, min_size=1, max_size=3)
    try:
        writes = WriteService(db, embedder)
        team, principal = await _principal(writes, "lane-moved")
        following = _Following(embedder)
        claim_write = store.claim_write
        moved: list[bool] = []

        async def switch_then_first_claim(*args: Any, **kwargs: Any) -> Any:
            if not moved:  # the evidence's call has started, under the old model
                moved.append(True)
                async with db.admin() as conn:
                    await conn.execute(
                        "UPDATE embedding_models SET name = 'other-model' WHERE name = $1",
                        embedder.model,
                    )
                following.current = "other-model"
            return await claim_write(*args, **kwargs)

        monkeypatch.setattr(store, "claim_write", switch_then_first_claim)
        mutations = MutationService(WriteService(db, following))
        with pytest.raises(MutationError) as refused:
            await asyncio.wait_for(
                mutations.apply(principal, remember_items(principal, _call("m"))), timeout=30
            )
        assert moved and following.calls[0] == [_call("m")["evidence"][0]["content"]]
        assert refused.value.code == "EMBEDDING_MODEL_MISMATCH", refused.value.message
        async with db.admin() as conn:
            assert not await conn.fetchval(
                "SELECT count(*) FROM write_log WHERE team_id = $1 AND client_id LIKE '%-m'", team
            )
    finally:
        await db.close()
