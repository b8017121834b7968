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

``--prune-from N`` sets the full-text lists' ``PRUNE_FROM_POSTINGS``
(gateway/store/bm25.py) for every arm: ``0`` sends every question down the
pruned path (first floor, minor lexemes) that only spaces of about 30,000
evidence and more take with the shipped threshold, so that a change to that
path can be compared on a smaller dataset.

**Datasets as arms** (``--dataset NAME=DIR``, repeatable, instead of
``--data-dir`` and ``--arm``)::

    python benchmarks/recall_ab.py --queries 80 --parts \\
        --dataset 100k=HELD100K --dataset 1m=HELD1M

Each arm is a dataset kept by ``recall_bench.py --data-dir`` with its own
embedded server and its own gateway (the shipped settings), all in this
process, so that a figure at one size can be set against another measured under
the same load: every question goes to every arm, the arms' order rotated one
place per question (each arm takes each position equally often), and the
ratio printed is each arm's p50 over the first arm's. Each arm asks as its own
dataset's token, at its own team's ``knownAt`` instant. Answers are not
compared (the datasets differ). Per arm and kind it also prints where the
statements' time went: each statement of a recall named by its step
(:data:`STEPS`: the token lookup, the scope round, the first round, ...; the time
from sending it to its answer, medians over the recalls) and each step's
ratio to the first arm's. ``--parts`` then times the first round's parts,
which the recall sends as one statement, one by one on each arm (same
questions, same rotation, in a tenant transaction with the recall's plan
mode): the evidence full-text list, the evidence vector list, the hydration of
both lists' candidates, and relationship discovery by full text and by vector.
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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_bench as rb
import vector_ef_bench
from bench_common import p50_p95

import gateway.store.database as database_module

SHIPPED_CACHE_BYTES = database_module.STATEMENT_CACHE_MAX_BYTES
KINDS = {"full": rb.FULL, "evidence-only": rb.EVIDENCE_ONLY, "knownAt": rb.FULL_AT}
WARM = 5

# A recall's statements by the start of their text (whitespace collapsed), in
# the order a full recall sends them (gateway/store/: the token lookup of
# auth.py, the unit of database.py, the scope round of round_trips.py (the view
# with the lists that need no query embedding; the view alone only when that
# round failed), the first round (the vector parts after the scope round), the
# answer and last rounds with the community snapshot and related handles between
# them; relationship discovery beside them on a side connection). A statement matching none is "other": a separate statement of a
# degraded recall, or a step renamed in the store (then this table is behind).
STEPS: tuple[tuple[str, str], ...] = (
    ("SELECT t.secret_sha256", "token"),
    ("BEGIN", "begin"),
    ("SELECT set_config('role'", "tenant settings"),
    ("SELECT now() AS now, s.id, s.kind", "view"),
    ("WITH scope AS MATERIALIZED", "scope round"),
    ("WITH cands AS MATERIALIZED", "first round"),
    # Relationship discovery on a side connection (round_trips.side_discovery),
    # beside the rounds above: it may be answered before or after the first round.
    ("WITH side_tenant AS MATERIALIZED", "discovery beside"),
    ("WITH run AS MATERIALIZED", "community snapshot"),
    ("SELECT o.id, o.space_id, o.subject_entity_id", "related handles"),
    # The answer round: with the related frontiers' handles when a shared branch
    # has related groups (round_trips.answer_round), else hypotheses and conflicts.
    ("WITH handles AS MATERIALIZED", "answer round"),
    ("SELECT (SELECT array_agg(ROW(x.*))", "hypotheses, conflicts"),
    ("WITH event AS", "nested rows, event"),
    ("COMMIT", "commit"),
)
STEP_NAMES: tuple[str, ...] = (*(name for _, name in STEPS), "other")


def statement_step(sql: str) -> str:
    """The step of a recall that sent ``sql`` (see :data:`STEPS`)."""
    text = " ".join(sql.split())
    for start, name in STEPS:
        if text.startswith(start):
            return name
    return "other"


def step_times(records: list[tuple[str, float]]) -> dict[str, float]:
    """Milliseconds per step of one recall from its statements ``(sql, seconds)``;
    a step that sent several statements gets their sum."""
    out: dict[str, float] = {}
    for sql, seconds in records:
        step = statement_step(sql)
        out[step] = out.get(step, 0.0) + seconds * 1000
    return out


def arm_order(arms: int, question: int) -> list[int]:
    """The arms' order for the ``question``-th question: rotated one place per
    question, so that over any ``arms`` consecutive questions each arm is asked
    once in each position (two arms: alternating)."""
    return [(question + k) % arms for k in range(arms)]


def step_medians(recalls: list[dict[str, float]]) -> dict[str, float]:
    """Each step's median over ``recalls`` (one dict of :func:`step_times` each); a
    recall that did not send a step counts 0 for it, so that the medians of the
    steps add up like the recalls do."""
    seen = {step for times in recalls for step in times}
    return {
        step: statistics.median(times.get(step, 0.0) for times in recalls)
        for step in STEP_NAMES
        if step in seen
    }


class RecordingCounter(database_module.StatementCounter):
    """The pool's statement counter that also keeps each counted statement's text
    and time, until :meth:`take`. Put in place of the store's before the gateways
    open their pools (Database.open makes its counter when called)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, float]] = []

    def __call__(self, record: object) -> None:
        before = self.count
        super().__call__(record)
        if self.count != before:
            query = str(getattr(record, "query", ""))
            self.records.append((query, float(getattr(record, "elapsed", 0.0) or 0.0)))

    def take(self) -> list[tuple[str, float]]:
        records, self.records = self.records, []
        return records


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


def functions_spec(spec: str) -> tuple[str, Path]:
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


def with_search_path(dsn: str, schema: str | None) -> str:
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


@dataclass
class Gateway:
    """One arm: a gateway app in this process, and what its recalls send."""

    name: str
    app: Any
    client: httpx.AsyncClient
    headers: dict[str, str]
    known_at: str  # the arm's team's own knownAt instant
    team: str
    space: UUID  # the team's shared space (``--parts``)
    generation: int  # its generation now (``--parts``)


Timings = dict[tuple[str, str], list[tuple[float, float, int, dict[str, float]]]]


async def open_gateway(
    stack: contextlib.AsyncExitStack,
    name: str,
    dsn: str,
    token: str,
    known_at: str,
    team: str,
    space: UUID,
    settings: tuple[int, str | None] | None = None,
    counter: type[database_module.StatementCounter] = RecordingCounter,
) -> Gateway:
    """A gateway app on ``dsn`` with its pool open, and an HTTP client to it;
    ``settings``: an arm's statement cache limit and plan mode (None: the
    shipped ones); ``counter``: the pool's statement counter (the default keeps
    each statement's text and time for :func:`step_times`)."""
    from gateway.app import create_app
    from gateway.settings import Settings

    conn = await asyncpg.connect(dsn)
    try:
        generation = await conn.fetchval(
            "SELECT max(generation) FROM space_generations WHERE team_id = $1 AND space_id = $2",
            team,
            space,
        )
    finally:
        await conn.close()
    # Both read by Database.open when the app's lifespan opens its pool.
    database_module.StatementCounter = counter  # type: ignore[misc]
    database_module.STATEMENT_CACHE_MAX_BYTES = SHIPPED_CACHE_BYTES
    if settings is not None:
        database_module.STATEMENT_CACHE_MAX_BYTES = settings[0]
    app = create_app(Settings(database_url=dsn, migrate_on_start=False, log_level="warning"))
    await stack.enter_async_context(app.router.lifespan_context(app))
    if settings is not None:
        app.state.services.recall.plan_cache_mode = settings[1]
    client = await stack.enter_async_context(
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ab")
    )
    # The start-up warm-up (docs/deploy.md) reads the store's files in the
    # background; timing recalls beside it would time the disk.
    deadline = time.monotonic() + 1800
    while (await client.get("/readyz")).status_code != 200:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: the gateway did not become ready")
        await asyncio.sleep(0.2)
    return Gateway(
        name,
        app,
        client,
        {"Authorization": f"Bearer {token}"},
        known_at,
        team,
        space,
        int(generation or 1),
    )


async def ask_all(
    gateways: list[Gateway], kinds: list[str], questions: list[str], compare: bool
) -> tuple[Timings, int]:
    """Every question of every kind to every arm, the arms' order rotated per
    question (:func:`arm_order`); the first :data:`WARM` of each kind are not
    counted. Returns per (kind, arm) each recall's (end-to-end ms, statements'
    ms, statements, ms per step), and, with ``compare``, the number of questions
    whose ranked answers differ between arms."""
    timings: Timings = {}
    differ = 0
    for kind in kinds:
        for i, question in enumerate(questions):
            answers = set()
            for k in arm_order(len(gateways), i):
                gw = gateways[k]
                counter = gw.app.state.services.db.counter
                await asyncio.sleep(0)  # the logger's pending calls (call_soon)
                count, seconds = counter.count, counter.seconds
                counter.take()
                variables: dict[str, Any] = {"q": question}
                if kind == "knownAt":
                    variables["knownAt"] = gw.known_at
                started = time.perf_counter()
                r = await gw.client.post(
                    "/graphql",
                    json={"query": KINDS[kind], "variables": variables},
                    headers=gw.headers,
                )
                elapsed = (time.perf_counter() - started) * 1000
                await asyncio.sleep(0)
                body = r.json()
                if "errors" in body:
                    raise SystemExit(f"{gw.name}: {body['errors']}")
                got = body["data"]["recallMemory"]
                answers.add(
                    json.dumps([got["results"], got.get("relatedRelationships")], sort_keys=True)
                )
                steps = step_times(counter.take())
                if i >= WARM:
                    timings.setdefault((kind, gw.name), []).append(
                        (
                            elapsed,
                            (counter.seconds - seconds) * 1000,
                            counter.count - count,
                            steps,
                        )
                    )
            differ += compare and len(answers) > 1
    return timings, differ


def report(timings: Timings, names: list[str], steps: bool) -> None:
    """p50/p95 per kind and arm, each arm's p50 against the first arm's, and
    (``steps``) each step's median statements' time per arm."""
    for kind in dict.fromkeys(k for k, _ in timings):
        base = p50_p95([r[0] for r in timings[(kind, names[0])]])[0]
        for name in names:
            rows = timings[(kind, name)]
            p50, p95 = p50_p95([r[0] for r in rows])
            ratio = "" if name == names[0] else f"   p50 {p50 / base:.2f}x {names[0]}'s"
            print(
                f"  {kind:14} {name:12} p50 {p50:6.1f} ms   p95 {p95:6.1f} ms   statements' "
                f"time {statistics.median(r[1] for r in rows):5.1f} ms   statements "
                f"{statistics.median(r[2] for r in rows):.0f}{ratio}"
            )
        if not steps:
            continue
        medians = {name: step_medians([r[3] for r in timings[(kind, name)]]) for name in names}
        print(f"    {kind}: statements' time per step, medians (ms)")
        ratio_of = f"   {names[-1]}/{names[0]}" if len(names) > 1 else ""
        print("      " + f"{'step':24}" + "".join(f"{name:>12}" for name in names) + ratio_of)
        for step in STEP_NAMES:
            if not any(step in m for m in medians.values()):
                continue
            cells = "".join(f"{medians[name].get(step, 0.0):12.1f}" for name in names)
            first = medians[names[0]].get(step, 0.0)
            last = medians[names[-1]].get(step, 0.0)
            ratio = f"   {last / first:.1f}x" if len(names) > 1 and first > 0 else ""
            print(f"      {step:24}{cells}{ratio}")


PARTS = (
    "evidence full-text list",
    "evidence vector list",
    "hydration",
    "discovery: full-text list",
    "discovery: vector list",
    "first round, whole",
)


async def time_parts(
    gateways: list[Gateway], questions: list[str]
) -> dict[tuple[str, str], list[float]]:
    """The first round's parts, each sent as its own statement, for every question
    on every arm (rotated like the recalls); the first :data:`WARM` questions are
    not counted. The query embedding is computed once per question, outside."""
    embedder = gateways[0].app.state.services.recall.embedder
    embed = getattr(embedder, "embed_queries", None) or embedder.embed
    out: dict[tuple[str, str], list[float]] = {}
    for i, question in enumerate(questions):
        vector = np.asarray((await embed([question]))[0], dtype=np.float32)
        for k in arm_order(len(gateways), i):
            times = await _parts_once(gateways[k], question, vector)
            if i >= WARM:
                for part, ms in times.items():
                    out.setdefault((part, gateways[k].name), []).append(ms)
    return out


async def _parts_once(gw: Gateway, question: str, vector: np.ndarray) -> dict[str, float]:
    """:data:`PARTS` for one question on one arm, in one tenant transaction with
    the recall's plan mode, as a recall of the benchmark's defaults asks them (the
    shared space, the current view, default limits): each list alone, the
    hydration of both lists' candidates, discovery by each list; then the whole
    first round as the recall sends it. Milliseconds from sending to the answer."""
    from gateway.services.recall_input import LIMITS
    from gateway.services.recall_types import overfetch
    from gateway.store import recall as hydration
    from gateway.store import related, round_trips, search

    per_list = overfetch(LIMITS["limit"].default)
    per_discovery = overfetch(
        max(LIMITS["relationshipLimit"].default, LIMITS["communityLimit"].default)
    )
    branch = (search.BranchSearch("shared", gw.space, gw.generation),)
    db = gw.app.state.services.db
    times: dict[str, float] = {}
    async with (
        db.unit(
            gw.team, [gw.space], plan_cache_mode=gw.app.state.services.recall.plan_cache_mode
        ) as unit,
        unit.step() as conn,
    ):
        now: datetime = await conn.fetchval("SELECT now()")

        def candidates(text: str | None, v: np.ndarray | None) -> search.CandidateQuery:
            return search.CandidateQuery(gw.team, branch, text, v, (), (), per_list, None)

        def discovery(text: str | None, v: np.ndarray | None) -> related.DiscoveryQuery:
            return related.DiscoveryQuery(
                team_id=gw.team,
                space_id=gw.space,
                generation=gw.generation,
                readable_space_ids=[gw.space],
                t_sys=now,
                t_valid=now,
                text=text,
                vector=v,
                per_list=per_discovery,
                returned_relationship_ids=(),
                known_evidence_ids=(),
                known_relationship_ids=(),
            )

        async def timed(part: str, sql: str, args: list[Any]) -> list[Any]:
            started = time.perf_counter()
            rows = await conn.fetch(sql, *args)
            times[part] = (time.perf_counter() - started) * 1000
            return list(rows)

        ids: list[str] = []
        for part, wanted, query in (
            (PARTS[0], "fulltext", candidates(question, None)),
            (PARTS[1], "vector", candidates(None, vector)),
        ):
            sql, args = search.build_statement(query, [wanted])  # type: ignore[list-item]
            ids += [row[3] for row in await timed(part, sql, args)]
        await timed(
            PARTS[2],
            hydration.ELIGIBLE_SQL,
            [gw.team, list(dict.fromkeys(ids)), [gw.space], now, now],
        )
        await timed(PARTS[3], *related.build_discovery(discovery(question, None)))
        await timed(PARTS[4], *related.build_discovery(discovery(None, vector)))
        started = time.perf_counter()
        await round_trips.first_round(
            conn, candidates(question, vector), now, discovery(question, vector)
        )
        times[PARTS[5]] = (time.perf_counter() - started) * 1000
    return times


def report_parts(parts: dict[tuple[str, str], list[float]], names: list[str]) -> None:
    print("  the first round's parts, each its own statement (median / p95 ms):")
    ratio_of = f"   {names[-1]}/{names[0]} (p50)" if len(names) > 1 else ""
    print("    " + f"{'part':28}" + "".join(f"{name:>22}" for name in names) + ratio_of)
    for part in PARTS:
        cells = "".join(
            "{:>22}".format("{:.1f} / {:.1f}".format(*p50_p95(parts[(part, name)])))
            for name in names
        )
        first = p50_p95(parts[(part, names[0])])[0]
        last = p50_p95(parts[(part, names[-1])])[0]
        ratio = f"   {last / first:.1f}x" if len(names) > 1 and first > 0 else ""
        print(f"    {part:28}{cells}{ratio}")


def _questions(n: int) -> list[str]:
    """The same ``n`` + :data:`WARM` questions every run (and for every arm)."""
    rng = np.random.default_rng(21)
    corpus = rb.Zipf(np.random.default_rng(10))
    return [corpus.query(rng, int(rng.integers(0, len(rb.TOPICS)))) for _ in range(n + WARM)]


async def run(
    dsn: str,
    arms: list[Arm],
    n: int,
    kinds: list[str],
    functions: list[tuple[str, Path]],
    team: str | None = None,
    ef_floors: list[int] | None = None,
) -> int:
    """Arms that differ in the gateway's settings or functions, on one dataset."""
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
    token = data["token"] if team is None else await team_token(dsn, team)
    async with contextlib.AsyncExitStack() as stack:
        gateways = [
            await open_gateway(
                stack,
                name,
                with_search_path(dsn, schema),
                token,
                at,
                team or "bench-00",
                data["teams"][team or "bench-00"],
                (size, mode),
            )
            for name, size, mode, schema in arms
        ]
        timings, differ = await ask_all(gateways, kinds, _questions(n), compare=True)
    print(
        f"{n} questions per kind, arms interleaved (load average now {os.getloadavg()[0]:.1f}); "
        f"answers that differ between arms: {differ}"
    )
    report(timings, [a[0] for a in arms], steps=False)
    return differ


async def run_datasets(
    dsns: list[tuple[str, str]], n: int, kinds: list[str], team: str | None, parts: bool
) -> None:
    """Arms that are datasets, each with its own server and gateway (module doc)."""
    async with contextlib.AsyncExitStack() as stack:
        gateways = []
        for name, dsn in dsns:
            await database_module.prepare(dsn, migrate=True)
            data = await rb.reuse(dsn, 7)
            if data is None:
                raise SystemExit(f"{name}: no dataset in that folder (recall_bench.py --data-dir)")
            who = team or "bench-00"
            token = data["token"] if team is None else await team_token(dsn, team)
            at = await rb.known_instant(dsn, who)
            gateways.append(
                await open_gateway(stack, name, dsn, token, at, who, data["teams"][who])
            )
        questions = _questions(n)
        load = os.getloadavg()[0]
        timings, _ = await ask_all(gateways, kinds, questions, compare=False)
        print(
            f"{n} questions per kind, datasets interleaved (load average {load:.1f} -> "
            f"{os.getloadavg()[0]:.1f}); p50 ratios against {dsns[0][0]}"
        )
        names = [name for name, _ in dsns]
        report(timings, names, steps=True)
        if parts:
            load = os.getloadavg()[0]
            timed = await time_parts(gateways, questions)
            print(f"  (load average {load:.1f} -> {os.getloadavg()[0]:.1f})")
            report_parts(timed, names)


def _dataset(spec: str) -> tuple[str, Path, int | None]:
    """``NAME=DIR``, or ``NAME=DIR:MB`` for that arm's server with ``MB`` of
    shared buffers (else the gateway's memory settings)."""
    name, _, rest = spec.partition("=")
    folder, _, buffers = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not name or not folder or (buffers and not buffers.isdigit()):
        raise argparse.ArgumentTypeError(f"a dataset is NAME=DIR or NAME=DIR:MB, not {spec!r}")
    return name, Path(folder), int(buffers) if buffers else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--queries", type=int, default=80)
    parser.add_argument("--arm", type=_arm, action="append", default=[])
    parser.add_argument(
        "--dataset",
        type=_dataset,
        action="append",
        default=[],
        metavar="NAME=DIR[:MB]",
        help="an arm that is a dataset kept by recall_bench.py --data-dir (repeatable; "
        "instead of --data-dir and --arm; the first is the reference of the ratios; "
        ":MB: that arm's server gets MB of shared buffers)",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="with --dataset: also time the first round's parts one by one on each arm",
    )
    parser.add_argument("--kinds", default="full,evidence-only,knownAt")
    parser.add_argument(
        "--functions",
        type=functions_spec,
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
    parser.add_argument(
        "--prune-from",
        type=int,
        metavar="N",
        help="the full-text lists' PRUNE_FROM_POSTINGS for every arm (gateway/store/bm25.py; "
        "0: the pruned path of large spaces, taken by every question on a smaller dataset)",
    )
    args = parser.parse_args()
    if args.prune_from is not None:
        from gateway.store import bm25

        bm25.PRUNE_FROM_POSTINGS = args.prune_from
    kinds = args.kinds.split(",")
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    if args.dataset:
        if args.data_dir or args.arm or args.functions or args.ef_floor:
            parser.error("--dataset arms take none of --data-dir, --arm, --functions, --ef-floor")
        if len({name for name, _, _ in args.dataset}) != len(args.dataset):
            parser.error("two datasets of one name")
        with contextlib.ExitStack() as stack:
            dsns = [(name, stack.enter_context(rb.database(d, mb))) for name, d, mb in args.dataset]
            asyncio.run(run_datasets(dsns, args.queries, kinds, args.team, args.parts))
        return
    if not (args.data_dir and args.arm):
        parser.error("give --data-dir and --arm (or --dataset)")
    if args.parts:
        parser.error("--parts needs --dataset arms")
    with rb.database(args.data_dir) as dsn:
        differ = asyncio.run(
            run(
                dsn,
                args.arm,
                args.queries,
                kinds,
                args.functions,
                args.team,
                args.ef_floor,
            )
        )
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
