"""HNSW index build benchmark: what ``maintenance_work_mem`` and parallel
maintenance workers do to the build that ends ``load --index-after``.

A measuring script, not a test. It fills a table shaped like a space's vector
partition (``vector(384)``, storage PLAIN) with ``--vectors`` unit vectors
(random, or clustered like ``load_bench.py --vectors clustered``) by COPY, then
builds the same index the store declares (``hnsw (embedding vector_cosine_ops)
WITH (m = 16, ef_construction = 64)``) once per combination of
``--memory-mb`` and ``--workers``, in an interleaved order repeated
``--repeats`` times, dropping the index after each. Printed per combination:
the median build time, the WAL the build wrote (the WAL position moved; a build
writes its whole index to the WAL), the index size, and whether pgvector said
the graph outgrew ``maintenance_work_mem`` (its NOTICE).

    python benchmarks/index_build_bench.py --vectors 50000
    python benchmarks/index_build_bench.py --vectors 50000 --memory-mb 64,1024 --workers 0,2

Runs on a fresh embedded PostgreSQL of its own, or in a scratch database on
``--database-url``/``DATABASE_URL`` (its WAL figures then include whatever else
that server writes meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from beir_eval import _with_database, server
from load_bench import clustered

_INDEX = (
    "CREATE INDEX bench_hnsw ON bench_vectors "
    "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
)


def _vectors(n: int, kind: str, seed: int) -> np.ndarray:
    if kind == "clustered":
        rng = np.random.default_rng(seed)
        return np.stack([clustered(int(rng.integers(2**62))) for _ in range(n)])
    rows = np.random.default_rng(seed).standard_normal((n, 384)).astype(np.float32)
    unit: np.ndarray = rows / np.linalg.norm(rows, axis=1, keepdims=True)  # numpy says Any
    return unit


async def _wal_bytes(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"))


async def run(dsn: str, args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        await register_vector(conn)
        await conn.execute(
            "CREATE TABLE bench_vectors (id integer PRIMARY KEY, embedding vector(384) NOT NULL)"
        )
        await conn.execute("ALTER TABLE bench_vectors ALTER COLUMN embedding SET STORAGE PLAIN")
        rows = _vectors(args.vectors, args.kind, args.seed)
        started = time.perf_counter()
        await conn.copy_records_to_table(
            "bench_vectors", records=[(i, rows[i]) for i in range(len(rows))]
        )
        await conn.execute("VACUUM (ANALYZE) bench_vectors")
        print(f"copied {args.vectors} {args.kind} vectors in {time.perf_counter() - started:.1f} s")
        notices: list[str] = []
        conn.add_log_listener(lambda _c, message: notices.append(str(message.message)))
        combos = [
            (int(m), int(w)) for m in args.memory_mb.split(",") for w in args.workers.split(",")
        ]
        times: dict[tuple[int, int], list[float]] = {c: [] for c in combos}
        wal: dict[tuple[int, int], list[int]] = {c: [] for c in combos}
        outgrew: dict[tuple[int, int], bool] = dict.fromkeys(combos, False)
        size = 0
        for r in range(args.repeats):
            order = combos if r % 2 == 0 else list(reversed(combos))
            for memory, workers in order:
                await conn.execute(
                    "SELECT set_config('maintenance_work_mem', $1, false), "
                    "set_config('max_parallel_maintenance_workers', $2, false)",
                    f"{memory}MB",
                    str(workers),
                )
                notices.clear()
                before = await _wal_bytes(conn)
                t0 = time.perf_counter()
                await conn.execute(_INDEX)
                times[(memory, workers)].append(time.perf_counter() - t0)
                wal[(memory, workers)].append(await _wal_bytes(conn) - before)
                size = int(await conn.fetchval("SELECT pg_relation_size('bench_hnsw')"))
                outgrew[(memory, workers)] |= any("no longer fits" in n for n in notices)
                await conn.execute("DROP INDEX bench_hnsw")
                print(
                    f"  run {r + 1}: {memory:5d} MB, {workers} workers: "
                    f"{times[(memory, workers)][-1]:6.1f} s",
                    flush=True,
                )
        print(f"index size {size / 2**20:.0f} MB for {args.vectors} vectors")
        print("maintenance_work_mem  workers  median s  WAL MB  graph outgrew memory")
        for memory, workers in combos:
            print(
                f"{memory:17d} MB  {workers:7d}  {statistics.median(times[(memory, workers)]):8.1f}"
                f"  {statistics.median(wal[(memory, workers)]) / 2**20:6.0f}"
                f"  {'yes' if outgrew[(memory, workers)] else 'no'}"
            )
    finally:
        await conn.close()


async def _scratch(admin_dsn: str, args: argparse.Namespace) -> None:
    name = "recall_index_bench_" + secrets.token_hex(4)
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            await run(_with_database(admin_dsn, name), args)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vectors", type=int, default=50_000)
    parser.add_argument("--kind", choices=["random", "clustered"], default="random")
    parser.add_argument("--memory-mb", default="64,256,1024", help="comma-separated values")
    parser.add_argument("--workers", default="0,1,2", help="comma-separated values")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    args = parser.parse_args()
    with server(args.database_url) as admin_dsn:
        asyncio.run(_scratch(admin_dsn, args))


if __name__ == "__main__":
    main()
