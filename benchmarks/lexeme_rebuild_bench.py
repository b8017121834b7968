"""How long db/0106's backfill and recall_rebuild_lexeme_stats() hold writers off.

A measuring script, not a test. Both count the lexeme statistics of every
posting of the store (db/0106 when it is applied to a store that holds postings;
db/0107's rebuild whenever the owner runs it) under SHARE ROW EXCLUSIVE on
``evidence_terms`` and ``relationship_terms``: readers go on, every writer of
postings (any evidence or relationship insert) waits until the transaction ends.

On a fresh database (embedded server, or a scratch database on
``--database-url``), ``--spaces`` teams of one shared space each get
``--postings`` evidence postings in all (``--lexemes`` distinct lexemes per
space, 45 per document, about what the loader makes of an abstract), written with the
postings' triggers disabled (only the count is measured here; the rebuild
recounts from the postings whatever the statistics held). Then, ``--rounds``
times: the rebuild is started on one connection and, once it holds its lock, a
writer on a second connection inserts one posting; printed per round the
rebuild's time (statement and commit) and how long the writer waited, and the
rate per million postings. Then the same for db/0106's own text (the
statistics emptied first, as before that migration).

    python benchmarks/lexeme_rebuild_bench.py --postings 2000000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import asyncpg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from beir_eval import scratch_database, server  # noqa: E402

from gateway.store import migrations  # noqa: E402

PER_DOCUMENT = 45


def backfill_of_0106() -> str:
    """db/0106's count, from its lock of the postings tables to its triggers."""
    text = (migrations.migrations_dir() / "0106_lexeme_statistics.sql").read_text("utf-8")
    start = text.index("LOCK TABLE evidence_terms, relationship_terms")
    return text[start : text.index("CREATE TRIGGER", start)]


async def _fill(conn: asyncpg.Connection, spaces: int, postings: int, lexemes: int) -> None:
    """Teams, spaces and postings (no document rows: the count reads only the
    postings), the postings' triggers off meanwhile."""
    documents = postings // PER_DOCUMENT
    await conn.execute("SET statement_timeout = 0")
    async with conn.transaction():
        for s in range(spaces):
            await conn.execute("INSERT INTO teams (id, name) VALUES ($1, $2)", f"rb{s}", f"rb{s}")
            await conn.execute(
                "INSERT INTO memory_spaces (team_id, kind) VALUES ($1, 'shared')", f"rb{s}"
            )
        await conn.execute("ALTER TABLE evidence_terms DISABLE TRIGGER USER")
        # document d of space d % spaces; its 45 lexemes distinct (a step prime to
        # the vocabulary), spread over the space's vocabulary
        await conn.execute(
            """
            INSERT INTO evidence_terms (team_id, space_id, lexeme, evidence_id, tf, recorded_at)
            SELECT m.team_id, m.id, 'w' || ((d * 7919 + k * 104729) % $3)::text,
                   'd' || d::text, 1 + (d + k) % 3, now()
            FROM generate_series(0, $1 - 1) d
            JOIN memory_spaces m ON m.team_id = 'rb' || (d % $2)::text
            CROSS JOIN generate_series(0, 44) k
            """,
            documents,
            spaces,
            lexemes,
        )
        await conn.execute("ALTER TABLE evidence_terms ENABLE TRIGGER USER")
    await conn.execute("VACUUM ANALYZE evidence_terms")


async def _writer(dsn: str, started: asyncio.Event) -> float:
    """One posting inserted by the owner while the count runs: how long it waited."""
    conn = await asyncpg.connect(dsn)
    try:
        await started.wait()
        await asyncio.sleep(0.2)  # the count holds its lock by now
        t0 = time.perf_counter()
        async with conn.transaction():
            # triggers off for this one row: its wait is the lock's, not a check's
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute(
                "INSERT INTO evidence_terms (team_id, space_id, lexeme, evidence_id, tf, "
                "recorded_at) SELECT team_id, id, 'zzwriter', 'd0', 1, now() "
                "FROM memory_spaces WHERE team_id = 'rb0'"
            )
            waited = time.perf_counter() - t0
            raise _Undo
    except _Undo:
        return waited
    finally:
        await conn.close()


class _Undo(Exception):
    """Rolls the writer's row back."""


async def _count(
    dsn: str, conn: asyncpg.Connection, sql: str, empty_first: bool
) -> tuple[float, float, float]:
    """The count in one transaction: its statements' time, its commit's (where the
    statistics' deferred foreign-key checks run), how long a writer waited."""
    started = asyncio.Event()
    writer = asyncio.create_task(_writer(dsn, started))
    tx = conn.transaction()
    await tx.start()
    t0 = time.perf_counter()
    if empty_first:
        await conn.execute(
            "DELETE FROM evidence_lexeme_stats; DELETE FROM relationship_lexeme_stats"
        )
    await conn.execute("LOCK TABLE evidence_terms, relationship_terms IN SHARE ROW EXCLUSIVE MODE")
    started.set()
    await conn.execute(sql)
    t1 = time.perf_counter()
    await tx.commit()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, await writer


async def main_async(args: argparse.Namespace) -> None:
    with server(args.database_url) as admin:
        async with scratch_database(admin) as dsn:
            conn = await asyncpg.connect(dsn)
            try:
                t0 = time.perf_counter()
                await _fill(conn, args.spaces, args.postings, args.lexemes)
                n = await conn.fetchval("SELECT count(*) FROM evidence_terms")
                print(
                    f"{n:,} postings in {args.spaces} spaces written in {time.perf_counter() - t0:.1f} s"
                )
                await conn.execute("SET statement_timeout = 0")
                arms = {
                    "recall_rebuild_lexeme_stats()": (
                        "SELECT recall_rebuild_lexeme_stats()",
                        False,
                    ),
                    "db/0106 backfill": (backfill_of_0106(), True),
                }
                results: dict[str, list[tuple[float, float, float]]] = {a: [] for a in arms}
                for r in range(args.rounds):
                    order = list(arms) if r % 2 == 0 else list(reversed(arms))
                    for name in order:
                        sql, empty = arms[name]
                        results[name].append(await _count(dsn, conn, sql, empty))
                rows = await conn.fetchval("SELECT count(*) FROM evidence_lexeme_stats")
            finally:
                await conn.close()
    load = os.getloadavg()
    print(
        f"{n:,} postings, {rows:,} statistics rows, {args.rounds} rounds interleaved; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for name, got in results.items():
        took = statistics.median(t + c for t, c, _ in got)
        commit = statistics.median(c for _, c, _ in got)
        waited = statistics.median(w for _, _, w in got)
        print(
            f"  {name:<31} median {took:6.2f} s ({took / n * 1e6:.2f} s per million postings; "
            f"its commit {commit:.2f} s), a writer waited {waited:6.2f} s; all (count/commit/wait): "
            + ", ".join(f"{t:.2f}/{c:.2f}/{w:.2f}" for t, c, w in got)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postings", type=int, default=1_000_000)
    parser.add_argument("--spaces", type=int, default=10)
    parser.add_argument("--lexemes", type=int, default=30_000, help="vocabulary per space")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
