"""The timeline of a recall: when its statements run against its query embedding.

    python benchmarks/recall_timeline.py --data-dir HELD100K --queries 60
    python benchmarks/recall_timeline.py --data-dir HELD100K --queries 60 --contention
    python benchmarks/recall_timeline.py --data-dir HELD100K --queries 60 --evidence-only

A recall embeds its question while it reads the view, and its first round (the
candidate lists) needs the embedding. This script shows how the two overlap: a
gateway app in this process (on a dataset kept by ``recall_bench.py
--data-dir``) answers full recalls of fresh questions (never in the query
embedding LRU), and per recall it records, in milliseconds from the request's
start: each statement's send and answer (the driver's query logger: its answer
time less its elapsed time), each stage of :mod:`gateway.stages`, and the model
run of the query embedding in its inference thread (wall and the thread's own
CPU). It prints the medians of each event's start and end, and the idle time:
from the last statement before the first round to the first round's send.

``--contention`` then asks what running the lexical lists *during* the model
run would cost the model: per question, (a) the model run alone, (b) the
full-text lists alone (evidence and relationship discovery, each its own
statement, in a tenant transaction with the recall's plan mode), (c) both at
once (the statements sent, then the model run started); for the shipped
provider and one with a single inference thread. Medians of each, and of the
wall time of (c) against (a) + (b): what overlapping them could save on this
machine (2 cores shared by the model's threads and the PostgreSQL backend).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_ab as ab
import recall_bench as rb
from bench_common import p50_p95

import gateway.store.database as database_module
from gateway.stages import stage_tracer


class _Span:
    def __init__(self, out: list[tuple[str, float, float]], name: str) -> None:
        self.out, self.name = out, name

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.out.append((self.name, started, time.perf_counter()))


class RecordingTracer:
    """Just enough of an OpenTelemetry tracer for :func:`gateway.stages.stage`."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []

    def start_as_current_span(self, name: str) -> contextlib.AbstractContextManager[None]:
        return _Span(self.spans, name).run()


class TimedStatements(database_module.StatementCounter):
    """The pool's statement counter that keeps each statement's (step, sent, answered)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, float, float]] = []

    def __call__(self, record: object) -> None:
        before = self.count
        answered = time.perf_counter()
        super().__call__(record)
        if self.count != before:
            elapsed = float(getattr(record, "elapsed", 0.0) or 0.0)
            step = ab.statement_step(str(getattr(record, "query", "")))
            self.events.append((step, answered - elapsed, answered))


def _local_provider(embedder: Any) -> Any:
    """The local provider under the app's (possibly model-following) provider."""
    return getattr(embedder, "current", embedder)


def time_model_runs(provider: Any, out: list[tuple[str, float, float, float]]) -> None:
    """Record each model run of ``provider``'s request lane: (name, start, end, thread CPU)."""
    original = provider._embed_now

    def timed(texts: list[str]) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(texts)
        finally:
            out.append(("model run", started, time.perf_counter(), time.thread_time() - cpu))

    provider._embed_now = timed


async def timeline(
    gw: ab.Gateway, questions: list[str], document: str = rb.FULL
) -> list[dict[str, tuple[float, float]]]:
    counter: TimedStatements = gw.app.state.services.db.counter
    runs: list[tuple[str, float, float, float]] = []
    time_model_runs(_local_provider(gw.app.state.services.recall.embedder), runs)
    recalls = []
    for i, question in enumerate(questions):
        tracer = RecordingTracer()
        await asyncio.sleep(0)
        counter.events.clear()
        runs.clear()
        started = time.perf_counter()
        with stage_tracer(tracer):  # type: ignore[arg-type]
            r = await gw.client.post(
                "/graphql",
                json={"query": document, "variables": {"q": question}},
                headers=gw.headers,
            )
        ended = time.perf_counter()
        await asyncio.sleep(0)
        if "errors" in r.json():
            raise SystemExit(f"recall failed: {r.json()['errors']}")
        if i < ab.WARM:
            continue
        events: dict[str, tuple[float, float]] = {"request": (0.0, (ended - started) * 1000)}
        for name, t0, t1 in tracer.spans:
            events.setdefault(name, ((t0 - started) * 1000, (t1 - started) * 1000))
        for step, t0, t1 in counter.events:
            events.setdefault("sql " + step, ((t0 - started) * 1000, (t1 - started) * 1000))
        for name, t0, t1, cpu in runs:
            events[name] = ((t0 - started) * 1000, (t1 - started) * 1000)
            events["model run thread CPU"] = (0.0, cpu * 1000)
        recalls.append(events)
    return recalls


def report_timeline(recalls: list[dict[str, tuple[float, float]]]) -> None:
    names = sorted(
        {n for r in recalls for n in r},
        key=lambda n: statistics.median(r[n][0] for r in recalls if n in r),
    )
    print(f"  {'event':34}{'start':>8}{'end':>8}{'length':>8}   (medians, ms from the request)")
    for name in names:
        got = [r[name] for r in recalls if name in r]
        start = statistics.median(s for s, _ in got)
        end = statistics.median(e for _, e in got)
        length = statistics.median(e - s for s, e in got)
        print(f"  {name:34}{start:8.2f}{end:8.2f}{length:8.2f}   ({len(got)} recalls)")
    gaps = [
        r["sql first round"][0]
        - max(e for n, (_, e) in r.items() if n.startswith("sql ") and e < r["sql first round"][0])
        for r in recalls
        if "sql first round" in r
    ]
    if gaps:
        print(f"  idle connection before the first round: median {statistics.median(gaps):.2f} ms")


async def contention(gw: ab.Gateway, questions: list[str]) -> None:
    """Model run and full-text lists alone and at once (module doc)."""
    from gateway.embeddings.local import LocalEmbeddingProvider
    from gateway.services.recall_input import LIMITS
    from gateway.services.recall_types import overfetch
    from gateway.store import related, search

    shipped = _local_provider(gw.app.state.services.recall.embedder)
    one = LocalEmbeddingProvider(threads=1)
    per_list = overfetch(LIMITS["limit"].default)
    per_discovery = overfetch(
        max(LIMITS["relationshipLimit"].default, LIMITS["communityLimit"].default)
    )
    branch = (search.BranchSearch("shared", gw.space, gw.generation),)
    db = gw.app.state.services.db
    mode = gw.app.state.services.recall.plan_cache_mode
    results: dict[str, dict[str, list[float]]] = {}
    try:
        async with db.unit(gw.team, [gw.space], plan_cache_mode=mode) as unit, unit.step() as conn:
            now = await conn.fetchval("SELECT now()")

            async def lexical(question: str) -> float:
                started = time.perf_counter()
                q = search.CandidateQuery(gw.team, branch, question, None, (), (), per_list, None)
                await conn.fetch(*_flat(search.build_statement(q, ["fulltext"])))
                d = related.DiscoveryQuery(
                    gw.team,
                    gw.space,
                    gw.generation,
                    [gw.space],
                    now,
                    now,
                    question,
                    None,
                    per_discovery,
                    (),
                    (),
                    (),
                )
                await conn.fetch(*_flat(related.build_discovery(d)))
                return (time.perf_counter() - started) * 1000

            async def model(provider: Any, question: str) -> float:
                started = time.perf_counter()
                await provider.embed([question])
                return (time.perf_counter() - started) * 1000

            for name, provider in (("2 threads (shipped)", shipped), ("1 thread", one)):
                got = results.setdefault(name, {})
                for i, question in enumerate(questions):
                    alone_m = await model(provider, question + " a")
                    alone_l = await lexical(question + " a")
                    started = time.perf_counter()
                    lex = asyncio.ensure_future(lexical(question + " b"))
                    await asyncio.sleep(0)  # the statements go out first
                    both_m = await model(provider, question + " b")
                    both_l = await lex
                    wall = (time.perf_counter() - started) * 1000
                    if i < ab.WARM:
                        continue
                    for key, v in (
                        ("model alone", alone_m),
                        ("lexical alone", alone_l),
                        ("sum alone", alone_m + alone_l),
                        ("model beside lexical", both_m),
                        ("lexical beside model", both_l),
                        ("wall of both at once", wall),
                        ("saved", alone_m + alone_l - wall),
                    ):
                        got.setdefault(key, []).append(v)
    finally:
        await one.aclose()
    for name, got in results.items():
        print(f"  query embedding with {name}:")
        for key, values in got.items():
            p50, p95 = p50_p95(values)
            print(f"    {key:26} p50 {p50:6.2f} ms   p95 {p95:6.2f} ms")


def _flat(statement: tuple[str, list[Any]]) -> list[Any]:
    sql, args = statement
    return [sql, *args]


async def run(dsn: str, n: int, contend: bool, evidence_only: bool = False) -> None:
    await database_module.prepare(dsn, migrate=True)
    data = await rb.reuse(dsn, 7)
    if data is None:
        raise SystemExit("no dataset in that folder: run recall_bench.py with --data-dir first")
    at = await rb.known_instant(dsn, "bench-00")
    async with contextlib.AsyncExitStack() as stack:
        gw = await ab.open_gateway(
            stack,
            "gw",
            dsn,
            data["token"],
            at,
            "bench-00",
            data["teams"]["bench-00"],
            counter=TimedStatements,
        )
        # Fresh questions: none in the LRU, so every recall runs the model.
        rng = np.random.default_rng(33)
        corpus = rb.Zipf(np.random.default_rng(10))
        questions = [
            corpus.query(rng, int(rng.integers(0, len(rb.TOPICS)))) for _ in range(n + ab.WARM)
        ]
        load = os.getloadavg()[0]
        document, kind = (rb.EVIDENCE_ONLY, "evidence-only") if evidence_only else (rb.FULL, "full")
        recalls = await timeline(gw, questions, document)
        print(
            f"{len(recalls)} {kind} recalls of fresh questions (load average {load:.1f} -> "
            f"{os.getloadavg()[0]:.1f}; {threading.active_count()} threads in this process)"
        )
        report_timeline(recalls)
        if contend:
            load = os.getloadavg()[0]
            await contention(gw, questions)
            print(f"  (load average {load:.1f} -> {os.getloadavg()[0]:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--contention", action="store_true")
    parser.add_argument(
        "--evidence-only",
        action="store_true",
        help="evidence-only recalls (relationshipLimit 0, communityLimit 0) instead of full ones",
    )
    args = parser.parse_args()
    with rb.database(args.data_dir) as dsn:
        asyncio.run(run(dsn, args.queries, args.contention, args.evidence_only))


if __name__ == "__main__":
    main()
