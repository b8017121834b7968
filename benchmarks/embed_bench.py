"""Local model throughput: texts/s of the loader's kind of call, by how it is cut into runs.

A measuring script, not a test. Reads a BEIR-layout folder (its
``corpus.jsonl`` and ``queries.jsonl``) and, for each configuration of the
local MiniLM provider, embeds ``--texts`` documents in one call (what the
loader sends) and prints texts/s, the CPU used (user and system seconds, and
cores busy on average), minor page faults per text and the peak RSS during
the call. Then the latency of single test queries (the recall path), alone and
while a bulk call runs on the same provider (the model is shared by both).

    python benchmarks/embed_bench.py --beir PATH_TO_SCIFACT
    python benchmarks/embed_bench.py --beir PATH_TO_SCIFACT --texts 500 \\
        --configs 64:inf:1,1:inf:1,4:inf:1,16:inf:1,64:256:2

A configuration is ``batch:budget:workers[:threads]``: at most ``batch``
texts per run, at most ``budget`` padded tokens per run (``inf``: none, one
padded run per ``batch`` texts of similar length, the former behaviour),
``workers`` bulk runs at once, ``threads`` onnxruntime threads per run
(default 2). ``64:inf:1:2`` is the provider as it was before the runs were
cut by tokens. ``int8[:workers[:threads]]`` is the ``minilm-int8`` model (one
text per run). Every configuration is loaded first and the ``--rounds`` are
interleaved; each line also gives the CPU per text and the cosine of every
vector with the first configuration's (its agreement with it). ``--statements`` adds one short statement per document (as the
loader's relationships add), so the call has the SciFact load's mix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from bench_common import rank_of_count as percentile  # noqa: E402

from gateway.embeddings.local import LocalEmbeddingProvider  # noqa: E402
from gateway.embeddings.local_int8 import LocalInt8EmbeddingProvider  # noqa: E402

UNLIMITED = 10**9


def read_corpus(folder: Path, limit: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    with (folder / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            title = str(doc.get("title") or "").strip()
            out.append((title, f"{title} {doc.get('text', '')}".strip()))
            if len(out) >= limit:
                break
    return out


def read_queries(folder: Path, limit: int) -> list[str]:
    with (folder / "queries.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f][:limit]


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so each call gets its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def parse_config(text: str) -> tuple[int, int, int, int]:
    batch, budget, workers, *threads = text.split(":")
    return (
        int(batch),
        UNLIMITED if budget == "inf" else int(budget),
        int(workers),
        int(threads[0]) if threads else 2,
    )


async def query_latencies(provider: LocalEmbeddingProvider, queries: list[str]) -> list[float]:
    out = []
    for query in queries:
        start = time.perf_counter()
        await provider.embed([query])
        out.append((time.perf_counter() - start) * 1000)
    return out


async def bulk(
    provider: LocalEmbeddingProvider, texts: list[str]
) -> tuple[dict[str, float], np.ndarray]:
    reset_peak_rss()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    vectors = await provider.embed(texts)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "cpu_ms_per_text": (user + system) * 1000 / len(texts),
        "texts_per_s": len(texts) / wall,
        "wall_s": wall,
        "user_s": user,
        "system_s": system,
        "cores": (user + system) / wall,
        "faults_per_text": (after.ru_minflt - before.ru_minflt) / len(texts),
        "peak_rss_mib": peak_rss_mib(),
    }, vectors


def make_provider(config: str) -> tuple[str, LocalEmbeddingProvider]:
    """A provider and its label; ``int8[:workers[:threads]]`` is the minilm-int8 model."""
    if config.startswith("int8"):
        _, *rest = config.split(":")
        workers = int(rest[0]) if rest else None
        threads = int(rest[1]) if len(rest) > 1 else 2
        label = f"minilm-int8, one text per run, workers {workers or threads}, threads {threads}"
        return label, LocalInt8EmbeddingProvider(bulk_workers=workers, threads=threads)
    batch, budget, workers, threads = parse_config(config)
    label = (
        f"batch {batch}, budget {'none' if budget == UNLIMITED else budget}, "
        f"workers {workers}, threads {threads}"
    )
    return label, LocalEmbeddingProvider(
        batch_size=batch, token_budget=budget, bulk_workers=workers, threads=threads
    )


async def run_configs(
    configs: list[str], texts: list[str], queries: list[str], rounds: int
) -> None:
    """Every configuration loaded at once, then the rounds interleaved (A, B, A, B...).

    Interleaving spreads the other work of a shared host over every
    configuration alike. Peak RSS then counts every loaded session, not only
    the measured one. The agreement column is the cosine of each text's
    vector with the first configuration's.
    """
    providers = [make_provider(config) for config in configs]
    width = max(len(label) for label, _ in providers)
    first: np.ndarray | None = None
    try:
        for label, provider in providers:
            started = time.perf_counter()
            await provider.embed(["load the model"])
            print(f"{label:{width}s} loaded in {time.perf_counter() - started:.2f} s", flush=True)
        for _ in range(rounds):
            for label, provider in providers:
                figures, vectors = await bulk(provider, texts)
                if first is None:
                    first = vectors
                cosines = (vectors * first).sum(axis=1)
                print(
                    f"{label:{width}s} {figures['texts_per_s']:7.2f} texts/s  "
                    f"{figures['wall_s']:7.1f} s  "
                    f"user {figures['user_s']:6.1f} s  sys {figures['system_s']:5.1f} s  "
                    f"CPU/text {figures['cpu_ms_per_text']:6.1f} ms  "
                    f"cores {figures['cores']:4.2f}  faults/text {figures['faults_per_text']:6.0f}  "
                    f"peak RSS {figures['peak_rss_mib']:6.0f} MiB  "
                    f"cosine min {cosines.min():.4f} mean {cosines.mean():.4f}",
                    flush=True,
                )
        for label, provider in providers if queries else []:
            alone = await query_latencies(provider, queries)
            load = asyncio.ensure_future(provider.embed(texts))
            await asyncio.sleep(0.2)
            during = await query_latencies(provider, queries)
            still_running = not load.done()
            await load
            print(
                f"{label:{width}s} query alone p50 {statistics.median(alone):6.1f} ms "
                f"p95 {percentile(alone, 0.95):6.1f} ms; during a bulk call p50 "
                f"{statistics.median(during):6.1f} ms p95 {percentile(during, 0.95):6.1f} ms"
                + ("" if still_running else " (the bulk call ended first)"),
                flush=True,
            )
    finally:
        for _, provider in providers:
            await provider.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beir", type=Path, required=True, help="BEIR-layout folder")
    parser.add_argument("--texts", type=int, default=256, help="documents per bulk call")
    parser.add_argument("--statements", action="store_true", help="add a statement per document")
    parser.add_argument("--queries", type=int, default=50, help="test queries timed (0: none)")
    parser.add_argument("--rounds", type=int, default=1, help="bulk calls per configuration")
    parser.add_argument(
        "--configs",
        default="64:inf:1,1:inf:1,4:inf:1,16:inf:1,64:256:2",
        help="comma-separated batch:budget:workers (see the module's docstring)",
    )
    args = parser.parse_args()
    docs = read_corpus(args.beir, args.texts)
    texts = [text for _, text in docs]
    if args.statements:
        texts += [f"{title} has_abstract" for title, _ in docs]
    queries = read_queries(args.beir, args.queries) if args.queries else []
    load = os.getloadavg()
    print(f"{len(texts)} texts per bulk call, {len(queries)} queries; load average {load[0]:.2f}")
    await run_configs(args.configs.split(","), texts, queries, args.rounds)
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
