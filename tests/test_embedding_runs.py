"""How the local model cuts a call into runs, and the two lanes it runs them in.

The vectors must not depend on how texts were grouped (a bulk load and a
single ``remember`` of the same text must store the same vector), and a query
must not queue behind a bulk load's runs.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateway.embeddings.base import token_batches
from gateway.embeddings.local import REQUEST_TEXTS, LocalEmbeddingProvider
from gateway.errors import EmbeddingError


def test_token_batches_groups_short_texts_and_isolates_long_ones() -> None:
    lengths = [256, 12, 14, 256, 40, 10, 200]
    groups = token_batches(lengths, max_texts=64, max_tokens=256)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        padded = len(group) * max(lengths[i] for i in group)
        assert len(group) == 1 or padded <= 256
    # shortest first, and the four short ones fit in one run
    assert groups[0] == [5, 1, 2, 4]
    assert [5, 1, 2, 4] in groups and [6] in groups and [0] in groups and [3] in groups


def test_token_batches_respects_the_text_limit() -> None:
    groups = token_batches([3] * 10, max_texts=4, max_tokens=10_000)
    assert [len(g) for g in groups] == [4, 4, 2]


def test_token_batches_keeps_a_text_longer_than_the_budget() -> None:
    assert token_batches([500, 2], max_texts=8, max_tokens=100) == [[1], [0]]
    assert token_batches([], max_texts=8, max_tokens=100) == []
    with pytest.raises(ValueError):
        token_batches([1], max_texts=0, max_tokens=100)


def _texts(n: int) -> list[str]:
    """Texts of many lengths, from a few tokens to about 120."""
    words = "the billing service owner moved the weekly rotation after the outage review".split()
    return [
        f"note {i}: " + " ".join(words[(i * 7 + k) % len(words)] for k in range(1 + (i * 37) % 90))
        for i in range(n)
    ]


async def test_bulk_runs_match_one_padded_batch_and_single_texts() -> None:
    """The grouping is a matter of speed only: a large call cut into small runs
    (two workers) gives the vectors of the former single padded batch per 64
    texts and of each text embedded alone."""
    texts = _texts(REQUEST_TEXTS + 8) + ["the longest " * 200]
    runs = LocalEmbeddingProvider()
    padded = LocalEmbeddingProvider(batch_size=64, token_budget=10**9, threads=1)
    try:
        bulk = await runs.embed(texts)
        reference = await padded.embed(texts)
        singles = np.vstack([await runs.embed([t]) for t in texts[:8]])
    finally:
        await runs.aclose()
        await padded.aclose()
    assert bulk.shape == (len(texts), 384)
    assert float((bulk * reference).sum(axis=1).min()) >= 0.9999
    assert float((bulk[:8] * singles).sum(axis=1).min()) >= 0.9999
    # and the rows are in input order: each matches its own text's vector only
    assert np.argmax(bulk @ reference.T, axis=1).tolist() == list(range(len(texts)))


async def test_a_query_does_not_wait_behind_a_bulk_call() -> None:
    provider = LocalEmbeddingProvider()
    long_text = " ".join(["the payments api latency budget was raised after the review"] * 30)
    try:
        await provider.embed(["load the model first"])
        bulk = asyncio.ensure_future(provider.embed([f"{i} {long_text}" for i in range(64)]))
        await asyncio.sleep(0.05)  # the bulk call's runs are queued or running
        query = await provider.embed(["who owns the payments api?"])
        # 64 runs of 256 tokens take seconds; the query is one run of a few tokens
        assert not bulk.done()
        assert query.shape == (1, 384)
        assert (await bulk).shape == (64, 384)
    finally:
        await provider.aclose()


async def test_closing_stops_a_bulk_call() -> None:
    provider = LocalEmbeddingProvider()
    texts = [f"{i} " + "the payments api latency budget " * 60 for i in range(64)]
    try:
        await provider.embed(["load the model first"])
        bulk = asyncio.ensure_future(provider.embed(texts))
        await asyncio.sleep(0.05)
    finally:
        await provider.aclose()
    with pytest.raises(EmbeddingError, match="closed"):
        await bulk
