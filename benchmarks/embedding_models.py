"""Which local embedding model should be the default? Measured, per candidate, in one run.

A measuring script, not a test. For every local model of the catalogue
(``gateway.embeddings.catalog``: the providers the gateway really runs), in a
child process of its own so that memory figures do not mix:

* bulk throughput: documents per second embedding the corpus (the loader's
  path: ``provider.embed`` over the whole list, batched by the provider);
* query latency: one question embedded at a time (recall's path,
  ``embed_queries``), every test query, median and p95;
* memory: the child's resident set after loading the model and its peak
  (VmRSS / VmHWM of /proc), and the installed size of the package that ships
  the weights;
* quality: nDCG@10 and recall@10 of the vector list (exact cosine over the
  corpus vectors, numpy), and of its weighted RRF with the store's own full-text
  list (BM25 of ``gateway.store.search``, computed once in a scratch database,
  60 candidates per list as recall overfetches) by the gateway's fusion engine.

``--distractors N`` scores on a sub-corpus (every judged document plus N others
drawn with a fixed seed) when a slow candidate cannot embed the whole corpus in
the time at hand; the figures then compare the candidates with each other on
that sub-corpus, not with the full-corpus figures of docs/benchmarks.md.

    python benchmarks/embedding_models.py PATH/TO/scifact
    python benchmarks/embedding_models.py PATH/TO/scifact --models minilm --distractors 1000
    python benchmarks/embedding_models.py --conversations   # the generated chat set

``--conversations`` scores the generated conversation set of
``conversations.py`` instead of a BEIR folder: turns stored as ``speaker: text``,
questions each answered by one turn.

The dataset is read where it lies (BEIR layout) and never copied. The full-text
list needs a database: ``--database-url`` (or ``DATABASE_URL``) names a server
for a scratch database; without either an embedded PostgreSQL is started in a
temporary folder. ``--no-fulltext`` skips it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from beir_eval import (  # noqa: E402
    Dataset,
    Scores,
    check_folder,
    percentile,
    read_dataset,
    scratch_database,
    server,
)
from conversations import conversation_dataset  # noqa: E402

from gateway.embeddings import LOCAL_MODELS, embed_queries  # noqa: E402
from gateway.fusion import fuse_weighted  # noqa: E402

PER_LIST = 60  # recall's overfetch per list (gateway.services.recall.overfetch for limit 10)
SEED = 13


def subset(data: Dataset, distractors: int | None) -> Dataset:
    """Every judged document plus ``distractors`` others (fixed seed), or the whole corpus."""
    if distractors is None:
        return data
    judged = {d for docs in data.qrels.values() for d in docs}
    others = [doc for doc in data.corpus if doc[0] not in judged]
    rng = random.Random(SEED)  # noqa: S311 - a reproducible sample, not a secret
    keep = {d for d, _ in rng.sample(others, min(distractors, len(others)))} | judged
    corpus = [doc for doc in data.corpus if doc[0] in keep]
    return Dataset(corpus, data.queries, data.qrels, data.titles)


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def package_mib(distribution: str) -> float:
    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        return float("nan")
    # locate() is typed as a bare os.PathLike; on a file system it is a Path already
    paths = [Path(f.locate()) for f in files]
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


# --- the child: one model ------------------------------------------------------------


async def measure_one(key: str, data: Dataset, out: Path) -> None:
    model = LOCAL_MODELS[key]
    provider = model.make(64)
    started = time.perf_counter()
    load = getattr(provider, "load", None)
    if callable(load):
        load()
    load_s = time.perf_counter() - started
    rss_loaded = _status_kib("VmRSS")

    queries = list(data.queries.values())
    for q in queries[:5]:  # warm-up: first runs allocate
        await embed_queries(provider, [q])
    latencies = []
    query_vectors = []
    for q in queries:
        t = time.perf_counter()
        query_vectors.append((await embed_queries(provider, [q]))[0])
        latencies.append(time.perf_counter() - t)

    docs = [text for _, text in data.corpus]
    t = time.perf_counter()
    doc_vectors = await provider.embed(docs)
    bulk_s = time.perf_counter() - t
    await provider.aclose()

    np.save(out / f"{key}.docs.npy", doc_vectors)
    np.save(out / f"{key}.queries.npy", np.vstack(query_vectors))
    ms = [s * 1000 for s in latencies]
    (out / f"{key}.json").write_text(
        json.dumps(
            {
                "model_id": model.model_id,
                "load_s": load_s,
                "query_p50_ms": statistics.median(ms),
                "query_p95_ms": percentile(ms, 0.95),
                "docs_per_s": len(docs) / bulk_s,
                "bulk_s": bulk_s,
                "rss_loaded_mib": rss_loaded / 1024,
                "rss_peak_mib": _status_kib("VmHWM") / 1024,
                "package_mib": package_mib(model.package.split()[0]),
            }
        )
    )


# --- the parent: every model, then the scores -----------------------------------------


async def fulltext_lists(data: Dataset, database_url: str | None) -> list[list[str]]:
    """The store's full-text list for every query, on this corpus (no vectors loaded)."""
    from fulltext_quality import TEAM, load_corpus

    from gateway.store.database import Database
    from gateway.store.search import BranchSearch, CandidateQuery, evidence_candidates

    lists: list[list[str]] = []
    with server(database_url or os.environ.get("DATABASE_URL")) as admin_dsn:
        async with scratch_database(admin_dsn) as dsn:
            space = await load_corpus(dsn, data, None, None)
            db = await Database.open(dsn, min_size=1, max_size=2)
            try:
                branch = BranchSearch("shared", space, 1)
                for text in data.queries.values():
                    query = CandidateQuery(
                        team_id=TEAM,
                        branches=(branch,),
                        text=text,
                        vector=None,
                        entity_ids=(),
                        exclude_ids=(),
                        per_list=PER_LIST,
                        known_at=None,
                    )
                    async with db.tenant(TEAM, [space]) as conn:
                        found = await evidence_candidates(conn, query)
                    lists.append(
                        next(ids for (_, name), ids in found.items() if name == "fulltext")
                    )
            finally:
                await db.close()
    return lists


@dataclass
class Result:
    key: str
    figures: dict[str, Any]
    vector: Scores
    fused: Scores | None


def score(key: str, folder: Path, data: Dataset, fulltext: list[list[str]] | None) -> Result:
    figures = json.loads((folder / f"{key}.json").read_text())
    docs = np.load(folder / f"{key}.docs.npy")
    queries = np.load(folder / f"{key}.queries.npy")
    ids = [d for d, _ in data.corpus]
    vector = Scores.empty()
    fused = Scores.empty() if fulltext is not None else None
    for i, qid in enumerate(data.queries):
        sims = docs @ queries[i]
        top = np.argpartition(-sims, min(PER_LIST, len(ids) - 1))[:PER_LIST]
        ranked = [ids[j] for j in top[np.argsort(-sims[top])]]
        vector.add(ranked, data.qrels[qid])
        if fused is not None and fulltext is not None:
            both = fuse_weighted(
                {"fulltext": fulltext[i], "vector": ranked}, {"fulltext": 1.0, "vector": 1.0}
            )
            fused.add(both, data.qrels[qid])
    return Result(key, figures, vector, fused)


def dataset(args: argparse.Namespace) -> Dataset:
    if args.conversations:
        return conversation_dataset()
    return subset(read_dataset(args.dataset, args.split), args.distractors)


def run(args: argparse.Namespace) -> None:
    data = dataset(args)
    sub = f" (sub-corpus: judged + {args.distractors} others)" if args.distractors else ""
    name = "conversations" if args.conversations else f"{args.dataset.name} ({args.split})"
    print(
        f"{name}: {len(data.corpus)} documents{sub}, "
        f"{len(data.queries)} queries; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    fulltext = None
    if not args.no_fulltext:
        t = time.perf_counter()
        fulltext = asyncio.run(fulltext_lists(data, args.database_url))
        full = Scores.empty()
        for i, qid in enumerate(data.queries):
            full.add(fulltext[i], data.qrels[qid])
        print(full.line("full-text list (BM25)", 28), f"({time.perf_counter() - t:.0f} s)")
    results = []
    with tempfile.TemporaryDirectory(prefix="recall-embed-bench-") as tmp:
        folder = Path(tmp)
        for key in args.models:
            started = time.perf_counter()
            child = [sys.executable, __file__, "--split", args.split, "--child", key, "--out", tmp]
            child += ["--conversations"] if args.conversations else [str(args.dataset)]
            if args.distractors is not None:
                child += ["--distractors", str(args.distractors)]
            subprocess.run(child, check=True)  # noqa: S603 - this script, its own arguments
            result = score(key, folder, data, fulltext)
            results.append(result)
            print(f"measured {key} in {time.perf_counter() - started:.0f} s", flush=True)
            print(result.vector.line(f"  {key} vector list", 28))
            if result.fused is not None:
                print(result.fused.line(f"  {key} fused with BM25", 28))
    print()
    print(
        "| model | vector nDCG@10 | fused nDCG@10 | query p50 | query p95 | docs/s "
        "| RSS loaded | RSS peak | package |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f = r.figures
        fused = f"{statistics.fmean(r.fused.ndcg):.3f}" if r.fused is not None else "-"
        print(
            f"| {r.key} (`{f['model_id']}`) | {statistics.fmean(r.vector.ndcg):.3f} | {fused} "
            f"| {f['query_p50_ms']:.1f} ms | {f['query_p95_ms']:.1f} ms | {f['docs_per_s']:.1f} "
            f"| {f['rss_loaded_mib']:.0f} MiB | {f['rss_peak_mib']:.0f} MiB "
            f"| {f['package_mib']:.0f} MiB |"
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "dataset", type=Path, nargs="?", help="BEIR-layout folder (read, never copied)"
    )
    parser.add_argument(
        "--conversations", action="store_true", help="the generated conversation set instead"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(LOCAL_MODELS),
        choices=list(LOCAL_MODELS),
        help="catalogue keys to measure (default: all)",
    )
    parser.add_argument("--distractors", type=int, help="sub-corpus: judged + N other documents")
    parser.add_argument("--no-fulltext", action="store_true", help="skip the BM25 list and RRF")
    parser.add_argument("--database-url", help="server for the scratch database")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.conversations:
        if args.dataset is None:
            parser.error("name a BEIR folder or give --conversations")
        problem = check_folder(args.dataset, args.split)
        if problem:
            parser.error(problem)
    if args.child:
        asyncio.run(measure_one(args.child, dataset(args), args.out))
        return
    run(args)


if __name__ == "__main__":
    main()
