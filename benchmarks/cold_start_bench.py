"""The first recalls after a start, on a dataset kept by recall_bench.py.

    python benchmarks/cold_start_bench.py --data-dir HELD1M --recalls 12 --evict

Starts the dataset's embedded server (the shipped memory settings, or the
``RECALL_PG_*`` overrides of the environment), opens a gateway on it (its
lifespan, warm-up included, as ``serve`` does), waits for ``/readyz`` to say
ready, and times the first ``--recalls`` full recalls one after another, each
with a question of its own (recall_ab.py's questions), printing each one's
time and the blocks the server read from outside its shared buffers meanwhile.
Then the same questions again (warm).

``--evict`` first drops the data directory's files from the operating system's
page cache (``posix_fadvise(DONTNEED)`` on each file, the server stopped), so the
start is cold the way it is after a reboot, without dropping anyone else's
cache. The server must not be running (it would be attached to, not started).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_ab
import recall_bench as rb


def evict(folder: Path) -> int:
    """Drop every file under ``folder`` from the page cache; returns bytes named."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                total += os.fstat(fd).st_size
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return total


async def blocks(dsn: str) -> tuple[int, int]:
    """The database's (blocks read, blocks hit) so far."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT blks_read, blks_hit FROM pg_stat_database WHERE datname = current_database()"
        )
        assert row is not None
        return int(row[0]), int(row[1])
    finally:
        await conn.close()


_STATIO = """
SELECT relid::regclass::text AS name, coalesce(heap_blks_read, 0) AS heap,
       coalesce(idx_blks_read, 0) AS idx FROM pg_statio_all_tables
"""


async def statio(dsn: str) -> dict[str, tuple[int, int]]:
    """Blocks read from outside shared buffers per table: (its rows, its indexes)."""
    conn = await asyncpg.connect(dsn)
    try:
        return {r["name"]: (int(r["heap"]), int(r["idx"])) for r in await conn.fetch(_STATIO)}
    finally:
        await conn.close()


def top_reads(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> None:
    rows = []
    for name, (heap, idx) in after.items():
        was = before.get(name, (0, 0))
        rows.append((heap - was[0] + idx - was[1], heap - was[0], idx - was[1], name))
    rows.sort(reverse=True)
    print("  blocks read from outside shared buffers during the first recalls, by table:")
    for total, heap, idx, name in rows[:10]:
        print(f"    {total:8} (rows {heap:7}, indexes {idx:7})  {name}")


async def run(dsn: str, recalls: int, started: float) -> None:
    data = await rb.reuse(dsn, 7)
    if data is None:
        raise SystemExit("no dataset in that folder (recall_bench.py --data-dir)")
    who = "bench-00"
    at = await rb.known_instant(dsn, who)
    async with contextlib.AsyncExitStack() as stack:
        opened = time.perf_counter()
        gw = await recall_ab.open_gateway(
            stack, "cold", dsn, data["token"], at, who, data["teams"][who]
        )
        while True:
            ready = await gw.client.get("/readyz")
            if ready.status_code == 200:
                break
            await asyncio.sleep(0.2)
        now = time.perf_counter()
        print(
            f"gateway ready {now - opened:.1f} s after its start ({now - started:.1f} s after "
            f"the server's): {ready.json()}"
        )
        questions = recall_ab._questions(recalls)[:recalls]
        await asyncio.sleep(1.1)  # the statistics of other sessions are flushed each second
        io_before = await statio(dsn)
        for label in ("first", "again"):
            times = []
            for i, question in enumerate(questions):
                before = await blocks(dsn)
                t0 = time.perf_counter()
                r = await gw.client.post(
                    "/graphql",
                    json={"query": recall_ab.KINDS["full"], "variables": {"q": question}},
                    headers=gw.headers,
                )
                ms = (time.perf_counter() - t0) * 1000
                body: dict[str, Any] = r.json()
                after = await blocks(dsn)
                err = f"  ERROR {body['errors'][0]['message'][:80]}" if "errors" in body else ""
                times.append(ms)
                print(
                    f"  {label} {i + 1:2}: {ms:9.1f} ms   blocks read {after[0] - before[0]:7}"
                    f"   hit {after[1] - before[1]:7}{err}"
                )
            print(
                f"{label}: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms, "
                f"sum {sum(times) / 1000:.1f} s (load average {os.getloadavg()[0]:.1f})"
            )
            if label == "first":
                await asyncio.sleep(1.1)
                top_reads(io_before, await statio(dsn))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--recalls", type=int, default=12)
    parser.add_argument("--evict", action="store_true")
    args = parser.parse_args()
    from gateway.embedded import EmbeddedPostgres

    probe = EmbeddedPostgres(args.data_dir, database="bench")
    if probe.is_running():
        raise SystemExit("the dataset's server is running: stop it first")
    if args.evict:
        size = evict(args.data_dir)
        print(f"evicted {size / 2**30:.1f} GB of files from the page cache")
    print(f"load average {os.getloadavg()[0]:.1f}")
    started = time.perf_counter()
    with rb.database(args.data_dir) as dsn:
        print(f"server up in {time.perf_counter() - started:.1f} s")
        asyncio.run(run(dsn, args.recalls, started))


if __name__ == "__main__":
    main()
