"""traceMemory benchmark on the bundled demo dataset, over HTTP.

    python benchmarks/trace_bench.py --calls 400

Loads the demo data (the records `recall-gateway demo` loads, embeddings
included), issues a private-bound token for the demo principal, starts the
gateway on loopback and sends traceMemory sequentially for every relationship
that principal may read, round-robin, with the default bounds, evidence content
and every nested object (sources, entities). Prints p50 and p95 latency, SQL
statements per trace, the median lineage size, and for scale the p50 of a
trivial authenticated query (`viewer`) over the same client.

With no DATABASE_URL, an embedded server is started in a temporary folder and
removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway import tokens  # noqa: E402
from gateway.cli import DEMO_TEAM, demo_dataset  # noqa: E402
from gateway.embeddings import create_provider  # noqa: E402
from gateway.services import loader  # noqa: E402
from gateway.services.records import TokenRecord  # noqa: E402
from gateway.services.writes import Actor, WriteService  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.store.database import Database, prepare  # noqa: E402

PRINCIPAL = "ines"

QUERY = """query($id: ID!) { traceMemory(relationshipId: $id, includeEvidenceContent: true) {
  relationship { id statement status subject { name } object { name } }
  validAtView semanticGroup
  evidence { supportId evidenceId decision supportsAtView quote content source { title authority } }
  evidenceTotal
  events { kind recordedAt status decision conflictEvent supportId caseId reason }
  equivalents { id ownerId status }
  conflicts { id question state positions { id disposition relationshipIds supporterCount } }
  lineage { depth relationship { id statement status } viaEntity { name } validAtView
            events { kind status } }
  visited { relationshipCount entityCount depthReached }
  truncated stoppedReason stoppedReasons } }"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def database() -> Iterator[str]:
    given = os.environ.get("DATABASE_URL")
    if given:
        yield given
        return
    from gateway.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="trace-bench-") as folder:
        server = EmbeddedPostgres(Path(folder), database="bench")
        server.start()
        try:
            yield server.dsn
        finally:
            server.stop()


async def load_demo(dsn: str) -> tuple[str, list[str]]:
    """Load the demo data; a token for the demo principal and the IDs it may read."""
    await prepare(dsn, migrate=True)
    db = await Database.open(dsn, min_size=1, max_size=2)
    embedder = create_provider(Settings(embedding_provider="local"))
    try:
        writes = WriteService(db, embedder)
        records = loader.parse(demo_dataset())
        await loader.load(writes, records, batch_size=500, actor=Actor.operator())
        token_id, secret = tokens.new_token_id(), tokens.new_secret()
        record = TokenRecord(
            kind="token",
            team=DEMO_TEAM,
            id=token_id,
            principal=PRINCIPAL,
            binding="private",
            secret=secret,
        )
        await writes.apply([record], Actor.operator())
        async with db.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT r.id FROM relationships r JOIN memory_spaces s "
                "ON s.team_id = r.team_id AND s.id = r.space_id "
                "WHERE r.team_id = $1 AND (s.kind = 'shared' OR s.owner_principal_id = $2) "
                "ORDER BY r.id",
                DEMO_TEAM,
                PRINCIPAL,
            )
            await conn.execute("ANALYZE")
    finally:
        await db.close()
        await embedder.aclose()
    return tokens.format_token(token_id, secret), [r["id"] for r in rows]


def serve(dsn: str, port: int) -> tuple[Any, Any, threading.Thread]:
    """The gateway on loopback in a thread; returns (uvicorn server, app, thread)."""
    import uvicorn

    from gateway.app import create_app

    app = create_app(Settings(database_url=dsn, migrate_on_start=False))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return server, app, thread
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("the gateway did not become ready")


def measure(port: int, token: str, ids: list[str], calls: int, app: Any) -> dict[str, float]:
    counter = app.state.services.db.counter
    latencies, statements, lineage = [], [], []
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

        def call(rel_id: str) -> dict[str, Any]:
            r = client.post(
                "/graphql", json={"query": QUERY, "variables": {"id": rel_id}}, headers=headers
            )
            body: dict[str, Any] = r.json()
            if "errors" in body:
                raise SystemExit(f"trace of {rel_id} failed: {body['errors']}")
            trace: dict[str, Any] = body["data"]["traceMemory"]
            return trace

        for rel_id in ids:  # warm-up: plans, caches
            call(rel_id)
        floor = []  # HTTP, authentication and GraphQL for a trivial query, for scale
        for _ in range(min(calls, 100)):
            started = time.perf_counter()
            client.post("/graphql", json={"query": "{ viewer { principalId } }"}, headers=headers)
            floor.append((time.perf_counter() - started) * 1000)
        for i in range(calls):
            rel_id = ids[i % len(ids)]
            before = counter.count
            started = time.perf_counter()
            trace = call(rel_id)
            latencies.append((time.perf_counter() - started) * 1000)
            statements.append(counter.count - before)
            lineage.append(trace["visited"]["relationshipCount"])
    latencies.sort()
    return {
        "p50_ms": statistics.median(latencies),
        "p95_ms": latencies[int(0.95 * (len(latencies) - 1))],
        "statements": statistics.median(statements),
        "statements_max": max(statements),
        "visited": statistics.median(lineage),
        "visited_max": max(lineage),
        "floor_ms": statistics.median(floor),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--port", type=int, default=8791)
    args = parser.parse_args()
    with database() as dsn:
        started = time.perf_counter()
        token, ids = asyncio.run(load_demo(dsn))
        log(f"demo data loaded in {time.perf_counter() - started:.1f} s; {len(ids)} relationships")
        server, app, thread = serve(dsn, args.port)
        try:
            f = measure(args.port, token, ids, args.calls, app)
        finally:
            server.should_exit = True
            thread.join(timeout=30)  # the pool closes before the database stops
    print(f"dataset: the demo data, principal {PRINCIPAL} ({len(ids)} readable relationships)")
    print(f"traceMemory over HTTP, {args.calls} calls, default bounds, sequential:")
    print(f"  p50 {f['p50_ms']:.1f} ms   p95 {f['p95_ms']:.1f} ms")
    print(
        f"  SQL statements per trace: median {f['statements']:.0f}, max {f['statements_max']:.0f}"
    )
    print(
        f"  relationships visited per trace: median {f['visited']:.0f}, max {f['visited_max']:.0f}"
    )
    print(
        f"for scale, {{ viewer {{ principalId }} }} over the same client: p50 {f['floor_ms']:.1f} ms"
    )


if __name__ == "__main__":
    main()
