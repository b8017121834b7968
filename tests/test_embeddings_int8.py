"""The opt-in ``minilm-int8`` model: the bundled MiniLM's graph with int8 matrix products.

Real files, real onnxruntime, real PostgreSQL (the store's model checks and a
``reembed`` to it). Each store-changing test has a database of its own
(``fresh_dsn``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import pytest_asyncio

from gateway import cli
from gateway.embeddings import (
    LOCAL_MODELS,
    EmbeddingProvider,
    FollowingProvider,
    LocalEmbeddingProvider,
    StoreModel,
    by_key,
    create_provider,
    local_int8,
)
from gateway.embeddings.base import validate_vectors
from gateway.embeddings.local import MODEL_ID as DEFAULT_ID
from gateway.embeddings.local import _mean_pool, default_model_file
from gateway.embeddings.local_int8 import MODEL_ID, LocalInt8EmbeddingProvider, derive
from gateway.errors import ConfigurationError
from gateway.services import loader
from gateway.services.reembed import read_store_model, reembed
from gateway.settings import Settings
from gateway.store.database import Database
from tests.factories import team_records
from tests.test_reembed import extra_evidence, live_vectors, load, texts_of, top_vector_hit

TEXTS = [
    "short",
    "The deploy was rolled back on Friday after the payment errors.",
    "word " * 600,  # beyond 256 tokens: truncated
    "Who decided to move the on-call rotation to weekly shifts, and why?",
    "",
]


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def int8(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LocalInt8EmbeddingProvider]:
    provider = LocalInt8EmbeddingProvider(cache=tmp_path_factory.mktemp("int8-cache"))
    try:
        yield provider
    finally:
        await provider.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def store(fresh_dsn: str) -> AsyncIterator[Database]:
    db = await Database.open(fresh_dsn, min_size=1, max_size=4)
    try:
        yield db
    finally:
        await db.close()


async def test_vectors_are_unit_rows_of_their_own_model(int8: LocalInt8EmbeddingProvider) -> None:
    vectors = await int8.embed(TEXTS)
    assert int8.model == MODEL_ID != DEFAULT_ID
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


async def test_a_texts_vector_does_not_depend_on_its_call(
    int8: LocalInt8EmbeddingProvider,
) -> None:
    """Bit for bit: alone, again, in a small call (request lane) or a bulk call."""
    alone = np.vstack([await int8.embed([t]) for t in TEXTS])
    assert np.array_equal(alone, np.vstack([await int8.embed([t]) for t in TEXTS]))
    assert np.array_equal(await int8.embed(TEXTS), alone)
    others = [f"Note {i}: the billing service moved to room {i}." for i in range(40)]
    bulk = await int8.embed(others + TEXTS)  # more than 16 texts: the bulk lane
    assert np.array_equal(bulk[len(others) :], alone)


async def test_close_to_the_default_models_vectors_and_still_a_retrieval_model(
    int8: LocalInt8EmbeddingProvider, embedder: EmbeddingProvider
) -> None:
    ours = await int8.embed(TEXTS[:4])
    default = await embedder.embed(TEXTS[:4])
    cosines = (ours * default).sum(axis=1)
    assert (cosines > 0.97).all() and not np.array_equal(ours, default), cosines
    anchor, paraphrase, unrelated = await int8.embed(
        [
            "The database migration is scheduled for next Tuesday.",
            "We plan to migrate the database next Tuesday.",
            "Penguins live mostly in the southern hemisphere.",
        ]
    )
    assert float(anchor @ paraphrase) > float(anchor @ unrelated) + 0.3


async def test_the_default_still_runs_the_shipped_graph_bit_for_bit(
    embedder: EmbeddingProvider,
) -> None:
    """The default provider's vectors are those of the file as shipped, run as before."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(
        default_model_file().read_bytes(), options, providers=["CPUExecutionProvider"]
    )
    provider = LocalEmbeddingProvider()
    try:
        tokenizer = provider._ensure_loaded().tokenizer
        for text in TEXTS:
            ids = np.array([tokenizer.encode(text).ids], dtype=np.int64)
            mask = np.ones_like(ids)
            (hidden,) = session.run(
                ["last_hidden_state"],
                {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
            )
            expected = validate_vectors(_mean_pool(hidden, mask), 1, 384)
            for source in (provider, embedder):
                got = await source.embed([text])
                assert np.array_equal(got, expected), (text, source)
    finally:
        await provider.aclose()
    assert embedder.model == DEFAULT_ID


def test_the_derivation_is_deterministic_and_checks_its_input() -> None:
    source = default_model_file().read_bytes()
    derived = derive(source)
    assert derive(source) == derived
    assert hashlib.sha256(derived).hexdigest() == local_int8.DERIVED_SHA256
    # A graph that is not the bundled one is refused, not half rewritten.
    with pytest.raises(ConfigurationError, match="cannot derive the int8 graph"):
        derive(derived)


async def test_a_derived_graph_other_than_the_pinned_one_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(local_int8, "DERIVED_SHA256", "0" * 64)
    provider = LocalInt8EmbeddingProvider(cache=tmp_path)
    try:
        with pytest.raises(ConfigurationError, match="derived int8 graph") as caught:
            await provider.embed(["anything"])
    finally:
        await provider.aclose()
    assert caught.value.code == "CONFIGURATION_ERROR"
    assert os.listdir(tmp_path) == []  # nothing unverified was kept


async def test_the_cache_is_used_only_when_it_verifies(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, int8: LocalInt8EmbeddingProvider
) -> None:
    expected = await int8.embed(TEXTS)
    first = LocalInt8EmbeddingProvider(cache=tmp_path)
    try:
        assert np.array_equal(await first.embed(TEXTS), expected)
    finally:
        await first.aclose()
    (name,) = os.listdir(tmp_path)
    kept = tmp_path / name
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == local_int8.DERIVED_SHA256

    def no_derivation(_: bytes) -> bytes:
        raise AssertionError("derived again despite a verified cache")

    with monkeypatch.context() as patch:
        patch.setattr(local_int8, "derive", no_derivation)
        cached = LocalInt8EmbeddingProvider(cache=tmp_path)
        try:
            assert np.array_equal(await cached.embed(TEXTS), expected)
        finally:
            await cached.aclose()

    # A damaged or foreign file under the cache's name is derived again and replaced.
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0xFF
    kept.write_bytes(bytes(data))
    repaired = LocalInt8EmbeddingProvider(cache=tmp_path)
    try:
        assert np.array_equal(await repaired.embed(TEXTS), expected)
    finally:
        await repaired.aclose()
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == local_int8.DERIVED_SHA256


def test_selectable_like_the_other_local_models() -> None:
    model = by_key("minilm-int8")
    assert model.model_id == MODEL_ID and LOCAL_MODELS["minilm-int8"] is model
    named = create_provider(Settings(embedding_model="minilm-int8"), None)
    assert isinstance(named, FollowingProvider)
    assert isinstance(named.current, LocalInt8EmbeddingProvider) and named.model == MODEL_ID
    # auto: a new store still gets the default; a store of int8 vectors gets this model.
    assert create_provider(Settings(embedding_model="auto"), None).model == DEFAULT_ID
    assert create_provider(Settings(embedding_model="auto"), MODEL_ID).model == MODEL_ID


async def test_refused_against_a_store_of_the_default_model(
    store: Database, embedder: EmbeddingProvider, int8: LocalInt8EmbeddingProvider
) -> None:
    await load(store, embedder, team_records("initech"))
    assert await read_store_model(store) == DEFAULT_ID
    with pytest.raises(loader.LoadError, match="refusing to mix"):
        await load(store, int8, extra_evidence("initech", 1))
    mismatch = StoreModel(int8, DEFAULT_ID).mismatch()
    assert mismatch is not None and MODEL_ID in mismatch and DEFAULT_ID in mismatch
    assert StoreModel(embedder, DEFAULT_ID).mismatch() is None


async def test_reembed_moves_a_store_to_it_and_back(
    store: Database, embedder: EmbeddingProvider, int8: LocalInt8EmbeddingProvider
) -> None:
    team = "hooli"
    await load(store, embedder, team_records(team) + extra_evidence(team, 5))
    before = await live_vectors(store)
    report = await reembed(store, int8, batch_size=4)
    assert report.switched and await read_store_model(store) == MODEL_ID
    texts = await texts_of(store)
    after = await live_vectors(store)
    assert after.keys() == before.keys()
    for key, (model, vector) in after.items():
        assert model == MODEL_ID
        assert np.array_equal(vector, (await int8.embed([texts[key]]))[0]), key
    question = (await int8.embed(["who owns the billing service of hooli"]))[0]
    assert await top_vector_hit(store, team, question) == "ev-owner"
    # The default model's writes are now refused; int8 writes go in.
    with pytest.raises(loader.LoadError, match="refusing to mix"):
        await load(store, embedder, [extra_evidence(team, 7)[-1] | {"id": "ev-default"}])
    await load(store, int8, [extra_evidence(team, 7)[-1] | {"id": "ev-int8"}])
    # And back: the default's vectors are the same as before the round trip.
    back = await reembed(store, embedder, batch_size=4)
    assert back.switched and await read_store_model(store) == DEFAULT_ID
    again = await live_vectors(store)
    for key, (model, vector) in before.items():
        assert again[key][0] == model == DEFAULT_ID
        assert np.array_equal(again[key][1], vector), key


def test_cli_reembed_offers_it(
    fresh_dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    monkeypatch.delenv("RECALL_EMBEDDING_MODEL", raising=False)
    assert cli.main(["reembed", "--model", "minilm-int8"]) == 0
    assert "no vectors yet" in capsys.readouterr().out
