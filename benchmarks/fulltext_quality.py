"""Ranking quality and latency of the evidence candidate search on a BEIR dataset.

A measuring script, not a test. It loads a BEIR-layout dataset (``corpus.jsonl``,
``queries.jsonl``, ``qrels/<split>.tsv``) into a fresh database as one team's
shared space, runs every query of the split through
``gateway.store.search.evidence_candidates`` and prints nDCG@10 (graded gains,
the relevance as judged) and recall@10 of the full-text (BM25) list, plus the
median and p95 latency of the candidate call. With ``--dense`` it also embeds
the corpus with the local MiniLM model and reports the vector list and the
reciprocal rank fusion of both lists (k = 60).

Why this exists: PostgreSQL's own ``ts_rank_cd`` reached nDCG@10 0.33 on
SciFact, BM25 0.68; this keeps our in-database BM25 honest against that mark.

The dataset is read where it lies and never copied: its licence (SciFact:
CC BY-NC) allows evaluation, not redistribution. For speed the corpus is
written directly as the owner role (COPY into sources, evidence and
embeddings), not through the loader; the store's own triggers still fill the
postings and the search statistics, so the numbers measure the real read path.

    python benchmarks/fulltext_quality.py PATH            # BEIR-layout folder, e.g. SciFact
    python benchmarks/fulltext_quality.py PATH --dense    # also the vector list and RRF

The database: ``--database-url`` (or ``DATABASE_URL``) names a server on which
a scratch database is created and dropped afterwards; without either, an
embedded PostgreSQL is started in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from beir_eval import (  # noqa: E402
    RRF_K,
    Dataset,
    Scores,
    check_folder,
    latency_line,
    read_dataset,
    rrf,
    scratch_database,
    server,
)

from gateway.embeddings import LocalEmbeddingProvider  # noqa: E402
from gateway.store.database import Database  # noqa: E402
from gateway.store.search import BranchSearch, CandidateQuery, evidence_candidates  # noqa: E402

TEAM = "bench"


async def load_corpus(
    dsn: str, data: Dataset, vectors: np.ndarray | None, model: str | None
) -> uuid.UUID:
    """The corpus as evidence of one source in the team's shared space."""
    conn = await asyncpg.connect(dsn)
    try:
        await register_vector(conn)
        async with conn.transaction():
            await conn.execute("INSERT INTO teams (id, name) VALUES ($1, $2)", TEAM, "Benchmark")
            space: uuid.UUID = await conn.fetchval(
                "INSERT INTO memory_spaces (team_id, kind) VALUES ($1, 'shared') RETURNING id",
                TEAM,
            )
            await conn.execute(
                "INSERT INTO sources (team_id, id, space_id, generation, kind, title, authority) "
                "VALUES ($1, 'corpus', $2, 1, 'document', 'corpus', 'high')",
                TEAM,
                space,
            )
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
                records=[
                    (TEAM, did, space, 1, "corpus", text, hashlib.sha256(text.encode()).digest())
                    for did, text in data.corpus
                ],
            )
            if vectors is not None and model is not None:
                await conn.execute(
                    "INSERT INTO embedding_models (name, dimensions) VALUES ($1, $2)",
                    model,
                    vectors.shape[1],
                )
                await conn.copy_records_to_table(
                    "evidence_embeddings",
                    columns=[
                        "team_id",
                        "space_id",
                        "evidence_id",
                        "model",
                        "dimensions",
                        "embedding",
                    ],
                    records=[
                        (TEAM, space, did, model, vectors.shape[1], vectors[i])
                        for i, (did, _) in enumerate(data.corpus)
                    ],
                )
        # Fresh statistics (and a visibility map) as a long-running store would have.
        await conn.execute("VACUUM ANALYZE")
        return space
    finally:
        await conn.close()


# --- the run ------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    data = read_dataset(args.dataset, args.split)
    print(
        f"{args.dataset.name}: {len(data.corpus)} documents, {len(data.queries)} "
        f"{args.split} queries, {sum(len(v) for v in data.qrels.values())} judgements"
    )
    provider = LocalEmbeddingProvider() if args.dense else None
    doc_vectors = query_vectors = None
    if provider is not None:
        started = time.perf_counter()
        doc_vectors = await provider.embed([text for _, text in data.corpus])
        query_vectors = await provider.embed(list(data.queries.values()))
        print(f"embedded corpus and queries in {time.perf_counter() - started:.1f} s")

    with server(args.database_url or os.environ.get("DATABASE_URL")) as admin_dsn:
        async with scratch_database(admin_dsn) as dsn:
            started = time.perf_counter()
            space = await load_corpus(
                dsn, data, doc_vectors, provider.model if provider is not None else None
            )
            print(f"loaded in {time.perf_counter() - started:.1f} s")
            db = await Database.open(dsn, min_size=1, max_size=2)
            try:
                await evaluate(db, space, data, query_vectors, args.per_list)
            finally:
                await db.close()
    if provider is not None:
        await provider.aclose()


async def evaluate(
    db: Database,
    space: uuid.UUID,
    data: Dataset,
    query_vectors: np.ndarray | None,
    per_list: int,
) -> None:
    branch = BranchSearch("shared", space, 1)

    async def call(
        text: str | None, vector: np.ndarray | None
    ) -> tuple[dict[str, list[str]], float]:
        query = CandidateQuery(
            team_id=TEAM,
            branches=(branch,),
            text=text,
            vector=vector,
            entity_ids=(),
            exclude_ids=(),
            per_list=per_list,
            known_at=None,
        )
        async with db.tenant(TEAM, [space]) as conn:
            started = time.perf_counter()
            lists = await evidence_candidates(conn, query)
            elapsed = time.perf_counter() - started
        return {name: ids for (_, name), ids in lists.items()}, elapsed

    # Warm the caches and the prepared statements before timing.
    first = next(iter(data.queries.values()))
    for _ in range(3):
        await call(first, None if query_vectors is None else query_vectors[0])

    fulltext = Scores.empty()
    dense = Scores.empty()
    fused = Scores.empty()
    t_fulltext: list[float] = []
    t_vector: list[float] = []
    t_both: list[float] = []
    for i, (qid, text) in enumerate(data.queries.items()):
        judged = data.qrels[qid]
        lists, elapsed = await call(text, None)
        t_fulltext.append(elapsed)
        fulltext.add(lists["fulltext"], judged)
        if query_vectors is not None:
            vector = query_vectors[i]
            lists_v, elapsed = await call(None, vector)
            t_vector.append(elapsed)
            dense.add(lists_v["vector"], judged)
            both, elapsed = await call(text, vector)
            t_both.append(elapsed)
            ranked = rrf([both["fulltext"], both["vector"]])
            fused.add(ranked, judged)

    print()
    print(fulltext.line("fulltext (BM25)"))
    if query_vectors is not None:
        print(dense.line("vector (MiniLM)"))
        print(fused.line(f"RRF k={RRF_K} (both)"))
    print()
    print(f"candidate call latency, per_list={per_list}, one branch:")
    print(latency_line("fulltext only", t_fulltext))
    if query_vectors is not None:
        print(latency_line("vector only", t_vector))
        print(latency_line("fulltext + vector", t_both))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="BEIR-layout folder (read, never copied)")
    parser.add_argument("--split", default="test", help="qrels split to score (default: test)")
    parser.add_argument("--dense", action="store_true", help="also embed and score vectors")
    parser.add_argument("--per-list", type=int, default=100, help="candidates per list")
    parser.add_argument(
        "--database-url", help="server to create a scratch database on (default: embedded)"
    )
    args = parser.parse_args(argv)
    problem = check_folder(args.dataset, args.split)
    if problem:
        parser.error(problem)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
