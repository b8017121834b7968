"""A worker's memory: the local model must not keep the high-water mark of a batch.

onnxruntime's CPU arena kept every byte of its largest run: one batch of 64
texts of 256 tokens (the write path's batch) took a process from about 280 MB
to 1.6 GB RSS for good (32 texts: several hundred MB more). The bound below is
far from both figures, so the test does not depend on the allocator's details.
"""

from __future__ import annotations

import re
from pathlib import Path

from gateway.embeddings.local import LocalEmbeddingProvider


def rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match is not None
    return int(match.group(1)) / 1024


async def test_a_large_batch_leaves_no_lasting_memory() -> None:
    provider = LocalEmbeddingProvider(batch_size=64)
    try:
        await provider.embed(["warm up the session"])
        before = rss_mib()
        long_text = " ".join(["billing service owner latency of the payments api"] * 40)
        vectors = await provider.embed([f"{i} {long_text}" for i in range(32)])
        assert vectors.shape == (32, 384)
        await provider.embed(["a short query afterwards"])
        grown = rss_mib() - before
        assert grown < 200, f"RSS grew by {grown:.0f} MiB after one batch and stayed there"
    finally:
        await provider.aclose()
