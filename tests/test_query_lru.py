"""Recall's LRU of query embeddings is keyed by who asks and by the vector space,
not by events.

A store's first vectors (seen by the store-model watcher of a serving gateway)
leave the space unchanged: the LRU keeps its vectors. A store moving to another
model (``reembed``) changes it: no vector of the old model is served again
(also checked by test_reembed.py's serving gateway); a process that names its
model keeps its key, and the mismatch check before the LRU keeps its old
vectors out. The store is the real PostgreSQL; the other model is
test_reembed.py's deterministic double.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from gateway.embeddings import EmbeddingProvider, Vectors, by_model_id
from gateway.services.recall import QueryEmbeddings
from gateway.services.reembed import reembed
from gateway.services.writes import WriteService

from .conftest import app_for, load_jsonl, unique, until
from .factories import jsonl, team_records
from .test_recall import Binding, recall, token
from .test_reembed import Double, registered_double

QUESTION = "who owns the billing service"
ASKER = ("team-a", "alice", "private")
WATCHER = "the store-model watcher (it reads the store about once a second) saw the change"


async def test_a_stores_first_vectors_keep_the_query_lru(
    fresh_dsn: str, embedder: EmbeddingProvider
) -> None:
    app = app_for(fresh_dsn)
    async with app.router.lifespan_context(app):
        services = app.state.services
        embeddings = services.recall.embeddings
        assert embeddings.store_model.held is None  # a store without vectors
        before = await embeddings.vector(QUESTION, [], ASKER)
        assert before is not None
        assert embeddings.known(QUESTION, ASKER) == (True, before)
        # The store gets its first vectors, of the model the gateway embeds with.
        await load_jsonl(WriteService(services.db, embedder), jsonl(team_records(unique("first"))))
        await until(lambda: embeddings.store_model.held == services.embedder.model, WATCHER)
        known, vector = embeddings.known(QUESTION, ASKER)
        assert known and vector is before  # the same vector, no model run
        degradations: list[Any] = []
        assert await embeddings.vector(QUESTION, degradations, ASKER) is before
        assert degradations == []


async def test_a_model_switch_empties_the_query_lru(
    fresh_dsn: str, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = registered_double(monkeypatch, "double-lru")
    app = app_for(fresh_dsn)
    async with app.router.lifespan_context(app):
        services = app.state.services
        embeddings = services.recall.embeddings
        await load_jsonl(WriteService(services.db, embedder), jsonl(team_records(unique("sw"))))
        await until(lambda: embeddings.store_model.held == embedder.model, WATCHER)
        before = await embeddings.vector(QUESTION, [], ASKER)
        assert before is not None and embeddings.known(QUESTION, ASKER)[0]
        assert (await reembed(services.db, Double(target.model))).switched
        await until(lambda: embeddings.store_model.held == target.model, WATCHER)
        # Not served from the LRU: the provider embeds with the store's new model.
        assert embeddings.known(QUESTION, ASKER) == (False, None)
        after = await embeddings.vector(QUESTION, [], ASKER)
        assert after is not None
        assert np.array_equal(after, target.vectors([QUESTION])[0])
        assert not np.array_equal(after, before)
        assert embeddings.known(QUESTION, ASKER) == (True, after)


async def test_a_pinned_gateway_never_serves_a_cached_vector_after_a_switch(
    fresh_dsn: str, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that names its model keeps its LRU key when the store moves on:
    the mismatch check, before the LRU, is what keeps the cached vector out."""
    target = registered_double(monkeypatch, "double-pinned")
    own = by_model_id(embedder.model)
    assert own is not None
    app = app_for(fresh_dsn, embedding_model=own.key)
    async with app.router.lifespan_context(app):
        services = app.state.services
        embeddings = services.recall.embeddings
        await load_jsonl(WriteService(services.db, embedder), jsonl(team_records(unique("pin"))))
        await until(lambda: embeddings.store_model.held == embedder.model, WATCHER)
        assert await embeddings.vector(QUESTION, [], ASKER) is not None
        assert embeddings.known(QUESTION, ASKER)[0]
        assert (await reembed(services.db, Double(target.model))).switched
        await until(lambda: embeddings.store_model.held == target.model, WATCHER)
        assert embeddings.known(QUESTION, ASKER) == (False, None)
        degradations: list[Any] = []
        assert await embeddings.vector(QUESTION, degradations, ASKER) is None
        assert [d.code for d in degradations] == ["query_embedding_model_mismatch"]


class _Switching:
    """A provider whose model changes while it embeds (a switch during the call)."""

    def __init__(self) -> None:
        self.model = "model-a"
        self.dimensions = 384

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.model = "model-b"
        return Double(self.model).vectors(texts)

    async def aclose(self) -> None:
        return None


async def test_a_vector_of_a_model_switched_to_during_the_call_is_not_kept() -> None:
    switching = _Switching()
    embeddings = QueryEmbeddings(switching)
    assert await embeddings.vector(QUESTION, [], ASKER) is not None
    # Filed under neither name: under model-a it would be another model's vector.
    assert embeddings.known(QUESTION, ASKER) == (False, None)
    assert not embeddings._cache
    again = await embeddings.vector(QUESTION, [], ASKER)  # model-b from the start: kept
    assert embeddings.known(QUESTION, ASKER) == (True, again)


async def test_a_question_asked_by_one_caller_is_not_cached_for_another() -> None:
    """A cached question answers about 10 ms sooner: an LRU shared by callers
    would tell one, by timing, what another team or principal asked."""
    double = Double("double-askers")
    embeddings = QueryEmbeddings(double)
    first = await embeddings.vector(QUESTION, [], ASKER)
    assert first is not None
    assert await embeddings.vector(QUESTION, [], ASKER) is first  # the asker's own: cached
    assert double.texts == [QUESTION]
    for other in (
        ("team-b", "alice", "private"),
        ("team-a", "bob", "private"),
        ("team-a", "alice", "shared_only"),
    ):
        assert embeddings.known(QUESTION, other) == (False, None)
        again = await embeddings.vector(QUESTION, [], other)
        assert again is not None and np.array_equal(again, first)
    assert double.texts == [QUESTION] * 4  # each other caller ran the model


async def test_recall_files_a_question_under_its_caller(
    gateway_app: Any, client: Any, writes: WriteService
) -> None:
    """Through the gateway: the same question from two teams' principals, a second
    principal of one team and a principal's shared_only token is four entries,
    each under its caller."""
    teams = [unique("lrua"), unique("lrub")]
    for team in teams:
        await load_jsonl(writes, jsonl(team_records(team)))
    callers: list[tuple[str, str, Binding]] = [
        (teams[0], "alice", "private"),
        (teams[0], "alice", "shared_only"),
        (teams[0], "bob", "private"),
        (teams[1], "alice", "private"),
    ]
    question = f"who owns billing {unique('q')}"
    for team, principal, binding in callers:
        await recall(client, await token(writes, team, principal, binding), q=question, limit=3)
    cache = gateway_app.state.services.recall.embeddings._cache
    assert sorted(k[:3] for k in cache if k[4] == question) == sorted(callers)
