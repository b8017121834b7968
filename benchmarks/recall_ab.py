"""Whole-recall A/B, interleaved in one process, on a dataset kept by recall_bench.py.

    python benchmarks/recall_ab.py --data-dir HELD100K --queries 80 \\
        --arm before=15360:server --arm after=65536:force_generic_plan
    python benchmarks/recall_ab.py --data-dir HELD100K --queries 80 \\
        --functions old=db/0060_vector_ef_by_space_size.sql \\
        --arm old=65536:server:old --arm shipped=65536:server

Each arm is a gateway app of its own (own pool, own query-embedding LRU) in this
process, on the same server and data; an arm is ``name=CACHE_BYTES:PLAN_MODE``
or ``name=CACHE_BYTES:PLAN_MODE:SCHEMA``: the longest statement its connections
keep prepared (asyncpg's ``max_cacheable_statement_size``; 15360 is asyncpg's
default), the ``plan_cache_mode`` its recalls set (``server``: none, the
server's own), and a schema put before ``public`` on its connections'
``search_path``, so that the functions in it stand in for the store's own of the
same name (the store calls them unqualified). ``--functions SCHEMA=FILE``
(repeatable) makes that schema first, anew: the SQL of FILE run with the schema
first on the search path, so that its functions are created there instead of
in ``public``. FILE must hold only ``CREATE [OR REPLACE] FUNCTION`` statements,
such as a migration that restates a function (any other statement would change
the dataset for both arms). That is how two versions of a server-side function
are compared on one dataset. Every
question goes to every arm, in alternating order, so that load from elsewhere
falls on all arms alike (the machine this was written on is shared); the first
five questions of each kind warm the connections and are not counted.

Prints per kind of recall and arm: p50 and p95 end to end, the statements'
time (median) and the statements per recall; and checks that the arms return
the same ranked results and related relationships for every question (exit 1
if any differ).

``--ef-floor F`` (repeatable) makes the schema ``ef_floor_F`` of
``vector_ef_bench.py``: the store's two vector functions with the ef_search rule
of db/0060 at a floor of F, for an arm ``NAME=CACHE:MODE:ef_floor_F`` (a file
of ``--functions`` cannot do it: the functions set their own search path, so
they would call the store's rule).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_bench as rb
import vector_ef_bench

import gateway.store.database as database_module

KINDS = {"full": rb.FULL, "evidence-only": rb.EVIDENCE_ONLY, "knownAt": rb.FULL_AT}
WARM = 5


Arm = tuple[str, int, str | None, str | None]


def _arm(spec: str) -> Arm:
    name, _, rest = spec.partition("=")
    size, _, rest = rest.partition(":")
    mode, _, schema = rest.partition(":")
    if not name or not size.isdigit() or not mode:
        raise argparse.ArgumentTypeError(
            f"an arm is NAME=CACHE_BYTES:PLAN_MODE[:SCHEMA], not {spec!r}"
        )
    if schema and not schema.isidentifier():
        raise argparse.ArgumentTypeError(f"not a schema name: {schema!r}")
    return name, int(size), None if mode == "server" else mode, schema or None


def _functions(spec: str) -> tuple[str, Path]:
    schema, _, file = spec.partition("=")
    if not schema.isidentifier() or not file:
        raise argparse.ArgumentTypeError(f"functions are SCHEMA=FILE, not {spec!r}")
    return schema, Path(file)


async def make_schemas(dsn: str, functions: list[tuple[str, Path]]) -> None:
    """Each schema anew, holding the functions of its files (see the module doc)."""
    from gateway.store.database import APP_ROLE

    conn = await asyncpg.connect(dsn)
    try:
        for schema in dict(functions):
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            await conn.execute(f"CREATE SCHEMA {schema}")
            await conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {APP_ROLE}")
        for schema, file in functions:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL search_path = {schema}, public")
                await conn.execute(file.read_text())
        for schema in dict(functions):
            names = await conn.fetchval(
                "SELECT string_agg(p.proname, ', ' ORDER BY p.proname) FROM pg_proc p "
                "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1",
                schema,
            )
            print(f"schema {schema}: {names}")
    finally:
        await conn.close()


def _with_search_path(dsn: str, schema: str | None) -> str:
    """The DSN whose connections look in ``schema`` first (asyncpg passes unknown
    query parameters to the server as settings)."""
    if schema is None:
        return dsn
    return f"{dsn}{'&' if '?' in dsn else '?'}search_path={schema}%2Cpublic"


async def team_token(dsn: str, team: str) -> str:
    """A token of ``team``'s analyst (the dataset's own token is bench-00's)."""
    from gateway import tokens

    secret = tokens.new_secret()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO api_tokens (id, team_id, principal_id, secret_sha256, binding) "
            "VALUES ($1, $2, 'analyst', $3, 'private') "
            "ON CONFLICT (id) DO UPDATE SET secret_sha256 = EXCLUDED.secret_sha256",
            f"ab-{team}",
            team,
            tokens.hash_secret(secret),
        )
    finally:
        await conn.close()
    return tokens.format_token(f"ab-{team}", secret)


async def run(
    dsn: str,
    arms: list[Arm],
    n: int,
    kinds: list[str],
    functions: list[tuple[str, Path]],
    team: str | None = None,
    ef_floors: list[int] | None = None,
) -> int:
    from gateway.app import create_app
    from gateway.settings import Settings

    await database_module.prepare(dsn, migrate=True)
    await make_schemas(dsn, functions)
    if ef_floors:
        conn = await asyncpg.connect(dsn)
        try:
            await vector_ef_bench.make_arms(conn, ef_floors)
        finally:
            await conn.close()
    data = await rb.reuse(dsn, 7)
    if data is None:
        raise SystemExit("no dataset in that folder: run recall_bench.py with --data-dir first")
    # The team's own instant: another team's would show it an empty space, or all of it.
    at = await rb.known_instant(dsn, team or "bench-00")
    rng = np.random.default_rng(21)
    corpus = rb.Zipf(np.random.default_rng(10))
    questions = [corpus.query(rng, int(rng.integers(0, len(rb.TOPICS)))) for _ in range(n + WARM)]
    token = data["token"] if team is None else await team_token(dsn, team)
    headers = {"Authorization": f"Bearer {token}"}
    differ = 0
    async with contextlib.AsyncExitStack() as stack:
        gateways = []
        for name, size, mode, schema in arms:
            # Read by Database.open when the app's lifespan opens its pool.
            database_module.STATEMENT_CACHE_MAX_BYTES = size
            app = create_app(
                Settings(
                    database_url=_with_search_path(dsn, schema),
                    migrate_on_start=False,
                    log_level="warning",
                )
            )
            await stack.enter_async_context(app.router.lifespan_context(app))
            app.state.services.recall.plan_cache_mode = mode
            client = await stack.enter_async_context(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ab")
            )
            gateways.append((name, app, client))
        timings: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
        for kind in kinds:
            for i, question in enumerate(questions):
                answers = set()
                for name, app, client in gateways if i % 2 == 0 else gateways[::-1]:
                    counter = app.state.services.db.counter
                    count, seconds = counter.count, counter.seconds
                    variables: dict[str, Any] = {"q": question}
                    if kind == "knownAt":
                        variables["knownAt"] = at
                    started = time.perf_counter()
                    r = await client.post(
                        "/graphql",
                        json={"query": KINDS[kind], "variables": variables},
                        headers=headers,
                    )
                    elapsed = (time.perf_counter() - started) * 1000
                    body = r.json()
                    if "errors" in body:
                        raise SystemExit(f"{name}: {body['errors']}")
                    got = body["data"]["recallMemory"]
                    answers.add(
                        json.dumps(
                            [got["results"], got.get("relatedRelationships")], sort_keys=True
                        )
                    )
                    if i >= WARM:
                        timings.setdefault((kind, name), []).append(
                            (elapsed, (counter.seconds - seconds) * 1000, counter.count - count)
                        )
                differ += len(answers) > 1
    print(
        f"{n} questions per kind, arms interleaved (load average now {os.getloadavg()[0]:.1f}); "
        f"answers that differ between arms: {differ}"
    )
    for (kind, name), rows in timings.items():
        ends = sorted(r[0] for r in rows)
        print(
            f"  {kind:14} {name:12} p50 {statistics.median(ends):6.1f} ms   "
            f"p95 {ends[max(0, int(len(ends) * 0.95) - 1)]:6.1f} ms   statements' time "
            f"{statistics.median(r[1] for r in rows):5.1f} ms   statements "
            f"{statistics.median(r[2] for r in rows):.0f}"
        )
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=80)
    parser.add_argument("--arm", type=_arm, action="append", required=True)
    parser.add_argument("--kinds", default="full,evidence-only,knownAt")
    parser.add_argument(
        "--functions",
        type=_functions,
        action="append",
        default=[],
        metavar="SCHEMA=FILE",
        help="make SCHEMA anew with the functions of FILE, for an arm's search path",
    )
    parser.add_argument(
        "--team", help="recall as this team's analyst (default: the dataset's token, bench-00)"
    )
    parser.add_argument(
        "--ef-floor",
        type=int,
        action="append",
        default=[],
        metavar="F",
        help="make schema ef_floor_F: the store's two vector functions with db/0060's "
        "ef_search rule at a floor of F (benchmarks/vector_ef_bench.py), for an arm",
    )
    args = parser.parse_args()
    with rb.database(args.data_dir) as dsn:
        differ = asyncio.run(
            run(
                dsn,
                args.arm,
                args.queries,
                args.kinds.split(","),
                args.functions,
                args.team,
                args.ef_floor,
            )
        )
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
