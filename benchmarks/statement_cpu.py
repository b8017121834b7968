"""Server CPU of one recall's statements, and an interleaved A/B of two versions.

    python benchmarks/statement_cpu.py capture --data-dir HELD10K --out main.pickle
    python benchmarks/statement_cpu.py snapshot-role --data-dir HELD10K --role recall_before
    python benchmarks/statement_cpu.py compare --data-dir HELD10K --rounds 30 \\
        --arm main=main.pickle:recall_before --arm change=change.pickle

``capture`` runs full recalls (``recall_bench.FULL``, one question of the
benchmark's generator) through an in-process gateway on a dataset kept by
``recall_bench.py --data-dir`` and writes the statements of the last one, text
and arguments, to a file: run it once with each version of the code.

``compare`` replays each arm's statements the way a recall's unit runs them
(the token lookup, then one tenant transaction: the tenant settings and every
statement, rolled back so that the recall event is not kept), on one
connection per arm, arms in alternating order for ``--rounds`` rounds after
three of warm-up, and reads the backend's CPU time from
``/proc/PID/schedstat`` around each statement: the server's CPU per recall and
per statement, which other load on a shared machine does not distort the way
it distorts latency. The rows of every statement are compared between arms
(the view's clock and the recall event's time left out): the script exits 1
if any differ. The server must be a process of this machine. Beside it, the
replaying thread's own CPU over the transaction's statements (sending them,
decoding their rows): the client's side of the same statements.

An arm's optional ``:ROLE`` replaces the tenant role. ``snapshot-role`` makes
such a role: a copy of ``recall_app``'s grants and row-level security policies
as they are now. Made before a migration that changes the policies, it keeps
the old ones, so that old and new policies are compared on one dataset.

An arm's optional ``@SCHEMA`` puts that schema first on its connection's search
path, so that the functions in it stand in for the store's own (the statements
call them unqualified); ``--functions SCHEMA=FILE`` makes it anew from a file of
``CREATE FUNCTION`` statements, such as the migration a change restates, as
``recall_ab.py --functions`` does::

    python benchmarks/statement_cpu.py compare --data-dir HELD100K --rounds 30 \\
        --functions old=db/0105_fulltext_top_k_without_arrays.sql \\
        --arm old=main.pickle@old --arm new=main.pickle

``capture --fresh`` captures the recall of a question new to the query
embedding LRU (a repeated question's recall sends its vector lists with the
view, one statement fewer). ``capture --prune-from N`` captures with the full-text lists'
``PRUNE_FROM_POSTINGS`` at ``N`` (0: the pruned path of large spaces, see
``recall_ab.py --prune-from``). ``capture --known-at`` captures the recall of the
view at the team's knownAt instant, as the benchmark's knownAt step asks it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import numpy as np
from pgvector.asyncpg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_ab as ab
import recall_bench as rb

import gateway.store.database as database_module

Statement = tuple[str, tuple[Any, ...]]
_DRIVER = ("BEGIN", "COMMIT", "pg_advisory_unlock_all")


def _cpu_ns(pid: int) -> int:
    """Nanoseconds the process has run on a CPU (first field of schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def capture(
    dsn: str, seed: int, fresh: bool = False, known_at: bool = False
) -> list[Statement]:
    """The statements (and arguments) of one full recall, after two warm-up recalls.
    ``fresh``: the query embedding LRU emptied before each, so the recall is that
    of a new question (since the scope round, one statement more than a repeated
    one's). ``known_at``: the recall of the view at the team's knownAt instant
    (``recall_bench.known_instant``: the newest tenth of its space hidden), as the
    benchmark's knownAt step asks it."""
    from gateway.app import create_app
    from gateway.settings import Settings

    seen: list[Statement] = []
    counted = database_module.StatementCounter.__call__

    def keep(self: database_module.StatementCounter, record: object) -> None:
        seen.append((str(getattr(record, "query", "")), tuple(getattr(record, "args", ()) or ())))
        counted(self, record)

    database_module.StatementCounter.__call__ = keep  # type: ignore[method-assign]
    data = await rb.reuse(dsn, seed)
    if data is None:
        raise SystemExit("no dataset in that folder: run recall_bench.py with --data-dir first")
    question = rb.Zipf(np.random.default_rng(10)).query(np.random.default_rng(9), 3)
    variables: dict[str, Any] = {"q": question}
    if known_at:
        variables["knownAt"] = await rb.known_instant(dsn)
    app = create_app(Settings(database_url=dsn, migrate_on_start=False, log_level="warning"))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as client,
    ):
        for _ in range(3):
            seen.clear()
            if fresh:
                app.state.services.recall.embeddings._cache.clear()
            r = await client.post(
                "/graphql",
                json={"query": rb.FULL_AT if known_at else rb.FULL, "variables": variables},
                headers={"Authorization": f"Bearer {data['token']}"},
            )
            if "errors" in r.json():
                raise SystemExit(f"recall failed: {r.json()['errors']}")
    return list(seen)


SNAPSHOT_ROLE = """
DO $$
DECLARE r record;
BEGIN
    EXECUTE format('DROP ROLE IF EXISTS %I', '{role}');
    EXECUTE format('CREATE ROLE %I NOLOGIN NOINHERIT NOBYPASSRLS', '{role}');
    EXECUTE format('GRANT %I TO CURRENT_USER', '{role}');
    EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', '{role}');
    FOR r IN SELECT c.oid::regclass AS t, p.privilege_type AS priv
             FROM pg_class c, aclexplode(c.relacl) p
             WHERE c.relnamespace = 'public'::regnamespace
               AND p.grantee = 'recall_app'::regrole LOOP
        EXECUTE format('GRANT %s ON %s TO %I', r.priv, r.t, '{role}');
    END LOOP;
    FOR r IN SELECT a.attrelid::regclass AS t, a.attname AS col, p.privilege_type AS priv
             FROM pg_attribute a, aclexplode(a.attacl) p
             WHERE p.grantee = 'recall_app'::regrole LOOP
        EXECUTE format('GRANT %s (%I) ON %s TO %I', r.priv, r.col, r.t, '{role}');
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS f FROM pg_proc p
             WHERE p.pronamespace = 'public'::regnamespace
               AND has_function_privilege('recall_app', p.oid, 'EXECUTE') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', r.f, '{role}');
    END LOOP;
    FOR r IN SELECT pol.polrelid::regclass AS t, pol.polname AS name,
                    pg_get_expr(pol.polqual, pol.polrelid) AS q,
                    pg_get_expr(pol.polwithcheck, pol.polrelid) AS c
             FROM pg_policy pol WHERE 'recall_app'::regrole = ANY (pol.polroles) LOOP
        EXECUTE format('CREATE POLICY %I ON %s TO %I USING (%s) WITH CHECK (%s)',
                       r.name || '_' || '{role}', r.t, '{role}', r.q, coalesce(r.c, r.q));
    END LOOP;
END $$
"""


async def snapshot_role(dsn: str, role: str) -> None:
    if not role.isidentifier():
        raise SystemExit(f"not a role name: {role!r}")
    conn = await asyncpg.connect(dsn)
    try:
        # policies named after the role: drop those of an earlier snapshot first
        for t, name in await conn.fetch(
            "SELECT polrelid::regclass::text, polname FROM pg_policy WHERE polname LIKE $1",
            f"%\\_{role}",
        ):
            await conn.execute(f'DROP POLICY "{name}" ON {t}')
        if await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
            await conn.execute(f"DROP OWNED BY {role}")
        await conn.execute(SNAPSHOT_ROLE.replace("{role}", role))
    finally:
        await conn.close()


def _split(statements: list[Statement]) -> tuple[Statement, list[Statement]]:
    tenant = next(s for s in statements if "set_config('role'" in s[0])
    body = [
        s
        for s in statements
        if not any(mark in s[0] for mark in _DRIVER) and "set_config('role'" not in s[0]
    ]
    return tenant, body


async def _replay(
    conn: asyncpg.Connection, pid: int, statements: list[Statement], role: str | None
) -> tuple[int, list[int], list[Any], int]:
    """One recall: CPU of the whole, CPU per statement, the rows, and this
    thread's CPU over the tenant transaction's statements (sending them, and
    decoding their rows: the client's side of them)."""
    tenant, body = _split(statements)
    started = _cpu_ns(pid)
    per: list[int] = []
    rows: list[Any] = []
    client = 0
    lookup, *unit = body
    mark = _cpu_ns(pid)
    rows.append([tuple(r) for r in await conn.fetch(lookup[0], *lookup[1])])
    per.append(_cpu_ns(pid) - mark)
    tx = conn.transaction()
    await tx.start()
    try:
        args = list(tenant[1])
        if role is not None:
            args[0] = role
        await conn.execute(tenant[0], *args)
        for sql, values in unit:
            since = datetime.now(UTC) - timedelta(seconds=1)
            mark = _cpu_ns(pid)
            if "INSERT INTO recall_events" in sql:  # a new event ID each time
                values = (values[0], uuid.uuid4(), *values[2:])
            mine = time.thread_time_ns()
            got = await conn.fetch(sql, *values)
            client += time.thread_time_ns() - mine
            per.append(_cpu_ns(pid) - mark)
            # the view's clock and the event's recorded_at differ by construction
            clocked = "SELECT now() AS now" in sql or "INSERT INTO recall_events" in sql
            event = "INSERT INTO recall_events" in sql  # a new event ID each time
            rows.append([_unclocked(tuple(r)[event:], since) if clocked else tuple(r) for r in got])
    finally:
        await tx.rollback()
    return _cpu_ns(pid) - started, per, rows, client


def _unclocked(value: Any, since: datetime) -> Any:
    """``value`` with the view's clock and the event's instants (every timestamp
    from ``since`` on, nested in records and arrays too: the scope round returns
    them inside its records and beside them) left out."""
    if isinstance(value, datetime):
        return "now" if value >= since else value
    if isinstance(value, (tuple, list, asyncpg.Record)):
        return tuple(_unclocked(v, since) for v in value)
    return value


Arm = tuple[list[Statement], str | None, str | None]  # statements, role, schema


async def compare(dsn: str, arms: dict[str, Arm], rounds: int) -> int:
    from gateway.store.database import STATEMENT_CACHE_MAX_BYTES, _learn_domains

    conns: dict[str, tuple[asyncpg.Connection, int]] = {}
    for name, (_, _, schema) in arms.items():
        conn = await asyncpg.connect(
            ab.with_search_path(dsn, schema),
            max_cacheable_statement_size=STATEMENT_CACHE_MAX_BYTES,
        )
        await register_vector(conn)
        await _learn_domains(conn)
        conns[name] = (conn, int(await conn.fetchval("SELECT pg_backend_pid()")))
    totals: dict[str, list[int]] = {n: [] for n in arms}
    per: dict[str, list[list[int]]] = {n: [] for n in arms}
    clients: dict[str, list[int]] = {n: [] for n in arms}
    differ = 0
    names = list(arms)
    try:
        for i in range(rounds + 3):
            answers = []
            for name in names if i % 2 == 0 else names[::-1]:
                conn, pid = conns[name]
                total, each, rows, client = await _replay(conn, pid, *arms[name][:2])
                answers.append(rows)
                if i >= 3:
                    totals[name].append(total)
                    per[name].append(each)
                    clients[name].append(client)
            differ += any(a != answers[0] for a in answers[1:])
    finally:
        for conn, _ in conns.values():
            await conn.close()
    print(
        f"{rounds} rounds, arms interleaved (load average now {os.getloadavg()[0]:.1f}); "
        f"rounds whose rows differ between arms: {differ}"
    )
    base = statistics.median(totals[names[0]])
    for name in names:
        median = statistics.median(totals[name])
        steps = "  ".join(
            f"{statistics.median(column) / 1e6:.2f}" for column in zip(*per[name], strict=True)
        )
        print(
            f"  {name:12} server CPU per recall: median {median / 1e6:6.2f} ms "
            f"(x{median / base:.3f}), per statement: {steps} ms; this client's CPU "
            f"over them: median {statistics.median(clients[name]) / 1e3:.0f} us"
        )
    return differ


def _arm(spec: str) -> tuple[str, Arm]:
    name, _, rest = spec.partition("=")
    rest, _, schema = rest.partition("@")
    file, _, role = rest.partition(":")
    if not name or not file or (schema and not schema.isidentifier()):
        raise argparse.ArgumentTypeError(f"an arm is NAME=FILE[:ROLE][@SCHEMA], not {spec!r}")
    with open(file, "rb") as f:
        statements = pickle.load(f)  # noqa: S301 - a file this script wrote
    return name, (statements, role or None, schema or None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture")
    cap.add_argument("--data-dir", type=Path, required=True)
    cap.add_argument("--out", type=Path, required=True)
    cap.add_argument("--seed", type=int, default=7)
    cap.add_argument("--prune-from", type=int, metavar="N")
    cap.add_argument(
        "--fresh", action="store_true", help="a new question's recall (the LRU emptied first)"
    )
    cap.add_argument(
        "--known-at", action="store_true", help="a knownAt view's recall (the team's instant)"
    )
    snap = sub.add_parser("snapshot-role")
    snap.add_argument("--data-dir", type=Path, required=True)
    snap.add_argument("--role", required=True)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("--data-dir", type=Path, required=True)
    cmp_.add_argument("--arm", type=_arm, action="append", required=True)
    cmp_.add_argument("--rounds", type=int, default=30)
    cmp_.add_argument(
        "--functions", type=ab.functions_spec, action="append", default=[], metavar="SCHEMA=FILE"
    )
    args = parser.parse_args()
    with rb.database(args.data_dir) as dsn:
        if args.command == "capture":
            if args.prune_from is not None:
                from gateway.store import bm25

                bm25.PRUNE_FROM_POSTINGS = args.prune_from
            asyncio.run(database_module.prepare(dsn, migrate=True))
            statements = asyncio.run(capture(dsn, args.seed, args.fresh, args.known_at))
            args.out.write_bytes(pickle.dumps(statements))
            print(f"{len(statements)} statements written to {args.out}")
        elif args.command == "snapshot-role":
            asyncio.run(snapshot_role(dsn, args.role))
            print(f"role {args.role}: recall_app's grants and policies as they are now")
        else:
            asyncio.run(ab.make_schemas(dsn, args.functions))
            sys.exit(1 if asyncio.run(compare(dsn, dict(args.arm), args.rounds)) else 0)


if __name__ == "__main__":
    main()
