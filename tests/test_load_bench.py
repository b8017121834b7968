"""benchmarks/load_bench.py's ``--index-after``: it builds the spaces its own load
deferred, never one that another load left waiting (on the real PostgreSQL)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import asyncpg

from gateway.embeddings import EmbeddingProvider
from gateway.services.writes import WriteService
from gateway.store.database import Database

from .conftest import REPO, unique
from .test_index_after import _space, _state
from .test_index_after_safety import _interrupted


def _bench() -> ModuleType:
    path = REPO / "benchmarks" / "load_bench.py"
    spec = importlib.util.spec_from_file_location("load_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("load_bench", module)
    spec.loader.exec_module(module)
    return module


async def test_the_benchmark_builds_only_the_spaces_its_load_deferred(
    fresh_dsn: str, embedder: EmbeddingProvider, tmp_path: Path
) -> None:
    if TYPE_CHECKING:  # mypy reads the script itself (pyproject: benchmarks/ is checked too)
        import load_bench as bench
    else:
        bench = _bench()
    db = await Database.open(fresh_dsn, min_size=1, max_size=4)
    try:
        other = unique("ixbench-other")
        waiting = await _interrupted(WriteService(db, embedder), other, embedder.model)
    finally:
        await db.close()

    path = tmp_path / "bench.jsonl"
    hasher = bench.HashEmbedder()
    assert hasher.model == embedder.model
    bench.write_file(path, bench.generated_documents(3, 7), hasher)
    args = argparse.Namespace(
        embedder="hash", batch_size=50, index_memory_mb=64, index_workers=1, concurrency=2
    )
    figures = await bench.run_load(fresh_dsn, path, args, True, index_after=True)
    assert figures["written"] == figures["records"]

    conn = await asyncpg.connect(fresh_dsn)
    try:
        mine = await _space(conn, bench.TEAM)
        for _table, attached, methods in await _state(conn, mine):
            assert attached is True and "hnsw:True" in methods
        for _table, attached, _methods in await _state(conn, waiting):
            assert attached is False  # still waiting for its own load or build
        recorded = await conn.fetch("SELECT space_id FROM vector_deferrals")
        assert [r["space_id"] for r in recorded] == [waiting]
    finally:
        await conn.close()
