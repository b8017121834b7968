"""Shared pieces of the retrieval-quality scripts: BEIR data, metrics, a scratch database.

``fulltext_quality.py`` (the store's candidate lists) and ``beir_quality.py``
(``recallMemory`` end to end) score with exactly the same code, so that their
figures can stand side by side. Not a test and not part of the package.

A BEIR-layout folder holds ``corpus.jsonl`` (``_id``, ``title``, ``text``),
``queries.jsonl`` (``_id``, ``text``) and ``qrels/<split>.tsv`` (header, then
``query-id  corpus-id  score``). It is read where it lies and never copied:
SciFact's licence (CC BY-NC) allows evaluation, not redistribution.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from gateway.embedded import EmbeddedPostgres
from gateway.store.database import prepare

RRF_K = 60
CUTOFF = 10
MAX_CONTENT = 20_000  # evidence.content's limit (db/0001_memory_model.sql)


@dataclass(frozen=True)
class Dataset:
    corpus: list[tuple[str, str]]  # (id, title + text)
    queries: dict[str, str]  # id -> text, only those judged in the split
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> relevance
    titles: dict[str, str]  # doc id -> title ("" when the corpus has none)


def read_dataset(folder: Path, split: str) -> Dataset:
    corpus: list[tuple[str, str]] = []
    titles: dict[str, str] = {}
    with (folder / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            text = f"{doc.get('title', '')} {doc.get('text', '')}".strip()
            if text:
                corpus.append((str(doc["_id"]), text[:MAX_CONTENT]))
                titles[str(doc["_id"])] = str(doc.get("title") or "").strip()
    qrels: dict[str, dict[str, int]] = {}
    with (folder / "qrels" / f"{split}.tsv").open(encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        next(reader)  # header: query-id, corpus-id, score
        for qid, did, score in reader:
            qrels.setdefault(qid, {})[did] = int(score)
    queries: dict[str, str] = {}
    with (folder / "queries.jsonl").open(encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            if str(q["_id"]) in qrels:
                queries[str(q["_id"])] = q["text"]
    return Dataset(corpus, queries, qrels, titles)


def check_folder(folder: Path, split: str) -> str | None:
    """Why ``folder`` is not a usable BEIR folder, or None."""
    for need in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (folder / need).is_file():
            return f"no {need} in {folder}"
    return None


# --- metrics ------------------------------------------------------------------------


def ndcg_at(ranked: Sequence[str], judged: dict[str, int], k: int = CUTOFF) -> float:
    """nDCG@k with gain = relevance and log2 discounts (as pytrec_eval / BEIR)."""
    dcg = sum(judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(judged.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: Sequence[str], judged: dict[str, int], k: int = CUTOFF) -> float:
    relevant = {d for d, g in judged.items() if g > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def rrf(lists: Sequence[Sequence[str]], k: int = RRF_K) -> list[str]:
    """Equal-weight RRF, ties by ID: an independent reference, not the gateway's engine."""
    scores: dict[str, float] = {}
    for ranked in lists:
        for rank, d in enumerate(ranked, start=1):
            scores[d] = scores.get(d, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda d: (-scores[d], d))


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Scores:
    """Per-query nDCG@10 and recall@10 of one ranking method."""

    ndcg: list[float]
    recall: list[float]

    @classmethod
    def empty(cls) -> Scores:
        return cls([], [])

    def add(self, ranked: Sequence[str], judged: dict[str, int]) -> None:
        self.ndcg.append(ndcg_at(ranked, judged))
        self.recall.append(recall_at(ranked, judged))

    def line(self, name: str, width: int = 22) -> str:
        return (
            f"{name:<{width}} nDCG@{CUTOFF} {sum(self.ndcg) / len(self.ndcg):.3f}   "
            f"recall@{CUTOFF} {sum(self.recall) / len(self.recall):.3f}"
        )


def latency_line(name: str, seconds: Sequence[float], width: int = 22) -> str:
    ms = sorted(s * 1000 for s in seconds)
    median = (ms[(len(ms) - 1) // 2] + ms[len(ms) // 2]) / 2
    return f"{name:<{width}} median {median:6.2f} ms   p95 {percentile(ms, 0.95):6.2f} ms"


# --- database -----------------------------------------------------------------------


def _with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + name))


@contextlib.contextmanager
def server(url: str | None) -> Iterator[str]:
    """An admin DSN: the given server, or an embedded one in a temporary folder."""
    if url:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="recall-bench-") as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg", database="postgres")
        pg.install_signal_handlers()
        with pg:
            yield pg.dsn


@contextlib.asynccontextmanager
async def scratch_database(admin_dsn: str) -> AsyncIterator[str]:
    """A fresh, migrated database on that server, dropped afterwards."""
    name = "recall_bench_" + secrets.token_hex(4)
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            dsn = _with_database(admin_dsn, name)
            await prepare(dsn, migrate=True)
            yield dsn
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
