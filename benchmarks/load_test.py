"""Bounded load test on loopback: fixed requests at fixed concurrency, then stop.

    python benchmarks/load_test.py --requests 2000 --concurrency 16

Starts the gateway (``recall-gateway demo``: the embedded database in a
temporary folder, the bundled demo data, a bearer token) as a child process on
a free loopback port, warms it up, then sends exactly ``--requests``
``recallMemory`` requests over ``--concurrency`` keep-alive connections, and
stops the gateway. Prints the number of failed requests (HTTP status other
than 200, or any GraphQL error: must be 0), p50/p95/max latency, throughput,
and the gateway process's resident memory (VmRSS, PostgreSQL not included)
before and after the load.

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
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else -1


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


async def run_load(
    port: int, token: str, requests: int, concurrency: int, document: str
) -> dict[str, object]:
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
        "p95_ms": ordered[int(0.95 * (len(ordered) - 1))] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def start_gateway(folder: Path, port: int) -> tuple[subprocess.Popen[bytes], str]:
    """``recall-gateway demo`` on ``port``; its output goes to a file we read the token from."""
    env = {**os.environ, "RECALL_DATA_DIR": str(folder / "db"), "RECALL_LOG_LEVEL": "warning"}
    env.pop("DATABASE_URL", None)
    env.pop("RECALL_DATABASE_URL", None)
    output = folder / "gateway.log"
    with output.open("wb") as sink:
        proc = subprocess.Popen(  # noqa: S603 - our own console script
            [str(Path(sys.executable).parent / "recall-gateway"), "demo", "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    for _ in range(600):
        found = re.search(r"RECALL_TOKEN=(\S+)", output.read_text(errors="replace"))
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise SystemExit("the gateway exited:\n" + output.read_text(errors="replace"))
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("the gateway printed no token within 300 s")


def wait_ready(port: int) -> None:
    import urllib.request

    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the gateway never said ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--operation", choices=sorted(DOCUMENTS), default="recall")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="recall-load-") as tmp:
        port = free_port()
        proc, token = start_gateway(Path(tmp), port)
        try:
            wait_ready(port)
            document = DOCUMENTS[args.operation]
            asyncio.run(run_load(port, token, args.warmup, min(args.concurrency, 4), document))
            before = rss_kib(proc.pid)
            result = asyncio.run(run_load(port, token, args.requests, args.concurrency, document))
            after = rss_kib(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    failures = result["failures"]
    assert isinstance(failures, list)
    print(f"requests:      {result['requests']} {args.operation} at concurrency {args.concurrency}")
    print(f"errors:        {len(failures)}")
    for f in failures[:5]:
        print(f"  {f}")
    print(
        f"latency:       p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, "
        f"max {result['max_ms']:.1f} ms"
    )
    print(
        f"throughput:    {result['requests'] / result['elapsed_s']:.0f} requests/s "  # type: ignore[operator]
        f"({result['elapsed_s']:.1f} s)"
    )
    print(
        f"gateway RSS:   {before / 1024:.1f} MiB before, {after / 1024:.1f} MiB after "
        f"({(after - before) / 1024:+.1f} MiB)"
    )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
