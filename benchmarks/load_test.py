"""Bounded load test on loopback: fixed requests at fixed concurrency, then stop.

    python benchmarks/load_test.py --requests 2000 --concurrency 16

Starts the gateway (``recall-gateway demo``: the embedded database in a
temporary folder, the bundled demo data, a bearer token) as a child process on
a free loopback port, warms it up, then sends exactly ``--requests``
``recallMemory`` requests over ``--concurrency`` keep-alive connections, and
stops the gateway. Prints the number of failed requests (HTTP status other
than 200, or any GraphQL error: must be 0), p50/p95/max latency, throughput,
the gateway process's resident memory (VmRSS, PostgreSQL not included) when
ready, before the load and at its peak during the load (sampled every 100 ms),
and where the CPU went during the load: the gateway process against every
PostgreSQL process of its embedded server (user + system time, in CPU seconds
and as a share of the run's wall time on the machine's cores).

``--serve`` runs ``recall-gateway serve`` on a database loaded beforehand by
``load`` and ``tokens issue`` in other processes, so that the gateway's RSS
holds only what serving needs (``demo`` loads and embeds the demo data in the
serving process itself, whose allocator keeps some of that).

The client is a minimal HTTP/1.1 client on asyncio streams: httpx tops out
around 600 requests/s here, which would measure the client, not the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TypedDict

import psutil
from bench_common import free_port, rank_below, wait_ready

ROOT = Path(__file__).resolve().parents[1]
QUERIES = [
    "who owns the billing service",
    "where does the robot fleet charge",
    "latency of the payments api",
    "what changed in the last release",
]
DOCUMENTS = {
    "recall": (
        "query R($q: String) { recallMemory(query: $q, limit: 10) { results { evidenceId rank "
        "context spaceKind source { title } supportingRelationships { statement } } "
        "degradations { code } } }"
    ),
    # authentication and one small statement: the gateway's own overhead
    "viewer": "query V { viewer { principalId readableSpaces } }",
}


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else -1


class PeakRss:
    """The highest VmRSS of a process, sampled every 100 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, rss_kib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss_kib(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def postgres_processes(data_dir: Path) -> list[psutil.Process]:
    """The embedded server's postmaster and its children (backends, walwriter...)."""
    pid = int((data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
    postmaster = psutil.Process(pid)
    return [postmaster, *postmaster.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for p in processes:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


class Connection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int, token: str, document: str) -> None:
        self.port, self.token, self.document = port, token, document
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def recall(self, query: str) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        body = json.dumps({"query": self.document, "variables": {"q": query}}).encode()
        head = (
            f"POST /graphql HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Bearer {self.token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value.strip())
        payload = await self.reader.readexactly(length)
        return status, payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


class LoadResult(TypedDict):
    """What :func:`run_load` measured: answered requests, the failed ones' status
    and start of body, the wall time, latency percentiles in milliseconds."""

    requests: int
    failures: list[str]
    elapsed_s: float
    p50_ms: float
    p95_ms: float
    max_ms: float


async def run_load(
    port: int, token: str, requests: int, concurrency: int, document: str
) -> LoadResult:
    latencies: list[float] = []
    failures: list[str] = []
    counter = iter(range(requests))

    async def worker() -> None:
        conn = Connection(port, token, document)
        await conn.open()
        try:
            for i in counter:
                started = time.perf_counter()
                status, payload = await conn.recall(QUERIES[i % len(QUERIES)])
                latencies.append(time.perf_counter() - started)
                if status != 200 or b'"errors"' in payload:
                    failures.append(f"{status} {payload[:200]!r}")
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "requests": len(latencies),
        "failures": failures,
        "elapsed_s": elapsed,
        "p50_ms": statistics.median(ordered) * 1000,
        "p95_ms": rank_below(ordered, 0.95) * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def start_gateway(folder: Path, port: int, serve: bool) -> tuple[subprocess.Popen[bytes], str]:
    """The gateway on ``port`` (``demo``, or ``serve`` after ``load`` + ``tokens issue``)
    and a token: from the demo's output, or from ``tokens issue``."""
    env = {**os.environ, "RECALL_DATA_DIR": str(folder / "db"), "RECALL_LOG_LEVEL": "warning"}
    env.pop("DATABASE_URL", None)
    env.pop("RECALL_DATABASE_URL", None)
    cli = str(Path(sys.executable).parent / "recall-gateway")
    token = None
    if serve:
        demo = folder / "demo.jsonl"
        demo.write_bytes((ROOT / "gateway" / "demo" / "demo.jsonl").read_bytes())
        for args in (["load", str(demo)], ["communities", "build"]):
            subprocess.run([cli, *args], env=env, check=True, capture_output=True)  # noqa: S603
        issued = subprocess.run(  # noqa: S603
            [cli, "tokens", "issue", "--team", "northwind", "--principal", "ines"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        token = issued.stdout.strip()
    output = folder / "gateway.log"
    with output.open("wb") as sink:
        proc = subprocess.Popen(  # noqa: S603 - our own console script
            [cli, "serve" if serve else "demo", "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    if token is not None:
        return proc, token
    for _ in range(600):
        found = re.search(r"RECALL_TOKEN=(\S+)", output.read_text(errors="replace"))
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise SystemExit("the gateway exited:\n" + output.read_text(errors="replace"))
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("the gateway printed no token within 300 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--operation", choices=sorted(DOCUMENTS), default="recall")
    parser.add_argument(
        "--serve", action="store_true", help="load with the CLI first, then run `serve`"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="recall-load-") as tmp:
        port = free_port()
        proc, token = start_gateway(Path(tmp), port, args.serve)
        try:
            wait_ready(port)
            ready = rss_kib(proc.pid)
            document = DOCUMENTS[args.operation]
            asyncio.run(run_load(port, token, args.warmup, min(args.concurrency, 4), document))
            before = rss_kib(proc.pid)
            gateway = [psutil.Process(proc.pid)]
            postgres = postgres_processes(Path(tmp) / "db")
            gw_cpu, pg_cpu = cpu_seconds(gateway), cpu_seconds(postgres)
            with PeakRss(proc.pid) as peak:
                result = asyncio.run(
                    run_load(port, token, args.requests, args.concurrency, document)
                )
            # backends that started during the load count too
            postgres = postgres_processes(Path(tmp) / "db")
            gw_cpu, pg_cpu = cpu_seconds(gateway) - gw_cpu, cpu_seconds(postgres) - pg_cpu
            after = rss_kib(proc.pid)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    failures = result["failures"]
    elapsed = result["elapsed_s"]
    cores = os.cpu_count() or 1
    count = max(result["requests"], 1)
    load1, _, _ = os.getloadavg()
    print(f"requests:      {result['requests']} {args.operation} at concurrency {args.concurrency}")
    print(f"errors:        {len(failures)}")
    for f in failures[:5]:
        print(f"  {f}")
    print(
        f"latency:       p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, "
        f"max {result['max_ms']:.1f} ms"
    )
    print(f"throughput:    {result['requests'] / elapsed:.1f} requests/s ({elapsed:.1f} s)")
    print(
        f"gateway RSS:   {ready / 1024:.1f} MiB when ready, {before / 1024:.1f} MiB after warm-up, "
        f"{peak.peak / 1024:.1f} MiB peak under load, {after / 1024:.1f} MiB after"
    )
    print(
        f"CPU:           gateway {gw_cpu:.1f} s ({gw_cpu / elapsed / cores:.0%} of {cores} cores), "
        f"PostgreSQL {pg_cpu:.1f} s ({pg_cpu / elapsed / cores:.0%}); "
        f"gateway share {gw_cpu / max(gw_cpu + pg_cpu, 1e-9):.0%}; per request "
        f"gateway {gw_cpu / count * 1000:.1f} ms, PostgreSQL {pg_cpu / count * 1000:.1f} ms"
    )
    print(f"load average:  {load1:.2f} (1 min, at the end)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
