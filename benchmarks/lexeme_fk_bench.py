"""What db/0107's foreign key on the lexeme statistics costs a write, at commit.

A measuring script, not a test. ``evidence_lexeme_stats`` and
``relationship_lexeme_stats`` reference ``memory_spaces`` (db/0107), DEFERRABLE
INITIALLY DEFERRED: every *new* statistics row (a (space, lexeme, shard) the
space's shard has not seen) queues one foreign-key check, run at COMMIT; an
upsert that updates an existing row queues none. A write of many new words
therefore pays one check per new word at commit.

Two fresh databases on one server, the same schema, one with the foreign keys
and one without (dropped after migrating), each with one team and space. Each
round writes, in each database in turn (interleaved, the order alternating),
one transaction as the owner: a COPY of ``--docs`` evidence rows of ``--words``
words each, every word new to the store (random letters, so about docs x words
new lexemes and as many new statistics rows), through every trigger the loader's
COPY fires. Timed apart: the COPY statement (triggers included), the deferred
checks (``SET CONSTRAINTS ALL IMMEDIATE`` runs them at once, apart from the
commit's WAL flush, which is noisy) and the COMMIT. Printed: per variant the
median times and the new statistics rows per round, then the medians of the
per-round differences (with minus without): the checks, per new row, and the
whole transaction.

    python benchmarks/lexeme_fk_bench.py --docs 200 --words 50 --rounds 9

``--known`` writes the same number of rows with words already counted (no new
statistics row, so no check queued): the control, whose commit should not
differ between the variants.

``--beir FOLDER`` writes a BEIR corpus instead (title and text of each line of
its ``corpus.jsonl``, in file order), ``--docs`` documents per round until the
corpus is written: a load of real text into an empty space, where each batch
meets fewer new words than the one before.

    python benchmarks/lexeme_fk_bench.py --beir PATH_TO_SCIFACT --docs 500
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import statistics
import string
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from beir_eval import scratch_database, server  # noqa: E402

_SETUP = """
INSERT INTO teams (id, name) VALUES ('fkbench', 'FK bench');
INSERT INTO memory_spaces (team_id, id, kind) VALUES ('fkbench', $1, 'shared');
INSERT INTO sources (team_id, id, space_id, generation, kind, title, authority)
VALUES ('fkbench', 'src', $1, 1, 'document', 'Words', 'high');
"""

_FOREIGN_KEYS = """
SELECT c.conrelid::regclass::text AS tbl, c.conname
FROM pg_constraint c
WHERE c.contype = 'f' AND c.conrelid IN ('evidence_lexeme_stats'::regclass,
                                          'relationship_lexeme_stats'::regclass)
"""


def _word(rng: random.Random) -> str:
    # 'q' and 11 letters: to_tsvector keeps it as one lexeme (the stemmer may
    # trim an ending), and collisions among millions are negligible
    return "q" + "".join(rng.choices(string.ascii_lowercase, k=11))


async def _prepare(dsn: str, with_fk: bool) -> tuple[asyncpg.Connection, Any]:
    conn = await asyncpg.connect(dsn)
    space = await conn.fetchval("SELECT gen_random_uuid()")
    async with conn.transaction():
        for statement in _SETUP.strip().split(";\n"):
            if "$1" in statement:
                await conn.execute(statement, space)
            else:
                await conn.execute(statement)
    if not with_fk:
        for row in await conn.fetch(_FOREIGN_KEYS):
            await conn.execute(f'ALTER TABLE {row["tbl"]} DROP CONSTRAINT "{row["conname"]}"')
    fks = len(await conn.fetch(_FOREIGN_KEYS))
    assert fks == (2 if with_fk else 0), fks
    return conn, space


Timing = tuple[float, float, float, int]


async def _round(conn: asyncpg.Connection, space: Any, texts: list[str], tag: str) -> Timing:
    """One transaction: the COPY's time, the deferred checks' (``SET CONSTRAINTS
    ALL IMMEDIATE``, which runs them at once), the COMMIT's, new statistics rows."""
    before = await conn.fetchval("SELECT count(*) FROM evidence_lexeme_stats")
    records = [
        ("fkbench", f"{tag}-{i}", space, 1, "src", text, hashlib.sha256(text.encode()).digest())
        for i, text in enumerate(texts)
    ]
    tx = conn.transaction()
    await tx.start()
    started = time.perf_counter()
    await conn.copy_records_to_table(
        "evidence",
        columns=[
            "team_id",
            "id",
            "space_id",
            "generation",
            "source_id",
            "content",
            "content_sha256",
        ],
        records=records,
    )
    copied = time.perf_counter()
    # the deferred checks run here, apart from the commit's WAL flush
    await conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
    checked = time.perf_counter()
    await tx.commit()
    committed = time.perf_counter()
    after = await conn.fetchval("SELECT count(*) FROM evidence_lexeme_stats")
    return copied - started, checked - copied, committed - checked, after - before


def _corpus(folder: Path) -> list[str]:
    texts = []
    with (folder / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            text = f"{doc.get('title') or ''} {doc.get('text', '')}".strip()
            if text:
                texts.append(text)
    return texts


async def main_async(args: argparse.Namespace) -> None:
    corpus = _corpus(args.beir) if args.beir else None
    if corpus is not None:
        args.warmup, args.rounds = 0, -(-len(corpus) // args.docs)
    rng = random.Random(args.seed)  # noqa: S311 - reproducible words, not a secret
    with server(args.database_url) as admin:
        async with scratch_database(admin) as dsn_fk, scratch_database(admin) as dsn_plain:
            variants = {
                "with FK": await _prepare(dsn_fk, True),
                "without FK": await _prepare(dsn_plain, False),
            }
            known = [_word(rng) for _ in range(args.words)]
            for conn, space in variants.values():  # counted once before the rounds
                await _round(conn, space, [" ".join(known)], "known")
            times: dict[str, list[Timing]] = {v: [] for v in variants}
            for r in range(args.warmup + args.rounds):
                if corpus is not None:
                    texts = corpus[r * args.docs : (r + 1) * args.docs]
                elif args.known:
                    texts = [" ".join(known) for _ in range(args.docs)]
                else:
                    texts = [
                        " ".join(_word(rng) for _ in range(args.words)) for _ in range(args.docs)
                    ]
                order = list(variants) if r % 2 == 0 else list(reversed(variants))
                for name in order:
                    conn, space = variants[name]
                    got = await _round(conn, space, texts, f"r{r}")
                    if r >= args.warmup:
                        times[name].append(got)
            for conn, _ in variants.values():
                await conn.close()
    load = os.getloadavg()
    kind = (
        f"{args.beir.name} documents"
        if args.beir
        else f"evidence x {args.words} {'known' if args.known else 'new'} words"
    )
    print(
        f"{args.docs} {kind} per round, {args.rounds} rounds (+{args.warmup} warm-up), "
        "interleaved; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for name, rows in times.items():
        print(
            f"  {name:<11} COPY median {statistics.median(r[0] for r in rows) * 1e3:8.1f} ms, "
            f"deferred checks {statistics.median(r[1] for r in rows) * 1e3:7.1f} ms, "
            f"COMMIT {statistics.median(r[2] for r in rows) * 1e3:7.1f} ms, "
            f"new statistics rows per round {statistics.median(r[3] for r in rows):,.0f}"
        )
    pairs = list(zip(times["with FK"], times["without FK"], strict=True))
    checks = statistics.median(a[1] - b[1] for a, b in pairs)
    whole = statistics.median(sum(a[:3]) - sum(b[:3]) for a, b in pairs)
    base = statistics.median(sum(b[:3]) for b in times["without FK"])
    new_rows = statistics.median(r[3] for r in times["with FK"])
    if args.beir:
        print(
            "  per round (new statistics rows, checks with FK ms, transaction without FK ms): "
            + ", ".join(f"{a[3]:,}/{a[1] * 1e3:.0f}/{sum(b[:3]) * 1e3:.0f}" for a, b in pairs)
        )
        rows_all = sum(r[3] for r in times["with FK"])
        checks_all = sum(a[1] - b[1] for a, b in pairs)
        base_all = sum(sum(b[:3]) for b in times["without FK"])
        print(
            f"  whole corpus: {rows_all:,} new statistics rows, checks {checks_all:.2f} s "
            f"({checks_all / rows_all * 1e6:.2f} us per row) of {base_all:.2f} s of evidence "
            f"COPY + commit without FK ({checks_all / base_all * 100:+.1f} %)"
        )
    per_row = f" ({checks / new_rows * 1e6:.2f} us per new row)" if new_rows else ""
    print(
        f"  with FK minus without (median of per-round differences): deferred checks "
        f"{checks * 1e3:.1f} ms{per_row}; whole transaction {whole * 1e3:.1f} ms of "
        f"{base * 1e3:.1f} ms without ({whole / base * 100:+.1f} %)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=200, help="evidence rows per round")
    parser.add_argument("--words", type=int, default=50, help="words per evidence")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=107)
    parser.add_argument("--known", action="store_true", help="words already counted (control)")
    parser.add_argument("--beir", type=Path, default=None, help="a BEIR folder's corpus instead")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
