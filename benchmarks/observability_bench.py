"""What tracing costs a recall: recallMemory over HTTP with tracing off and on, A/B in one run.

    python benchmarks/observability_bench.py --evidence 5000 --teams 5 --queries 100

Generates recall_bench's dataset once, then alternates rounds: tracing off (the
default: no exporter configured; the request log line and Prometheus samples
are always kept) and tracing on (OpenTelemetry SDK, OTLP/HTTP exporter with a
batch processor sending to a sink on loopback, asgi and asyncpg
instrumentation: every span a production setup records). asyncpg's
instrumentation patches the driver for the whole process, so it is removed
before each "off" round. Prints p50 and p95 per arm over all rounds, the
ratio of the medians, and the spans the sink received.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import recall_bench as rb
from bench_common import rank_below

from gateway.store.database import prepare


class Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that accepts and drops every export."""

    received = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        self.rfile.read(length)
        Sink.received += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def serve(dsn: str, port: int, traced: bool) -> tuple[Any, Any]:
    from gateway.observability import Observability
    from gateway.observability.tracing import uninstrument_asyncpg

    if not traced:  # what a process without an exporter gets (the variables are set here)
        uninstrument_asyncpg()
        return rb.serve(dsn, port, Observability(metrics_enabled=True))
    observability = Observability.from_environment(metrics_enabled=True)
    if observability.provider is None:
        raise SystemExit("tracing did not turn on")
    return rb.serve(dsn, port, observability)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evidence", type=int, default=5000)
    parser.add_argument("--teams", type=int, default=5)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8795)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    # Both arms keep their request log line and metrics; the lines are not printed.
    logging.getLogger("gateway.request").setLevel(logging.WARNING)
    sink = ThreadingHTTPServer(("127.0.0.1", args.port + 1), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{args.port + 1}"
    os.environ["OTEL_TRACES_EXPORTER"] = "otlp"

    corpus = rb.Zipf(np.random.default_rng(args.seed + 3))
    arms: dict[str, list[float]] = {"off": [], "on": []}
    with rb.database() as dsn:
        asyncio.run(prepare(dsn, migrate=True))
        data = asyncio.run(rb.generate(dsn, args.evidence, args.teams, args.seed, corpus, False))
        rng = np.random.default_rng(args.seed + 2)
        queries = [
            corpus.query(rng, int(rng.integers(0, len(rb.TOPICS)))) for _ in range(args.queries)
        ]
        for round_ in range(args.rounds):
            for arm in ("off", "on"):
                server, _app = serve(dsn, args.port, traced=arm == "on")
                try:
                    latencies = _latencies(args.port, data["token"], queries)
                finally:
                    server.should_exit = True
                    time.sleep(1.0)
                arms[arm] += latencies
                rb.log(f"round {round_ + 1} {arm}: p50 {statistics.median(latencies):.1f} ms")
    load = os.getloadavg()
    print(
        f"recallMemory over HTTP, {args.queries} queries x {args.rounds} rounds per arm, "
        f"{args.evidence} evidence, {args.teams} teams; load average {load[0]:.2f}"
    )
    for arm, values in arms.items():
        values.sort()
        print(
            f"  tracing {arm:3}: p50 {statistics.median(values):6.1f} ms   "
            f"p95 {rank_below(values, 0.95):6.1f} ms"
        )
    ratio = statistics.median(arms["on"]) / statistics.median(arms["off"])
    print(f"  on/off ratio of medians: {ratio:.3f}; OTLP exports received: {Sink.received}")
    marked, plain = stage_overhead()
    print(
        f"  a recall stage with tracing off: {marked:.0f} ns per call against {plain:.0f} ns "
        f"unmarked ({marked - plain:.0f} ns more; a recall passes about 10 stages)"
    )


def stage_overhead(calls: int = 200_000) -> tuple[float, float]:
    """Nanoseconds per call of an awaited no-op coroutine with and without the stage
    decorator, no stage tracer set (tracing off), interleaved, best of five."""
    from gateway.stages import stage

    async def plain() -> None:
        return None

    marked = stage("bench")(plain)

    async def loop(fn: Any) -> float:
        started = time.perf_counter_ns()
        for _ in range(calls):
            await fn()
        return (time.perf_counter_ns() - started) / calls

    async def measure() -> tuple[float, float]:
        best = [float("inf"), float("inf")]
        for _ in range(5):
            best[0] = min(best[0], await loop(marked))
            best[1] = min(best[1], await loop(plain))
        return best[0], best[1]

    return asyncio.run(measure())


def _latencies(port: int, token: str, queries: list[str]) -> list[float]:
    out = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        headers = {"Authorization": f"Bearer {token}"}
        for q in queries[:5]:  # warm-up: model, plans, caches
            client.post(
                "/graphql", json={"query": rb.QUERY, "variables": {"q": q}}, headers=headers
            )
        for q in queries:
            body = {"query": rb.QUERY, "variables": {"q": q}}
            started = time.perf_counter()
            answer = client.post("/graphql", json=body, headers=headers).json()
            out.append((time.perf_counter() - started) * 1000)
            if "errors" in answer:
                raise SystemExit(f"recall failed: {answer['errors']}")
    return out


if __name__ == "__main__":
    main()
