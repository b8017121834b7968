"""Recall benchmark: generate a multi-team dataset, then measure recallMemory over HTTP.

    python benchmarks/recall_bench.py --evidence 100000 --teams 10 --queries 200
    python benchmarks/recall_bench.py --evidence 5000 --teams 5 --related

With ``--related`` the relationships get statements from the topic vocabulary,
a subject entity per topic, vectors in an active projection generation, and
community snapshots are built; the run then measures a full recall (every
frontier on, with related relationships and communities selected) next to an
evidence-only recall (relationshipLimit 0, communityLimit 0) on the same data.

Prints, from one run: p50 and p95 latency of recallMemory over HTTP on
loopback, SQL statements per recall, and the vector list's recall@10 against
an exact search under the team/space filter.

The dataset is written straight into the tables with COPY (the loader's
embedding step would take ~6 minutes per 100k texts here). Vectors are
synthetic: every team draws its evidence from the *same* topic centroids, so
other teams' vectors crowd each team's neighbourhood, the case that plain
HNSW + WHERE gets wrong. Recall over HTTP embeds the query with the real
model, so its latency is real; the filtered-recall figure uses synthetic query
vectors near the centroids.

Texts (``--corpus``):

- ``zipf`` (default): word frequencies shaped like real text, fitted to
  SciFact. A vocabulary of 3,000 made-up words with Zipf-Mandelbrot
  frequencies (exponent 1, offset 8: the offset stands for the stop words
  that ``to_tsvector`` drops), and per topic 300 words with their own Zipf
  law (offset 3); a text of 10 to 80 words takes 30% of them from its topic, a
  query of 4 to 10 words likewise. Then a query lexeme is in 2.9% of a space
  (median; mean 7.5%) and the commonest lexeme in 47%, as in SciFact (median
  3.2%, mean 7.6%, commonest 49%, the test claims against the corpus, with
  the same English configuration).
- ``tiny``: the previous generator, kept as a worst case: 8 words per topic,
  so every query lexeme is in about 11% of a space and 4 of them make a query.

With no DATABASE_URL, an embedded server is started in a temporary folder and
removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final
from uuid import UUID

import asyncpg
import httpx
import numpy as np
from pgvector.asyncpg import register_vector

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import schedstat_ns  # noqa: E402

from gateway import tokens  # noqa: E402
from gateway.store.database import prepare  # noqa: E402

TOPICS = [
    "billing invoices payments ledger refund charge customer account",
    "latency spikes timeout queue backlog worker throughput saturation",
    "database migration schema postgres index vacuum replication failover",
    "deploy release rollback canary pipeline build artifact version",
    "security token rotation secret vault audit access permission",
    "search ranking relevance recall embedding vector query index",
    "incident outage pager alert escalation postmortem root cause",
    "storage bucket object retention backup snapshot restore archive",
]
DIM = 384
MODEL = "all-MiniLM-L6-v2-int8-onnx"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def database(keep: Path | None = None, shared_buffers_mb: int | None = None) -> Iterator[str]:
    """The benchmark's database: DATABASE_URL, else an embedded server in ``keep``
    (kept, so that a later run with the same folder reuses the dataset) or in a
    temporary folder. The server's memory is the gateway's (``RECALL_PG_*`` or
    derived from the machine), ``shared_buffers_mb`` replacing its shared buffers."""
    given = os.environ.get("DATABASE_URL")
    if given:
        yield given
        return
    from gateway.embedded import EmbeddedPostgres, ServerMemory
    from gateway.settings import Settings

    with contextlib.ExitStack() as stack:
        folder = keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="recall-")))
        folder.mkdir(parents=True, exist_ok=True)
        memory = None
        if shared_buffers_mb is not None:
            memory = ServerMemory.from_settings(
                Settings().model_copy(update={"pg_shared_buffers_mb": shared_buffers_mb})
            )
        server = EmbeddedPostgres(folder, database="bench", memory=memory)
        server.start()
        try:
            yield server.dsn
        finally:
            server.stop()


VOCABULARY = 3_000
VOCABULARY_OFFSET = 8
TOPIC_WORDS = 300
TOPIC_OFFSET = 3
TOPIC_SHARE = 0.3


class Zipf:
    """Texts and queries with Zipf-distributed made-up words (see the module doc)."""

    def __init__(self, rng: np.random.Generator) -> None:
        syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
        words: set[str] = set()
        while len(words) < VOCABULARY:
            n = int(rng.integers(2, 5))
            words.add("".join(rng.choice(syllables, size=n).tolist()))
        self.words = np.array(sorted(words))
        rng.shuffle(self.words)
        ranks = np.arange(VOCABULARY, dtype=np.float64)
        self.global_cdf = np.cumsum(1.0 / (ranks + VOCABULARY_OFFSET))
        self.global_cdf /= self.global_cdf[-1]
        self.topic_words = [rng.choice(VOCABULARY, size=TOPIC_WORDS, replace=False) for _ in TOPICS]
        topic_ranks = np.arange(TOPIC_WORDS, dtype=np.float64)
        self.topic_cdf = np.cumsum(1.0 / (topic_ranks + TOPIC_OFFSET))
        self.topic_cdf /= self.topic_cdf[-1]

    def _draw(self, rng: np.random.Generator, topic: int, n: int) -> list[str]:
        from_topic = rng.random(n) < TOPIC_SHARE
        local = self.topic_words[topic][np.searchsorted(self.topic_cdf, rng.random(n))]
        general = np.searchsorted(self.global_cdf, rng.random(n))
        drawn: list[str] = self.words[np.where(from_topic, local, general)].tolist()
        return drawn

    def sample(self, rng: np.random.Generator, topic: int, n: int) -> list[str]:
        return self._draw(rng, topic, n)

    def text(self, rng: np.random.Generator, topic: int) -> str:
        return " ".join(self._draw(rng, topic, int(rng.integers(10, 81))))

    def query(self, rng: np.random.Generator, topic: int) -> str:
        return " ".join(self._draw(rng, topic, int(rng.integers(4, 11))))


class Tiny:
    """The earlier worst case: 8 words per topic (see the module doc)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.words = [t.split() for t in TOPICS]

    def sample(self, rng: np.random.Generator, topic: int, n: int) -> list[str]:
        return list(rng.choice(self.words[topic], size=n).tolist())

    def text(self, rng: np.random.Generator, topic: int) -> str:
        return " ".join(self.sample(rng, topic, int(rng.integers(8, 30))))

    def query(self, rng: np.random.Generator, topic: int) -> str:
        return " ".join(rng.choice(self.words[topic], size=4).tolist())


def unit(v: np.ndarray) -> np.ndarray:
    scaled: np.ndarray = v / np.linalg.norm(v, axis=-1, keepdims=True)  # numpy says Any
    return scaled.astype(np.float32)


async def generate(
    dsn: str,
    n_evidence: int,
    n_teams: int,
    seed: int,
    corpus: Zipf | Tiny,
    related: bool = False,
    bulk_index: bool = False,
    skew: int = 1,
) -> dict[str, Any]:
    """Write the dataset; returns the team names, their shared spaces and the centroids.

    ``bulk_index``: each space's vector partitions are loaded without their HNSW
    index, which is built afterwards (see :func:`_unindexed_partitions`).
    ``skew``: the first team (the token's) gets this many times the evidence of
    each other team, ``n_evidence`` in all (one generic plan serves every team:
    the case a skewed store measures)."""
    rng = np.random.default_rng(seed)
    centroids = unit(rng.standard_normal((len(TOPICS), DIM)))
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    guards = await _postings_guards(conn)
    planned: set[str] = set()
    try:
        for table, trigger in guards:
            await conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")
        await conn.execute(
            "INSERT INTO embedding_models (name, dimensions) VALUES ($1, 384) "
            "ON CONFLICT DO NOTHING",
            MODEL,
        )
        teams: dict[str, UUID] = {}
        base = n_evidence // (n_teams - 1 + skew)
        for t in range(n_teams):
            per_team = base * skew if t == 0 else base
            team = f"bench-{t:02d}"
            started = time.perf_counter()
            await conn.execute("INSERT INTO teams (id, name) VALUES ($1, $2)", team, team)
            await conn.execute(
                "INSERT INTO principals (team_id, id, kind, display_name) "
                "VALUES ($1, 'analyst', 'person', 'Analyst')",
                team,
            )
            space = await conn.fetchval(
                "INSERT INTO memory_spaces (team_id, kind) VALUES ($1, 'shared') RETURNING id",
                team,
            )
            teams[team] = space
            detached = await _unindexed_partitions(conn, space) if bulk_index else {}
            await conn.execute(
                "INSERT INTO sources (team_id, id, space_id, generation, kind, title, authority) "
                "VALUES ($1, 'src', $2, 1, 'document', 'Generated notes', 'medium')",
                team,
                space,
            )
            await conn.execute(
                "INSERT INTO source_lifecycle_events (team_id, space_id, source_id, status) "
                "VALUES ($1, $2, 'src', 'active')",
                team,
                space,
            )
            await conn.execute(
                "INSERT INTO entities (team_id, id, space_id, generation, name, kind) "
                "VALUES ($1, 'topic', $2, 1, 'Topic', 'concept')",
                team,
                space,
            )
            if related:
                await conn.execute(
                    "INSERT INTO relationship_projections "
                    "(team_id, generation, model, status, activated_at) "
                    "VALUES ($1, 1, $2, 'active', now())",
                    team,
                    MODEL,
                )
                for k in range(len(TOPICS)):
                    await conn.execute(
                        "INSERT INTO entities (team_id, id, space_id, generation, name, kind) "
                        "VALUES ($1, $2, $3, 1, $4, 'concept')",
                        team,
                        f"topic-{k}",
                        space,
                        f"Topic {k}",
                    )
            topic_of = rng.integers(0, len(TOPICS), size=per_team)
            evidence, lifecycle, rels, rel_events, supports, decisions, vectors = (
                [],
                [],
                [],
                [],
                [],
                [],
                [],
            )
            rel_vectors: list[tuple[Any, ...]] = []
            noise = rng.standard_normal((per_team, DIM)).astype(np.float32) * 0.045
            vecs = unit(centroids[topic_of] + noise)
            for i in range(per_team):
                ident = f"ev-{i:06d}"
                body = corpus.text(rng, int(topic_of[i]))
                text = f"Note {i} of {team}: {body}."
                evidence.append(
                    (team, ident, space, 1, "src", text, hashlib.sha256(text.encode()).digest())
                )
                lifecycle.append((team, space, ident, "active"))
                subject, statement = "topic", f"Topic mentions {i}"
                if related:
                    subject = f"topic-{topic_of[i]}"
                    statement = f"Topic {topic_of[i]} mentions " + " ".join(
                        corpus.sample(rng, int(topic_of[i]), 5)
                    )
                    rel_vectors.append((team, space, f"rel-{i:06d}", 1, MODEL, DIM, vecs[i]))
                rels.append(
                    (
                        team,
                        f"rel-{i:06d}",
                        space,
                        1,
                        subject,
                        "mentions",
                        f"t{topic_of[i]}-{i}",
                        "analyst",
                        f"g-{i}",
                        statement,
                    )
                )
                rel_events.append((team, space, f"rel-{i:06d}", "active"))
                supports.append((team, f"sup-{i:06d}", space, ident, f"rel-{i:06d}"))
                decisions.append((team, space, f"sup-{i:06d}", "grant"))
                vectors.append((team, space, ident, MODEL, DIM, vecs[i]))
            # Two writes, two transactions, so two instants: all but the newest
            # tenth, then that tenth. A knownAt view at the first instant
            # (known_instant) hides the newest part of the space.
            cut = per_team - per_team // NEWEST_PART
            for part in (slice(0, cut), slice(cut, per_team)):
                async with conn.transaction():
                    await _copy(
                        conn,
                        planned,
                        "evidence",
                        records=evidence[part],
                        columns=[
                            "team_id",
                            "id",
                            "space_id",
                            "generation",
                            "source_id",
                            "content",
                            "content_sha256",
                        ],
                    )
                    await _copy(
                        conn,
                        planned,
                        "evidence_lifecycle_events",
                        records=lifecycle[part],
                        columns=["team_id", "space_id", "evidence_id", "status"],
                    )
                    await _copy(
                        conn,
                        planned,
                        "relationships",
                        records=rels[part],
                        columns=[
                            "team_id",
                            "id",
                            "space_id",
                            "generation",
                            "subject_entity_id",
                            "predicate",
                            "object_value",
                            "owner_principal_id",
                            "semantic_group_key",
                            "statement",
                        ],
                    )
                    await _copy(
                        conn,
                        planned,
                        "relationship_status_events",
                        records=rel_events[part],
                        columns=["team_id", "space_id", "relationship_id", "status"],
                    )
                    await _copy(
                        conn,
                        planned,
                        "supports",
                        records=supports[part],
                        columns=["team_id", "id", "space_id", "evidence_id", "relationship_id"],
                    )
                    await _copy(
                        conn,
                        planned,
                        "support_decisions",
                        records=decisions[part],
                        columns=["team_id", "space_id", "support_id", "decision"],
                    )
                    await _copy(
                        conn,
                        planned,
                        detached.get("evidence_embeddings", "evidence_embeddings"),
                        records=vectors[part],
                        columns=[
                            "team_id",
                            "space_id",
                            "evidence_id",
                            "model",
                            "dimensions",
                            "embedding",
                        ],
                    )
                    if rel_vectors[part]:
                        await _copy(
                            conn,
                            planned,
                            detached.get("relationship_embeddings", "relationship_embeddings"),
                            records=rel_vectors[part],
                            columns=[
                                "team_id",
                                "space_id",
                                "relationship_id",
                                "projection_generation",
                                "model",
                                "dimensions",
                                "embedding",
                            ],
                        )
            if detached:
                await _index_and_attach(conn, space, detached)
            if related:
                await add_frontier_material(conn, team, space, per_team, corpus, seed + 11 + t)
            log(f"  {team}: {per_team} evidence in {time.perf_counter() - started:.1f} s")
        secret = tokens.new_secret()
        await conn.execute(
            "INSERT INTO api_tokens (id, team_id, principal_id, secret_sha256, binding) "
            "VALUES ('bench-token', 'bench-00', 'analyst', $1, 'private')",
            tokens.hash_secret(secret),
        )
        for table, trigger in guards:
            await conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER {trigger}")
        # Planner statistics and the visibility map (index-only scans), as
        # autovacuum leaves them after a bulk load on a running store.
        await conn.execute("VACUUM ANALYZE")
        return {
            "teams": teams,
            "centroids": centroids,
            "token": tokens.format_token("bench-token", secret),
        }
    finally:
        await conn.close()


async def _copy(
    conn: asyncpg.Connection,
    planned: set[str],
    table: str,
    *,
    records: list[tuple[Any, ...]],
    columns: list[str],
) -> None:
    """COPY ``records`` into ``table``; the first time a table is written, ANALYZE it
    right after (inside the same transaction, which ANALYZE samples too).

    The foreign keys' checks (and any statement a trigger plans) are planned at
    their first run in the generator's one session. Planned on a table without
    statistics, the lookup of a referenced row by its key took an index led by
    (team_id, space_id) alone with the ID as a filter (relationships has several
    such indexes), so every row of the next COPY looked through all of its
    space's rows: at 90,000 relationships per space, ``relationship_status_events``'
    COPY ran for minutes in its foreign-key check. ANALYZE gives the planner the
    table's statistics and invalidates the plans made without them, as the
    loader's statistics refresh does for a new store (docs/data-model.md)."""
    await conn.copy_records_to_table(table, records=records, columns=columns)
    if table not in planned:
        planned.add(table)
        await conn.execute(f'ANALYZE "{table}"')


# The postings' insert guards of db/0115 (every posting's document exists, and is
# locked FOR KEY SHARE, as the foreign key did). Their statement is planned at its
# first run in the generator's session, a space's first COPY, when no table has
# statistics yet; the planner then took an index led by (team_id, space_id) alone,
# with the document's ID as a filter, so each document was looked for among all of
# its space's rows written so far: quadratic per space (the first COPY of 90,000
# relationships of a 1,000,000-evidence run was still in that check after 28
# minutes). Every posting here is written by the fill triggers from the rows of
# the same statement, so the check cannot fail: the generator turns these
# triggers off while it writes and on again before the dataset is used.
_GUARDS = ("evidence_terms_check_documents", "relationship_terms_check_documents")


async def _postings_guards(conn: asyncpg.Connection) -> list[tuple[str, str]]:
    """(table, trigger) of the guards of :data:`_GUARDS` this schema has."""
    rows = await conn.fetch(
        "SELECT t.tgrelid::regclass::text AS tab, t.tgname FROM pg_trigger t "
        "WHERE t.tgname = ANY ($1::text[]) AND NOT t.tgisinternal ORDER BY 2",
        list(_GUARDS),
    )
    return [(r["tab"], r["tgname"]) for r in rows]


# Each team's newest 1/NEWEST_PART of its evidence (with its relationships and
# vectors) is written in a transaction of its own, after the rest (see generate).
NEWEST_PART = 10

_VECTOR_TABLES = ("evidence_embeddings", "relationship_embeddings")
_INDEX_DDL: dict[str, str] = {}


async def _unindexed_partitions(conn: asyncpg.Connection, space: UUID) -> dict[str, str]:
    """Detach the space's two vector partitions and drop their HNSW indexes, so that
    COPY does not insert each vector into a graph one by one (at 100,000 vectors per
    space that took about 25 minutes per space here, against about a minute for a
    bulk build). Returns parent table -> partition; :func:`_index_and_attach` builds
    the same index and attaches the partition again, as a bulk load of a real
    store would."""
    detached = {}
    for parent in _VECTOR_TABLES:
        part = f"{parent}_{space.hex}"
        await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {part}")
        rows = await conn.fetch(
            "SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS ddl "
            "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_am a ON a.oid = c.relam "
            "WHERE i.indrelid = $1::regclass AND a.amname = 'hnsw'",
            part,
        )
        for row in rows:
            _INDEX_DDL[part] = row["ddl"]
            await conn.execute(f"DROP INDEX {row['name']}")
        detached[parent] = part
    return detached


async def _index_and_attach(
    conn: asyncpg.Connection, space: UUID, detached: dict[str, str]
) -> None:
    """Build the dropped HNSW index of each detached partition, then attach it again
    (PostgreSQL adopts the matching index instead of building another)."""
    await conn.execute("SET maintenance_work_mem = '1GB'")
    for parent, part in detached.items():
        await conn.execute(_INDEX_DDL[part])
        await conn.execute(
            f"ALTER TABLE {parent} ATTACH PARTITION {part} FOR VALUES IN ('{space}')"
        )
    await conn.execute("RESET maintenance_work_mem")


# Every this-many evidence/relationships: a hypothesis, a relationship conflict
# case (between relationships i and i+1, every third one resolved), an evidence
# conflict (between evidence i and i+1), so that every frontier has answers.
HYPOTHESIS_EVERY = 50
CASE_EVERY = 97
EVIDENCE_CONFLICT_EVERY = 89


async def add_frontier_material(
    conn: asyncpg.Connection,
    team: str,
    space: UUID,
    per_team: int,
    corpus: Zipf | Tiny,
    seed: int,
) -> None:
    """Hypotheses and conflicts of one team, drawn from their own random stream so
    that the evidence and relationships are the same with or without them."""
    rng = np.random.default_rng(seed)
    hyps, hyp_rels, hyp_evs, hyp_events = [], [], [], []
    for i in range(0, per_team, HYPOTHESIS_EVERY):
        topic = int(rng.integers(0, len(TOPICS)))
        statement = "Perhaps " + " ".join(corpus.sample(rng, topic, 6))
        hyps.append((team, f"hyp-{i:06d}", space, 1, statement))
        hyp_rels.append((team, space, f"hyp-{i:06d}", f"rel-{i:06d}"))
        hyp_evs.append((team, space, f"hyp-{i:06d}", f"ev-{i:06d}"))
        hyp_events.append((team, space, f"hyp-{i:06d}", "propose", "proposed"))
    cases, positions, members = [], [], []
    case_events: list[tuple[str, UUID, str, str, str | None]] = []  # resolved: the winner
    for n, i in enumerate(range(0, per_team - 1, CASE_EVERY)):
        case = f"case-{i:06d}"
        cases.append((team, case, space, 1, f"Which of rel-{i:06d} and its neighbour holds?"))
        for side, rel in (("a", i), ("b", i + 1)):
            positions.append((team, space, case, f"{case}-{side}", f"Position {side}"))
            members.append((team, space, case, f"{case}-{side}", f"rel-{rel:06d}"))
        case_events.append((team, space, case, "open", None))
        if n % 3 == 0:
            case_events.append((team, space, case, "resolve", f"{case}-a"))
    occurrences, conflicts, cited = [], [], []
    for i in range(0, per_team - 1, EVIDENCE_CONFLICT_EVERY):
        conflict = f"econf-{i:06d}"
        conflicts.append((team, conflict, space, 1, f"Do ev-{i:06d} and ev-{i + 1:06d} agree?"))
        for side, ev in (("a", i), ("b", i + 1)):
            occ = f"occ-{ev:06d}-{side}"
            occurrences.append((team, space, f"ev-{ev:06d}", occ, "Note", 0, 4))
            cited.append(
                (team, space, conflict, f"{conflict}-{side}", f"Says {side}", f"ev-{ev:06d}", occ)
            )
    async with conn.transaction():
        await conn.executemany(
            "INSERT INTO hypotheses (team_id, id, space_id, generation, statement) "
            "VALUES ($1, $2, $3, $4, $5)",
            hyps,
        )
        await conn.executemany(
            "INSERT INTO hypothesis_relationships (team_id, space_id, hypothesis_id, "
            "relationship_id) VALUES ($1, $2, $3, $4)",
            hyp_rels,
        )
        await conn.executemany(
            "INSERT INTO hypothesis_evidence (team_id, space_id, hypothesis_id, evidence_id) "
            "VALUES ($1, $2, $3, $4)",
            hyp_evs,
        )
        await conn.executemany(
            "INSERT INTO hypothesis_feedback (team_id, space_id, hypothesis_id, decision, "
            "status) VALUES ($1, $2, $3, $4, $5)",
            hyp_events,
        )
        await conn.executemany(
            "INSERT INTO conflict_cases (team_id, id, space_id, generation, question) "
            "VALUES ($1, $2, $3, $4, $5)",
            cases,
        )
        await conn.executemany(
            "INSERT INTO conflict_positions (team_id, space_id, case_id, id, label) "
            "VALUES ($1, $2, $3, $4, $5)",
            positions,
        )
        await conn.executemany(
            "INSERT INTO conflict_position_relationships (team_id, space_id, case_id, "
            "position_id, relationship_id) VALUES ($1, $2, $3, $4, $5)",
            members,
        )
        await conn.executemany(
            "INSERT INTO conflict_case_events (team_id, space_id, case_id, event, "
            "preferred_position_id) VALUES ($1, $2, $3, $4, $5)",
            case_events,
        )
        await conn.executemany(
            "INSERT INTO evidence_occurrences (team_id, space_id, evidence_id, id, quote, "
            "span_start, span_end) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            occurrences,
        )
        await conn.executemany(
            "INSERT INTO evidence_conflicts (team_id, id, space_id, generation, question) "
            "VALUES ($1, $2, $3, $4, $5)",
            conflicts,
        )
        await conn.executemany(
            "INSERT INTO evidence_conflict_positions (team_id, space_id, conflict_id, id, "
            "label, evidence_id, occurrence_id) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            cited,
        )


async def reuse(dsn: str, seed: int) -> dict[str, Any] | None:
    """The dataset already in the database (a kept ``--data-dir``), with a new token;
    None when there is none yet."""
    conn = await asyncpg.connect(dsn)
    try:
        exists = await conn.fetchval("SELECT to_regclass('teams') IS NOT NULL")
        if not exists:
            return None
        rows = await conn.fetch(
            "SELECT team_id, id FROM memory_spaces WHERE kind = 'shared' "
            "AND team_id LIKE 'bench-%' ORDER BY team_id"
        )
        if not rows:
            return None
        secret = tokens.new_secret()
        await conn.execute(
            "UPDATE api_tokens SET secret_sha256 = $1 WHERE id = 'bench-token'",
            tokens.hash_secret(secret),
        )
    finally:
        await conn.close()
    # The centroids are the first draw of the generator's stream (see generate).
    centroids = unit(np.random.default_rng(seed).standard_normal((len(TOPICS), DIM)))
    return {
        "teams": {r["team_id"]: r["id"] for r in rows},
        "centroids": centroids,
        "token": tokens.format_token("bench-token", secret),
    }


_threads: list[threading.Thread] = []


def stop(server: Any) -> None:
    """Stop the gateway thread and wait for its lifespan to end (before the database)."""
    server.should_exit = True
    for thread in _threads:
        thread.join(timeout=30)
    _threads.clear()


def serve(dsn: str, port: int, observability: Any = None) -> tuple[Any, Any]:
    """The gateway on loopback in a thread; returns (uvicorn server, app)."""
    import uvicorn

    from gateway.app import create_app
    from gateway.settings import Settings

    app = create_app(Settings(database_url=dsn, migrate_on_start=False), observability)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _threads.append(thread)
    # minutes, not seconds: a big store's start-up warm-up (docs/deploy.md) keeps
    # /readyz at 503 while it reads
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return server, app
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("the gateway did not become ready")


QUERY = """query($q: String!) { recallMemory(query: $q, limit: 10) {
  results { evidenceId rank context source { id } supportingRelationships { id } }
  degradations { code } } }"""

# The same recalls as a knownAt view (statistics of that instant, exact vector
# scans): what a historical view costs next to the current one.
QUERY_AT = """query($q: String!, $knownAt: DateTime) {
  recallMemory(query: $q, limit: 10, knownAt: $knownAt) {
  results { evidenceId rank context source { id } supportingRelationships { id } }
  degradations { code } } }"""

EVIDENCE_ONLY = """query($q: String!) {
  recallMemory(query: $q, limit: 10, relationshipLimit: 0, communityLimit: 0) {
  results { evidenceId rank context source { id } supportingRelationships { id } }
  degradations { code } } }"""

FULL = """query($q: String!) { recallMemory(query: $q, limit: 10) {
  results { evidenceId rank context source { id } supportingRelationships { id } }
  relatedRelationships { representativeId equivalentIds representative { statement } }
  relatedCommunities { id summary members { representativeId representative { statement } } }
  degradations { code } } }"""

FULL_AT = """query($q: String!, $knownAt: DateTime) {
  recallMemory(query: $q, limit: 10, knownAt: $knownAt) {
  results { evidenceId rank context source { id } supportingRelationships { id } }
  relatedRelationships { representativeId equivalentIds representative { statement } }
  degradations { code } } }"""


# Every frontier with what identifies and orders its items (answers mode).
ANSWERS = """query($q: String!, $knownAt: DateTime, $ke: [ID!], $kr: [ID!]) {
  recallMemory(query: $q, limit: 10, knownAt: $knownAt, knownEvidenceIds: $ke,
               knownRelationshipIds: $kr) {
    results { evidenceId rank spaceKind sourceId: source { id }
              supportingRelationships { id status } }
    relatedRelationships { representativeId equivalentIds semanticGroup }
    relatedCommunities { id membersTruncated members { representativeId equivalentIds } }
    relatedHypotheses { id status sourceRelationshipIds sourceEvidenceIds }
    conflicts { id
      ... on RelationshipConflict { state preferredPositionId
            positions { id disposition relationshipIds supporterCount } }
      ... on EvidenceConflict { positions { id citation { evidenceId occurrenceId } } } }
    searchStates {
      evidence { status lists { spaceKind list status candidates } }
      relationships { status lists { spaceKind list status candidates } }
      communities { status lists { spaceKind list status candidates } }
      hypotheses { status lists { spaceKind list status candidates } } }
    degradations { frontier code optional }
    suggestedActions { kind hypothesisIds } } }"""


def _normalised(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without what differs by construction between two runs: a
    community's ID carries its snapshot run's random UUID (kept: the ordinal)."""
    for c in answer["relatedCommunities"]:
        c["id"] = c["id"].rsplit(":", 1)[-1]
    return answer


def collect_answers(
    port: int, token: str, queries: list[str], known_at: str
) -> list[dict[str, Any]]:
    """Per query three recalls: the current view; the same at ``known_at`` (a
    temporal view); and the current view with the first answer's top two evidence
    and top relationship as known IDs (coverage and exclusion)."""
    out: list[dict[str, Any]] = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        headers = {"Authorization": f"Bearer {token}"}

        def ask(variables: dict[str, Any]) -> dict[str, Any]:
            r = client.post(
                "/graphql", json={"query": ANSWERS, "variables": variables}, headers=headers
            )
            body = r.json()
            if "errors" in body:
                raise SystemExit(f"recall failed: {body['errors']}")
            return _normalised(body["data"]["recallMemory"])

        for i, q in enumerate(queries):
            current = ask({"q": q})
            temporal = ask({"q": q, "knownAt": known_at})
            known = ask(
                {
                    "q": q,
                    "ke": [r["evidenceId"] for r in current["results"][:2]],
                    "kr": [h["representativeId"] for h in current["relatedRelationships"][:1]],
                }
            )
            for variant, answer in (
                ("current", current),
                ("known_at", temporal),
                ("known_ids", known),
            ):
                row = {"query": i, "text": q, "variant": variant, "answer": answer}
                if variant == "known_at":
                    row["known_at"] = known_at  # what a later compare checks first
                out.append(row)
    return out


def compare_answers(
    expected: list[dict[str, Any]], got: list[dict[str, Any]], instant_before: str
) -> int:
    """Print how many answers are identical, and the first differences; returns
    the number of answers that differ.

    A ``known_at`` answer is compared only when the file's was asked at the same
    instant: files written before each team had its own instant carry none, and
    used ``instant_before`` (the first team's last evidence write). Another
    instant is another question, so those answers are counted apart ("not
    comparable"), never as differences."""
    want = {(a["query"], a["variant"]): a for a in expected}
    differ = 0
    other_instant: set[str] = set()
    incomparable = 0
    for a in got:
        before = want.get((a["query"], a["variant"]))
        if before is None or before["text"] != a["text"]:
            raise SystemExit("the answers file was written for other queries or data")
        if a["variant"] == "known_at":
            asked = before.get("known_at", instant_before)
            if asked != a["known_at"]:
                incomparable += 1
                other_instant.add(asked)
                continue
        if before["answer"] != a["answer"]:
            differ += 1
            if differ <= 5:
                for key in a["answer"]:
                    if before["answer"][key] != a["answer"][key]:
                        log(
                            f"  query {a['query']} {a['variant']}: {key} differs:\n"
                            f"    before {json.dumps(before['answer'][key])[:600]}\n"
                            f"    now    {json.dumps(a['answer'][key])[:600]}"
                        )
    counts = {
        name: sum(1 for a in got if a["answer"][name])
        for name in (
            "results",
            "relatedRelationships",
            "relatedCommunities",
            "relatedHypotheses",
            "conflicts",
        )
    }
    compared = len(got) - incomparable
    print(
        f"answers: {compared - differ} of {compared} identical to the file "
        f"(non-empty: {', '.join(f'{k} {v}' for k, v in counts.items())})"
    )
    if incomparable:
        now = next(a["known_at"] for a in got if a["variant"] == "known_at")
        print(
            f"answers not comparable: {incomparable} known_at answers, asked at "
            f"{now}, the file's at {', '.join(sorted(other_instant))} (another instant is "
            "another question; files written before each team had its own knownAt "
            "instant used the first team's last evidence write)"
        )
    return differ


# The only instant a knownAt recall used before each team had its own (the
# first team's last evidence write); answers files written then carry no
# instant, and are compared with this one (see compare_answers).
KNOWN_AT_SQL_BEFORE = "SELECT max(recorded_at) FROM evidence WHERE team_id = 'bench-00'"


async def known_instant(dsn: str, team: str = "bench-00") -> str:
    """``team``'s own knownAt instant: the end of its first evidence write, so that
    the view hides the newest part of its space (the last tenth of its evidence with
    its relationships and vectors, written after: see ``generate``; then its
    hypotheses and conflicts).

    Each team needs its own: the teams are generated one after another, so an
    instant inside one team's history is before every later team's first write
    (their spaces are empty at it) and after every earlier team's last. A dataset
    generated before the newest part was written apart has one evidence instant
    per team: then its end (the view hides the hypotheses and conflicts only)."""
    conn = await asyncpg.connect(dsn)
    try:
        at = await conn.fetchval(
            "WITH e AS (SELECT recorded_at FROM evidence WHERE team_id = $1) "
            "SELECT coalesce((SELECT max(recorded_at) FROM e "
            "                 WHERE recorded_at < (SELECT max(recorded_at) FROM e)), "
            "                (SELECT max(recorded_at) FROM e))",
            team,
        )
    finally:
        await conn.close()
    if at is None:
        raise SystemExit(f"team {team} has no evidence: no knownAt instant inside its history")
    return str(at.isoformat())


async def known_instant_before(dsn: str) -> str:
    """The knownAt instant of answers files written before :func:`known_instant`
    was per team (they do not say which they used)."""
    conn = await asyncpg.connect(dsn)
    try:
        at = await conn.fetchval(KNOWN_AT_SQL_BEFORE)
    finally:
        await conn.close()
    return str(at.isoformat())


async def build_snapshots(dsn: str, teams: list[str]) -> None:
    from gateway.services.communities import build_communities
    from gateway.store.database import Database

    db = await Database.open(dsn, min_size=1, max_size=2)
    try:
        for team in teams:
            started = time.perf_counter()
            report = await build_communities(db, team, max_nodes=50_000, max_edges=500_000)
            log(
                f"  communities of {team}: {report.status}, {report.communities} communities "
                f"in {time.perf_counter() - started:.1f} s"
            )
    finally:
        await db.close()


# (start, end) of every query embedding and statement while http_latency runs:
# since the scope round the lexical lists run while the question is embedded, so
# the gateway's own share is end-to-end minus the time covered by either (their
# union), not minus their sum.
_INTERVALS: list[tuple[float, float]] = []


def _covered(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by at least one of ``spans``."""
    total, reach = 0.0, lo
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def _time_statements(counter: Any) -> None:
    """Record each statement's (start, end) beside the counter's sums: asyncpg
    calls query loggers soon after the answer, with the statement's ``elapsed``."""
    base = type(counter)
    if getattr(base, "_records_spans", False):
        return

    class Spanned(base):  # type: ignore[misc, valid-type]
        _records_spans = True

        def __call__(self, record: object) -> None:
            before = self.count
            super().__call__(record)
            if self.count != before:
                ended = time.perf_counter()
                _INTERVALS.append((ended - float(getattr(record, "elapsed", 0.0) or 0.0), ended))

    counter.__class__ = Spanned


def _timed_embeddings(app: Any) -> list[float]:
    """Seconds the query embeddings take, accumulated in the returned one-item list.

    Recall embeds its question through ``embed_queries`` when the provider has
    one (asymmetric models, and the provider that follows the store's model),
    else through ``embed``: time the method recall actually calls, or every
    question would read as free.
    """
    embedder = app.state.services.recall.embedder
    spent = [0.0]
    method = "embed_queries" if callable(getattr(embedder, "embed_queries", None)) else "embed"
    original = getattr(embedder, method)

    async def timed(texts: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(texts)
        finally:
            ended = time.perf_counter()
            spent[0] += ended - started
            _INTERVALS.append((started, ended))

    setattr(embedder, method, timed)
    return spent


def http_latency(
    port: int,
    token: str,
    queries: list[str],
    app: Any,
    query: str = QUERY,
    extra: dict[str, Any] | None = None,
    server: Sequence[int] = (),
) -> dict[str, float]:
    """Sequential recalls; per recall its latency, statements, the statements' time
    (send to answer, as the driver sees it) and the query embedding's time.
    ``extra``: more variables for every recall (a knownAt instant). The first five
    questions warm up (model, plans, caches) and are not timed.

    Also the CPU a recall costs, read around each one outside its timed window:
    this process's (the gateway's thread and the model's threads) less the
    client's own thread, and ``server``'s (PostgreSQL's processes). One recall
    at a time, their sum over the machine's cores is a floor no schedule of the
    same work can beat: it says whether a latency target is within reach of
    the work as it stands, whatever runs beside what. The process's CPU clock
    keeps what a thread that ended ran (a sum over the live threads would drop
    it, or subtract all it ran before the recall); a server process that ends
    within a recall is not read (main says when PostgreSQL started parallel
    workers, the processes that would)."""
    loop_tid = _threads[-1].native_id if _threads else None  # the gateway's (serve)
    loop_stat = f"/proc/self/task/{loop_tid}/schedstat"
    more = extra or {}
    counter = app.state.services.db.counter
    if not hasattr(counter, "seconds"):  # a gateway before the counter timed statements
        counter.seconds = float("nan")
    embedding = _timed_embeddings(app)
    _time_statements(counter)
    latencies, statements, sql, embed, share = [], [], [], [], []
    gateway_cpu, loop_cpu, server_cpu, cpu = [], [], [], []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        headers = {"Authorization": f"Bearer {token}"}
        for q in queries[:5]:  # warm-up: model, plans, caches
            client.post(
                "/graphql", json={"query": query, "variables": {"q": q, **more}}, headers=headers
            )
        for q in queries[5:]:
            before, before_s, before_e = counter.count, counter.seconds, embedding[0]
            _INTERVALS.clear()
            own, pg = _gateway_cpu_ns(), _pids_cpu_ns(_tree_pids(server))
            loop = schedstat_ns(loop_stat)
            started = time.perf_counter()
            r = client.post(
                "/graphql", json={"query": query, "variables": {"q": q, **more}}, headers=headers
            )
            elapsed = time.perf_counter() - started
            gateway_cpu.append((_gateway_cpu_ns() - own) / 1e6)
            loop_cpu.append((schedstat_ns(loop_stat) - loop) / 1e6)
            # a process started meanwhile counts from 0; one gone, not at all
            after = _pids_cpu_ns(_tree_pids(server))
            server_cpu.append(sum(ns - pg.get(pid, 0) for pid, ns in after.items()) / 1e6)
            cpu.append(gateway_cpu[-1] + server_cpu[-1])
            latencies.append(elapsed * 1000)
            statements.append(counter.count - before)
            sql.append((counter.seconds - before_s) * 1000)
            embed.append((embedding[0] - before_e) * 1000)
            share.append(1 - _covered(_INTERVALS, started, started + elapsed) / elapsed)
            body = r.json()
            if "errors" in body:
                raise SystemExit(f"recall failed: {body['errors']}")
    latencies.sort()
    return {
        "p50_ms": statistics.median(latencies),
        "p95_ms": latencies[int(0.95 * (len(latencies) - 1))],
        "statements": statistics.median(statements),
        "sql_ms": statistics.median(sql),
        "embedding_ms": statistics.median(embed),
        "gateway_share": statistics.median(share),
        "gateway_cpu_ms": statistics.median(gateway_cpu),
        "loop_cpu_ms": statistics.median(loop_cpu),
        "server_cpu_ms": statistics.median(server_cpu) if server else float("nan"),
        # each recall's own sum: the median of the floors, not a sum of medians
        "cpu_ms": statistics.median(cpu) if server else float("nan"),
    }


def _gateway_cpu_ns() -> int:
    """CPU nanoseconds of this process (threads that ended included) less the
    calling thread's: the gateway's and its model's threads, read from the
    client's thread."""
    return time.process_time_ns() - time.thread_time_ns()


def _parallel_workers(dsn: str) -> int | None:
    """Parallel workers PostgreSQL has started (``pg_stat_database``, PostgreSQL 18;
    None before): processes that start and end within one statement, whose CPU a
    reading around a recall misses. Read after the gateway stopped, its backends'
    counts are all flushed (a backend flushes its statistics when it exits)."""

    async def read() -> int | None:
        conn = await asyncpg.connect(dsn)
        try:
            value = await conn.fetchval(
                "SELECT sum(parallel_workers_launched) FROM pg_stat_database"
            )
        except asyncpg.UndefinedColumnError:
            return None
        finally:
            await conn.close()
        return int(value or 0)

    return asyncio.run(read())


def _cores() -> int:
    """The cores this process (and the embedded server, its child) may run on."""
    return len(os.sched_getaffinity(0))


def _tree_pids(roots: Sequence[int]) -> frozenset[int]:
    """``roots`` and their descendants now alive."""
    import psutil

    out = set()
    for pid in roots:
        try:
            out |= {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
        except psutil.Error:
            continue
    return frozenset(out)


def _pids_cpu_ns(pids: frozenset[int]) -> dict[int, int]:
    return {pid: schedstat_ns(f"/proc/{pid}/schedstat") for pid in pids}


def throughput(
    dsn: str, port: int, token: str, queries: list[str], workers: int, clients: int, n: int
) -> dict[str, Any]:
    """Full recalls per second over HTTP: ``recall-gateway serve --workers N`` as a
    child process, ``clients`` keep-alive connections of the light asyncio client
    (benchmarks/load_test.py; httpx would measure itself), ``n`` requests."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import load_test
    from bench_common import free_port, start_gateway, stop, wait_ready

    port = port or free_port()
    proc = start_gateway(dsn, port, workers)
    try:
        wait_ready(port)
        load_test.QUERIES[:] = queries
        warm_passes = _warm_up(port, token, len(queries), clients)
        server = _server_processes(dsn)
        load_before = os.getloadavg()[0]
        runs = _model_runs(port)
        gw_cpu, pg_cpu = _tree_cpu([proc.pid]), _tree_cpu(server)
        result: dict[str, Any] = dict(
            asyncio.run(load_test.run_load(port, token, n, clients, FULL))
        )
        gw_cpu, pg_cpu = _tree_cpu([proc.pid]) - gw_cpu, _tree_cpu(server) - pg_cpu
        after = _model_runs(port)
        result["model_runs"] = None if runs is None or after is None else round(after - runs)
        result["side"] = side_discoveries(port)  # warm-up included
        result["warm_passes"] = warm_passes
        load_after = os.getloadavg()[0]
    finally:
        stop(proc)
    result["per_s"] = result["requests"] / result["elapsed_s"]
    result["load"] = (load_before, load_after)
    count = max(int(result["requests"]), 1)
    result["gateway_cpu_ms"] = gw_cpu / count * 1000
    # None: the server is not a process of this machine that psutil may read
    result["server_cpu_ms"] = pg_cpu / count * 1000 if server else None
    return result


WARM_PASSES_MAX: Final = 12


def _warm_up(port: int, token: str, questions: int, clients: int) -> int:
    """Passes of every question over ``clients`` new connections, until two passes
    in a row run the model for none (or ``WARM_PASSES_MAX``); returns the passes.

    Each worker keeps its own query-embedding LRU and sees only the questions of
    the connections it accepts, and one pass's connections can all land on one
    worker (splits of 7-1 and 0-8 were seen): a fixed short warm-up left a third of
    the measured "repeated" recalls running the model (about 8 ms of CPU each),
    which moved the workers' CPU per recall by 2-3 ms from run to run. A pass
    sends each question to one worker or the other, so a question a worker lacks
    after k passes is about 2^-k likely: with 100 questions, two clean passes in
    a row come after about 8-10 passes (the cap, 12, bounds a run whose workers
    never share the connections). The measured step prints its own model runs,
    so any left are seen."""
    import load_test  # benchmarks/ is on the path: see throughput()

    clean = 0
    for done in range(1, WARM_PASSES_MAX + 1):
        before = _model_runs(port)
        asyncio.run(load_test.run_load(port, token, questions, clients, FULL))
        after = _model_runs(port)
        if before is None or after is None:
            return done  # no /metrics: one pass, as before
        clean = clean + 1 if after == before else 0
        if clean == 2:
            return done
    return WARM_PASSES_MAX


def _model_runs(port: int) -> float | None:
    """Query embeddings the workers have run so far (``/metrics``' count of embedding
    calls, summed over the workers; None without it). Each worker keeps its own
    LRU, so the throughput step's measured requests run the model for questions a
    worker has not seen yet (see :func:`_warm_up`), about 8 ms of CPU each. The
    count is of every embedding call, a write's too: the benchmarks that read it
    (this step, worker_cpu_ab.py) write nothing meanwhile."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("recall_gateway_embedding_duration_seconds_count"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _side_text(side: dict[str, float] | None) -> str:
    if not side:
        return "none"
    return ", ".join(f"{k} {side.get(k, 0):.0f}" for k in ("taken", "used", "refused"))


def side_discoveries(port: int) -> dict[str, float]:
    """The workers' relationship discoveries on side connections so far (``/metrics``:
    taken, refused, used; summed over the workers; empty without them)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("recall_gateway_side_discoveries_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _server_processes(dsn: str) -> list[int]:
    """The PostgreSQL server's processes when it runs on this machine (its
    postmaster, found as the parent of one of its backends); else none."""
    import psutil

    async def postmaster() -> int | None:
        conn = await asyncpg.connect(dsn)
        try:  # asked while the backend lives: it exits once the connection closes
            parent = psutil.Process(int(await conn.fetchval("SELECT pg_backend_pid()"))).parent()
        except psutil.Error:
            return None
        finally:
            await conn.close()
        return parent.pid if parent is not None else None

    try:
        pid = asyncio.run(postmaster())
    except OSError:
        return []
    return [pid] if pid is not None else []


def _tree_cpu(roots: list[int]) -> float:
    """User + system CPU seconds of processes and their descendants now alive:
    CPU per request is the figure a shared, loaded machine does not distort
    (throughput and latency under others' load are the machine's, not ours)."""
    import psutil

    total = 0.0
    for pid in roots:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in family:
            try:
                times = p.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


async def stage_latency(dsn: str, data: dict[str, Any], queries: list[str]) -> dict[str, float]:
    """Where a recall's time goes: its main steps timed one by one, in this process,
    for the same queries and team as over HTTP (medians, ms)."""
    from gateway.embeddings import LocalEmbeddingProvider
    from gateway.services.recall_types import overfetch
    from gateway.store import recall as hydration
    from gateway.store import search
    from gateway.store.database import Database

    team = "bench-00"
    space = data["teams"][team]
    branch = search.BranchSearch("shared", space, 1)
    provider = LocalEmbeddingProvider()
    db = await Database.open(dsn, min_size=1, max_size=1)
    times: dict[str, list[float]] = {"embedding": [], "candidates": [], "hydration": []}
    try:
        for q in queries:
            started = time.perf_counter()
            vector = (await provider.embed([q]))[0]
            times["embedding"].append(time.perf_counter() - started)
            query = search.CandidateQuery(team, (branch,), q, vector, (), (), overfetch(10), None)
            async with db.tenant(team, [space]) as conn:
                started = time.perf_counter()
                lists = await search.evidence_candidates(conn, query)
                times["candidates"].append(time.perf_counter() - started)
                ids = list(dict.fromkeys(i for ranked in lists.values() for i in ranked))
                now = await conn.fetchval("SELECT now()")
                started = time.perf_counter()
                await hydration.eligible_evidence(conn, team, ids, [space], now, now)
                times["hydration"].append(time.perf_counter() - started)
    finally:
        await db.close()
        await provider.aclose()
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


Approx = Callable[[asyncpg.Connection, str, UUID, np.ndarray, int], Awaitable[list[str]]]


async def _recall_against_exact(
    dsn: str,
    data: dict[str, Any],
    n_queries: int,
    rng: np.random.Generator,
    wide: int,
    exact_sql: str,
    approx: Approx,
) -> dict[str, float]:
    """recall@10 of a list of 10 and recall@``wide`` of a list of ``wide`` from
    ``approx`` against ``exact_sql`` (team, space, query vector, limit: the exact
    top IDs), and the median time of each list (ms), over synthetic query vectors
    near the topic centroids, the teams taken in turn."""
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    hits = {10: 0, wide: 0}
    total = {10: 0, wide: 0}
    times: dict[int, list[float]] = {10: [], wide: []}
    try:
        teams = list(data["teams"].items())
        for i in range(n_queries):
            team, space = teams[i % len(teams)]
            topic = int(rng.integers(0, len(TOPICS)))
            qv = unit(
                data["centroids"][topic] + rng.standard_normal(DIM).astype(np.float32) * 0.045
            )
            exact = [r[0] for r in await conn.fetch(exact_sql, team, space, qv, max(wide, 10))]
            for k in (10, wide):
                async with conn.transaction():
                    started = time.perf_counter()
                    got = await approx(conn, team, space, qv, k)
                    times[k].append(time.perf_counter() - started)
                hits[k] += len(set(got[:k]) & set(exact[:k]))
                total[k] += len(exact[:k])
    finally:
        await conn.close()
    return {
        "recall10": hits[10] / total[10] if total[10] else 0.0,
        "recall_wide": hits[wide] / total[wide] if total[wide] else 0.0,
        "wide": wide,
        "ms10": statistics.median(times[10]) * 1000,
        "ms_wide": statistics.median(times[wide]) * 1000,
    }


async def filtered_vector_recall(
    dsn: str, data: dict[str, Any], n_queries: int, seed: int
) -> dict[str, float]:
    """The store's vector list vs an exact scan of the same space: recall@10 of a list
    of 10, recall@60 of a list of 60 (what a recall of limit 10 asks for, see
    ``overfetch``), and the median time of each list's statement (ms).

    The exact reference computes every distance of the space below an ``OFFSET 0``
    fence, so that no index can answer its ``ORDER BY``. ``enable_indexscan = off``
    is not enough on PostgreSQL 18: it only penalises the index path, and the
    planner still took the partition's HNSW index (at the default ef_search of 40),
    so the reference was itself approximate and the recall printed until then
    (0.949 at 100,000 evidence) compared two approximate lists."""
    from gateway.services.recall_types import overfetch
    from gateway.store import search

    async def approx(
        conn: asyncpg.Connection, team: str, space: UUID, qv: np.ndarray, k: int
    ) -> list[str]:
        got = await search.evidence_candidates(
            conn,
            search.CandidateQuery(
                team_id=team,
                branches=(search.BranchSearch("shared", space, 1),),
                text=None,
                vector=qv,
                entity_ids=(),
                exclude_ids=(),
                per_list=k,
                known_at=None,
            ),
        )
        return got[("shared", "vector")]

    exact_sql = (
        "SELECT s.evidence_id FROM (SELECT evidence_id::text AS evidence_id, "
        "embedding <=> $3 AS distance FROM evidence_embeddings "
        "WHERE team_id = $1 AND space_id = $2 OFFSET 0) s "
        'ORDER BY s.distance, s.evidence_id COLLATE "C" LIMIT $4'
    )
    rng = np.random.default_rng(seed + 1)
    return await _recall_against_exact(dsn, data, n_queries, rng, overfetch(10), exact_sql, approx)


async def relationship_vector_recall(
    dsn: str, data: dict[str, Any], n_queries: int, seed: int
) -> dict[str, float]:
    """Relationship discovery's vector list (``relationship_vector_candidates``, the
    function the discovery statement calls) vs an exact scan of the same space's
    active-projection vectors: recall@10 of a list of 10 and recall@N of the list of
    N that discovery asks for at the default limits, with each list's median time
    (ms). Every generated relationship is eligible (one generation, recorded before
    now), so the exact reference needs no other filter; it computes every distance
    below an ``OFFSET 0`` fence, like the evidence reference, so that no index can
    answer its ``ORDER BY``."""
    from gateway.services.recall_types import overfetch
    from gateway.store.related import EXACT_SEARCH_BELOW

    async def approx(
        conn: asyncpg.Connection, team: str, space: UUID, qv: np.ndarray, k: int
    ) -> list[str]:
        rows = await conn.fetch(
            "SELECT relationship_id FROM relationship_vector_candidates("
            "$1, $2, 1, 1, $3, $4, now(), $5)",
            team,
            space,
            qv,
            k,
            EXACT_SEARCH_BELOW,
        )
        return [r[0] for r in rows]

    exact_sql = (
        "SELECT s.relationship_id FROM (SELECT relationship_id::text AS relationship_id, "
        "embedding <=> $3 AS distance FROM relationship_embeddings "
        "WHERE team_id = $1 AND space_id = $2 AND projection_generation = 1 OFFSET 0) s "
        'ORDER BY s.distance, s.relationship_id COLLATE "C" LIMIT $4'
    )
    rng = np.random.default_rng(seed + 5)
    # relationshipLimit 5, communityLimit 3: discovery asks for overfetch(5)
    # (gateway/services/related.py)
    return await _recall_against_exact(dsn, data, n_queries, rng, overfetch(5), exact_sql, approx)


async def query_lexeme_spread(
    dsn: str, data: dict[str, Any], queries: list[str]
) -> tuple[float, float, float]:
    """How common the queries' lexemes are in the first team's space: the share of its
    evidence holding a query lexeme (median, mean) and holding its commonest word (the
    "Note i of team" prefix that every generated text carries is left out)."""
    team, space = next(iter(data["teams"].items()))
    conn = await asyncpg.connect(dsn)
    try:
        n = await conn.fetchval(
            "SELECT count(*) FROM evidence WHERE team_id = $1 AND space_id = $2", team, space
        )
        row = await conn.fetchrow(
            "WITH q AS (SELECT (unnest(to_tsvector('english', x))).lexeme AS l "
            "FROM unnest($3::text[]) AS x), "
            "df AS (SELECT (SELECT count(*) FROM evidence_terms t WHERE t.team_id = $1 "
            "AND t.space_id = $2 AND t.lexeme = q.l) AS n FROM q) "
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY n) AS median, avg(n) AS mean "
            "FROM df",
            team,
            space,
            queries,
        )
        assert row is not None  # an aggregate: one row
        top = await conn.fetchval(
            "SELECT max(c) FROM (SELECT count(*) AS c FROM evidence_terms "
            "WHERE team_id = $1 AND space_id = $2 AND lexeme !~ '[0-9]' "
            "AND lexeme NOT IN ('note', 'bench') GROUP BY lexeme) s",
            team,
            space,
        )
    finally:
        await conn.close()
    return float(row["median"]) / n, float(row["mean"]) / n, float(top) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evidence", type=int, default=100_000)
    parser.add_argument("--teams", type=int, default=10)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--corpus", choices=("zipf", "tiny"), default="zipf", help="text generator (see above)"
    )
    parser.add_argument(
        "--related",
        action="store_true",
        help="relationship vectors, hypotheses, conflicts and community snapshots; "
        "full vs evidence-only recall",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="keep the embedded server's data here; a later run with the same folder "
        "(and the same dataset options) reuses the dataset instead of generating it",
    )
    parser.add_argument(
        "--answers-out", type=Path, help="write every frontier's ranked answers to this file"
    )
    parser.add_argument(
        "--answers-compare",
        type=Path,
        help="compare every frontier's ranked answers with this file (exit 1 if any differ)",
    )
    parser.add_argument(
        "--answers-only", action="store_true", help="answers modes only: skip the timings"
    )
    parser.add_argument(
        "--throughput",
        type=int,
        default=0,
        metavar="N",
        help="also send N full recalls to `recall-gateway serve` (see --workers, --clients)",
    )
    parser.add_argument(
        "--bulk-index",
        action="store_true",
        help="load each space's vectors without its HNSW index and build the index "
        "afterwards (much faster generation at 1,000,000 evidence; see _unindexed_partitions)",
    )
    parser.add_argument(
        "--skew",
        type=int,
        default=1,
        metavar="K",
        help="the first team (the one the token belongs to) gets K times the evidence "
        "of each other team",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    corpus: Zipf | Tiny = (Zipf if args.corpus == "zipf" else Tiny)(
        np.random.default_rng(args.seed + 3)
    )
    differ = 0
    with database(args.data_dir) as dsn:
        asyncio.run(prepare(dsn, migrate=True))
        data = asyncio.run(reuse(dsn, args.seed))
        if data is None:
            log(f"generating {args.evidence} evidence across {args.teams} teams")
            started = time.perf_counter()
            data = asyncio.run(
                generate(
                    dsn,
                    args.evidence,
                    args.teams,
                    args.seed,
                    corpus,
                    args.related,
                    args.bulk_index,
                    args.skew,
                )
            )
            log(f"generated in {time.perf_counter() - started:.0f} s")
            if args.related:
                asyncio.run(build_snapshots(dsn, list(data["teams"])))
        else:
            log(f"reusing the dataset in {args.data_dir}: {len(data['teams'])} teams")
        rng = np.random.default_rng(args.seed + 2)
        queries = [
            corpus.query(rng, int(rng.integers(0, len(TOPICS)))) for _ in range(args.queries)
        ]
        # Each timed loop asks questions of its own, never asked before in the
        # gateway's process (the answers mode asked `queries`), so its query
        # embedding is the model's, not the recall service's LRU; the same draws
        # every run, so that runs compare.
        fresh = [
            [corpus.query(rng, int(rng.integers(0, len(TOPICS)))) for _ in range(args.queries + 5)]
            for _ in range(3)
        ]
        server, app = serve(dsn, args.port)
        measured = {}
        workers_before: int | None = None
        parallel: int | None = None
        try:
            if args.answers_out or args.answers_compare:
                answers = collect_answers(
                    args.port, data["token"], queries, asyncio.run(known_instant(dsn, "bench-00"))
                )
                if args.answers_out:
                    args.answers_out.write_text("\n".join(json.dumps(a) for a in answers) + "\n")
                    log(f"wrote {len(answers)} answers to {args.answers_out}")
                if args.answers_compare:
                    expected = [
                        json.loads(line)
                        for line in args.answers_compare.read_text().splitlines()
                        if line
                    ]
                    differ = compare_answers(
                        expected, answers, asyncio.run(known_instant_before(dsn))
                    )
            if not args.answers_only:
                at = {"knownAt": asyncio.run(known_instant(dsn, "bench-00"))}
                runs = (
                    {
                        "full": (FULL, None),
                        "evidence-only": (EVIDENCE_ONLY, None),
                        "full, knownAt": (FULL_AT, at),
                    }
                    if args.related
                    else {"evidence": (QUERY, None), "knownAt": (QUERY_AT, at)}
                )
                pg = _server_processes(dsn)
                workers_before = _parallel_workers(dsn) if pg else None
                measured = {
                    name: http_latency(args.port, data["token"], asked, app, q, extra, pg)
                    for asked, (name, (q, extra)) in zip(fresh, runs.items(), strict=False)
                }
                # The first loop's questions again: their embeddings come from the LRU.
                name, (q, extra) = next(iter(runs.items()))
                measured[f"{name}, repeated"] = http_latency(
                    args.port, data["token"], fresh[0], app, q, extra, pg
                )
        finally:
            stop(server)
        if workers_before is not None:
            after = _parallel_workers(dsn)
            parallel = None if after is None else after - workers_before
        rate = None
        if args.throughput:
            rate = throughput(
                dsn, 0, data["token"], queries, args.workers, args.clients, args.throughput
            )
        if not args.answers_only:
            vector_recall = asyncio.run(
                filtered_vector_recall(dsn, data, min(args.queries, 100), args.seed)
            )
            rel_recall = (
                asyncio.run(
                    relationship_vector_recall(dsn, data, min(args.queries, 100), args.seed)
                )
                if args.related
                else None
            )
            spread = asyncio.run(query_lexeme_spread(dsn, data, queries))
            stages = asyncio.run(stage_latency(dsn, data, queries))
    if args.answers_only:
        sys.exit(1 if differ else 0)
    print(
        f"dataset: {args.evidence} evidence, {args.teams} teams, one shared space each, "
        f"corpus {args.corpus}"
    )
    print(
        f"query lexemes: each in {spread[0]:.1%} of a space (median; mean {spread[1]:.1%}); "
        f"the commonest word of a space in {spread[2]:.0%}"
    )
    print(
        f"recallMemory over HTTP, {args.queries} queries, limit 10, sequential "
        f"(load average now {os.getloadavg()[0]:.1f}); new questions per loop (the "
        "query is embedded), 'repeated': the first loop's again (embeddings from the LRU):"
    )
    for name, figures in measured.items():
        print(
            f"  {name:22} p50 {figures['p50_ms']:.1f} ms   p95 {figures['p95_ms']:.1f} ms   "
            f"SQL statements per recall (median): {figures['statements']:.0f}"
        )
        print(
            f"  {'':22} medians: statements' time {figures['sql_ms']:.1f} ms, query embedding "
            f"{figures['embedding_ms']:.1f} ms; gateway's own share (end-to-end less the time a statement or the embedding ran) "
            f"{figures['gateway_share']:.0%} of end-to-end"
        )
        cpu = figures["cpu_ms"]
        if cpu == cpu:  # PostgreSQL's CPU read (a server of this machine)
            print(
                f"  {'':22} CPU per recall (medians): the gateway {figures['gateway_cpu_ms']:.1f} ms "
                f"(its event loop {figures['loop_cpu_ms']:.1f}, the rest the query model's "
                f"threads; the client's thread not counted), PostgreSQL "
                f"{figures['server_cpu_ms']:.1f} ms: on {_cores()} cores no schedule of "
                f"this work answers in less than {cpu / _cores():.1f} ms (the median of each "
                f"recall's CPU over the cores)"
            )
    if parallel:
        print(
            f"  PostgreSQL started {parallel} parallel workers during the sequential recalls: "
            "their CPU is not in the figures above (a process that ends within a recall is "
            "not read): the floor is below what the work takes by their share"
        )
    if rate is not None:
        print(
            f"full recalls over HTTP, {args.workers} worker processes, {args.clients} concurrent "
            f"clients, {rate['requests']} requests over {len(queries)} questions (repeated: "
            f"each worker's LRU warmed first): {rate['per_s']:.0f}/s, "
            f"p50 {rate['p50_ms']:.1f} ms, p95 {rate['p95_ms']:.1f} ms, "
            f"errors {len(rate['failures'])}, load average {rate['load'][0]:.1f} -> "
            f"{rate['load'][1]:.1f}; query embeddings run by the workers meanwhile "
            f"{rate.get('model_runs')} (each worker has its own LRU; warm-up passes of every "
            f"question: {rate.get('warm_passes')}); discovery on a side "
            f"connection (warm-up included): {_side_text(rate.get('side'))}"
        )
        if rate["server_cpu_ms"] is None:
            print(
                f"  CPU per full recall in that run: gateway workers "
                f"{rate['gateway_cpu_ms']:.1f} ms (PostgreSQL's not read: not a process here)"
            )
        else:
            cpu = rate["gateway_cpu_ms"] + rate["server_cpu_ms"]
            print(
                f"  CPU per full recall in that run: gateway workers "
                f"{rate['gateway_cpu_ms']:.1f} ms, PostgreSQL {rate['server_cpu_ms']:.1f} ms; "
                f"at that cost the machine's {os.cpu_count()} cores would serve "
                f"{(os.cpu_count() or 1) * 1000 / cpu:.0f}/s with nothing else running"
            )
    print(
        "  evidence steps timed one by one (medians): query embedding "
        f"{stages['embedding']:.1f} ms, candidate statement (all lists) "
        f"{stages['candidates']:.1f} ms, hydration {stages['hydration']:.1f} ms"
    )
    vr = vector_recall
    print(
        "vector lists against exact search, over synthetic query vectors near the "
        "generator's topic centres (real text: benchmarks/vector_ef_bench.py --text):"
    )
    print(
        f"vector recall@10 vs exact search under the space filter: {vr['recall10']:.3f} "
        f"(list of 10, median {vr['ms10']:.1f} ms); recall@{vr['wide']:.0f} "
        f"{vr['recall_wide']:.3f} (list of {vr['wide']:.0f}, as a recall of limit 10 "
        f"asks, median {vr['ms_wide']:.1f} ms)"
    )
    if rel_recall is not None:
        rr = rel_recall
        print(
            f"relationship vector recall@10 vs exact search under the space filter: "
            f"{rr['recall10']:.3f} (list of 10, median {rr['ms10']:.1f} ms); "
            f"recall@{rr['wide']:.0f} {rr['recall_wide']:.3f} (list of {rr['wide']:.0f}, as "
            f"discovery asks at the default limits, median {rr['ms_wide']:.1f} ms)"
        )
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
