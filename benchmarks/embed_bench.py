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
cut by tokens. ``--statements`` adds one short statement per document (as the
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

from gateway.embeddings.local import LocalEmbeddingProvider  # noqa: E402

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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def query_latencies(provider: LocalEmbeddingProvider, queries: list[str]) -> list[float]:
    out = []
    for query in queries:
        start = time.perf_counter()
        await provider.embed([query])
        out.append((time.perf_counter() - start) * 1000)
    return out


async def bulk(provider: LocalEmbeddingProvider, texts: list[str]) -> dict[str, float]:
    reset_peak_rss()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    await provider.embed(texts)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "texts_per_s": len(texts) / wall,
        "wall_s": wall,
        "user_s": user,
        "system_s": system,
        "cores": (user + system) / wall,
        "faults_per_text": (after.ru_minflt - before.ru_minflt) / len(texts),
        "peak_rss_mib": peak_rss_mib(),
    }


async def run_config(
    config: tuple[int, int, int, int], texts: list[str], queries: list[str], rounds: int
) -> None:
    batch, budget, workers, threads = config
    provider = LocalEmbeddingProvider(
        batch_size=batch, token_budget=budget, bulk_workers=workers, threads=threads
    )
    label = (
        f"batch {batch}, budget {'none' if budget == UNLIMITED else budget}, "
        f"workers {workers}, threads {threads}"
    )
    try:
        await provider.embed(["load the model"])
        for _ in range(rounds):
            figures = await bulk(provider, texts)
            print(
                f"{label:46s} {figures['texts_per_s']:7.2f} texts/s  {figures['wall_s']:7.1f} s  "
                f"user {figures['user_s']:6.1f} s  sys {figures['system_s']:5.1f} s  "
                f"cores {figures['cores']:4.2f}  faults/text {figures['faults_per_text']:8.0f}  "
                f"peak RSS {figures['peak_rss_mib']:6.0f} MiB",
                flush=True,
            )
        if queries:
            alone = await query_latencies(provider, queries)
            load = asyncio.ensure_future(provider.embed(texts))
            await asyncio.sleep(0.2)
            during = await query_latencies(provider, queries)
            still_running = not load.done()
            await load
            print(
                f"{label:46s} query alone p50 {statistics.median(alone):6.1f} ms "
                f"p95 {percentile(alone, 0.95):6.1f} ms; during a bulk call p50 "
                f"{statistics.median(during):6.1f} ms p95 {percentile(during, 0.95):6.1f} ms"
                + ("" if still_running else " (the bulk call ended first)"),
                flush=True,
            )
    finally:
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
    for config in args.configs.split(","):
        await run_config(parse_config(config), texts, queries, args.rounds)
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
