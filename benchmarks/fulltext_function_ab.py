"""Interleaved A/B of a full-text function's server CPU, rows compared.

    python benchmarks/fulltext_function_ab.py --data-dir HELD100K --kind relationship \\
        --functions old=db/0170_relationship_fulltext_fewer_lookups.sql \\
        --arm old=old --arm new=public --questions 40 --rounds 9
    python benchmarks/fulltext_function_ab.py --data-dir SCIFACT_STORE --kind evidence \\
        --queries PATH/TO/scifact/queries.jsonl --questions 100 --prune-from 0 \\
        --functions old=db/0175_fulltext_best_scored_once.sql --arm old=old --arm new=public

Calls ``evidence_fulltext_top_k`` or ``relationship_fulltext_top_k`` directly,
with the arguments a recall gives them (the query's lexemes, IDF, df, largest
tf and the space's average length from the present statistics, computed once
per question as the tenant), in a tenant transaction (role, team, space, generic
plans) per call, on one connection per arm. An arm is ``NAME=SCHEMA``: the
schema put first on its connection's search path, so that a function of that
name there stands in for the store's own (``public``: the store's own);
``--functions SCHEMA=FILE`` (repeatable) makes that schema anew from a file of
``CREATE FUNCTION`` statements, such as the migration a change restates
(``recall_ab.py`` says more). A restated function that sets its own search
path calls the store's helpers, not the schema's: make such a version's schema
from a file whose ``SET search_path`` names it.

Each question goes to every arm, the arms' order alternating, for ``--rounds``
rounds after two of warm-up; the server CPU of each call is read from
``/proc/PID/schedstat`` around it (other load on a shared machine does not
distort it the way it distorts latency). Prints per arm the median over rounds
of the mean CPU per call, and the median per-call ratio to the first arm; exits
1 if any call's rows differ between arms.

Questions: the recall benchmark's generator (``recall_ab.py``'s, the same every
run), asked of the first ``--teams`` teams' shared spaces in turn; or the
``text`` of the first ``--questions`` lines of a BEIR ``queries.jsonl``
(``--queries``), asked of the first team's. ``--prune-from`` is the functions'
``PRUNE_FROM_POSTINGS`` (0: the path of large spaces, with the first floor).
The server must be a process of this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_ab as ab
import recall_bench as rb

from gateway.store import bm25

ARGUMENTS = """
WITH query_lexemes AS MATERIALIZED (
    SELECT u.lexeme FROM unnest(to_tsvector('english'::regconfig, $3::text)) AS u
),
query_idf AS MATERIALIZED (
    SELECT ql.lexeme, ln(1 + (st.n - d.df + 0.5) / (d.df + 0.5)) AS idf, st.avgdl, d.df, d.max_tf
    FROM query_lexemes ql
    CROSS JOIN (
        SELECT sum(x.doc_count)::double precision AS n,
               sum(x.total_length)::double precision / nullif(sum(x.doc_count), 0) AS avgdl
        FROM {kind}_search_stats x WHERE x.team_id = $1 AND x.space_id = $2
    ) st
    CROSS JOIN LATERAL (
        SELECT sum(c.df)::double precision AS df, max(c.max_tf) AS max_tf
        FROM {kind}_lexeme_stats c
        WHERE c.team_id = $1 AND c.space_id = $2 AND c.lexeme = ql.lexeme
    ) d
    WHERE d.df > 0 AND st.avgdl > 0
)
SELECT (SELECT array_agg(x.lexeme ORDER BY x.lexeme COLLATE "C") FROM query_idf x),
       (SELECT array_agg(x.idf ORDER BY x.lexeme COLLATE "C") FROM query_idf x),
       (SELECT array_agg(x.df ORDER BY x.lexeme COLLATE "C") FROM query_idf x),
       (SELECT array_agg(x.max_tf ORDER BY x.lexeme COLLATE "C") FROM query_idf x),
       (SELECT min(x.avgdl) FROM query_idf x),
       (SELECT max(g.generation) FROM space_generations g
         WHERE g.team_id = $1 AND g.space_id = $2)
"""

CALLS = {
    # the current view, as a recall asks it
    "evidence": "SELECT f.doc_id, f.rank FROM evidence_fulltext_top_k("
    "$1, $2, $3, NULL, '{}'::text[], $4, $5, $6, $7, $8, $9, $10) f",
    "relationship": "SELECT f.doc_id, f.rank FROM relationship_fulltext_top_k("
    "$1, $2, $3, now(), $4, $5, $6, $7, $8, $9, $10) f",
}

TENANT = (
    "SELECT set_config('role', 'recall_app', true), set_config('recall.team_id', $1, true), "
    "set_config('recall.space_ids', $2, true), "
    "set_config('plan_cache_mode', 'force_generic_plan', true)"
)


def _cpu_ns(pid: int) -> int:
    """Nanoseconds the process has run on a CPU (first field of schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def _calls(dsn: str, args: argparse.Namespace) -> list[tuple[str, str, tuple[Any, ...]]]:
    """(team, space, the function's arguments) per question with a lexeme in its space."""
    conn = await asyncpg.connect(dsn)
    try:
        spaces = await conn.fetch(
            "SELECT team_id, id FROM memory_spaces WHERE kind = 'shared' ORDER BY team_id LIMIT $1",
            1 if args.queries else args.teams,
        )
        if args.queries:
            with args.queries.open(encoding="utf-8") as f:
                questions = [json.loads(line)["text"] for line in f][: args.questions]
        else:
            questions = ab._questions(args.questions)[: args.questions]
        calls = []
        for i, question in enumerate(questions):
            team, space = spaces[i % len(spaces)]
            async with conn.transaction():
                await conn.execute(TENANT, team, "{" + str(space) + "}")
                row = await conn.fetchrow(ARGUMENTS.format(kind=args.kind), team, space, question)
            assert row is not None  # a SELECT without FROM: one row
            lexemes, idfs, dfs, max_tfs, avgdl, generation = row
            if lexemes:
                limit = args.limit
                call = (team, space, generation, limit, args.prune_from)
                calls.append((team, str(space), (*call, lexemes, idfs, dfs, max_tfs, avgdl)))
        return calls
    finally:
        await conn.close()


async def compare(dsn: str, args: argparse.Namespace) -> int:
    calls = await _calls(dsn, args)
    arms: dict[str, tuple[asyncpg.Connection, int]] = {}
    for name, schema in args.arm:
        conn = await asyncpg.connect(
            ab.with_search_path(dsn, None if schema == "public" else schema)
        )
        arms[name] = (conn, int(await conn.fetchval("SELECT pg_backend_pid()")))
    names = list(arms)
    per_round: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    differ = 0
    sql = CALLS[args.kind]
    try:
        for r in range(args.rounds + 2):
            total = dict.fromkeys(names, 0)
            for j, (team, space, values) in enumerate(calls):
                rows: dict[str, list[tuple[Any, ...]]] = {}
                cpu: dict[str, int] = {}
                for name in names if (r + j) % 2 == 0 else names[::-1]:
                    conn, pid = arms[name]
                    async with conn.transaction():
                        await conn.execute(TENANT, team, "{" + space + "}")
                        mark = _cpu_ns(pid)
                        got = await conn.fetch(sql, *values)
                        cpu[name] = _cpu_ns(pid) - mark
                    rows[name] = [tuple(x) for x in got]
                differ += any(rows[n] != rows[names[0]] for n in names)
                if r >= 2:
                    for n in names:
                        total[n] += cpu[n]
                        ratios[n].append(cpu[n] / max(cpu[names[0]], 1))
            if r >= 2:
                for n in names:
                    per_round[n].append(total[n] / len(calls) / 1e6)
    finally:
        for conn, _ in arms.values():
            await conn.close()
    print(
        f"{args.kind}_fulltext_top_k: {len(calls)} questions x {args.rounds} rounds, arms "
        f"interleaved, PRUNE_FROM_POSTINGS {args.prune_from} (load average now "
        f"{os.getloadavg()[0]:.1f}); calls whose rows differ between arms: {differ}"
    )
    base = statistics.median(per_round[names[0]])
    for n in names:
        median = statistics.median(per_round[n])
        print(
            f"  {n:12} server CPU per call: median {median:6.3f} ms (x{median / base:.3f}); "
            f"median per-call ratio x{statistics.median(ratios[n]):.3f}"
        )
    return differ


def _arm(spec: str) -> tuple[str, str]:
    name, _, schema = spec.partition("=")
    if not name or not schema.isidentifier():
        raise argparse.ArgumentTypeError(f"an arm is NAME=SCHEMA, not {spec!r}")
    return name, schema


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--kind", choices=("evidence", "relationship"), required=True)
    parser.add_argument("--arm", type=_arm, action="append", required=True)
    parser.add_argument(
        "--functions", type=ab.functions_spec, action="append", default=[], metavar="SCHEMA=FILE"
    )
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--teams", type=int, default=10)
    parser.add_argument("--queries", type=Path, help="a BEIR queries.jsonl to ask instead")
    parser.add_argument(
        "--limit", type=int, help="per_list (default: 60 for evidence, 40 for relationships)"
    )
    parser.add_argument("--prune-from", type=int, default=bm25.PRUNE_FROM_POSTINGS)
    args = parser.parse_args()
    if args.limit is None:
        args.limit = 60 if args.kind == "evidence" else 40
    with rb.database(args.data_dir) as dsn:
        asyncio.run(ab.make_schemas(dsn, args.functions))
        sys.exit(1 if asyncio.run(compare(dsn, args)) else 0)


if __name__ == "__main__":
    main()
