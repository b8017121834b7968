"""Remember benchmark: the `remember` mutation over HTTP on the demo data.

    python benchmarks/remember_bench.py --calls 200

Loads the bundled demo data (the same loader as `recall-gateway demo`),
issues a token for the demo principal, starts the gateway on loopback and
sends `remember` calls sequentially, each with new IDs: one evidence text (a
sentence of about 20 words) of an existing source, with one occurrence and one
entity mention, and one relationship between two demo entities supported by
that occurrence. The latency includes everything the mutation does before it
returns: authentication, validation, the checks and inserts in one
transaction, and the embeddings of the evidence and the relationship computed
by the configured provider (the local MiniLM model by default). Prints p50 and
p95, and the same for an evidence-only call (the two kinds interleaved, so both
see the same machine load), and the local model embedding two texts alone: in
one call (the floor printed since the first runs), and the call's own two texts
as the gateway embeds them (a call each, back to back).

With no DATABASE_URL, an embedded server is started in a temporary folder and
removed afterwards.

``--against DIR`` compares this checkout's gateway with another checkout's (for
example one of main): this script of each checkout is started with
``--serve-only`` in a process of its own (its own code, embedded server and
demo data; ports ``--port`` + 1 and + 2), so that neither shares a process
with the client, and every call of the two kinds (evidence + relationship,
evidence only) is sent to both gateways in turn, the first of the two
alternating, so that both see the same machine load. Printed: each one's p50
and p95, and their ratio.

``--profile`` prints where a call's time goes (medians of its phases);
``--timeline`` also every step of one call on one clock (the HTTP view, the
token lookup, graphql-core's execution, the resolver, each SQL statement from
its send to its answer, the embedding calls, the response's messages) and the
CPU each call took per thread (the event loop, the model's threads, the
client) and for the PostgreSQL server's processes; ``--timeline-out FILE``
writes each call's timeline and CPU as JSON lines, and ``--timeline`` prints
the event loop's CPU between its marks. The default call and the same call
with one rule of the write path switched (``--ab``, :data:`SWITCHES`; ``lane``:
the embedding lane's other rule, one call in flight where the default is two
and two where it is one; a candidate rule goes there as a class attribute of
the write path read per call, as the evidence's vectors stored first was
priced) are compared pair by pair (the median of the differences with a
bootstrap interval), the two taking turns at going first: the second of two
calls sent back to back was the faster by 0.3-0.6 ms whatever its rule
(docs/benchmarks.md). The last lines are the model alone, in this process:
two texts in one call (the floor printed since the first runs), the call's
own two texts a call each (as the gateway embeds them), and those two in one
call (one run, padded).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import schedstat_ns  # noqa: E402
from recall_bench import database, log, serve  # noqa: E402

from gateway import tokens  # noqa: E402
from gateway.cli import DEMO_TEAM, demo_dataset  # noqa: E402
from gateway.embeddings import create_provider  # noqa: E402
from gateway.services import loader  # noqa: E402
from gateway.services.records import TokenRecord  # noqa: E402
from gateway.services.writes import Actor, WriteService, _Lane  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.store.database import Database, prepare  # noqa: E402

PRINCIPAL = "ines"
SOURCE = "nw-src-oncall-chat"
SUBJECT, OBJECT = "nw-billing", "nw-payments-team"

MUTATION = """mutation($input: RememberInput!) {
  remember(input: $input) { receipts { kind id created } } }"""

WORDS = (
    "billing invoices retry queue latency checkout deploy freeze payments ledger refund "
    "cluster nightly export report escalation pager rotation database index replica"
).split()


async def load_demo(dsn: str) -> str:
    """Demo data and a token; returns the bearer token."""
    db = await Database.open(dsn, min_size=1, max_size=2)
    embedder = create_provider(Settings(embedding_provider="local"))
    try:
        writes = WriteService(db, embedder)
        records = loader.parse(demo_dataset())
        await loader.load(writes, records, batch_size=500)
        token_id, secret = tokens.new_token_id(), tokens.new_secret()
        record = TokenRecord(
            kind="token", team=DEMO_TEAM, id=token_id, principal=PRINCIPAL, secret=secret
        )
        await writes.apply([record], Actor.operator())
        return tokens.format_token(token_id, secret)
    finally:
        await embedder.aclose()
        await db.close()


def remember_input(i: int, with_relationship: bool) -> dict[str, Any]:
    words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(14))
    content = f"Billing service note {i}: the payments team reviewed {words} today."
    start = content.index("payments team")
    data: dict[str, Any] = {
        "sourceId": SOURCE,
        "evidence": [
            {
                "id": f"bench-ev-{i}",
                "content": content,
                "occurrences": [
                    {"id": f"bench-occ-{i}", "start": start, "end": start + len("payments team")}
                ],
                "mentions": [{"entity": OBJECT, "occurrence": f"bench-occ-{i}"}],
            }
        ],
    }
    if with_relationship:
        data["relationships"] = [
            {
                "id": f"bench-rel-{i}",
                "subject": SUBJECT,
                "predicate": "reviewed_by",
                "object": OBJECT,
                "supports": [
                    {
                        "id": f"bench-sup-{i}",
                        "evidence": f"bench-ev-{i}",
                        "occurrence": f"bench-occ-{i}",
                    }
                ],
            }
        ]
    return data


class Phases:
    """Where one call's time goes (``--profile``), from marks taken inside the gateway
    (same process, so one clock): the client's send and receive, the write
    service's transaction (its start, the end of the records' checks and inserts,
    the end of the vectors' computing and storing, its commit), each embedding
    call, and the SQL statements' time from send to answer."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        self.embeds: list[tuple[float, float, int]] = []
        self.rows: list[dict[str, float]] = []
        # every kind's rows (``full`` is ``rows``), for the kinds' comparison
        self.by_kind: dict[str, list[dict[str, float]]] = {}

    def install(self, app: Any) -> None:
        from gateway.services import writes as service

        phases = self
        apply, pending = service.WriteService._apply, service._Batch.embed_pending
        store = service._Batch._store_vectors
        embedder = app.state.services.embedder
        embed = embedder.embed

        import gateway.app as app_module
        from gateway.services.mutations import MutationService

        # the name the app's request handler looks up (gateway.app imports it)
        authenticate, mutate = vars(app_module)["authenticate"], MutationService.apply

        async def timed_authenticate(*args: Any) -> Any:
            try:
                return await authenticate(*args)
            finally:
                phases.marks["authenticated"] = time.perf_counter()

        async def timed_mutate(self: Any, *args: Any, **kwargs: Any) -> Any:
            phases.marks["resolver"] = time.perf_counter()
            try:
                return await mutate(self, *args, **kwargs)
            finally:
                phases.marks["resolved"] = time.perf_counter()

        vars(app_module)["authenticate"] = timed_authenticate
        MutationService.apply = timed_mutate  # type: ignore[method-assign]

        async def timed_apply(self: Any, *args: Any, **kwargs: Any) -> Any:
            phases.marks["apply"] = time.perf_counter()
            try:
                return await apply(self, *args, **kwargs)
            finally:
                phases.marks["committed"] = time.perf_counter()

        async def timed_pending(self: Any) -> None:
            phases.marks["records"] = time.perf_counter()
            await pending(self)
            phases.marks["vectors"] = time.perf_counter()

        async def timed_store(self: Any, *args: Any, **kwargs: Any) -> None:
            phases.marks["storing"] = time.perf_counter()
            await store(self, *args, **kwargs)

        async def timed_embed(texts: Any) -> Any:
            started = time.perf_counter()
            try:
                return await embed(texts)
            finally:
                phases.embeds.append((started, time.perf_counter(), len(texts)))

        service.WriteService._apply = timed_apply  # type: ignore[method-assign]
        service._Batch.embed_pending = timed_pending  # type: ignore[method-assign]
        service._Batch._store_vectors = timed_store  # type: ignore[method-assign]
        embedder.embed = timed_embed

    def start(self) -> None:
        self.marks = {"sent": time.perf_counter()}
        self.embeds = []

    def finish(self, sql_seconds: float, kind: str = "full") -> None:
        m = {**self.marks, "received": time.perf_counter()}
        row = {
            "total": m["received"] - m["sent"],
            "to the write service": m["apply"] - m["sent"],
            "  of which to authenticated (token lookup)": m["authenticated"] - m["sent"],
            "  of which authenticated to the resolver": m["resolver"] - m["authenticated"],
            "  of which the resolver to the write service": m["apply"] - m["resolver"],
            "records' checks and inserts": m["records"] - m["apply"],
            "vectors (await, embed, store)": m["vectors"] - m["records"],
            "  of which storing them (one statement)": m["vectors"] - m["storing"],
            "commit": m["committed"] - m["vectors"],
            "answer back": m["received"] - m["committed"],
            "  of which to the resolver's return": m["resolved"] - m["committed"],
            "SQL send-to-answer, all statements": sql_seconds,
        }
        calls = sorted(self.embeds)
        for k, (a, b, n) in enumerate(calls):
            row[f"embedding call {k + 1} ({n} text{'s' if n > 1 else ''})"] = b - a
            row[f"embedding call {k + 1} starts after send"] = a - m["sent"]
            row[f"embedding call {k + 1} ends after send"] = b - m["sent"]
        if calls:
            # The request lane runs one call at a time (gateway/embeddings/local.py):
            # a call that starts after the one before it ended left the lane idle.
            idle, busy_until = 0.0, calls[0][1]
            for a, b, _ in calls[1:]:
                idle += max(0.0, a - busy_until)
                busy_until = max(busy_until, b)
            row["embedding lane idle between calls"] = idle
            row["after the last embedding ends"] = m["received"] - max(b for _, b, _ in calls)
        self.by_kind.setdefault(kind, []).append(row)
        if kind == "full":
            self.rows.append(row)

    COMPARED = (
        "total",
        "to the write service",
        "embedding call 1 starts after send",
        "records' checks and inserts",
        "after the last embedding ends",
        "SQL send-to-answer, all statements",
    )

    def report(self) -> None:
        print("where a call's time goes (evidence + relationship kind), medians in ms:")
        for name in self.rows[0]:
            values = [r[name] * 1000 for r in self.rows if name in r]
            print(f"  {name:44} {statistics.median(values):7.2f}")
        kinds = [k for k in self.by_kind if k != "full"]
        if not kinds:
            return
        print("the kinds of the evidence + relationship call, interleaved (medians in ms):")
        print(f"  {'':44} {'full':>9}" + "".join(f" {k[:14]:>14}" for k in kinds))
        for name in self.COMPARED + tuple(self.extra_compared()):
            cells = []
            for kind in ("full", *kinds):
                values = [r[name] * 1000 for r in self.by_kind[kind] if name in r]
                cells.append(statistics.median(values) if values else float("nan"))
            print(f"  {name:44} {cells[0]:9.2f}" + "".join(f" {c:14.2f}" for c in cells[1:]))

    def extra_compared(self) -> list[str]:
        return []


class _Marks(dict[str, float]):
    """A call's marks, each also noting the event loop thread's CPU time when it is
    taken in that thread (``time.thread_time``): the loop's CPU between two marks."""

    def __init__(self, loop_tid: int, sent: float) -> None:
        super().__init__(sent=sent)
        self.loop_tid = loop_tid
        self.cpu: dict[str, float] = {}

    def __setitem__(self, key: str, value: float) -> None:
        super().__setitem__(key, value)
        if threading.get_native_id() == self.loop_tid:
            self.cpu[key] = time.thread_time()

    def setdefault(self, key: str, default: float) -> float:
        if key not in self:
            self[key] = default
        return self[key]


class Timeline(Phases):
    """``--timeline``: :class:`Phases`, and every step of one call on one clock
    (the HTTP view, the token lookup, the GraphQL execution, each SQL statement
    from its send to its answer, the response's messages), and the CPU each call
    took: the gateway's event loop thread, the process's other threads (the
    embedding model's), this client's thread, and the PostgreSQL server's
    processes (``/proc/.../schedstat``, nanoseconds)."""

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.statements: list[tuple[float, float, str]] = []
        self.cpu_rows: list[dict[str, float]] = []
        self.timelines: list[dict[str, float]] = []
        self.loop_tid = 0
        self.pg_pids: list[int] = []
        self.cpu_before: dict[str, int] = {}
        # (from mark -> to mark, the loop's CPU seconds between them), every call
        self.loop_cpu: list[tuple[str, float]] = []

    def install(self, app: Any) -> None:
        super().install(app)
        import asyncpg

        import gateway.http.view as view_module
        import gateway.store.auth as auth_store

        phases = self
        view_call = view_module.GraphQLHTTPView.__call__
        execute = view_module.GraphQLHTTPView.execute_operation
        find_token = auth_store.find_token
        # private, so not in asyncpg-stubs
        time_and_log = asyncpg.connection.Connection._time_and_log  # type: ignore[attr-defined]

        async def timed_call(self: Any, scope: Any, receive: Any, send: Any) -> None:
            phases.marks["view"] = time.perf_counter()
            phases.loop_tid = threading.get_native_id()

            async def timed_send(message: Any) -> None:
                phases.marks.setdefault(message["type"], time.perf_counter())
                await send(message)

            await view_call(self, scope, receive, timed_send)

        async def timed_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
            phases.marks["execute"] = time.perf_counter()
            return await execute(self, *args, **kwargs)

        async def timed_find(conn: Any, token_id: str) -> Any:
            phases.marks["token statement"] = time.perf_counter()
            return await find_token(conn, token_id)

        @contextlib.contextmanager
        def logged(self: Any, query: str, *args: Any) -> Iterator[None]:
            # asyncpg times each statement with this (its query loggers' clock):
            # from the statement's send to the task resuming with its answer
            started = time.perf_counter()
            try:
                with time_and_log(self, query, *args):
                    yield
            finally:
                text = " ".join(query.split())
                phases.statements.append((started, time.perf_counter(), text))

        from gateway.services import writes as service

        lane_vectors, batch_vectors = service._Lane.vectors, service._Batch._vectors

        async def timed_lane(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await lane_vectors(self, *args, **kwargs)
            finally:
                phases.marks["the lane's vectors returned"] = time.perf_counter()

        async def timed_vectors(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await batch_vectors(self, *args, **kwargs)
            finally:
                phases.marks["the batch's vectors returned"] = time.perf_counter()

        import strawberry.schema.schema as strawberry_schema

        # graphql-core's, imported by strawberry's module (which calls it by this name)
        graphql_execute = vars(strawberry_schema)["execute"]

        def timed_graphql(*args: Any, **kwargs: Any) -> Any:
            phases.marks["graphql-core executes (extensions' on_execute entered)"] = (
                time.perf_counter()
            )
            return graphql_execute(*args, **kwargs)

        vars(strawberry_schema)["execute"] = timed_graphql
        service._Lane.vectors = timed_lane  # type: ignore[method-assign]
        service._Batch._vectors = timed_vectors  # type: ignore[method-assign]
        view_module.GraphQLHTTPView.__call__ = timed_call  # type: ignore[method-assign]
        view_module.GraphQLHTTPView.execute_operation = timed_execute  # type: ignore[method-assign]
        auth_store.find_token = timed_find
        # private, so not in asyncpg-stubs
        asyncpg.connection.Connection._time_and_log = logged  # type: ignore[attr-defined]

    def _pg(self) -> list[int]:
        """The embedded server's processes: its postmaster and the postmaster's children."""
        import asyncpg

        async def folder() -> str:
            conn = await asyncpg.connect(self.dsn)
            try:
                return str(await conn.fetchval("SHOW data_directory"))
            finally:
                await conn.close()

        postmaster = int(Path(asyncio.run(folder()), "postmaster.pid").read_text().split()[0])
        pids = [postmaster]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                pids.append(int(stat.parent.name))
        return pids

    def _cpu(self) -> dict[str, int]:
        client = threading.get_native_id()
        out = {"gateway event loop": 0, "other threads (the model)": 0, "client": 0}
        for task in Path("/proc/self/task").iterdir():
            ns = schedstat_ns(f"{task}/schedstat")
            tid = int(task.name)
            if tid == self.loop_tid:
                out["gateway event loop"] += ns
            elif tid == client:
                out["client"] += ns
            else:
                out["other threads (the model)"] += ns
        out["PostgreSQL (all its processes)"] = sum(
            schedstat_ns(f"/proc/{pid}/schedstat") for pid in self.pg_pids
        )
        return out

    def start(self) -> None:
        if not self.pg_pids:
            self.pg_pids = self._pg()
        self.cpu_before = self._cpu()
        self.statements = []
        super().start()
        self.marks = _Marks(self.loop_tid, self.marks["sent"])

    def finish(self, sql_seconds: float, kind: str = "full") -> None:
        received = time.perf_counter()
        super().finish(sql_seconds, kind)
        after = self._cpu()
        cpu = {k: (after[k] - self.cpu_before[k]) / 1e9 for k in after}
        self.by_kind[kind][-1].update({f"CPU: {k}": v for k, v in cpu.items()})
        if kind != "full":
            return
        self.cpu_rows.append(cpu)
        sent = self.marks["sent"]
        line = {f"mark: {k}": v - sent for k, v in self.marks.items() if k != "sent"}
        line["mark: received"] = received - sent
        if isinstance(self.marks, _Marks):
            # the loop's CPU from each of its marks to the next (in time order)
            ordered = sorted(self.marks.cpu, key=lambda k: self.marks[k])
            for start, end in itertools.pairwise(ordered):
                seconds = self.marks.cpu[end] - self.marks.cpu[start]
                self.loop_cpu.append((f"{start} -> {end}", seconds))
        for k, (a, b, n) in enumerate(sorted(self.embeds)):
            line[f"embedding call {k + 1} ({n}): start"] = a - sent
            line[f"embedding call {k + 1} ({n}): end"] = b - sent
        for k, (a, b, query) in enumerate(self.statements):
            label = f"SQL {k + 1:2d} {query[:48]}"
            line[f"{label}: sent"] = a - sent
            line[f"{label}: answered"] = b - sent
        self.timelines.append(line)

    def extra_compared(self) -> list[str]:
        return [f"CPU: {k}" for k in self.cpu_rows[0]] if self.cpu_rows else []

    def report(self) -> None:
        super().report()
        print("CPU per call (evidence + relationship kind), medians and means in ms:")
        for name in self.cpu_rows[0]:
            values = [r[name] * 1000 for r in self.cpu_rows]
            print(
                f"  {name:44} {statistics.median(values):7.2f}   mean {statistics.mean(values):7.2f}"
            )
        print("the event loop's CPU between its marks (medians over the calls, ms):")
        segments: dict[str, list[float]] = {}
        for name, seconds in self.loop_cpu:
            segments.setdefault(name, []).append(seconds * 1000)
        for name, values in segments.items():
            if len(values) * 2 >= len(self.cpu_rows):
                print(f"  {statistics.median(values):7.3f}  {name}")
        print("timeline of a call (ms after the client's send, medians over the calls):")
        shape = Counter(tuple(line) for line in self.timelines)
        keys, count = shape.most_common(1)[0]
        print(f"  ({count} of {len(self.timelines)} calls had this sequence of steps)")
        rows = [line for line in self.timelines if tuple(line) == keys]
        ordered = sorted(keys, key=lambda k: statistics.median(r[k] for r in rows))
        print("  at (median)  since the step before (median of each call's difference)")
        previous = None
        for key in ordered:
            at = statistics.median(r[key] for r in rows) * 1000
            step = (
                statistics.median(r[key] - r[previous] for r in rows) * 1000
                if previous is not None
                else at
            )
            print(f"  {at:8.2f}  {step:+7.2f}  {key}")
            previous = key


class Other:
    """The gateway of another checkout (``--against``), in a process of its own."""

    def __init__(self, checkout: Path, port: int) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - this interpreter, a path the user gave
            [
                sys.executable,
                str(checkout / "benchmarks" / "remember_bench.py"),
                "--serve-only",
                "--port",
                str(port),
            ],
            cwd=checkout,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        token = None
        for line in self.proc.stdout:
            if line.startswith("READY "):
                token = line.split()[1]
                break
        if token is None:
            raise SystemExit(f"the gateway of {checkout} did not start")
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=60,
            headers={"Authorization": f"Bearer {token}"},
        )
        self.latencies: dict[str, list[float]] = {"full": [], "bare": []}

    def call(self, name: str, data: dict[str, Any], keep: bool) -> None:
        started = time.perf_counter()
        answer = self.client.post(
            "/graphql", json={"query": MUTATION, "variables": {"input": data}}
        ).json()
        if keep:
            self.latencies[name].append((time.perf_counter() - started) * 1000)
        if "errors" in answer:
            raise SystemExit(f"remember failed on the other gateway: {answer['errors']}")

    def close(self) -> None:
        self.client.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # its --serve-only waits for this
        self.proc.wait(timeout=60)


def measure(
    port: int,
    token: str,
    calls: int,
    first: int,
    app: Any,
    phases: Phases | None = None,
    ab: str = "lane",
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """The kinds of call, interleaved, so that all see the same machine load;
    latencies and SQL statements per call. ``serial`` is ``full`` with the
    write's embedding lane's other rule: one call in flight where the default
    is two (a text added while a call runs waits for its end instead of
    queueing behind it in the provider at once), two where it is one: an A/B
    of the lane's rule in one run; or, with another ``ab`` (:data:`SWITCHES`),
    ``full`` with that switch turned the other way."""
    counter = app.state.services.db.counter
    kinds = ("full", "serial", "bare")
    latencies: dict[str, list[float]] = {k: [] for k in kinds}
    statements: dict[str, list[int]] = {k: [] for k in kinds}
    headers = {"Authorization": f"Bearer {token}"}
    switch = SWITCHES[ab]
    default = switch.get()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        for i in range(first, first + calls):
            # the two kinds of the A/B take turns at going first: the second
            # of two such calls sent back to back was the faster by 0.3-0.8 ms
            # whichever rule it had (2026-12-05), which a fixed order adds to
            # one side
            order = kinds if i % 2 == 0 else ("serial", "full", "bare")
            for k, name in enumerate(order):
                n = len(kinds) * i + k
                data = remember_input(n, with_relationship=name != "bare")
                body = {"query": MUTATION, "variables": {"input": data}}
                if name == "serial":
                    switch.set(switch.other(default))
                before, seconds = counter.count, counter.seconds
                if phases is not None:
                    phases.start()
                started = time.perf_counter()
                r = client.post("/graphql", json=body, headers=headers)
                if phases is not None and name != "bare":
                    phases.finish(counter.seconds - seconds, name)
                switch.set(default)
                latencies[name].append((time.perf_counter() - started) * 1000)
                statements[name].append(counter.count - before)
                answer = r.json()
                if "errors" in answer:
                    raise SystemExit(f"remember failed: {answer['errors']}")
                if not all(x["created"] for x in answer["data"]["remember"]["receipts"]):
                    raise SystemExit("remember did not write")
    return latencies, statements


def other_rule(outstanding: int) -> int:
    """The lane's other rule: one call in flight against two, whichever is the default."""
    return 1 if outstanding > 1 else 2


@dataclass(frozen=True)
class Switch:
    """What the ``serial`` kind changes (``--ab``): a class attribute of the write
    path that is no setting, read per call, switched for that kind's calls only."""

    owner: Any
    attribute: str
    other: Callable[[Any], Any]
    says: Callable[[Any], str]

    def get(self) -> Any:
        return getattr(self.owner, self.attribute)

    def set(self, value: Any) -> None:
        setattr(self.owner, self.attribute, value)


SWITCHES = {
    "lane": Switch(_Lane, "OUTSTANDING", other_rule, lambda v: f"{v} embedding call(s) in flight"),
}


# The text the gateway renders for the benchmark's relationship (its entities' names
# in the demo data) and embeds for it.
RELATIONSHIP_TEXT = "Billing service reviewed by Payments team"


async def embedding_alone(calls: int) -> tuple[list[float], list[float], list[float]]:
    """The local model embedding two texts in this process: the floor of `remember`.
    First as printed since 2026-12-02 (an evidence text and a short second text,
    in one call); then the two texts a call embeds (its evidence and its
    relationship's rendered statement) as the gateway embeds them, one call each,
    back to back (texts of different lengths in one call are padded to the
    longest: the short one costs as much as the long one); and those two texts in
    one call (one model run, the relationship's text padded to the evidence's:
    what waiting for the relationship's text to run both at once would cost)."""
    embedder = create_provider(Settings(embedding_provider="local"))
    try:
        together, apart, both = [], [], []
        for i in range(calls):
            evidence = remember_input(i, False)["evidence"][0]["content"]
            started = time.perf_counter()
            await embedder.embed([evidence, f"Billing service {i}"])
            together.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await embedder.embed([evidence])
            await embedder.embed([RELATIONSHIP_TEXT])
            apart.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await embedder.embed([evidence, RELATIONSHIP_TEXT])
            both.append((time.perf_counter() - started) * 1000)
        return together, apart, both
    finally:
        await embedder.aclose()


def paired(default: list[float], other: list[float]) -> str:
    """The interleaved kinds compared pair by pair (call i of each, sent back to
    back): the median of ``other - default`` with a 95 % bootstrap interval (1,000
    resamples of the pairs), and in how many pairs the default was faster."""
    import random

    differences = [b - a for a, b in zip(default, other, strict=True)]
    draw = random.Random(11)  # noqa: S311 - resampling, not secrets
    medians = sorted(
        statistics.median(draw.choices(differences, k=len(differences))) for _ in range(1000)
    )
    faster = sum(d > 0 for d in differences)
    return (
        f"median of the pairs' differences {statistics.median(differences):+6.2f} ms "
        f"[{medians[25]:+.2f}, {medians[974]:+.2f}], the default faster in {faster} of "
        f"{len(differences)}"
    )


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def compare(here: Path, there: Path, port: int, calls: int, warmup: int) -> None:
    """``--against``: the two checkouts' gateways, each in a process of its own, the
    same calls interleaved (see the module's docstring)."""
    arms = (Other(here, port + 1), Other(there, port + 2))
    try:
        for i in range(warmup + calls):
            for k, name in enumerate(("full", "bare")):
                data = remember_input(2 * i + k, with_relationship=name == "full")
                for arm in arms if i % 2 == 0 else reversed(arms):
                    arm.call(name, data, keep=i >= warmup)
    finally:
        for arm in arms:
            arm.close()
    # The floor, in this process once both gateways have stopped: the client has
    # no gateway in its process here, so this is also the model alone.
    floor, apart, _ = asyncio.run(embedding_alone(calls))
    load = os.getloadavg()
    print(
        f"remember over HTTP on the demo data, {calls} calls of each kind, interleaved; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for name, values in (
        ("embedding 2 texts alone, in one call", floor),
        ("the call's 2 texts, a call each", apart),
    ):
        print(f"  {name:40} p50 {statistics.median(values):6.1f} ms   p95 {p95(values):6.1f} ms")
    for name, kind in (
        ("evidence + relationship (2 embeddings)", "full"),
        ("evidence only (1 embedding)", "bare"),
    ):
        a, b = (statistics.median(arm.latencies[kind]) for arm in arms)
        print(f"  {name}: ratio this / that {a / b:.2f}")
        for where, arm in zip((here, there), arms, strict=True):
            values = arm.latencies[kind]
            print(
                f"    {where!s:40} p50 {statistics.median(values):6.1f} ms   "
                f"p95 {p95(values):6.1f} ms"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument(
        "--profile", action="store_true", help="also print where a call's time goes"
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="also print one call's steps on one clock, and its CPU (implies --profile)",
    )
    parser.add_argument(
        "--timeline-out", type=Path, default=None, help="each call's timeline, JSON lines"
    )
    parser.add_argument(
        "--against", type=Path, default=None, help="another checkout's gateway, interleaved"
    )
    parser.add_argument(
        "--ab",
        choices=sorted(SWITCHES),
        default="lane",
        help="what the second evidence + relationship kind switches (default: the "
        "lane's rule, one embedding call in flight or two)",
    )
    parser.add_argument("--serve-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            args.port = probe.getsockname()[1]
    if args.against is not None and not args.serve_only:
        compare(ROOT, args.against.resolve(), args.port, args.calls, args.warmup)
        return
    with database() as dsn:
        asyncio.run(prepare(dsn, migrate=True))
        log("loading the demo data")
        token = asyncio.run(load_demo(dsn))
        server, app = serve(dsn, args.port)
        try:
            if args.serve_only:  # for another checkout's --against
                print(f"READY {token}", flush=True)
                sys.stdin.read()
                return
            timeline = args.timeline or args.timeline_out is not None
            phases = Timeline(dsn) if timeline else Phases() if args.profile else None
            if phases is not None:
                phases.install(app)
            measure(args.port, token, args.warmup, 0, app, None, args.ab)  # model, plans, caches
            if phases is not None:
                phases.rows.clear()
                phases.by_kind.clear()
                if isinstance(phases, Timeline):
                    phases.cpu_rows.clear()
                    phases.timelines.clear()
                    phases.loop_cpu.clear()
            runs, statements = measure(args.port, token, args.calls, 100_000, app, phases, args.ab)
        finally:
            server.should_exit = True
            # let the gateway close its pool before the database stops
            for thread in threading.enumerate():
                if thread is not threading.current_thread() and thread.daemon:
                    thread.join(timeout=10)
    floor, apart, both = asyncio.run(embedding_alone(args.calls))
    print(f"remember over HTTP on the demo data, {args.calls} sequential calls of each kind:")
    switch = SWITCHES[args.ab]
    other = switch.says(switch.other(switch.get()))
    for name, values, sql in (
        ("evidence + relationship (2 embeddings)", runs["full"], statements["full"]),
        (f"  same, {other}", runs["serial"], statements["serial"]),
        ("evidence only (1 embedding)", runs["bare"], statements["bare"]),
        ("embedding 2 texts alone, in-process", floor, None),
        ("the call's 2 texts, a call each, in-process", apart, None),
        ("the call's 2 texts in one call, in-process", both, None),
    ):
        line = f"  {name:44} p50 {statistics.median(values):6.1f} ms   p95 {p95(values):6.1f} ms"
        if sql:
            line += f"   SQL statements {statistics.median(sql):.0f}"
        print(line)
    print(f"  {other} against the default, paired: {paired(runs['full'], runs['serial'])}")
    if phases is not None:
        phases.report()
    if isinstance(phases, Timeline) and args.timeline_out is not None:
        args.timeline_out.write_text(
            "".join(
                json.dumps({**line, **cpu}) + "\n"
                for line, cpu in zip(phases.timelines, phases.cpu_rows, strict=True)
            )
        )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
