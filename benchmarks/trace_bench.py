"""traceMemory benchmark on the bundled demo dataset, over HTTP.

    python benchmarks/trace_bench.py --calls 400

Loads the demo data (the records `recall-gateway demo` loads, embeddings
included), issues a private-bound token for the demo principal, starts the
gateway on loopback and sends traceMemory sequentially for every relationship
that principal may read, round-robin, with the default bounds, evidence content
and every nested object (sources, entities). Prints p50 and p95 latency, SQL
statements per trace, the median lineage size, and for scale the p50 of a
trivial authenticated query (`viewer`) over the same client.

With ``--hub N`` it also writes (COPY) a synthetic team whose N relationships
all share one subject entity and one semantic group, and times the trace
service in-process (no HTTP) on one of them: the worst case for the lineage's
level statement and the equivalents list, which must stay bounded by the page
they return, not by the hub's size.

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

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_common import rank_below  # noqa: E402

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
        "p95_ms": rank_below(latencies, 0.95),
        "statements": statistics.median(statements),
        "statements_max": max(statements),
        "visited": statistics.median(lineage),
        "visited_max": max(lineage),
        "floor_ms": statistics.median(floor),
    }


async def hub_figures(dsn: str, n: int, repeats: int = 15) -> dict[str, float | str]:
    """Median in-process trace of one relationship among ``n`` sharing an entity,
    and why the trace stopped: a hub larger than the default bounds stops at
    ``max_edges``; a smaller one is traced whole, which is a figure too, not an
    error."""
    from gateway.services.auth import authenticate
    from gateway.services.trace import TraceService, validate

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("INSERT INTO teams (id, name) VALUES ('hub', 'Hub')")
        await conn.execute(
            "INSERT INTO principals (team_id, id, kind, display_name) "
            "VALUES ('hub', 'p', 'person', 'P')"
        )
        space = await conn.fetchval(
            "INSERT INTO memory_spaces (team_id, kind) VALUES ('hub', 'shared') RETURNING id"
        )
        await conn.execute(
            "INSERT INTO entities (team_id, id, space_id, generation, name, kind) "
            "VALUES ('hub', 'hub', $1, 1, 'Hub', 'thing')",
            space,
        )
        rels = [
            ("hub", f"r{i:06d}", space, 1, "hub", "has", str(i), "p", "group", f"Hub has {i}")
            for i in range(n)
        ]
        await conn.copy_records_to_table(
            "relationships",
            records=rels,
            columns=[
                "team_id",
                "id",
                "space_id",
                "generation",
                "subject_entity_id",
                "predicate",
                "object_value",
                "owner_principal_id",
                "semantic_group_key",
                "statement",
            ],
        )
        await conn.copy_records_to_table(
            "relationship_status_events",
            records=[("hub", space, r[1], "active") for r in rels],
            columns=["team_id", "space_id", "relationship_id", "status"],
        )
        secret = tokens.new_secret()
        await conn.execute(
            "INSERT INTO api_tokens (id, team_id, principal_id, secret_sha256, binding) "
            "VALUES ('hub-token', 'hub', 'p', $1, 'shared_only')",
            tokens.hash_secret(secret),
        )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()
    db = await Database.open(dsn, min_size=1, max_size=2)
    try:
        principal = await authenticate(db, tokens.format_token("hub-token", secret))
        service = TraceService(db)
        request = validate(relationship_id=f"r{n // 2:06d}")
        await service.trace(principal, request)  # warm-up
        latencies = []
        for _ in range(repeats):
            started = time.perf_counter()
            outcome = await service.trace(principal, request)
            latencies.append((time.perf_counter() - started) * 1000)
        stopped = outcome.stopped_reason if outcome.truncated else "not truncated"
    finally:
        await db.close()
    return {"p50_ms": statistics.median(latencies), "stopped": stopped or "truncated"}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--hub", type=int, default=0, help="also time a hub of N relationships")
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
        hub = asyncio.run(hub_figures(dsn, args.hub)) if args.hub else None
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
    if hub is not None:
        print(
            f"hub: one of {args.hub} relationships sharing an entity and a group, "
            f"in-process trace, default bounds: p50 {hub['p50_ms']:.1f} ms "
            f"(stopped: {hub['stopped']})"
        )


if __name__ == "__main__":
    main()
