"""Read replicas: recalls per second with the primary alone and with one streaming
replica, and what the consistency check adds.

    python benchmarks/replica_bench.py --recalls 300 --clients 8

Starts an embedded primary in a temporary folder, loads the bundled demo data,
makes a streaming replica of it with ``pg_basebackup`` (the embedded binaries)
and runs, in one process, three gateways on it side by side, in alternating
rounds so that load drift hits each alike:

- ``primary``: no read replicas (the single-machine set-up);
- ``replica``: the replica in rotation; clients send no position, so every
  read asks the primary for its position first and waits (up to
  RECALL_REPLICA_WAIT_MS) for the replica to have replayed it;
- ``replica+position``: clients send back the position of the last answer
  they saw (read-your-writes without a primary round trip).

Each recall writes its recall event on the primary (feedback on, the default),
so the primary's position moves with every recall. Prints recalls/s, p50 and
p95 latency per configuration, where the reads ran, then the cost of the check
itself (the primary position statement; a replica's replay position) and the
measurement behind LSNs over replay timestamps.

The clients run in the gateway's own process (ASGI, no sockets): on a machine
where the gateway's Python is the bottleneck, a replica takes database work
off the primary but does not add CPU to the gateway; run the gateway on more
cores (RECALL_WORKERS, more replicas of it) to turn that into throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import rank_of_count

from gateway import tokens
from gateway.app import create_app
from gateway.embedded import EmbeddedPostgres
from gateway.embeddings import create_provider
from gateway.services import loader
from gateway.services.records import TokenRecord
from gateway.services.writes import Actor, WriteService
from gateway.settings import Settings
from gateway.store.database import Database, prepare

QUERIES = [
    "who owns the billing service",
    "checkout latency spikes postmortem",
    "orders database migration runbook",
    "what pauses during the friday freeze",
    "on-call assistant escalation",
    "service catalog payments",
]
RECALL = (
    "query R($q: String) { recallMemory(query: $q, limit: 10) { "
    "results { evidenceId rank } relatedRelationships { representativeId } } }"
)


async def seed(dsn: str) -> str:
    """Load the demo data; a token of one of its principals."""
    db = await Database.open(dsn, max_size=2)
    provider = create_provider(Settings(embedding_provider="local"))
    try:
        writes = WriteService(db, provider)
        text = (resources.files("gateway") / "demo" / "demo.jsonl").read_text(encoding="utf-8")
        records = loader.parse(loader.split_lines(text))
        await loader.load(writes, records, batch_size=500, actor=Actor.operator())
        token_id, secret = tokens.new_token_id(), tokens.new_secret()
        record = TokenRecord(
            kind="token",
            team="northwind",
            id=token_id,
            principal="ines",
            binding="private",
            secret=secret,
        )
        await writes.apply([record], Actor.operator())
        return tokens.format_token(token_id, secret)
    finally:
        await provider.aclose()
        await db.close()


@contextlib.asynccontextmanager
async def gateway(
    primary: str, replica: str | None, feedback: bool
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        Settings(
            database_url=primary,
            read_database_urls=replica or "",
            pool_max_size=8,
            feedback_enabled=feedback,
        )
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60) as c:
            yield c


async def run_round(
    client: httpx.AsyncClient, tok: str, recalls: int, clients: int, send_position: bool
) -> tuple[float, list[float], Counter[str], list[float]]:
    latencies: list[float] = []
    where: Counter[str] = Counter()
    waits: list[float] = []
    queue = iter(range(recalls))

    async def one_client() -> None:
        position: str | None = None
        for n in queue:
            headers = {"Authorization": f"Bearer {tok}"}
            if send_position and position is not None:
                headers["X-Recall-Min-Position"] = position
            started = time.perf_counter()
            r = await client.post(
                "/graphql",
                json={"query": RECALL, "variables": {"q": QUERIES[n % len(QUERIES)]}},
                headers=headers,
            )
            latencies.append(time.perf_counter() - started)
            body = r.json()
            assert "errors" not in body, body
            consistency = (body.get("extensions") or {}).get("consistency")
            if consistency is None:
                where["primary (no replicas)"] += 1
                continue
            position = consistency.get("position", position)
            for read in consistency["reads"]:
                where[f"{read['servedBy']}: {read['reason']}"] += 1
                waits.append(read.get("waitedMs", 0.0))

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    return recalls / (time.perf_counter() - started), latencies, where, waits


async def check_costs(primary: str, replica: str, samples: int) -> None:
    p = await asyncpg.connect(primary)
    r = await asyncpg.connect(replica)
    try:
        for label, conn, sql in (
            ("primary position (pg_current_wal_lsn)", p, "SELECT pg_current_wal_lsn()::text"),
            ("replica replay (pg_last_wal_replay_lsn)", r, "SELECT pg_last_wal_replay_lsn()::text"),
        ):
            times = []
            for _ in range(samples):
                started = time.perf_counter()
                await conn.fetchval(sql)
                times.append((time.perf_counter() - started) * 1000)
            print(
                f"  {label:42s} p50 {statistics.median(times):.3f} ms  "
                f"p95 {rank_of_count(times, 0.95):.3f} ms"
            )
        # Why positions and not replay timestamps: on a quiet primary the replica is
        # caught up, yet its last replayed commit grows old.
        await asyncio.sleep(2.0)
        row = await r.fetchrow(
            "SELECT pg_last_wal_replay_lsn()::text AS replay, "
            "extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000 AS age_ms"
        )
        assert row is not None  # a SELECT without FROM: one row
        current = await p.fetchval("SELECT pg_current_wal_lsn()::text")
        print(
            f"  after 2 s without writes: primary at {current}, replica replayed {row['replay']}; "
            f"its last replayed commit is {row['age_ms']:.0f} ms old (a timestamp rule would "
            "call it lagging)"
        )
    finally:
        await p.close()
        await r.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recalls", type=int, default=300, help="recalls per round")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-feedback",
        action="store_true",
        help="RECALL_FEEDBACK_ENABLED=false: no recall event written per recall",
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="replica-bench-"))
    primary = EmbeddedPostgres(folder / "primary", database="recall").start()
    standby: EmbeddedPostgres | None = None
    try:
        await prepare(primary.dsn, migrate=True)
        tok = await seed(primary.dsn)
        standby = primary.start_standby(folder / "standby")
        print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
        configs = {
            "primary": (None, False),
            "replica": (standby.dsn, False),
            "replica+position": (standby.dsn, True),
        }
        rates: dict[str, list[float]] = {k: [] for k in configs}
        latencies: dict[str, list[float]] = {k: [] for k in configs}
        where: dict[str, Counter[str]] = {k: Counter() for k in configs}
        waits: dict[str, list[float]] = {k: [] for k in configs}
        feedback = not args.no_feedback
        async with contextlib.AsyncExitStack() as stack:
            clients = {
                name: await stack.enter_async_context(gateway(primary.dsn, url, feedback))
                for name, (url, _) in configs.items()
            }
            for name, client in clients.items():  # warm up: models, plans, caches
                await run_round(client, tok, 24, args.clients, configs[name][1])
            for _ in range(args.rounds):
                for name, client in clients.items():
                    rate, lat, seen, waited = await run_round(
                        client, tok, args.recalls, args.clients, configs[name][1]
                    )
                    rates[name].append(rate)
                    latencies[name] += lat
                    where[name] += seen
                    waits[name] += waited
        print(
            f"{args.rounds} rounds x {args.recalls} recalls, {args.clients} clients each, "
            f"feedback {'on' if feedback else 'off'}"
        )
        base = statistics.median(rates["primary"])
        for name in configs:
            lat = latencies[name]
            rate = statistics.median(rates[name])
            print(
                f"  {name:17s} {rate:6.1f} recalls/s (x{rate / base:.2f})  "
                f"p50 {statistics.median(lat) * 1000:6.1f} ms  p95 {rank_of_count(lat, 0.95) * 1000:6.1f} ms"
            )
            print("      " + ", ".join(f"{k} {v}" for k, v in where[name].most_common()))
            if waits[name]:
                print(
                    f"      waited for the replica: p50 {statistics.median(waits[name]):.2f} ms, "
                    f"p95 {rank_of_count(waits[name], 0.95):.2f} ms (all reads)"
                )
        print("the consistency check:")
        await check_costs(primary.dsn, standby.dsn, 500)
        print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


if __name__ == "__main__":
    asyncio.run(main())
