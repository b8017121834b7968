"""Vector lists against exact search, per ``ef_search`` floor, over several HNSW builds.

    python benchmarks/vector_ef_bench.py --data-dir HELD100K --floors 100,150,200 \\
        --builds 3 --queries 200

On a dataset kept by ``recall_bench.py --related --data-dir HELD100K`` (its
copy: the run rebuilds the vector indexes). Why: pgvector draws each
element's graph level at random, so every build of an index is another graph,
and a recall@10 measured on one build (0.993 on one, 0.973 on the next, same
vectors) says little about the next. This measures the store's two vector
lists, ``evidence_vector_candidates`` and ``relationship_vector_candidates``,
as the gateway calls them, on build after build:

- build 0 is the indexes as they are; before each later build every HNSW
  index of the dataset's spaces is rebuilt (``REINDEX INDEX``, timed);
- an *arm* per floor F: a schema ``ef_floor_F`` holding the two functions of
  the store, copied from the database (``pg_get_functiondef``) with their
  ``search_path`` pointed at that schema first, and an ``evidence_vector_ef``
  of its own, ``least(greatest(2 * limit, F, space size / 100), 1000)`` (the
  rule of db/0060 with F in place of its 100). And the arm ``store``: the
  store's own functions, untouched (today's rule, whatever the migrations
  say), so that today's recall and latency are measured in the same run;
- questions: synthetic query vectors near the generator's topic centres
  (recall_bench.py's own, the same draws every run), the teams in turn; per
  question the exact top N of its team's space (every distance computed
  below an ``OFFSET 0`` fence, so no index answers it), computed once;
- per question and arm, in rotating arm order (so that load from elsewhere
  falls on every arm alike): the evidence lists of 10 and of 60 (what a
  recall of limit 10 asks for) and the relationship lists of 10 and 40 (what
  discovery asks for at the default limits), each call timed from the client.

Prints per build and arm: recall@10 of the list of 10, recall@60 / @40 of
the wide lists, and the median time of each call; then each arm's worst build.
With ``--compare-to ARM`` it also says, for every list where an arm's answer
differs from that arm's, whether it holds at least as many of the exact top N
and whether its k-th distance is at most the other's at every rank k (the
test of "at least as near to exact search").
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_bench as rb

from gateway.store.database import APP_ROLE, prepare

STORE = "store"
# (function, list sizes): evidence lists of 10 and 60 (limit 10: overfetch(10)),
# relationship lists of 10 and 40 (relationshipLimit 5, communityLimit 3:
# overfetch(5)).
LISTS = {"evidence": (10, 60), "relationships": (10, 40)}
FUNCTIONS = ("evidence_vector_candidates", "relationship_vector_candidates")
EXACT_BELOW = 10_000  # gateway/store/search.py and related.py: EXACT_SEARCH_BELOW

EXACT_SQL = {
    "evidence": (
        "SELECT s.id, s.distance FROM (SELECT evidence_id::text AS id, "
        "embedding <=> $3 AS distance FROM evidence_embeddings "
        "WHERE team_id = $1 AND space_id = $2 AND NOT (evidence_id = ANY ($5::text[])) "
        "OFFSET 0) s "
        'ORDER BY s.distance, s.id COLLATE "C" LIMIT $4'
    ),
    "relationships": (
        "SELECT s.id, s.distance FROM (SELECT relationship_id::text AS id, "
        "embedding <=> $3 AS distance FROM relationship_embeddings "
        "WHERE team_id = $1 AND space_id = $2 AND projection_generation = 1 OFFSET 0) s "
        'ORDER BY s.distance, s.id COLLATE "C" LIMIT $4'
    ),
}
CALL_SQL = {
    "evidence": "SELECT evidence_id, distance FROM {schema}evidence_vector_candidates("
    "$1, $2, 1, $3, $4, NULL, $6::text[], $5)",
    "relationships": "SELECT relationship_id, distance FROM "
    "{schema}relationship_vector_candidates($1, $2, 1, 1, $3, $4, NULL, $5)",
}


async def call(
    conn: asyncpg.Connection, arm: str, kind: str, question: Question, size: int
) -> tuple[list[tuple[str, float]], float]:
    """One call of an arm's function as the gateway makes it: its rows, and ms.
    Excluded IDs (a recall's known evidence) apply to the evidence list only, as in
    the gateway (discovery applies its coverage after its lists)."""
    (team, space), qv, exclude = question
    schema = "" if arm == STORE else f"{arm_schema(int(arm))}."
    more = [list(exclude)] if kind == "evidence" else []
    started = time.perf_counter()
    rows = await conn.fetch(
        CALL_SQL[kind].format(schema=schema), team, space, qv, size, EXACT_BELOW, *more
    )
    elapsed = (time.perf_counter() - started) * 1000
    return [(r[0], r[1]) for r in rows], elapsed


def arm_schema(floor: int) -> str:
    return f"ef_floor_{floor}"


async def make_arms(conn: asyncpg.Connection, floors: list[int]) -> None:
    """One schema per floor with the store's two functions and its own ef rule."""
    for floor in floors:
        schema = arm_schema(floor)
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.execute(f"CREATE SCHEMA {schema}")
        # recall_ab.py's arms run them as the gateway does, as its tenant role.
        await conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {APP_ROLE}")
        await conn.execute(
            f"CREATE FUNCTION {schema}.evidence_vector_ef(p_space_size bigint, p_limit integer) "
            "RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE "
            f"RETURN least(greatest(p_limit * 2, {floor}, p_space_size / 100), 1000)::integer"
        )
        for name in FUNCTIONS:
            source = await conn.fetchval(
                "SELECT pg_get_functiondef(p.oid) FROM pg_proc p "
                "JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = 'public' AND p.proname = $1",
                name,
            )
            path = "SET search_path TO 'public', 'pg_temp'"
            head = f"CREATE OR REPLACE FUNCTION public.{name}("
            if path not in source or head not in source:
                raise SystemExit(f"{name}: not the shape this benchmark copies")
            source = source.replace(head, f"CREATE FUNCTION {schema}.{name}(", 1)
            source = source.replace(path, f"SET search_path TO '{schema}', 'public', 'pg_temp'", 1)
            await conn.execute(source)


async def drop_arms(conn: asyncpg.Connection, floors: list[int]) -> None:
    for floor in floors:
        await conn.execute(f"DROP SCHEMA IF EXISTS {arm_schema(floor)} CASCADE")


async def rebuild(conn: asyncpg.Connection, spaces: list[UUID]) -> float:
    """REINDEX every HNSW index of the spaces' vector partitions; seconds taken."""
    started = time.perf_counter()
    names = await conn.fetch(
        "SELECT i.indexrelid::regclass::text AS name FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam "
        "WHERE a.amname = 'hnsw' AND i.indrelid::regclass::text = ANY ($1::text[])",
        [
            f"{t}_{s.hex}"
            for s in spaces
            for t in ("evidence_embeddings", "relationship_embeddings")
        ],
    )
    await conn.execute("SET maintenance_work_mem = '256MB'")
    for row in names:
        await conn.execute(f"REINDEX INDEX {row['name']}")
    await conn.execute("RESET maintenance_work_mem")
    await conn.execute("ANALYZE evidence_embeddings, relationship_embeddings")
    return time.perf_counter() - started


@dataclass
class Tally:
    """Hits and call times of one arm, one list kind and size, one build."""

    hits: int = 0
    total: int = 0
    ms: list[float] = field(default_factory=list)


@dataclass
class Changed:
    """Lists of one arm that differ from the compared arm's (one kind and size)."""

    lists: int = 0
    more: int = 0
    same: int = 0
    fewer: int = 0
    nearer_every_rank: int = 0
    # The others: (question, excluded IDs, exact members of the compared list
    # and of this one, ranks k where this k-th distance is larger, the largest
    # such difference, this list's median distance minus the compared one's).
    farther: list[tuple[int, int, int, int, list[int], float, float]] = field(default_factory=list)


# (team, space), query vector, evidence IDs the recall excludes (known IDs)
Question = tuple[tuple[str, UUID], np.ndarray, tuple[str, ...]]


async def synthetic_questions(dsn: str, n: int, seed: int) -> list[Question]:
    """recall_bench.py's own query vectors, near its topic centres, the teams in turn."""
    data = await rb.reuse(dsn, seed)
    if data is None:
        raise SystemExit("no dataset in that folder: run recall_bench.py --related first")
    teams = list(data["teams"].items())
    rng = np.random.default_rng(seed + 1)
    questions: list[Question] = []
    for i in range(n):
        topic = int(rng.integers(0, len(rb.TOPICS)))
        noise = rng.standard_normal(rb.DIM).astype(np.float32) * 0.045
        questions.append((teams[i % len(teams)], rb.unit(data["centroids"][topic] + noise), ()))
    return questions


def read_answers(file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in file.read_text().splitlines() if line]


async def answers_questions(dsn: str, rows: list[dict[str, Any]]) -> list[Question]:
    """The questions of a recall_bench.py ``--answers-out`` file, as its recalls asked
    them of the token's team (``bench-00``): each embedded by the local model as
    recall embeds a question; its ``current`` variant with no exclusion, its
    ``known_ids`` variant without the two evidence IDs that recall had as known
    (the first two results of the current answer). So the lists compared are
    those of the recalls whose answers the file holds."""
    from gateway.embeddings import embed_queries
    from gateway.embeddings.local import LocalEmbeddingProvider

    current = {r["query"]: r for r in rows if r["variant"] == "current"}
    conn = await asyncpg.connect(dsn)
    try:
        space = await conn.fetchval(
            "SELECT id FROM memory_spaces WHERE team_id = 'bench-00' AND kind = 'shared'"
        )
    finally:
        await conn.close()
    provider = LocalEmbeddingProvider()
    try:
        texts = [current[q]["text"] for q in sorted(current)]
        vectors = [
            v
            for k in range(0, len(texts), 64)
            for v in await embed_queries(provider, texts[k : k + 64])
        ]
    finally:
        await provider.aclose()
    out: list[Question] = []
    for q, v in zip(sorted(current), vectors, strict=True):
        qv = np.asarray(v, dtype=np.float32)
        known = tuple(r["evidenceId"] for r in current[q]["answer"]["results"][:2])
        out += [(("bench-00", space), qv, ()), (("bench-00", space), qv, known)]
    return out


TEXT_TEAM = "text-00"
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")
SENTENCES_PER_PASSAGE = 3


def passages(folder: Path) -> list[tuple[str, str]]:
    """The corpus cut into passages of up to three sentences (ID, text): SciFact's
    5,183 abstracts make 16,735, a space above the store's exact-search bound of
    10,000 (one evidence per abstract, 5,183, would be scanned exactly)."""
    out = []
    with (folder / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            parts = [x for x in SENTENCE_END.split(str(doc.get("text", "")).strip()) if x]
            for k in range(0, len(parts), SENTENCES_PER_PASSAGE):
                text = " ".join(parts[k : k + SENTENCES_PER_PASSAGE])
                out.append((f"p-{doc['_id']}-{k // SENTENCES_PER_PASSAGE}", text))
    return out


async def text_questions(dsn: str, folder: Path, n: int, size: int | None = None) -> list[Question]:
    """The BEIR folder's passages embedded by the local model into one shared space
    (written once: a kept data folder reuses them), and its first ``n`` queries
    embedded as recall embeds a question. ``size``: only the first ``size``
    passages, in a space (and team) of their own, their vectors copied from the
    whole corpus's space when it is there (a space between 10,000 and 15,000
    vectors is where the ef_search floor decides the walk: from 15,000 on,
    size / 100 does)."""
    from gateway.embeddings import embed_queries
    from gateway.embeddings.local import LocalEmbeddingProvider

    team = TEXT_TEAM if size is None else f"text-{size}"
    provider = LocalEmbeddingProvider()
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    try:
        space = await conn.fetchval(
            "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", team
        )
        if space is None:
            rows = passages(folder)[:size]
            space = await write_text_space(conn, provider, rows, team)
        texts = []
        with (folder / "queries.jsonl").open(encoding="utf-8") as f:
            for line in f:
                texts.append(str(json.loads(line)["text"]))
        vectors: list[np.ndarray] = []
        for k in range(0, min(n, len(texts)), 64):
            vectors.extend(await embed_queries(provider, texts[k : min(n, k + 64)]))
    finally:
        await conn.close()
        await provider.aclose()
    return [((team, space), np.asarray(v, dtype=np.float32), ()) for v in vectors]


async def write_text_space(
    conn: asyncpg.Connection, provider: Any, rows: list[tuple[str, str]], team: str
) -> UUID:
    """The passages as evidence of one shared space, with their vectors (COPY, in
    one transaction, so the partition's HNSW index is built by inserts, as the
    store's writes build it). Vectors already in the whole corpus's space are
    copied, the others embedded."""
    started = time.perf_counter()
    known = {
        # pgvector's codec gives a Vector (to_numpy) or an array, by version
        r["evidence_id"]: getattr(r["embedding"], "to_numpy", lambda e=r["embedding"]: e)()
        for r in await conn.fetch(
            "SELECT evidence_id::text AS evidence_id, embedding FROM evidence_embeddings "
            "WHERE team_id = $1 AND evidence_id = ANY ($2::text[])",
            TEXT_TEAM,
            [i for i, _ in rows],
        )
    }
    vectors: list[Any] = [known.get(i) for i, _ in rows]
    missing = [k for k, v in enumerate(vectors) if v is None]
    for start in range(0, len(missing), 256):
        batch = missing[start : start + 256]
        for k, v in zip(batch, await provider.embed([rows[k][1] for k in batch]), strict=True):
            vectors[k] = v
        rb.log(f"  embedded {start + len(batch)} of {len(missing)} passages")
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO embedding_models (name, dimensions) VALUES ($1, 384) "
            "ON CONFLICT DO NOTHING",
            rb.MODEL,
        )
        await conn.execute("INSERT INTO teams (id, name) VALUES ($1, $2)", team, team)
        space: UUID = await conn.fetchval(
            "INSERT INTO memory_spaces (team_id, kind) VALUES ($1, 'shared') RETURNING id",
            team,
        )
        await conn.execute(
            "INSERT INTO sources (team_id, id, space_id, generation, kind, title, authority) "
            "VALUES ($1, 'src', $2, 1, 'document', 'Passages', 'medium')",
            team,
            space,
        )
        await conn.copy_records_to_table(
            "evidence",
            records=[
                (team, i, space, 1, "src", t, hashlib.sha256(t.encode()).digest()) for i, t in rows
            ],
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
        await conn.copy_records_to_table(
            "evidence_lifecycle_events",
            records=[(team, space, i, "active") for i, _ in rows],
            columns=["team_id", "space_id", "evidence_id", "status"],
        )
        await conn.copy_records_to_table(
            "evidence_embeddings",
            records=[
                (team, space, i, rb.MODEL, rb.DIM, np.asarray(v, dtype=np.float32))
                for (i, _), v in zip(rows, vectors, strict=True)
            ],
            columns=["team_id", "space_id", "evidence_id", "model", "dimensions", "embedding"],
        )
    await conn.execute("VACUUM ANALYZE")
    rb.log(f"  wrote {len(rows)} passages in {time.perf_counter() - started:.0f} s")
    return space


async def run(
    dsn: str,
    floors: list[int],
    builds: int,
    questions: list[Question],
    lists: dict[str, tuple[int, int]],
    compare_to: str | None,
) -> None:
    teams = list(dict.fromkeys(team for team, _, _ in questions))
    n = len(questions)
    arms = [STORE, *(str(f) for f in floors)]
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    try:
        await make_arms(conn, floors)
        exact: dict[tuple[int, str], list[tuple[str, float]]] = {}
        for q, ((team, space), qv, exclude) in enumerate(questions):
            for kind, sizes in lists.items():
                if exclude and kind != "evidence":
                    continue  # the same list as the question without exclusions
                more = [list(exclude)] if kind == "evidence" else []
                rows = await conn.fetch(EXACT_SQL[kind], team, space, qv, max(sizes), *more)
                exact[(q, kind)] = [(r[0], r[1]) for r in rows]
        results: dict[int, dict[tuple[str, str, int], Tally]] = {}
        # by arm, list kind and size, and whether the question excludes IDs
        changed: dict[tuple[str, str, int, bool], Changed] = {}
        for build in range(builds):
            note = "as found"
            if build:
                note = f"rebuilt in {await rebuild(conn, [s for _, s in teams]):.0f} s"
            load = os.getloadavg()[0]
            tallies: dict[tuple[str, str, int], Tally] = {}
            first: dict[tuple[str, str], list[float]] = {}
            for q, question in enumerate(questions):
                order = arms[q % len(arms) :] + arms[: q % len(arms)]
                for kind, sizes in lists.items():
                    if (q, kind) not in exact:
                        continue
                    truth = exact[(q, kind)]
                    # The question's first call (its graph pages may be outside
                    # shared buffers, as for a recall's one call): each arm makes
                    # it for every len(arms)-th question; not counted below.
                    _, elapsed = await call(conn, order[0], kind, question, max(sizes))
                    first.setdefault((order[0], kind), []).append(elapsed)
                    for size in sizes:
                        want = {i for i, _ in truth[:size]}
                        got_by_arm: dict[str, list[tuple[str, float]]] = {}
                        for arm in order:
                            got, elapsed = await call(conn, arm, kind, question, size)
                            got_by_arm[arm] = got
                            t = tallies.setdefault((arm, kind, size), Tally())
                            t.hits += len(want & {i for i, _ in got})
                            t.total += len(want)
                            t.ms.append(elapsed)
                        if compare_to is None:
                            continue
                        base = got_by_arm[compare_to]
                        for arm, got in got_by_arm.items():
                            if arm == compare_to or [i for i, _ in got] == [i for i, _ in base]:
                                continue
                            key = (arm, kind, size, bool(question[2]))
                            c = changed.setdefault(key, Changed())
                            c.lists += 1
                            mine = len(want & {i for i, _ in got})
                            theirs = len(want & {i for i, _ in base})
                            c.more += mine > theirs
                            c.same += mine == theirs
                            c.fewer += mine < theirs
                            mine_d = sorted(d for _, d in got)
                            theirs_d = sorted(d for _, d in base)
                            worse = [
                                k + 1
                                for k, (a, b) in enumerate(zip(mine_d, theirs_d, strict=False))
                                if a > b + 1e-12
                            ]
                            if not worse:
                                c.nearer_every_rank += 1
                                continue
                            c.farther.append(
                                (
                                    q,
                                    len(question[2]),
                                    theirs,
                                    mine,
                                    worse,
                                    max(mine_d[k - 1] - theirs_d[k - 1] for k in worse),
                                    statistics.median(mine_d) - statistics.median(theirs_d),
                                )
                            )
            results[build] = tallies
            print(
                f"build {build} ({note}; load average {load:.1f} -> "
                f"{os.getloadavg()[0]:.1f}), {n} questions, the teams in turn:"
            )
            print_build(tallies, first, arms, lists)
    finally:
        await drop_arms(conn, floors)
        await conn.close()
    print("worst build per arm (lowest recall of any build; median of the builds' p50):")
    for arm in arms:
        cells = []
        for kind, sizes in lists.items():
            for size in sizes:
                recalls = [r[(arm, kind, size)] for r in results.values()]
                worst = min(t.hits / t.total for t in recalls)
                p50 = statistics.median(statistics.median(t.ms) for t in recalls)
                cells.append(f"{kind} @{size} {worst:.3f} ({p50:.2f} ms)")
        print(f"  {label(arm):10} " + "   ".join(cells))
    if compare_to is not None:
        print(f"lists that differ from arm {label(compare_to)} (all builds):")
        for (arm, kind, size, excluding), c in sorted(changed.items()):
            print(
                f"  {label(arm):10} {kind} list of {size}"
                f"{', known IDs excluded' if excluding else ''}: {c.lists} differ; holds more of "
                f"the exact top {size} in {c.more}, as many in {c.same}, fewer in {c.fewer}; "
                f"at least as near at every rank in {c.nearer_every_rank}"
            )
            for q, excluded, theirs, mine, worse, most, median in c.farther:
                print(
                    f"    question {q} ({excluded} excluded): exact top {size} held "
                    f"{theirs} -> {mine}; farther at ranks {worse[:8]}"
                    f"{'...' if len(worse) > 8 else ''} ({len(worse)}), by at most {most:.4f}; "
                    f"median distance {median:+.4f}"
                )


def label(arm: str) -> str:
    return "store" if arm == STORE else f"floor {arm}"


def print_build(
    tallies: dict[tuple[str, str, int], Tally],
    first: dict[tuple[str, str], list[float]],
    arms: list[str],
    lists: dict[str, tuple[int, int]],
) -> None:
    for arm in arms:
        cells = []
        for kind, sizes in lists.items():
            for size in sizes:
                t = tallies[(arm, kind, size)]
                cells.append(
                    f"{kind} @{size} {t.hits / t.total:.3f} ({statistics.median(t.ms):.2f} ms)"
                )
        print(f"  {label(arm):10} " + "   ".join(cells))
        firsts = "   ".join(
            f"{kind} list of {max(sizes)}: {statistics.median(first[(arm, kind)]):.2f} ms"
            for kind, sizes in lists.items()
            if (arm, kind) in first
        )
        print(f"  {'':10} a question's first call (median): {firsts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--floors", default="100,120,150,200")
    parser.add_argument("--builds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--compare-to",
        help="an arm (store, or a floor) to compare every other arm's lists with",
    )
    parser.add_argument(
        "--text",
        type=Path,
        metavar="BEIR_FOLDER",
        help="real text instead of recall_bench's dataset: the folder's passages in one "
        "space of --data-dir (written on the first run), its queries as questions",
    )
    parser.add_argument(
        "--answers",
        type=Path,
        metavar="FILE",
        help="the questions of a recall_bench.py --answers-out file (its current and "
        "known-IDs recalls), embedded by the local model, instead of synthetic ones",
    )
    parser.add_argument(
        "--text-size",
        type=int,
        metavar="N",
        help="with --text: only the first N passages, in a space of their own",
    )
    args = parser.parse_args()
    floors = [int(f) for f in args.floors.split(",")]
    compare = args.compare_to
    if compare is not None and compare != STORE and int(compare) not in floors:
        raise SystemExit(f"--compare-to {compare}: not one of the arms")
    with rb.database(args.data_dir) as dsn:
        if args.text is not None:
            asyncio.run(prepare(dsn, migrate=True))
            questions = asyncio.run(text_questions(dsn, args.text, args.queries, args.text_size))
            lists = {"evidence": LISTS["evidence"]}
        elif args.answers is not None:
            questions = asyncio.run(answers_questions(dsn, read_answers(args.answers)))
            lists = LISTS
        else:
            questions = asyncio.run(synthetic_questions(dsn, args.queries, args.seed))
            lists = LISTS
        asyncio.run(run(dsn, floors, args.builds, questions, lists, compare))


if __name__ == "__main__":
    main()
