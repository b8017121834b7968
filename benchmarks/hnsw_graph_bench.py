"""HNSW graph quality against walk length, per graph (m, ef_construction) and space size.

    python benchmarks/hnsw_graph_bench.py --data-dir HELD1M --work SCRATCH \\
        --m 16,24,32 --ef-construction 64 --sizes 10000,30000,100000 \\
        --ef-search 100,150,200,300,400,600,800,1000 --builds 1 --queries 100
    python benchmarks/hnsw_graph_bench.py --text SCIFACT --work SCRATCH-TEXT \\
        --m 16,32 --sizes 10000,50234 --ef-search 40,60,100,150,200,400 --queries 300

Copies the evidence vectors of one space of a dataset kept by recall_bench.py
(the first team's shared space: 100,000 vectors at 1,000,000 evidence) into a
scratch embedded server of its own under ``--work`` (the dataset is only read,
and only while no other process has it open), or with ``--text`` embeds a BEIR
folder's abstracts, sentence by sentence, and titles with the local model
(real text: SciFact makes 50,234; written once to ``--work``). Then, per space
size (``--sizes``: the first N of those vectors, in the dataset's evidence ID
order, which is random with respect to topic), per ``m`` and per
``ef_construction``, builds the store's kind of index on them (cosine, as
db/0001; the store's own is m 16, ef_construction 64) ``--builds`` times
(pgvector draws each element's level at random, so each build is another graph)
and measures, per ``ef_search``, recall@10 of a plain ``ORDER BY embedding <=> q
LIMIT 10`` walk against the exact top 10 of that space (numpy over all its
vectors), with recall_bench.py's synthetic query vectors (near its topic
centres, the same draws every run) or with ``--text`` the folder's queries
embedded as recall embeds a question. Per build: its time and the index's
size; per walk width: the walk's median time from the client and the server
process's CPU per walk (``/proc``: user + system time over all the questions,
divided by their number; less disturbed by other load than the time). Every
build's walks run once untimed first, at the widest ``ef_search``, so that the
timed walks find the index in shared buffers (what a warm server does; the
first walk after a build would otherwise read it back from the OS cache).
Last, per graph and size, the smallest measured width that reached
``--target`` on every build: whether a graph keeps recall with a width that
grows slower than the space.

``--probes N`` also asks N members of each space for their 10 nearest others
(itself left out): what a store could measure of a space without questions.
``--ivf K`` instead cuts each space into K k-means clusters, one partial index
per cluster, and walks each question in its ``--ivf-probes`` nearest clusters
(a graph per cluster instead of one per space).

What it does not measure: the store's own vector function (its filters and
iterative scan, which on a space whose vectors are all visible walk the same
graph; its view check of the walked rows costs more with a wider walk too) and
a loaded machine's effect on the time (stated with the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_bench as rb
from vector_ef_bench import SENTENCE_END

TICKS = os.sysconf("SC_CLK_TCK")


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


def sentences(folder: Path) -> list[str]:
    """Every abstract's sentences and every title, in corpus order: SciFact's 5,183
    abstracts give 50,234 texts, the largest space of real text at hand (its
    passages of three sentences, vector_ef_bench.py's, are 16,735)."""
    out: list[str] = []
    with (folder / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            if str(doc.get("title", "")).strip():
                out.append(str(doc["title"]).strip())
            out += [x for x in SENTENCE_END.split(str(doc.get("text", "")).strip()) if x]
    return out


async def embed_text(folder: Path, n: int, work: Path) -> tuple[np.ndarray, np.ndarray]:
    """The folder's sentences (kept in ``work``) and first ``n`` queries, embedded."""
    from gateway.embeddings import embed_queries
    from gateway.embeddings.local import LocalEmbeddingProvider

    dump = work / "text-vectors.npy"
    provider = LocalEmbeddingProvider()
    try:
        if not dump.exists():
            texts = sentences(folder)
            started = time.perf_counter()
            out: list[Any] = []
            for k in range(0, len(texts), 1024):
                out.extend(await provider.embed(texts[k : k + 1024]))
                rb.log(f"  embedded {min(k + 1024, len(texts))} of {len(texts)} texts")
            rb.log(f"  embedded in {time.perf_counter() - started:.0f} s")
            np.save(dump, np.asarray(out, dtype=np.float32))
        with (folder / "queries.jsonl").open(encoding="utf-8") as f:
            asks = [str(json.loads(line)["text"]) for line in f][:n]
        qs = [
            v
            for k in range(0, len(asks), 64)
            for v in await embed_queries(provider, asks[k : k + 64])
        ]
    finally:
        await provider.aclose()
    return np.load(dump), np.asarray(qs, dtype=np.float32)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (the server process of a connection)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass(frozen=True)
class Graph:
    size: int
    m: int
    efc: int


async def measure(
    dsn: str,
    vectors: np.ndarray,
    qs: np.ndarray,
    sizes: list[int],
    ms: list[int],
    efc: list[int],
    efs: list[int],
    builds: int,
    target: float,
    probes: int = 0,
    ivf: int = 0,
    ivf_probes: tuple[int, ...] = (),
) -> None:
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    reached: dict[Graph, list[int | None]] = {}
    reached_probes: dict[Graph, list[int | None]] = {}
    try:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        await conn.execute("SET maintenance_work_mem = '1GB'")
        await conn.execute("SET max_parallel_maintenance_workers = 1")
        # A small table or a wide walk makes the planner prefer a scan and sort
        # (every distance: recall 1.0 at a scan's cost); the walk is what is measured.
        await conn.execute("SET enable_seqscan = off")
        for size in sizes:
            sub = vectors[:size]
            unit = sub / np.linalg.norm(sub, axis=1, keepdims=True)
            exact = [set(row.tolist()) for row in np.argsort(-(unit @ qs.T), axis=0)[:10].T]
            # Probes: members of the space asked for their 10 nearest others (the
            # probe itself left out of both lists): what a space could measure of
            # itself, without questions, to choose its own width.
            pids = np.random.default_rng(size).choice(size, probes, replace=False)
            pexact = [
                [i for i in row.tolist() if i != p][:10]
                for p, row in zip(
                    pids, np.argsort(-(unit @ unit[pids].T), axis=0)[:11].T, strict=True
                )
            ]
            await conn.execute("DROP TABLE IF EXISTS g; CREATE TABLE g (id int, v vector(384))")
            await conn.execute("ALTER TABLE g ALTER COLUMN v SET STORAGE PLAIN")
            await conn.copy_records_to_table(
                "g", records=[(i, v) for i, v in enumerate(sub)], columns=["id", "v"]
            )
            await conn.execute("VACUUM ANALYZE g")
            print(f"space of {size} vectors, {len(qs)} questions", flush=True)
            if ivf:
                await measure_ivf(conn, pid, unit, qs, exact, ivf, ivf_probes, ms, efc, efs)
                continue
            for m in ms:
                for e in efc:
                    graph = Graph(size, m, e)
                    for b in range(builds):
                        await conn.execute("DROP INDEX IF EXISTS g_v")
                        load = os.getloadavg()[0]
                        t0 = time.perf_counter()
                        await conn.execute(
                            f"CREATE INDEX g_v ON g USING hnsw (v vector_cosine_ops) "
                            f"WITH (m = {m}, ef_construction = {e})"
                        )
                        built = time.perf_counter() - t0
                        mb = await conn.fetchval("SELECT pg_relation_size('g_v')") / 2**20
                        print(
                            f"size {size} m {m} ef_construction {e} build {b}: {built:.1f} s "
                            f"(load {load:.1f} -> {os.getloadavg()[0]:.1f}), {mb:.1f} MB",
                            flush=True,
                        )
                        await conn.execute(f"SET hnsw.ef_search = {max(efs)}")
                        plan = "\n".join(
                            r[0]
                            for r in await conn.fetch(
                                "EXPLAIN SELECT id FROM g ORDER BY v <=> $1 LIMIT 10", qs[0]
                            )
                        )
                        if "Index Scan using g_v" not in plan:
                            raise SystemExit(f"the walk is not the index's: {plan}")
                        for q in qs:  # untimed: the index into shared buffers
                            await conn.fetch("SELECT id FROM g ORDER BY v <=> $1 LIMIT 10", q)
                        first: int | None = None
                        pfirst: int | None = None
                        for ef in efs:
                            await conn.execute(f"SET hnsw.ef_search = {ef}")
                            hits, times = 0, []
                            cpu0 = cpu_seconds(pid)
                            for q, truth in zip(qs, exact, strict=True):
                                t0 = time.perf_counter()
                                got = await conn.fetch(
                                    "SELECT id FROM g ORDER BY v <=> $1 LIMIT 10", q
                                )
                                times.append((time.perf_counter() - t0) * 1000)
                                hits += len({r[0] for r in got} & truth)
                            cpu = (cpu_seconds(pid) - cpu0) * 1000 / len(qs)
                            recall = hits / (10 * len(qs))
                            if first is None and recall >= target:
                                first = ef
                            print(
                                f"size {size} m {m:2} efc {e:3} build {b} ef_search {ef:5}: "
                                f"recall@10 {recall:.4f}   walk median "
                                f"{statistics.median(times):6.2f} ms   CPU {cpu:6.2f} ms "
                                f"(load {os.getloadavg()[0]:.1f})",
                                flush=True,
                            )
                            if probes:
                                phits = 0
                                for p, near in zip(pids, pexact, strict=True):
                                    got = await conn.fetch(
                                        "SELECT id FROM g ORDER BY v <=> $1 LIMIT 11", sub[p]
                                    )
                                    mine = [r[0] for r in got if r[0] != p][:10]
                                    phits += len(set(mine) & set(near))
                                precall = phits / (10 * probes)
                                if pfirst is None and precall >= target:
                                    pfirst = ef
                                print(
                                    f"size {size} m {m:2} efc {e:3} build {b} ef_search {ef:5}: "
                                    f"probes' recall@10 {precall:.4f}",
                                    flush=True,
                                )
                        reached.setdefault(graph, []).append(first)
                        reached_probes.setdefault(graph, []).append(pfirst)
                    await conn.execute("DROP INDEX IF EXISTS g_v")
        print(f"\nsmallest ef_search measured with recall@10 >= {target} on every build:")
        for graph, firsts in reached.items():
            worst = None if None in firsts else max(f for f in firsts if f is not None)
            print(
                f"  size {graph.size:7} m {graph.m:2} ef_construction {graph.efc:3}: "
                f"{worst if worst is not None else 'none measured'} (per build: {firsts})"
                + (f"; probes: {reached_probes[graph]}" if probes else "")
            )
    finally:
        await conn.close()


def kmeans(unit: np.ndarray, k: int, rounds: int = 15) -> tuple[np.ndarray, np.ndarray]:
    """Spherical k-means (cosine): the clusters' unit centres and each vector's cluster."""
    centres = unit[np.random.default_rng(k).choice(len(unit), k, replace=False)]
    for _ in range(rounds):
        assign = np.argmax(unit @ centres.T, axis=1)
        for c in range(k):
            members = unit[assign == c]
            if len(members):
                centres[c] = members.sum(axis=0) / np.linalg.norm(members.sum(axis=0))
    return centres, np.argmax(unit @ centres.T, axis=1)


async def measure_ivf(
    conn: asyncpg.Connection,
    pid: int,
    unit: np.ndarray,
    qs: np.ndarray,
    exact: list[set[int]],
    k: int,
    nprobes: tuple[int, ...],
    ms: list[int],
    efc: list[int],
    efs: list[int],
) -> None:
    """The space cut into ``k`` clusters (k-means over its vectors), one partial HNSW
    index per cluster (``WHERE c = i``: what a sub-partition per cluster would hold),
    and each question walked in the graphs of its ``P`` nearest clusters, the walks'
    rows merged by distance: recall@10 and the server's CPU per question (all its
    walks) per width and ``P`` (design note direction (c): routing to the nearest
    few clusters' graphs, each about the size where a short walk holds 0.98)."""
    started = time.perf_counter()
    centres, assign = kmeans(unit, k)
    sizes = np.bincount(assign, minlength=k)
    print(
        f"  {k} clusters in {time.perf_counter() - started:.1f} s, "
        f"sizes {int(sizes.min())}-{int(sizes.max())}",
        flush=True,
    )
    await conn.execute("ALTER TABLE g ADD COLUMN IF NOT EXISTS c int")
    await conn.execute("CREATE TEMP TABLE a (id int, c int)")
    await conn.copy_records_to_table(
        "a", records=[(i, int(c)) for i, c in enumerate(assign)], columns=["id", "c"]
    )
    await conn.execute("UPDATE g SET c = a.c FROM a WHERE a.id = g.id")
    await conn.execute("DROP TABLE a")
    await conn.execute("VACUUM ANALYZE g")
    routes = np.argsort(-(qs @ centres.T), axis=1)
    for m in ms:
        for e in efc:
            t0 = time.perf_counter()
            for c in range(k):
                await conn.execute(
                    f"CREATE INDEX g_c{c} ON g USING hnsw (v vector_cosine_ops) "
                    f"WITH (m = {m}, ef_construction = {e}) WHERE c = {c}"
                )
            built = time.perf_counter() - t0
            mb = await conn.fetchval(
                "SELECT sum(pg_relation_size(indexrelid)) FROM pg_index "
                "WHERE indrelid = 'g'::regclass"
            )
            print(f"  m {m} ef_construction {e}: {k} builds {built:.1f} s, {mb / 2**20:.1f} MB")
            plan = "\n".join(
                r[0]
                for r in await conn.fetch(
                    "EXPLAIN SELECT id FROM g WHERE c = 0 ORDER BY v <=> $1 LIMIT 10", qs[0]
                )
            )
            if "Index Scan using g_c0" not in plan:
                raise SystemExit(f"the walk is not the cluster's index: {plan}")
            for ef in efs:
                await conn.execute(f"SET hnsw.ef_search = {ef}")
                for p in nprobes:
                    hits, cpu0 = 0, cpu_seconds(pid)
                    for q, truth, route in zip(qs, exact, routes, strict=True):
                        rows = []
                        for c in route[:p]:
                            rows += await conn.fetch(
                                f"SELECT id, v <=> $1 AS d FROM g WHERE c = {int(c)} "
                                "ORDER BY v <=> $1 LIMIT 10",
                                q,
                            )
                        got = {r[0] for r in sorted(rows, key=lambda r: r[1])[:10]}
                        hits += len(got & truth)
                    cpu = (cpu_seconds(pid) - cpu0) * 1000 / len(qs)
                    print(
                        f"size {len(unit)} ivf {k} probe {p} m {m:2} efc {e:3} ef_search {ef:5}: "
                        f"recall@10 {hits / (10 * len(qs)):.4f}   CPU {cpu:6.2f} ms "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
            for c in range(k):
                await conn.execute(f"DROP INDEX g_c{c}")


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", type=Path, help="a dataset kept by recall_bench.py")
    source.add_argument("--text", type=Path, help="a BEIR folder: its sentences, embedded")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--m", default="16")
    parser.add_argument("--ef-construction", default="64")
    parser.add_argument("--ef-search", default="150,200,300,400,1000")
    parser.add_argument("--sizes", default="", help="space sizes (first N vectors); all")
    parser.add_argument("--builds", type=int, default=1)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--target", type=float, default=0.98)
    parser.add_argument(
        "--probes",
        type=int,
        default=0,
        help="also N members of each space as questions (their 10 nearest others)",
    )
    parser.add_argument("--ivf", type=int, default=0, help="K clusters, a graph each")
    parser.add_argument("--ivf-probes", default="1,2", help="clusters walked per question")
    args = parser.parse_args()
    from gateway.embedded import EmbeddedPostgres

    args.work.mkdir(parents=True, exist_ok=True)
    if args.text is not None:
        vectors, qs = asyncio.run(embed_text(args.text, args.queries, args.work))
    else:
        dump = args.work / "vectors.npy"
        if not dump.exists():
            with rb.database(args.data_dir) as dsn:
                asyncio.run(export(dsn, dump))
        vectors, qs = np.load(dump), questions(args.queries, 7)
    sizes = ints(args.sizes) if args.sizes else [len(vectors)]
    print(f"{len(vectors)} vectors; sizes {sizes}", flush=True)
    with EmbeddedPostgres(args.work / "pg", database="graph") as pg:
        asyncio.run(
            measure(
                pg.dsn,
                vectors,
                qs,
                [min(s, len(vectors)) for s in sizes],
                ints(args.m),
                ints(args.ef_construction),
                ints(args.ef_search),
                args.builds,
                args.target,
                args.probes,
                args.ivf,
                tuple(ints(args.ivf_probes)),
            )
        )


if __name__ == "__main__":
    main()
