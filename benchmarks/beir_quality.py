"""Retrieval quality of ``recallMemory`` end to end on a BEIR dataset (SciFact: target 0.70).

A measuring script, not a test. It

1. starts a temporary embedded PostgreSQL (or makes a scratch database on the
   server named by ``--database-url``/``DATABASE_URL``) and migrates it;
2. loads the corpus through the project's own write path (the loader's
   records, ``WriteService``, real local MiniLM embeddings, a progress bar on
   the terminal): per document one source, one entity, one evidence (title and
   text) and ONE relationship about the entity that the evidence supports, in
   the shared space of one team; a principal with a private-bound token (its
   private space stays empty, so every recall also runs the private branch);
3. serves the gateway on loopback and asks ``recallMemory(query, limit: 10)``
   over HTTP with that bearer token for every query of the split;
4. prints nDCG@10 and recall@10 of the answers, beside the figures of the
   candidate lists the same recall fuses (full text, vector, and their
   weighted RRF by the gateway's fusion engine), fetched from the store with
   the recall's own overfetch; and the median and p95 latency of a recall.

The lists' figures locate a loss: end to end below the fused lists means
hydration or branch fusion dropped or reordered hits; fused lists below their
best member means fusion hurt.

    python benchmarks/beir_quality.py PATH_TO_BEIR_FOLDER [--split test]

The dataset is read where it lies and never copied into the repository; the
temporary database does not outlive the run. Loading SciFact (5,183 documents,
20,734 records) took 29 minutes on 2 busy cores, nearly all of it computing
the embeddings of evidence and relationships.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from beir_eval import (  # noqa: E402
    CUTOFF,
    Dataset,
    Scores,
    check_folder,
    latency_line,
    read_dataset,
    scratch_database,
    server,
)
from recall_bench import serve  # noqa: E402

from gateway import tokens  # noqa: E402
from gateway.embeddings import create_provider  # noqa: E402
from gateway.fusion import fuse_weighted  # noqa: E402
from gateway.services import loader  # noqa: E402
from gateway.services.recall_types import overfetch  # noqa: E402
from gateway.services.records import TokenRecord  # noqa: E402
from gateway.services.writes import Actor, WriteService  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.store.database import Database  # noqa: E402
from gateway.store.search import BranchSearch, CandidateQuery, evidence_candidates  # noqa: E402

TEAM = "beir"
PRINCIPAL = "reader"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,100}$")

RECALL = """query($q: String!, $limit: Int!) {
  recallMemory(query: $q, limit: $limit) {
    results { evidenceId }
    degradations { code }
    searchStates { evidence { status } }
  }
}"""


def evidence_ids(data: Dataset) -> dict[str, str]:
    """Document ID -> evidence ID: the document's own ID when it is a valid client ID."""
    return {did: (did if _ID.match(did) else f"doc-{i}") for i, (did, _) in enumerate(data.corpus)}


def records(data: Dataset, ids: dict[str, str], name: str) -> list[dict[str, Any]]:
    """The corpus as loader records (docs/loading.md)."""
    out: list[dict[str, Any]] = [
        {"kind": "team", "id": TEAM, "name": f"BEIR {name}"[:200]},
        {"kind": "principal", "team": TEAM, "id": PRINCIPAL, "display_name": "Reader"},
    ]
    for did, text in data.corpus:
        eid = ids[did]
        title = data.titles.get(did) or f"{name} document {did}"
        out += [
            {
                "kind": "source",
                "team": TEAM,
                "id": f"src-{eid}",
                "type": "document",
                "title": title[:500],
                "authority": "high",
            },
            {
                "kind": "entity",
                "team": TEAM,
                "id": f"ent-{eid}",
                "name": title[:300],
                "type": "document",
            },
            {"kind": "evidence", "team": TEAM, "id": eid, "source": f"src-{eid}", "content": text},
            {
                "kind": "relationship",
                "team": TEAM,
                "id": f"rel-{eid}",
                "subject": f"ent-{eid}",
                "predicate": "has_abstract",
                "object_value": f"{name} {did}"[:1000],
                "owner": PRINCIPAL,
                "supports": [{"id": f"sup-{eid}", "evidence": eid}],
            },
        ]
    return out


def progress_bar(total: int) -> tuple[Callable[[int], None], Callable[[], None]]:
    """A rich progress bar on stderr (a terminal), else a line every 10%."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    console = Console(stderr=True)
    if console.is_terminal:
        bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        task = bar.add_task("loading", total=total)
        bar.start()
        return (lambda n: bar.advance(task, n)), bar.stop
    done = [0, 0]

    def advance(n: int) -> None:
        done[0] += n
        tenth = done[0] * 10 // total
        if tenth > done[1]:
            done[1] = tenth
            print(f"  loaded {done[0]}/{total} records", file=sys.stderr, flush=True)

    return advance, lambda: None


async def load(dsn: str, data: Dataset, name: str, batch_size: int) -> tuple[str, dict[str, str]]:
    """Write the corpus through the loader; returns a bearer token and the ID map."""
    db = await Database.open(dsn, min_size=1, max_size=2)
    embedder = create_provider(Settings(embedding_provider="local"))
    try:
        writes = WriteService(db, embedder)
        ids = evidence_ids(data)
        lines = [json.dumps(r) for r in records(data, ids, name)]
        parsed = loader.parse(lines)
        advance, stop = progress_bar(len(parsed))
        started = time.perf_counter()
        try:
            report = await loader.load(
                writes, parsed, batch_size=batch_size, actor=Actor.operator(), progress=advance
            )
        finally:
            stop()
        print(
            f"loaded {report.records} records in {report.batches} batches, "
            f"{time.perf_counter() - started:.0f} s",
            file=sys.stderr,
        )
        token_id, secret = tokens.new_token_id(), tokens.new_secret()
        await writes.apply(
            [TokenRecord(kind="token", team=TEAM, id=token_id, principal=PRINCIPAL, secret=secret)],
            Actor.operator(),
        )
        # Fresh planner statistics and visibility map, as a store that has run a while has.
        async with db.pool.acquire() as conn:
            await conn.execute("VACUUM ANALYZE")
        return tokens.format_token(token_id, secret), ids
    finally:
        await embedder.aclose()
        await db.close()


def ask(
    port: int, token: str, queries: Sequence[str], limit: int, app: Any
) -> tuple[list[list[str]], list[float], list[int], dict[str, int]]:
    """recallMemory over HTTP for every query: answers, latencies, statements, degradations."""
    counter = app.state.services.db.counter
    answers: list[list[str]] = []
    seconds: list[float] = []
    statements: list[int] = []
    degraded: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:

        def post(q: str) -> dict[str, Any]:
            r = client.post(
                "/graphql",
                json={"query": RECALL, "variables": {"q": q, "limit": limit}},
                headers=headers,
            )
            body: dict[str, Any] = r.json()
            if body.get("errors"):
                raise SystemExit(f"recall failed: {body['errors']}")
            result: dict[str, Any] = body["data"]["recallMemory"]
            return result

        for q in queries[:5]:  # warm-up: model, prepared statements, caches
            post(q)
        for q in queries:
            before = counter.count
            started = time.perf_counter()
            result = post(q)
            seconds.append(time.perf_counter() - started)
            statements.append(counter.count - before)
            answers.append([r["evidenceId"] for r in result["results"]])
            for d in result["degradations"]:
                degraded[d["code"]] = degraded.get(d["code"], 0) + 1
    return answers, seconds, statements, degraded


async def lists(dsn: str, queries: Sequence[str], per_list: int) -> list[dict[str, list[str]]]:
    """The candidate lists recall fuses, straight from the store, for every query."""
    embedder = create_provider(Settings(embedding_provider="local"))
    db = await Database.open(dsn, min_size=1, max_size=2)
    try:
        vectors = await embedder.embed(list(queries))
        async with db.admin() as conn:
            space = await conn.fetchval(
                "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", TEAM
            )
            generation = await conn.fetchval(
                "SELECT max(generation) FROM space_generations WHERE team_id = $1 "
                "AND space_id = $2",
                TEAM,
                space,
            )
        out = []
        for q, v in zip(queries, vectors, strict=True):
            query = CandidateQuery(
                team_id=TEAM,
                branches=(BranchSearch("shared", space, generation),),
                text=q,
                vector=np.asarray(v, dtype=np.float32),
                entity_ids=(),
                exclude_ids=(),
                per_list=per_list,
                known_at=None,
            )
            async with db.tenant(TEAM, [space]) as conn:
                got = await evidence_candidates(conn, query)
            out.append({name: ids for (_, name), ids in got.items()})
        return out
    finally:
        await db.close()
        await embedder.aclose()


def run(args: argparse.Namespace) -> None:
    data = read_dataset(args.dataset, args.split)
    name = args.dataset.name
    print(
        f"{name}: {len(data.corpus)} documents, {len(data.queries)} {args.split} queries, "
        f"{sum(len(v) for v in data.qrels.values())} judgements"
    )
    qids = list(data.queries)
    texts = [data.queries[q] for q in qids]
    per_list = overfetch(args.limit)
    with server(args.database_url or os.environ.get("DATABASE_URL")) as admin_dsn:

        async def measure() -> tuple[
            dict[str, str],
            list[list[str]],
            list[float],
            list[int],
            dict[str, int],
            list[dict[str, list[str]]],
        ]:
            async with scratch_database(admin_dsn) as dsn:
                token, ids = await load(dsn, data, name, args.batch_size)
                # The gateway runs in its own thread and event loop, the client in another.
                srv, app = await asyncio.to_thread(serve, dsn, args.port)
                try:
                    asked = await asyncio.to_thread(ask, args.port, token, texts, args.limit, app)
                finally:
                    srv.should_exit = True
                got = await lists(dsn, texts, per_list)
                return (ids, *asked, got)

        ids, answers, seconds, statements, degraded, candidate_lists = asyncio.run(measure())

    doc_of = {eid: did for did, eid in ids.items()}
    end_to_end, fulltext, vector, fused = (Scores.empty() for _ in range(4))
    for qid, answer, got in zip(qids, answers, candidate_lists, strict=True):
        judged = data.qrels[qid]
        end_to_end.add([doc_of[e] for e in answer], judged)
        fulltext.add([doc_of[e] for e in got["fulltext"]], judged)
        vector.add([doc_of[e] for e in got["vector"]], judged)
        fused.add([doc_of[e] for e in fuse_weighted(got)], judged)

    width = 34
    print()
    print(f"recallMemory over HTTP, limit {args.limit}, {len(texts)} queries (cut at {CUTOFF}):")
    print(end_to_end.line("recallMemory (end to end)", width))
    print(f"its candidate lists from the store, {per_list} per list (the recall's overfetch):")
    print(fulltext.line("  full text (BM25)", width))
    print(vector.line("  vector (MiniLM)", width))
    print(fused.line("  weighted RRF of both (fusion)", width))
    print()
    print(latency_line("recallMemory latency", seconds, width))
    print(f"SQL statements per recall (median): {statistics.median(statements):.0f}")
    print(f"degradations: {degraded or 'none'}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="BEIR-layout folder (read, never copied)")
    parser.add_argument("--split", default="test", help="qrels split to score (default: test)")
    parser.add_argument("--limit", type=int, default=CUTOFF, help="recallMemory limit (10)")
    parser.add_argument("--batch-size", type=int, default=500, help="loader records per batch")
    parser.add_argument("--port", type=int, default=8791, help="loopback port of the gateway")
    parser.add_argument(
        "--database-url", help="server to create a scratch database on (default: embedded)"
    )
    args = parser.parse_args(argv)
    problem = check_folder(args.dataset, args.split)
    if problem:
        parser.error(problem)
    run(args)


if __name__ == "__main__":
    main()
