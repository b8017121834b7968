"""Load benchmark: the loader's throughput on SciFact-shaped records, on a fresh store.

A measuring script, not a test. Per document it writes what
``beir_quality.py`` writes for SciFact: one source, one entity, one evidence
(the document's text) and one relationship about the entity that the evidence
supports, in the shared space of one team: four records per document. The
documents are generated (``--docs N``, abstracts of about 200 words drawn from
a fixed vocabulary, seeded) or read from a BEIR-layout folder
(``--beir FOLDER``, its ``corpus.jsonl``; the first ``--docs`` documents when
given).

    python benchmarks/load_bench.py --docs 500
    python benchmarks/load_bench.py --beir PATH_TO_SCIFACT --embedder local
    python benchmarks/load_bench.py --docs 2000 --embedder hash --profile load.prof
    python benchmarks/load_bench.py --docs 25000 --embedder supplied --server-profile
    python benchmarks/load_bench.py --docs 2000 --embedder supplied --index-after both
    python benchmarks/load_bench.py --docs 5000 --embedder supplied --index-after on --max-wal-size 64MB
    python benchmarks/load_bench.py --docs 2000 --embedder supplied --index-after on --concurrency 1

The file is written to a temporary folder as JSON Lines and loaded through the
loader (parse, then batches through ``WriteService``) on a fresh embedded
PostgreSQL (or a scratch database on ``--database-url``/``DATABASE_URL``).
Printed: records/s and evidence/s end to end (both passes included), the share of
the time spent inside the embedding provider, the peak RSS of this process
(the loader; the database server's processes are not counted), the
statements sent per 1,000 records, the WAL the server wrote and the
checkpoints it made meanwhile (``--max-wal-size`` sets the benchmark's own
server's, to see what forced checkpoints cost), the batches that overlapped
(``--concurrency``, the loader's batches in flight, default 2 as the CLI's),
and the server CPU of the load: every process of the database server, from
``/proc`` (the postmaster's reaped children included), for the rows and the
index builds apart; far steadier than the wall time on a shared machine.

``--embedder local`` uses the configured local model (what a user gets);
``--embedder supplied`` puts a vector in every evidence and relationship line
(after an ``embedding_model`` line naming the configured model), so the model
never runs.
``--embedder hash`` is a stand-in that makes a unit vector from a hash of the
text in microseconds: it isolates the cost of the write path itself, and is
what a file with embeddings supplied costs when the loader cannot take them.

``--index-after on`` loads as ``recall-gateway load --index-after`` does (the
space's vectors into its detached tables, the HNSW indexes built at the end;
the build's time is counted in the load's and printed as a share of it);
``both`` loads the same file into two fresh databases, without then with it,
an A/B in one run. Either way the vector list's recall@10 against an exact
search is printed (``--recall-queries`` random unit queries through
``evidence_vector_candidates`` forced onto the HNSW index, against the same
function's exact scan), so that the two graphs are compared on the same rows.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import json
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from beir_eval import scratch_database, server  # noqa: E402

from gateway.embeddings import EmbeddingProvider, Vectors, create_provider  # noqa: E402
from gateway.services import loader, vector_indexes  # noqa: E402
from gateway.services.writes import Actor, WriteService  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.store.bulk_writes import COPY_TABLES  # noqa: E402
from gateway.store.database import Database  # noqa: E402

TEAM = "bench"
PRINCIPAL = "reader"
RECORDS_PER_DOC = 4

_VOCABULARY = (
    "cell protein gene expression tumour patient cohort trial dose response receptor "
    "signal pathway mutation variant risk factor mortality infection virus antibody "
    "immune inflammation kinase inhibitor binding membrane tissue mouse model human "
    "clinical outcome association increase decrease level plasma serum marker study "
    "analysis sample control group treatment therapy effect significant reduced "
    "elevated activity function structure mechanism regulation transcription "
    "metabolism insulin glucose obesity diabetes cardiac vascular neuronal brain "
    "cortex memory stress oxidative damage repair replication chromatin histone"
).split()


class HashEmbedder:
    """A unit vector per text from its hash: no model, so only the write path is timed."""

    model = "all-MiniLM-L6-v2-int8-onnx"
    dimensions = 384

    def vector(self, text: str) -> Vectors:
        seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
        row = np.random.default_rng(seed).standard_normal(self.dimensions)
        return (row / np.linalg.norm(row)).astype(np.float32)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.empty((len(texts), self.dimensions), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self.vector(text)
        return out

    async def aclose(self) -> None:
        return None


TOPICS = 20
_CENTROIDS = np.random.default_rng(20261203).standard_normal((TOPICS, 384))
_CENTROIDS /= np.linalg.norm(_CENTROIDS, axis=1, keepdims=True)


class ClusteredEmbedder(HashEmbedder):
    """Vectors around :data:`TOPICS` centroids (a topic and the noise drawn from a
    hash of the text), closer to how a model's vectors bunch than uniform random
    ones, on which an HNSW graph is at its worst."""

    def vector(self, text: str) -> Vectors:
        return clustered(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest()))


def clustered(seed: int) -> Vectors:
    rng = np.random.default_rng(seed)
    row = _CENTROIDS[int(rng.integers(TOPICS))] + rng.standard_normal(384) * 0.045
    out: Vectors = (row / np.linalg.norm(row)).astype(np.float32)
    return out


class TimedEmbedder:
    """Wraps a provider and adds up the wall time spent inside ``embed``."""

    def __init__(self, inner: EmbeddingProvider) -> None:
        self.inner = inner
        self.model = inner.model
        self.dimensions = inner.dimensions
        self.seconds = 0.0
        self.texts = 0

    async def embed(self, texts: Sequence[str]) -> Vectors:
        started = time.perf_counter()
        try:
            return await self.inner.embed(texts)
        finally:
            self.seconds += time.perf_counter() - started
            self.texts += len(texts)

    async def aclose(self) -> None:
        await self.inner.aclose()


def generated_documents(count: int, seed: int) -> Iterator[tuple[str, str, str]]:
    """(id, title, text) of SciFact-like abstracts: about 200 words, a 10-word title."""
    rng = random.Random(seed)  # noqa: S311 - reproducible text, not secrets
    for i in range(count):
        title = " ".join(rng.choices(_VOCABULARY, k=10)).capitalize()
        words = rng.choices(_VOCABULARY, k=rng.randint(120, 280))
        yield f"doc-{i}", title, f"{title} {' '.join(words)}."


def beir_documents(folder: Path, limit: int | None) -> Iterator[tuple[str, str, str]]:
    with (folder / "corpus.jsonl").open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                return
            doc = json.loads(line)
            title = str(doc.get("title") or "").strip()
            text = f"{title} {doc.get('text', '')}".strip()[:20_000]
            if text:
                yield f"doc-{i}", title or f"document {i}", text


def document_records(ident: str, title: str, text: str) -> list[dict[str, Any]]:
    """One document's four records, shaped as ``beir_quality.py`` writes SciFact."""
    return [
        {
            "kind": "source",
            "team": TEAM,
            "id": f"src-{ident}",
            "type": "document",
            "title": title[:500],
            "authority": "high",
        },
        {
            "kind": "entity",
            "team": TEAM,
            "id": f"ent-{ident}",
            "name": title[:300],
            "type": "document",
        },
        {"kind": "evidence", "team": TEAM, "id": ident, "source": f"src-{ident}", "content": text},
        {
            "kind": "relationship",
            "team": TEAM,
            "id": f"rel-{ident}",
            "subject": f"ent-{ident}",
            "predicate": "has_abstract",
            "object_value": f"document {ident}",
            "owner": PRINCIPAL,
            "supports": [{"id": f"sup-{ident}", "evidence": ident}],
        },
    ]


def write_file(
    path: Path,
    docs: Iterator[tuple[str, str, str]],
    supplied: EmbeddingProvider | None,
    vectors: str = "random",
) -> tuple[int, int]:
    """The loader file, with vectors in it when ``supplied`` names a model (made
    by :class:`HashEmbedder`: their values do not matter to the write path);
    returns (records, evidence)."""
    records = evidence = 0
    hasher = ClusteredEmbedder() if vectors == "clustered" else HashEmbedder()
    with path.open("w", encoding="utf-8") as f:
        if supplied is not None:
            header = {
                "kind": "embedding_model",
                "model": supplied.model,
                "dimensions": supplied.dimensions,
            }
            f.write(json.dumps(header) + "\n")
        for line in (
            {"kind": "team", "id": TEAM, "name": "Load benchmark"},
            {"kind": "principal", "team": TEAM, "id": PRINCIPAL, "display_name": "Reader"},
        ):
            f.write(json.dumps(line) + "\n")
            records += 1
        for ident, title, text in docs:
            for record in document_records(ident, title, text):
                if supplied is not None and record["kind"] in ("evidence", "relationship"):
                    basis = record.get("content") or record["id"]
                    record["embedding"] = [round(float(x), 6) for x in hasher.vector(basis)]
                f.write(json.dumps(record) + "\n")
            records += RECORDS_PER_DOC
            evidence += 1
    return records, evidence


_COUNTING: list[Database] = []


def count_copies(db: Database) -> None:
    """The driver logs no COPY: count them as statements too (one round trip each)."""
    if not _COUNTING:
        original = asyncpg.connection.Connection.copy_records_to_table

        async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            _COUNTING[-1].counter.count += 1
            return await original(self, *args, **kwargs)

        asyncpg.connection.Connection.copy_records_to_table = counted  # type: ignore[method-assign]
    _COUNTING.append(db)


def file_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        yield from f


def peak_rss_mb() -> float:
    # ru_maxrss is in kilobytes on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def run_load(
    dsn: str, path: Path, args: argparse.Namespace, set_based: bool, index_after: bool = False
) -> dict[str, float]:
    # as the CLI opens it: the batches' lanes, the deferral's, two for the rest
    db = await Database.open(
        dsn, min_size=1, max_size=args.concurrency + 3, statement_timeout_ms=600_000
    )
    inner: EmbeddingProvider = (
        HashEmbedder() if args.embedder == "hash" else create_provider(Settings())
    )
    # supplied: the file carries every vector; the provider is there for its model name
    embedder = TimedEmbedder(inner)
    count_copies(db)
    try:
        if args.embedder == "local":
            await embedder.embed(["warm up the model before the clock starts"])
            embedder.seconds = 0.0
            embedder.texts = 0
        service = WriteService(db, embedder)
        before = db.counter.count
        cpu = ServerCpu(dsn)
        await cpu.start()
        started = time.perf_counter()
        checked = loader.check(file_lines(path))  # the first pass, as the CLI does
        if checked.embedding_model is not None:
            await loader.check_embedding_model(service, *checked.embedding_model)
        parsed_at = time.perf_counter()
        report = await loader.load(
            service,
            loader.stream(file_lines(path)),
            batch_size=args.batch_size,
            actor=Actor.operator(),
            set_based=set_based,
            index_after=index_after,
            # only when asked for: the same script then measures a loader before the option
            **({"concurrency": args.concurrency} if args.concurrency != 1 else {}),
        )
        rows_cpu = await cpu.seconds()
        index_seconds = 0.0
        if index_after:
            settings = Settings()
            index_started = time.perf_counter()
            steps: list[int] = []
            # only the spaces this load deferred, as `recall-gateway load
            # --index-after` does: never a space another load left waiting
            built = await vector_indexes.build_pending(
                db,
                await vector_indexes.pending(db, report.deferred),
                maintenance_work_mem_mb=args.index_memory_mb or settings.index_build_memory_mb,
                workers=(
                    settings.index_build_workers
                    if args.index_workers is None
                    else args.index_workers
                ),
                progress=steps.append,
            )
            index_seconds = time.perf_counter() - index_started
            for table, rows, seconds in built.per_table:
                print(f"  built {table.split('_')[0]} index: {rows} vectors, {seconds:.1f} s")
            # one step per table comes at its end; the others are the server's reports
            print(f"  index progress steps  {len(steps):10d}   (for {built.tables} tables)")
        elapsed = time.perf_counter() - started
        total_cpu = await cpu.seconds()
        figures = {
            "overlapped": getattr(report, "overlapped", 0),
            "lanes": getattr(report, "lanes", 0),
            "batches": report.batches,
            "index_seconds": index_seconds,
            "seconds": elapsed,
            "parse_seconds": parsed_at - started,
            "embed_seconds": embedder.seconds,
            "embedded_texts": embedder.texts,
            "statements": db.counter.count - before,
            "records": report.records,
            "written": sum(report.created.values()),
        }
        # absent, as the other optional figures are, when the server is not ours to read
        if total_cpu is not None and rows_cpu is not None:
            figures.update(server_cpu=total_cpu, rows_server_cpu=rows_cpu)
        return figures
    finally:
        await embedder.aclose()
        await db.close()


class ServerCpu:
    """CPU time of the database server's processes since :meth:`start`: every
    backend, parallel worker and background process of the server, live ones
    from ``/proc/PID/stat`` and ended ones from the postmaster's counters of its
    reaped children. Unlike the wall time, this barely moves with what else the
    machine runs. Only for a server on this machine whose processes this user may
    read (the benchmark's own embedded one); otherwise it reports nothing."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.postmaster: int | None = None
        self.base = 0.0

    async def start(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:  # while the backend lives: its parent is the postmaster
            self.postmaster = int(_stat(await conn.fetchval("SELECT pg_backend_pid()"))[1])
            self.base = _tree_cpu(self.postmaster)
        except (OSError, ValueError, IndexError):
            self.postmaster = None
        finally:
            await conn.close()

    async def seconds(self) -> float | None:
        if self.postmaster is None:
            return None
        try:
            return _tree_cpu(self.postmaster) - self.base
        except (OSError, ValueError, IndexError):
            return None


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name: [state, ppid, ...]."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def _tree_cpu(postmaster: int) -> float:
    fields = _stat(postmaster)
    # utime, stime, cutime, cstime: the postmaster's own and its reaped children's
    total = sum(int(x) for x in fields[11:15])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = _stat(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        if int(child[1]) == postmaster:
            total += int(child[11]) + int(child[12])
    return total / _TICKS


async def vector_recall(dsn: str, queries: int, seed: int, vectors: str = "random") -> float:
    """Mean recall@10 of the evidence vector list (HNSW path forced) against the
    same function's exact scan, over random unit queries."""
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    try:
        team, space = (
            TEAM,
            await conn.fetchval(
                "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", TEAM
            ),
        )
        rng = np.random.default_rng(seed)
        sql = (
            "SELECT evidence_id FROM evidence_vector_candidates($1, $2, 1, $3, 10, NULL, "
            "ARRAY[]::text[], $4)"
        )
        hits = 0
        for _ in range(queries):
            if vectors == "clustered":
                q = clustered(int(rng.integers(2**62)))
            else:
                q = rng.standard_normal(384).astype(np.float32)
                q /= np.linalg.norm(q)
            approx = {r[0] for r in await conn.fetch(sql, team, space, q, 0)}
            exact = {r[0] for r in await conn.fetch(sql, team, space, q, 2**62)}
            hits += len(approx & exact)
        return hits / (10 * queries)
    finally:
        await conn.close()


async def measure(
    admin_dsn: str,
    path: Path,
    args: argparse.Namespace,
    set_based: bool,
    index_after: bool = False,
) -> dict[str, float]:
    async with scratch_database(admin_dsn) as dsn:
        if args.server_profile:
            # Time spent in each PL/pgSQL function (the triggers), per database.
            admin = await asyncpg.connect(dsn)
            try:
                name = await admin.fetchval("SELECT current_database()")
                await admin.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")
            finally:
                await admin.close()
        before = await wal_and_checkpoints(dsn)
        figures = await run_load(dsn, path, args, set_based, index_after)
        after = await wal_and_checkpoints(dsn)
        figures.update({k: after[k] - before[k] for k in after})
        if args.server_profile:
            await server_profile(dsn, figures["seconds"])
        if args.recall_queries:
            figures["recall_at_10"] = await vector_recall(
                dsn, args.recall_queries, args.seed, args.vectors
            )
        return figures


async def wal_and_checkpoints(dsn: str) -> dict[str, float]:
    """The server's WAL position and checkpoints so far (pg_stat_checkpointer
    since PostgreSQL 17): their change over a load says how much WAL it wrote
    and how often max_wal_size forced a checkpoint."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        out = {
            "wal_bytes": float(
                await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
            )
        }
        if await conn.fetchval("SELECT to_regclass('pg_stat_checkpointer') IS NOT NULL"):
            row = await conn.fetchrow(
                "SELECT num_timed, num_requested, write_time + sync_time AS ms "
                "FROM pg_stat_checkpointer"
            )
            assert row is not None  # a view of one row
            out.update(
                checkpoints_timed=float(row["num_timed"]),
                checkpoints_requested=float(row["num_requested"]),
                checkpoint_ms=float(row["ms"]),
            )
        return out
    finally:
        await conn.close()


async def set_max_wal_size(admin_dsn: str, value: str) -> None:
    """ALTER SYSTEM on the benchmark's own embedded server (never on a server
    given with --database-url), then reload: max_wal_size needs no restart."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f"ALTER SYSTEM SET max_wal_size = '{value}'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()
    # the reload reaches the server processes asynchronously: ask a new session
    # until it answers with the new value
    now = None
    for _ in range(50):
        conn = await asyncpg.connect(admin_dsn)
        try:
            if await conn.fetchval(
                "SELECT pg_size_bytes(current_setting('max_wal_size')) = pg_size_bytes($1)", value
            ):
                now = await conn.fetchval("SHOW max_wal_size")
        finally:
            await conn.close()
        if now is not None:
            break
        await asyncio.sleep(0.1)
    if now is None:
        raise SystemExit(f"max_wal_size did not become {value}")
    print(f"max_wal_size {now}", flush=True)


def _insert_again(table: str, key: str) -> str:
    """Insert ``$1`` more rows like the table's first ones, ``key`` suffixed."""
    columns = COPY_TABLES[table]
    chosen = ", ".join(f"{c} || '-again'" if c == key else c for c in columns)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"SELECT {chosen} FROM {table} ORDER BY {key} LIMIT $1"
    )


_EXPLAINED = {
    "evidence": _insert_again("evidence", "id"),
    "evidence_embeddings": _insert_again("evidence_embeddings", "evidence_id"),
    "relationships": _insert_again("relationships", "id"),
    "parse (to_tsvector of the content, once)": (
        "SELECT to_tsvector('english', content) FROM evidence ORDER BY id LIMIT $1"
    ),
}


async def server_profile(dsn: str, seconds: float, rows: int = 200) -> None:
    """Where the database's time goes (no pg_stat_statements in the embedded server):
    the PL/pgSQL functions' time during the load (pg_stat_user_functions), the rows
    written per table, and EXPLAIN ANALYZE of inserting ``rows`` more rows like the
    loaded ones into the costly tables, in a transaction rolled back (its trigger
    times and the rest: constraints, generated columns, indexes)."""
    conn = await asyncpg.connect(dsn)
    try:
        await asyncio.sleep(1.2)  # the loader's sessions flush their statistics on exit
        functions = await conn.fetch(
            "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions "
            "ORDER BY total_time DESC LIMIT 8"
        )
        print(f"  server: PL/pgSQL functions during the load ({seconds:.1f} s wall)")
        for f in functions:
            print(
                f"    {f['funcname']:34} {f['calls']:9} calls {f['total_time'] / 1000:8.2f} s "
                f"total {f['self_time'] / 1000:8.2f} s self"
            )
        tables = await conn.fetch(
            "SELECT relname, n_tup_ins FROM pg_stat_user_tables WHERE n_tup_ins > 0 "
            "ORDER BY n_tup_ins DESC LIMIT 8"
        )
        print("  server: rows written per table (partitions separately)")
        for t in tables:
            print(f"    {t['relname']:34} {t['n_tup_ins']:9}")
        print(f"  server: EXPLAIN ANALYZE of {rows} more rows each, one transaction rolled back")
        tx = conn.transaction()
        await tx.start()  # the evidence copies are there for their embeddings' keys
        try:
            plans = {
                label: json.loads(
                    await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", rows)
                )[0]
                for label, sql in _EXPLAINED.items()
            }
        finally:
            await tx.rollback()
        for label, plan in plans.items():
            total = plan["Execution Time"]
            triggers = sorted(plan.get("Triggers", []), key=lambda t: -t["Time"])
            inside = sum(t["Time"] for t in triggers)
            parts = ", ".join(f"{t['Trigger Name']} {t['Time']:.0f} ms" for t in triggers)
            print(
                f"    {label:40} {total:8.0f} ms ({total / rows:.2f} ms/row); triggers "
                f"{inside:.0f} ms{': ' + parts if parts else ''}"
            )
        await postings_costs(conn, rows)
        await vector_index_costs(conn)
    finally:
        await conn.close()


_POSTINGS = (
    "INSERT INTO evidence_terms (team_id, space_id, lexeme, evidence_id, tf, recorded_at) "
    "SELECT e.team_id, e.space_id, u.lexeme, e.id, coalesce(array_length(u.positions, 1), 1), "
    "e.recorded_at FROM evidence e CROSS JOIN LATERAL unnest(e.search_document) AS u "
    "WHERE e.id LIKE '%-again'"
)


async def postings_costs(conn: asyncpg.Connection, rows: int) -> None:
    """Inside the evidence postings' statement (evidence_terms_fill's INSERT):
    ``rows`` more evidence rows copied with that trigger off, then the trigger's
    INSERT of their postings under EXPLAIN ANALYZE, with the check of their
    documents (db/0115's statement trigger; a foreign key per posting before) and
    with every trigger of the postings table off (a savepoint
    apart; all rolled back). The rest is the heap and its B-tree indexes."""
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute("ALTER TABLE evidence DISABLE TRIGGER evidence_terms_fill")
        await conn.execute(_EXPLAINED["evidence"], rows)
        plans = {}
        for label, off in (("as loaded", False), ("reference check off", True)):
            savepoint = conn.transaction()
            await savepoint.start()
            try:
                if off:
                    await conn.execute("ALTER TABLE evidence_terms DISABLE TRIGGER ALL")
                plans[label] = json.loads(
                    await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {_POSTINGS}")
                )[0]
            finally:
                await savepoint.rollback()
        indexes = await conn.fetch(
            "SELECT indexrelid::regclass::text AS name FROM pg_index "
            "WHERE indrelid = 'evidence_terms'::regclass ORDER BY 1"
        )
    finally:
        await tx.rollback()
    postings = max(p.get("Actual Rows", 0) for p in plans["as loaded"]["Plan"].get("Plans", [{}]))
    print(
        f"  server: the postings of {rows} evidence rows ({postings} postings; indexes "
        f"{', '.join(r['name'] for r in indexes)})"
    )
    for label, plan in plans.items():
        total = plan["Execution Time"]
        triggers = sum(t["Time"] for t in plan.get("Triggers", []))
        print(
            f"    {label:28} {total:8.0f} ms ({total / rows:.2f} ms per evidence, "
            f"{1000 * total / max(postings, 1):.1f} us per posting); triggers {triggers:.0f} ms"
        )


_HNSW = "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"


async def vector_index_costs(conn: asyncpg.Connection) -> None:
    """The evidence vectors of the largest space written into an HNSW index two
    ways, each in a transaction rolled back: inserted into an indexed copy of the
    table in batches of 500 (what a load does), and copied without the index,
    then the index built at once (CREATE INDEX, with the default and a larger
    maintenance_work_mem). The index's options are those of db/0001."""
    part = await conn.fetchval(
        "SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'evidence_embeddings'::regclass "
        "ORDER BY pg_relation_size(c.oid) DESC LIMIT 1"
    )
    if part is None:  # a store without any space's vector partition
        print("  server: no evidence vectors, no HNSW costs to measure")
        return
    n = await conn.fetchval(f"SELECT count(*) FROM {part}")
    print(f"  server: HNSW over the {n} evidence vectors of the largest space")

    async def timed(label: str, setup: Sequence[str], work: Sequence[str]) -> None:
        tx = conn.transaction()
        await tx.start()
        try:
            for sql in setup:
                await conn.execute(sql)
            started = time.perf_counter()
            for sql in work:
                await conn.execute(sql)
            seconds = time.perf_counter() - started
        finally:
            await tx.rollback()
        print(f"    {label:52} {seconds:8.1f} s ({seconds * 1000 / max(n, 1):.2f} ms/vector)")

    # ordinary tables (temporary ones would use the small local buffers), numbered
    # so that each batch reads only its rows
    source = [
        f"CREATE TABLE load_bench_src AS SELECT row_number() OVER () AS k, embedding FROM {part}",
        "CREATE INDEX ON load_bench_src (k)",
        "CREATE TABLE load_bench_v AS SELECT embedding FROM load_bench_src WITH NO DATA",
    ]
    batches = [
        f"INSERT INTO load_bench_v SELECT embedding FROM load_bench_src "
        f"WHERE k > {i} AND k <= {i + 500} ORDER BY k"
        for i in range(0, n, 500)
    ]
    await timed(
        "inserted into the index, batches of 500",
        [*source, f"CREATE INDEX ON load_bench_v {_HNSW}"],
        batches,
    )
    for memory in ("64MB", "512MB"):
        await timed(
            f"copied, then CREATE INDEX (maintenance_work_mem {memory})",
            [*source, f"SET LOCAL maintenance_work_mem = '{memory}'"],
            [
                "INSERT INTO load_bench_v SELECT embedding FROM load_bench_src ORDER BY k",
                f"CREATE INDEX ON load_bench_v {_HNSW}",
            ],
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=None, help="documents (default 500 generated)")
    parser.add_argument("--beir", type=Path, default=None, help="a BEIR folder to read instead")
    parser.add_argument(
        "--embedder",
        choices=("local", "hash", "supplied"),
        default="local",
        help="local: the configured model; hash: a stand-in of no cost; supplied: "
        "vectors in the file (an embedding_model line naming the configured model)",
    )
    parser.add_argument("--batch-size", type=int, default=500, help="loader records per batch")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="loader batches in flight at once (RECALL_LOAD_CONCURRENCY; 1: one at a time)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--path",
        choices=("set", "record", "both"),
        default="set",
        help="the set-based write path (default), the record-at-a-time one, or both "
        "one after the other on fresh databases (an A/B in one run)",
    )
    parser.add_argument("--profile", type=Path, default=None, help="write a cProfile file here")
    parser.add_argument(
        "--server-profile",
        action="store_true",
        help="also print where the database's time went: trigger functions' time, rows "
        "per table, EXPLAIN ANALYZE of inserting more rows like the loaded ones",
    )
    parser.add_argument(
        "--index-after",
        choices=("off", "on", "both"),
        default="off",
        help="load as 'load --index-after' does (on), not (off), or both one after the "
        "other on fresh databases",
    )
    parser.add_argument(
        "--index-memory-mb", type=int, default=None, help="RECALL_INDEX_BUILD_MEMORY_MB"
    )
    parser.add_argument(
        "--index-workers", type=int, default=None, help="RECALL_INDEX_BUILD_WORKERS"
    )
    parser.add_argument(
        "--recall-queries",
        type=int,
        default=0,
        help="measure the evidence vector list's recall@10 against an exact search "
        "with this many random queries after each load (0: not measured)",
    )
    parser.add_argument(
        "--vectors",
        choices=("random", "clustered"),
        default="random",
        help="supplied vectors (and recall queries): uniform random unit vectors from a "
        "hash of the text (default), or bunched around 20 topic centroids",
    )
    parser.add_argument(
        "--max-wal-size",
        default=None,
        help="max_wal_size of the benchmark's own embedded server (say 64MB or 4GB; "
        "not with --database-url): how often the load forces a checkpoint",
    )
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    args = parser.parse_args(argv)
    if args.max_wal_size and args.database_url:
        parser.error("--max-wal-size changes the server: only on the benchmark's own")

    with tempfile.TemporaryDirectory(prefix="recall-load-bench-") as tmp:
        path = Path(tmp) / "load.jsonl"
        if args.beir is not None:
            docs = beir_documents(args.beir, args.docs)
            source = f"BEIR folder {args.beir.name}"
        else:
            docs = generated_documents(args.docs or 500, args.seed)
            source = "generated SciFact-shaped documents"
        supplied = create_provider(Settings()) if args.embedder == "supplied" else None
        n_records, n_evidence = write_file(path, docs, supplied, args.vectors)
        print(
            f"{n_evidence} documents ({source}), {n_records} records, "
            f"{path.stat().st_size / 1e6:.1f} MB; embedder {args.embedder}, "
            f"batch size {args.batch_size}, concurrency {args.concurrency}; "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        paths = {"set": [True], "record": [False], "both": [False, True]}[args.path]
        modes = {"off": [False], "on": [True], "both": [False, True]}[args.index_after]
        with server(args.database_url) as admin_dsn:
            if args.max_wal_size:
                asyncio.run(set_max_wal_size(admin_dsn, args.max_wal_size))
            for set_based in paths:
                for index_after in modes:
                    profiler = cProfile.Profile() if args.profile else None
                    if profiler is not None:
                        profiler.enable()
                    figures = asyncio.run(measure(admin_dsn, path, args, set_based, index_after))
                    if profiler is not None:
                        profiler.disable()
                        profiler.dump_stats(str(args.profile))
                    label = "set-based" if set_based else "record at a time"
                    label += ", index after" if index_after else ", index per insert"
                    report(figures, n_evidence, label)


def report(figures: dict[str, float], n_evidence: int, label: str) -> None:
    seconds = figures["seconds"]
    print(
        f"{label}: loaded {int(figures['written'])} of {int(figures['records'])} records "
        f"in {seconds:.2f} s"
    )
    print(f"  records/s             {figures['records'] / seconds:10.1f}")
    print(f"  evidence/s            {n_evidence / seconds:10.1f}")
    print(f"  check pass share      {figures['parse_seconds'] / seconds:10.1%}")
    print(
        f"  embedding share       {figures['embed_seconds'] / seconds:10.1%}"
        f"   ({int(figures['embedded_texts'])} texts, {figures['embed_seconds']:.2f} s)"
    )
    print(f"  statements/1k records {figures['statements'] * 1000 / figures['records']:10.0f}")
    print(
        f"  batches overlapped    {int(figures['overlapped']):10d}   "
        f"(of {int(figures['batches'])}: started while the one before was in flight; "
        f"{int(figures['lanes'])} connections)"
    )
    if "server_cpu" in figures:
        rows_cpu = figures["rows_server_cpu"]
        print(
            f"  server CPU            {figures['server_cpu']:10.2f} s  "
            f"(rows {rows_cpu:.2f} s, {rows_cpu * 1000 / figures['records']:.3f} ms per record;"
            f" index builds {figures['server_cpu'] - rows_cpu:.2f} s)"
        )
    if figures["index_seconds"]:
        print(
            f"  index build share     {figures['index_seconds'] / seconds:10.1%}"
            f"   ({figures['index_seconds']:.1f} s)"
        )
    if "recall_at_10" in figures:
        print(f"  vector recall@10      {figures['recall_at_10']:10.3f}   (against exact search)")
    print(
        f"  WAL written           {figures['wal_bytes'] / 2**20:10.0f} MB"
        f"   ({figures['wal_bytes'] / 1024 / figures['records']:.1f} KB per record)"
    )
    if "checkpoints_requested" in figures:
        print(
            f"  checkpoints           {int(figures['checkpoints_requested']):10d} requested"
            f" (max_wal_size), {int(figures['checkpoints_timed'])} timed;"
            f" {figures['checkpoint_ms'] / 1000:.1f} s writing"
        )
    print(f"  peak RSS (loader)     {peak_rss_mb():10.0f} MB")
    print(f"  load average after    {os.getloadavg()[0]:10.2f}", flush=True)


if __name__ == "__main__":
    main()
