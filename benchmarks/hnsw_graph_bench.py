"""HNSW graph quality against walk length, at one space's vectors, over several builds.

    python benchmarks/hnsw_graph_bench.py --data-dir HELD1M --work SCRATCH \\
        --ef-construction 64,128,256 --ef-search 150,200,300,400,1000 --builds 2

Copies the evidence vectors of one space of a dataset kept by recall_bench.py
(the first team's shared space: 100,000 vectors at 1,000,000 evidence) into a
scratch embedded server of its own under ``--work`` (the dataset is only read,
and only while no other process has it open), then for each ``ef_construction``
builds the store's index on them (``m = 16``, cosine, as db/0001) ``--builds``
times (pgvector draws each element's level at random, so each build is another
graph) and measures, per ``ef_search``, recall@10 of a plain ``ORDER BY
embedding <=> q LIMIT 10`` walk against the exact top 10 (numpy over all the
vectors), with recall_bench.py's query vectors (near its topic centres). Also
the build's time and the walk's median time.

What it does not measure: the store's own vector function (its filters and
iterative scan, which on a space whose vectors are all visible walk the same
graph) and a loaded machine's effect on the time (stated with the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_bench as rb


async def export(dsn: str, out: Path) -> None:
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    try:
        space = await conn.fetchval(
            "SELECT id FROM memory_spaces WHERE team_id = 'bench-00' AND kind = 'shared'"
        )
        rows = await conn.fetch(
            "SELECT embedding FROM evidence_embeddings WHERE team_id = 'bench-00' "
            "AND space_id = $1 ORDER BY evidence_id",
            space,
        )
    finally:
        await conn.close()
    np.save(out, np.stack([np.asarray(r[0].to_numpy()) for r in rows]).astype(np.float32))


def questions(n: int, seed: int) -> np.ndarray:
    """recall_bench.py's query vectors (vector_ef_bench.py's draw)."""
    centroids = rb.unit(np.random.default_rng(seed).standard_normal((len(rb.TOPICS), rb.DIM)))
    rng = np.random.default_rng(seed + 1)
    out = []
    for _ in range(n):
        topic = int(rng.integers(0, len(rb.TOPICS)))
        noise = rng.standard_normal(rb.DIM).astype(np.float32) * 0.045
        out.append(rb.unit(centroids[topic] + noise))
    return np.stack(out).astype(np.float32)


async def measure(
    dsn: str, vectors: np.ndarray, efc: list[int], efs: list[int], builds: int, n: int
) -> None:
    qs = questions(n, 7)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    exact = np.argsort(-(unit @ qs.T), axis=0)[:10].T  # ids are row numbers
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    try:
        await conn.execute("SET maintenance_work_mem = '1GB'")
        await conn.execute("SET max_parallel_maintenance_workers = 1")
        await conn.execute("DROP TABLE IF EXISTS g; CREATE TABLE g (id int, v vector(384))")
        await conn.execute("ALTER TABLE g ALTER COLUMN v SET STORAGE PLAIN")
        await conn.copy_records_to_table(
            "g", records=[(i, v) for i, v in enumerate(vectors)], columns=["id", "v"]
        )
        await conn.execute("VACUUM ANALYZE g")
        for e in efc:
            for b in range(builds):
                await conn.execute("DROP INDEX IF EXISTS g_v")
                t0 = time.perf_counter()
                await conn.execute(
                    f"CREATE INDEX g_v ON g USING hnsw (v vector_cosine_ops) "
                    f"WITH (m = 16, ef_construction = {e})"
                )
                built = time.perf_counter() - t0
                size = await conn.fetchval("SELECT pg_relation_size('g_v')")
                for ef in efs:
                    await conn.execute(f"SET hnsw.ef_search = {ef}")
                    hits, times = 0, []
                    for q, truth in zip(qs, exact, strict=True):
                        t0 = time.perf_counter()
                        got = await conn.fetch("SELECT id FROM g ORDER BY v <=> $1 LIMIT 10", q)
                        times.append((time.perf_counter() - t0) * 1000)
                        hits += len({r[0] for r in got} & set(truth.tolist()))
                    print(
                        f"ef_construction {e:4} build {b}: {built:6.1f} s, "
                        f"{size / 2**20:5.1f} MB   ef_search {ef:5}: recall@10 "
                        f"{hits / (10 * len(qs)):.4f}   walk median "
                        f"{statistics.median(times):6.2f} ms   "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--ef-construction", default="64,128,256")
    parser.add_argument("--ef-search", default="150,200,300,400,1000")
    parser.add_argument("--builds", type=int, default=2)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    from gateway.embedded import EmbeddedPostgres

    args.work.mkdir(parents=True, exist_ok=True)
    dump = args.work / "vectors.npy"
    if not dump.exists():
        with rb.database(args.data_dir) as dsn:
            asyncio.run(export(dsn, dump))
    vectors = np.load(dump)
    print(f"{len(vectors)} vectors", flush=True)
    with EmbeddedPostgres(args.work / "pg", database="graph") as pg:
        asyncio.run(
            measure(
                pg.dsn,
                vectors,
                [int(x) for x in args.ef_construction.split(",")],
                [int(x) for x in args.ef_search.split(",")],
                args.builds,
                args.queries,
            )
        )


if __name__ == "__main__":
    main()
