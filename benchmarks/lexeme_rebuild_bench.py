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
rate per million postings. The arms, interleaved round by round:

- ``db/0107 rebuild (every row)``: db/0107's recall_rebuild_lexeme_stats(),
  its text read from that file and installed under another name: every row
  deleted and written again;
- ``recall_rebuild_lexeme_stats()``: the store's current function (db/0161:
  only the keys whose counts differ are written);
- with ``--backfill``, db/0106's own text (the statistics emptied first, as
  before that migration).

Before the rounds the statistics are counted once (one row per key, as either
rebuild leaves them); before each arm ``--damage`` keys are made wrong (a third
with a df too large, a third with rows lost, a third with rows of no posting),
the same number for every arm, so that the current function has that many
keys to write.

    python benchmarks/lexeme_rebuild_bench.py --postings 2000000
    python benchmarks/lexeme_rebuild_bench.py --postings 4400000 --lexemes 100000 --damage 1000
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


FULL_REWRITE = "bench_rebuild_every_row"


def rebuild_of_0107() -> str:
    """db/0107's recall_rebuild_lexeme_stats(), as that file created it, under the
    name :data:`FULL_REWRITE`."""
    text = (migrations.migrations_dir() / "0107_lexeme_statistics_kept_exact.sql").read_text(
        "utf-8"
    )
    start = text.index("CREATE FUNCTION recall_rebuild_lexeme_stats()")
    end = text.index("END $$;", start) + len("END $$;")
    return text[start:end].replace("recall_rebuild_lexeme_stats", FULL_REWRITE)


async def _damage(conn: asyncpg.Connection, keys: int) -> None:
    """Make ``keys`` keys of evidence_lexeme_stats wrong: a third df too large, a
    third lost, a third rows of lexemes no posting has."""
    third = max(keys // 3, 1)
    await conn.execute(
        "UPDATE evidence_lexeme_stats s SET df = s.df + 1 FROM (SELECT team_id, space_id, "
        "lexeme FROM evidence_lexeme_stats TABLESAMPLE SYSTEM (1) LIMIT $1) k "
        "WHERE (s.team_id, s.space_id, s.lexeme) = (k.team_id, k.space_id, k.lexeme)",
        third,
    )
    await conn.execute(
        "DELETE FROM evidence_lexeme_stats s USING (SELECT team_id, space_id, lexeme "
        "FROM evidence_lexeme_stats TABLESAMPLE SYSTEM (1) LIMIT $1) k "
        "WHERE (s.team_id, s.space_id, s.lexeme) = (k.team_id, k.space_id, k.lexeme)",
        third,
    )
    await conn.execute(
        "INSERT INTO evidence_lexeme_stats (team_id, space_id, lexeme, shard, df, max_tf) "
        "SELECT m.team_id, m.id, 'zzghost' || g, 0, 1, 1 FROM memory_spaces m "
        "CROSS JOIN generate_series(1, $1) g WHERE m.team_id = 'rb0' "
        "ON CONFLICT DO NOTHING",
        third,
    )


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
                await conn.execute(rebuild_of_0107())
                await conn.execute("SELECT recall_rebuild_lexeme_stats()")  # one row per key
                arms: dict[str, tuple[str, bool]] = {
                    "db/0107 rebuild (every row)": (f"SELECT {FULL_REWRITE}()", False),
                    "recall_rebuild_lexeme_stats()": (
                        "SELECT recall_rebuild_lexeme_stats()",
                        False,
                    ),
                }
                if args.backfill:
                    arms["db/0106 backfill"] = (backfill_of_0106(), True)
                results: dict[str, list[tuple[float, float, float]]] = {a: [] for a in arms}
                for r in range(args.rounds):
                    order = list(arms) if r % 2 == 0 else list(reversed(arms))
                    for name in order:
                        sql, empty = arms[name]
                        if args.damage:
                            await _damage(conn, args.damage)
                        results[name].append(await _count(dsn, conn, sql, empty))
                rows = await conn.fetchval("SELECT count(*) FROM evidence_lexeme_stats")
            finally:
                await conn.close()
    load = os.getloadavg()
    print(
        f"{n:,} postings, {rows:,} statistics rows, {args.damage} keys damaged before each "
        f"arm, {args.rounds} rounds interleaved; "
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
    parser.add_argument(
        "--damage", type=int, default=0, help="keys made wrong before each arm (0: none)"
    )
    parser.add_argument("--backfill", action="store_true", help="also db/0106's own text")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
