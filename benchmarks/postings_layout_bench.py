"""BM25 postings layouts measured side by side on a copy of a kept dataset.

A measuring script, not a test, and a design experiment: nothing of the store
changes but a scratch schema. Run it on a COPY of a dataset kept by
``recall_bench.py --data-dir`` (it adds the schemas ``postings_lab`` and
``lab_a``, ``lab_b``, ``lab_c`` to that database; ``drop`` removes them)::

    python benchmarks/postings_layout_bench.py setup --data-dir HELD100K-COPY
    python benchmarks/postings_layout_bench.py insert --data-dir HELD100K-COPY --rounds 12
    python benchmarks/postings_layout_bench.py read --data-dir HELD100K-COPY --questions 60
    python benchmarks/postings_layout_bench.py group --data-dir HELD100K-COPY --questions 40
    python benchmarks/postings_layout_bench.py migration --data-dir HELD100K-COPY
    python benchmarks/postings_layout_bench.py drop --data-dir HELD100K-COPY

``setup`` copies every evidence posting into each layout, in load order
(documents by ``recorded_at`` then ID, each document's lexemes in ``tsvector``
order, as the postings trigger of db/0055 writes them) with the key present, so
that each B-tree has the shape that inserts give it:

- ``a``: today's key ``(team_id, space_id, lexeme, evidence_id) INCLUDE
  (recorded_at, tf)``;
- ``b``: ``(space_id, lexeme, evidence_id) INCLUDE (team_id, recorded_at,
  tf)``: no text column before the space, so the first two key columns have
  cached offsets (a space's ID is unique in a store: the vector partitions are
  listed by it alone);
- ``c``: as ``b`` with ``lexeme_id integer`` from a dictionary of the store's
  lexemes (``postings_lab.lexemes``) in place of the text;
- ``d``: today's key with ``lexeme_id`` (team kept first);
- ``g``: grouped postings, one row per space, lexeme and loader batch of 500
  documents, with the documents' IDs and term frequencies in two arrays.

Each layout gets the write path's statement triggers: the lexeme statistics
(as db/0106, into its own copy of the statistics) and the documents' guard
(the store's ``evidence_terms_check_documents``).

``insert`` writes one batch's postings (``--docs`` abstracts of one space,
copied under new IDs into ``evidence`` first, without triggers, so that the
guard finds them) into each layout in a transaction rolled back, the layouts
rotated one place per round, each arm run twice per round and the second run
timed (its pages already logged in full since the last checkpoint: the B-tree's
own CPU, not the checkpoint's timing; ``--cold`` times the first run after a
``CHECKPOINT`` instead). Printed per arm: the backend's CPU per posting
(``/proc/PID/schedstat``, median of the rounds), the WAL per posting, and the
median of the per-round ratios to the first arm. Arms ending in ``_sorted``
insert in key order; ``_notrig`` ones with the triggers off; ``heap_notrig``
into a table without a key (the heap's own cost); the ``c``, ``d`` and ``g``
arms include looking up (and adding) the batch's lexemes in the dictionary.

``read`` calls ``evidence_fulltext_top_k`` (db/0175's text) over layouts
``a``, ``b`` and ``c`` (schemas ``lab_a``, ``lab_b``, ``lab_c``: the same
function with only the postings' table, and for ``c`` the lexeme IDs, changed)
and the store's own, interleaved, one connection per arm (superuser: no
row-level security on any arm), with the arguments the recall computes for
the benchmark's questions (each question on the next team's shared space), and
compares every list with the store's function (exit 1 if any differs).

``group`` times the read path's largest step alone (every query lexeme's
postings summed per document) from today's key and from layout ``g``'s blocks
(the arrays unnested), and compares the sums. ``migration`` times what a
migration to layout ``b`` (the key rebuilt) or ``c`` (dictionary, postings
rewritten in key order, key, statistics) costs on this store.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import recall_ab  # noqa: E402
import recall_bench as rb  # noqa: E402

LAB = "postings_lab"

_TEXT_COLUMNS = "team_id, space_id, lexeme, evidence_id, tf, recorded_at"
_INT_TABLE = """CREATE TABLE {lab}.terms_{x} (
    team_id client_id NOT NULL, space_id uuid NOT NULL, lexeme_id integer NOT NULL,
    evidence_id client_id NOT NULL, tf integer NOT NULL CHECK (tf >= 1),
    recorded_at timestamptz NOT NULL, PRIMARY KEY {key})"""
_STATS = """CREATE FUNCTION {lab}.stats_add_{x}() RETURNS trigger LANGUAGE plpgsql
    SET search_path = public, pg_temp AS $$
DECLARE my_shard smallint := recall_stats_shard();
BEGIN
    INSERT INTO {lab}.stats_{x} AS s (team_id, space_id, {lex}, shard, df, max_tf)
    SELECT n.team_id, n.space_id, n.{lex}, my_shard, count(*), max(n.tf) FROM new_postings n
    GROUP BY n.team_id, n.space_id, n.{lex} ORDER BY {order}
    ON CONFLICT ({conflict}) DO UPDATE
        SET df = s.df + excluded.df, max_tf = greatest(s.max_tf, excluded.max_tf);
    RETURN NULL;
END $$"""
# layout: (table DDL, statistics key, lexeme column)
_LAYOUTS: dict[str, tuple[str, str, str]] = {
    "a": (
        f"CREATE TABLE {LAB}.terms_a (LIKE evidence_terms INCLUDING CONSTRAINTS, "
        "PRIMARY KEY (team_id, space_id, lexeme, evidence_id) INCLUDE (recorded_at, tf))",
        "team_id, space_id, lexeme, shard",
        "lexeme",
    ),
    "b": (
        f"CREATE TABLE {LAB}.terms_b (LIKE evidence_terms INCLUDING CONSTRAINTS, "
        "PRIMARY KEY (space_id, lexeme, evidence_id) INCLUDE (team_id, recorded_at, tf))",
        "space_id, lexeme, shard",
        "lexeme",
    ),
    "c": (
        _INT_TABLE.format(
            lab=LAB,
            x="c",
            key="(space_id, lexeme_id, evidence_id) INCLUDE (team_id, recorded_at, tf)",
        ),
        "space_id, lexeme_id, shard",
        "lexeme_id",
    ),
    "d": (
        _INT_TABLE.format(
            lab=LAB,
            x="d",
            key="(team_id, space_id, lexeme_id, evidence_id) INCLUDE (recorded_at, tf)",
        ),
        "team_id, space_id, lexeme_id, shard",
        "lexeme_id",
    ),
}

# The batch's lexemes added to the dictionary, then each posting's ID looked up
# through the batch's distinct lexemes (never a scan of the whole dictionary).
_DICT = (
    f"INSERT INTO {LAB}.lexemes (lexeme) SELECT DISTINCT b.lexeme FROM batch b "
    f"WHERE NOT EXISTS (SELECT 1 FROM {LAB}.lexemes l WHERE l.lexeme = b.lexeme) "
    "ON CONFLICT (lexeme) DO NOTHING"
)
_MAP = (
    "WITH m AS MATERIALIZED (SELECT l.id, l.lexeme FROM (SELECT DISTINCT lexeme FROM batch) x "
    f"CROSS JOIN LATERAL (SELECT l.id, l.lexeme FROM {LAB}.lexemes l WHERE l.lexeme = x.lexeme) l) "
)
_OFF = "SET LOCAL session_replication_role = replica"


def _into(layout: str, order: str = "") -> str:
    return (
        f"INSERT INTO {LAB}.terms_{layout} ({_TEXT_COLUMNS}) "
        f"SELECT {_TEXT_COLUMNS} FROM batch{order}"
    )


def _into_int(layout: str, order: str = "") -> str:
    return (
        _MAP + f"INSERT INTO {LAB}.terms_{layout} (team_id, space_id, lexeme_id, evidence_id, tf, "
        "recorded_at) SELECT b.team_id, b.space_id, m.id, b.evidence_id, b.tf, b.recorded_at "
        f"FROM batch b JOIN m ON m.lexeme = b.lexeme{order}"
    )


# The grouped layout's write: one row per (space, lexeme) of the batch, its
# statistics from the same rows, and the documents' guard as one statement.
_GROUPED = [
    _DICT,
    _MAP
    + f", ins AS (INSERT INTO {LAB}.blocks_g (space_id, lexeme_id, block, team_id, recorded_at, "
    "evidence_ids, tfs) SELECT b.space_id, m.id, 999999, min(b.team_id), max(b.recorded_at), "
    "array_agg(b.evidence_id ORDER BY b.evidence_id), array_agg(b.tf ORDER BY b.evidence_id) "
    "FROM batch b JOIN m ON m.lexeme = b.lexeme GROUP BY b.space_id, m.id "
    "RETURNING space_id, lexeme_id, team_id, cardinality(evidence_ids) AS df, "
    "(SELECT max(x) FROM unnest(tfs) x) AS max_tf) "
    f"INSERT INTO {LAB}.stats_c AS s (team_id, space_id, lexeme_id, shard, df, max_tf) "
    "SELECT i.team_id, i.space_id, i.lexeme_id, recall_stats_shard(), i.df, i.max_tf FROM ins i "
    "ORDER BY 2, 3 ON CONFLICT (space_id, lexeme_id, shard) DO UPDATE "
    "SET df = s.df + excluded.df, max_tf = greatest(s.max_tf, excluded.max_tf)",
    "SELECT count(*), count(l.found) FROM (SELECT DISTINCT team_id, space_id, evidence_id "
    "FROM batch) n LEFT JOIN LATERAL (SELECT true AS found FROM evidence e "
    "WHERE e.team_id = n.team_id AND e.space_id = n.space_id AND e.id = n.evidence_id "
    "FOR KEY SHARE OF e) l ON true",
]

INSERT_ARMS: dict[str, list[str]] = {
    "a": [_into("a")],
    "b": [_into("b")],
    "b_sorted": [_into("b", " ORDER BY space_id, lexeme, evidence_id")],
    "c": [_DICT, _into_int("c")],
    "c_sorted": [_DICT, _into_int("c", " ORDER BY 2, 3, 4")],
    "d": [_DICT, _into_int("d")],
    "g": _GROUPED,
    "a_notrig": [_OFF, _into("a")],
    "b_notrig": [_OFF, _into("b")],
    "heap_notrig": [_OFF, _into("h")],
}


def _cpu_ns(pid: int) -> int:
    """Nanoseconds the process has run on a CPU (first field of schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def _connect(dsn: str) -> tuple[asyncpg.Connection, int]:
    conn = await asyncpg.connect(dsn)
    return conn, await conn.fetchval("SELECT pg_backend_pid()")


async def setup(dsn: str) -> None:
    """The scratch schema: dictionary, layouts filled in load order, triggers, functions."""
    conn, pid = await _connect(dsn)
    try:
        await conn.execute("SET maintenance_work_mem = '1GB'; SET work_mem = '256MB'")
        await conn.execute(f"DROP SCHEMA IF EXISTS {LAB} CASCADE; CREATE SCHEMA {LAB}")
        await conn.execute(
            f"CREATE TABLE {LAB}.lexemes (id integer GENERATED BY DEFAULT AS IDENTITY "
            "PRIMARY KEY, lexeme text NOT NULL UNIQUE)"
        )
        await conn.execute(
            f"INSERT INTO {LAB}.lexemes (id, lexeme) SELECT row_number() OVER "
            '(ORDER BY lexeme COLLATE "C"), lexeme FROM (SELECT DISTINCT lexeme FROM '
            "evidence_terms UNION SELECT DISTINCT lexeme FROM relationship_terms) x"
        )
        await conn.execute(
            f"SELECT setval(pg_get_serial_sequence('{LAB}.lexemes', 'id'), "
            f"(SELECT max(id) FROM {LAB}.lexemes))"
        )
        # Load order: documents as the loader wrote them, each one's lexemes in
        # tsvector order, lexeme IDs joined once.
        await conn.execute(
            f"CREATE UNLOGGED TABLE {LAB}.src AS SELECT t.*, l.id AS lexeme_id "
            "FROM evidence_terms t JOIN evidence e ON e.team_id = t.team_id "
            "AND e.space_id = t.space_id AND e.id = t.evidence_id "
            f"JOIN {LAB}.lexemes l ON l.lexeme = t.lexeme "
            'ORDER BY e.recorded_at, e.id, t.lexeme COLLATE "C"'
        )
        n = await conn.fetchval(f"SELECT count(*) FROM {LAB}.src")
        print(f"{n:,} postings; load average {os.getloadavg()[0]:.1f}")
        for x, (ddl, conflict, lex) in _LAYOUTS.items():
            await conn.execute(ddl)
            columns = _TEXT_COLUMNS.replace("lexeme", lex)
            c0 = _cpu_ns(pid)
            await conn.execute(
                f"INSERT INTO {LAB}.terms_{x} ({columns}) SELECT {columns} FROM {LAB}.src"
            )
            cpu = (_cpu_ns(pid) - c0) / 1e3
            await conn.execute(
                f"CREATE TABLE {LAB}.stats_{x} (team_id client_id NOT NULL, space_id uuid NOT "
                f"NULL, {lex} {'text' if lex == 'lexeme' else 'integer'} NOT NULL, shard "
                "smallint NOT NULL, df bigint NOT NULL, max_tf integer NOT NULL, "
                f"PRIMARY KEY ({conflict}))"
            )
            join = "" if lex == "lexeme" else f" JOIN {LAB}.lexemes l USING (lexeme)"
            pick = "s.lexeme" if lex == "lexeme" else "l.id"
            await conn.execute(
                f"INSERT INTO {LAB}.stats_{x} SELECT s.team_id, s.space_id, {pick}, s.shard, "
                f"s.df, s.max_tf FROM evidence_lexeme_stats s{join}"
            )
            order = ", ".join(c for c in conflict.split(", ") if c != "shard")
            await conn.execute(_STATS.format(lab=LAB, x=x, lex=lex, order=order, conflict=conflict))
            size = await conn.fetchval(f"SELECT pg_relation_size('{LAB}.terms_{x}_pkey')")
            print(
                f"  layout {x}: filled in load order, {cpu / n:.2f} us of CPU per posting "
                f"(no triggers), key {size / 2**20:.0f} MB"
            )
        await conn.execute(
            f"CREATE TABLE {LAB}.terms_h (LIKE evidence_terms INCLUDING CONSTRAINTS)"
        )
        await conn.execute(
            f"CREATE TABLE {LAB}.blocks_g (space_id uuid NOT NULL, lexeme_id integer NOT NULL, "
            "block bigint NOT NULL, team_id client_id NOT NULL, recorded_at timestamptz NOT NULL, "
            "evidence_ids text[] NOT NULL, tfs integer[] NOT NULL, "
            "PRIMARY KEY (space_id, lexeme_id, block))"
        )
        await conn.execute(
            f"INSERT INTO {LAB}.blocks_g SELECT s.space_id, s.lexeme_id, s.blk, min(s.team_id), "
            "max(s.recorded_at), array_agg(s.evidence_id ORDER BY s.evidence_id), "
            "array_agg(s.tf ORDER BY s.evidence_id) FROM (SELECT t.*, (dense_rank() OVER "
            "(PARTITION BY t.space_id ORDER BY e.recorded_at, e.id) - 1) / 500 AS blk "
            f"FROM {LAB}.src t JOIN evidence e ON e.team_id = t.team_id "
            "AND e.space_id = t.space_id AND e.id = t.evidence_id) s "
            "GROUP BY s.space_id, s.lexeme_id, s.blk ORDER BY s.blk, s.space_id, s.lexeme_id"
        )
        g = await conn.fetchrow(
            f"SELECT count(*) AS n, pg_table_size('{LAB}.blocks_g') AS t, "
            f"pg_relation_size('{LAB}.blocks_g_pkey') AS k FROM {LAB}.blocks_g"
        )
        assert g is not None
        print(
            f"  layout g: {g['n']:,} rows, table {g['t'] / 2**20:.0f} MB, "
            f"key {g['k'] / 2**20:.0f} MB"
        )
        for x in ("a", "b", "c", "d", "h"):
            stats = x if x != "h" else "a"
            await conn.execute(
                f"CREATE TRIGGER stats_add AFTER INSERT ON {LAB}.terms_{x} REFERENCING NEW "
                f"TABLE AS new_postings FOR EACH STATEMENT EXECUTE FUNCTION "
                f"{LAB}.stats_add_{stats}()"
            )
            await conn.execute(
                f"CREATE TRIGGER check_documents AFTER INSERT ON {LAB}.terms_{x} REFERENCING NEW "
                "TABLE AS new_postings FOR EACH STATEMENT EXECUTE FUNCTION "
                "public.evidence_terms_check_documents()"
            )
        await conn.execute(f"DROP TABLE {LAB}.src")
        await conn.execute(
            f"VACUUM ANALYZE {LAB}.terms_a, {LAB}.terms_b, {LAB}.terms_c, "
            f"{LAB}.terms_d, {LAB}.blocks_g, {LAB}.lexemes"
        )
        for schema, sql in functions().items():
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
            await conn.execute(sql)
    finally:
        await conn.close()


def functions() -> dict[str, str]:
    """db/0175's evidence_fulltext_top_k per layout, each in a schema of its own."""
    text = (REPO / "db" / "0175_fulltext_best_scored_once.sql").read_text()
    body = text[text.index("CREATE OR REPLACE FUNCTION evidence_fulltext_top_k(") :]
    out = {}
    for x in ("a", "b", "c"):
        t = body.replace("FROM evidence_terms p", f"FROM {LAB}.terms_{x} p")
        if x == "c":
            for old, new in (
                ("p.lexeme = r.lexeme", "p.lexeme_id = r.lexeme_id"),
                ("p.lexeme = l.lexeme", "p.lexeme_id = l.lexeme_id"),
                ("SELECT l.lexeme, l.idf, l.df,\n", "SELECT l.lexeme, l.lexeme_id, l.idf, l.df,\n"),
                (
                    "SELECT u.lexeme, u.idf, u.df,\n",
                    f"SELECT u.lexeme, (SELECT x.id FROM {LAB}.lexemes x "
                    "WHERE x.lexeme = u.lexeme) AS lexeme_id, u.idf, u.df,\n",
                ),
                (
                    "(SELECT l.lexeme FROM lex l ORDER BY",
                    "(SELECT l.lexeme, l.lexeme_id FROM lex l ORDER BY",
                ),
                (
                    "SELECT l.lexeme, l.idf, l.upto <",
                    "SELECT l.lexeme, l.lexeme_id, l.idf, l.upto <",
                ),
            ):
                if old not in t:
                    raise SystemExit(f"db/0175 changed: {old!r} not found")
                t = t.replace(old, new)
        out[f"lab_{x}"] = t.replace(
            "FUNCTION evidence_fulltext_top_k(", f"FUNCTION lab_{x}.evidence_fulltext_top_k("
        )
    return out


async def _insert_once(
    conn: asyncpg.Connection, pid: int, arm: str, ids: list[str], team: str, tag: str
) -> tuple[float, float, int]:
    """One batch into one arm, rolled back: (us of CPU per posting, WAL bytes per posting, postings)."""
    async with conn.transaction():
        await conn.execute(_OFF)
        await conn.execute(
            "INSERT INTO evidence (team_id, id, space_id, generation, source_id, content, "
            "content_sha256, search_document, doc_length, observed_at, recorded_by, recorded_at) "
            "SELECT team_id, id || $3, space_id, generation, source_id, content, content_sha256, "
            "search_document, doc_length, observed_at, recorded_by, now() FROM evidence "
            "WHERE team_id = $1 AND id = ANY($2::text[]) ORDER BY id",
            team,
            ids,
            tag,
        )
        await conn.execute(
            "CREATE TEMP TABLE batch ON COMMIT DROP AS SELECT n.team_id, n.space_id, u.lexeme, "
            "n.id AS evidence_id, coalesce(array_length(u.positions, 1), 1) AS tf, n.recorded_at "
            "FROM (SELECT * FROM evidence WHERE team_id = $1 AND id = ANY (SELECT x || $3 FROM "
            "unnest($2::text[]) x) ORDER BY id) n CROSS JOIN LATERAL unnest(n.search_document) u",
            team,
            ids,
            tag,
        )
        await conn.execute("ANALYZE batch")
        await conn.execute("SET LOCAL session_replication_role = origin")
        n = await conn.fetchval("SELECT count(*) FROM batch")
        lsn0 = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        c0 = _cpu_ns(pid)
        for sql in INSERT_ARMS[arm]:
            await conn.execute(sql)
        cpu = (_cpu_ns(pid) - c0) / 1e3
        wal = await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", lsn0)
        raise _Rollback((cpu / n, float(wal) / n, n))


class _Rollback(Exception):
    """Carries a measurement out of the transaction it rolls back."""

    def __init__(self, value: tuple[float, float, int]) -> None:
        super().__init__()
        self.value = value


async def _measured(*args: Any) -> tuple[float, float, int]:
    try:
        await _insert_once(*args)
    except _Rollback as done:
        return done.value
    raise AssertionError("unreachable")


async def insert(dsn: str, arms: list[str], rounds: int, docs: int, team: str, cold: bool) -> None:
    conn, pid = await _connect(dsn)
    try:
        ids = [
            r[0]
            for r in await conn.fetch(
                "SELECT id FROM evidence WHERE team_id = $1 ORDER BY md5(id) LIMIT $2", team, docs
            )
        ]
        res: dict[str, list[tuple[float, float]]] = {a: [] for a in arms}
        load0, n = os.getloadavg()[0], 0
        for r in range(rounds + 1):  # round 0 warms
            for a in arms[r % len(arms) :] + arms[: r % len(arms)]:
                if cold:
                    await conn.execute("CHECKPOINT")
                else:
                    await _measured(conn, pid, a, ids, team, f"-{a}-{r}w")
                us, wal, n = await _measured(conn, pid, a, ids, team, f"-{a}-{r}")
                if r:
                    res[a].append((us, wal))
    finally:
        await conn.close()
    print(
        f"{docs} abstracts of {team}, {n:,} postings per batch, {rounds} rounds (+1 warm-up), "
        f"arms rotated, {'cold (CHECKPOINT before each)' if cold else 'warm'}; "
        f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    for a in arms:
        cpu = [x[0] for x in res[a]]
        ratio = statistics.median(x[0] / y[0] for x, y in zip(res[a], res[arms[0]], strict=True))
        print(
            f"  {a:12} {statistics.median(cpu):5.2f} us/posting (min {min(cpu):.2f}, max "
            f"{max(cpu):.2f})  WAL {statistics.median(x[1] for x in res[a]):5.0f} B/posting  "
            f"ratio to {arms[0]} {ratio:.3f}"
        )


_ARGS = """
WITH query_lexemes AS MATERIALIZED (
    SELECT u.lexeme FROM unnest(to_tsvector('english'::regconfig, $1)) AS u),
query_idf AS MATERIALIZED (
    SELECT ql.lexeme, ln(1 + (st.n - d.df + 0.5) / (d.df + 0.5)) AS idf, st.avgdl, d.df, d.max_tf
    FROM query_lexemes ql
    CROSS JOIN LATERAL (SELECT sum(x.doc_count)::double precision AS n,
               sum(x.total_length)::double precision / nullif(sum(x.doc_count), 0) AS avgdl
        FROM evidence_search_stats x WHERE x.team_id = $2 AND x.space_id = $3) st
    CROSS JOIN LATERAL (SELECT sum(c.df)::double precision AS df, max(c.max_tf) AS max_tf
        FROM evidence_lexeme_stats c
        WHERE c.team_id = $2 AND c.space_id = $3 AND c.lexeme = ql.lexeme) d
    WHERE d.df > 0 AND st.avgdl > 0)
SELECT (SELECT array_agg(x.lexeme ORDER BY x.lexeme COLLATE "C") FROM query_idf x),
       (SELECT array_agg(x.idf ORDER BY x.lexeme COLLATE "C") FROM query_idf x),
       (SELECT array_agg(x.df ORDER BY x.lexeme COLLATE "C") FROM query_idf x),
       (SELECT array_agg(x.max_tf ORDER BY x.lexeme COLLATE "C") FROM query_idf x),
       (SELECT min(x.avgdl) FROM query_idf x)
"""


async def read(dsn: str, questions: int, reps: int, prune_from: int) -> int:
    """The store's function against lab_a, lab_b, lab_c: CPU per call, lists compared."""
    from gateway.services.recall_input import LIMITS
    from gateway.services.recall_types import overfetch

    arms = ["public", "lab_a", "lab_b", "lab_c"]
    per_list = overfetch(LIMITS["limit"].default)
    setup_conn = await asyncpg.connect(dsn)
    try:
        spaces = await setup_conn.fetch(
            "SELECT DISTINCT ON (team_id) team_id, space_id, generation FROM evidence "
            "ORDER BY team_id, space_id"
        )
        calls: list[tuple[Any, ...]] = []
        for i, q in enumerate(recall_ab._questions(questions)):
            t = spaces[i % len(spaces)]
            found = await setup_conn.fetchrow(_ARGS, q, t["team_id"], t["space_id"])
            assert found is not None
            lex, idf, df, max_tf, avgdl = found
            if lex:
                calls.append(
                    (
                        t["team_id"],
                        t["space_id"],
                        t["generation"],
                        None,
                        [],
                        per_list,
                        prune_from,
                        lex,
                        idf,
                        df,
                        max_tf,
                        avgdl,
                    )
                )
    finally:
        await setup_conn.close()
    conns = {a: await _connect(dsn) for a in arms}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    differ = {a: 0 for a in arms}
    load0, k = os.getloadavg()[0], 0
    try:
        for rep in range(reps + 1):  # rep 0 warms
            for args in calls:
                k += 1
                rows = {}
                for a in arms[k % len(arms) :] + arms[: k % len(arms)]:
                    conn, pid = conns[a]
                    c0 = _cpu_ns(pid)
                    got = await conn.fetch(
                        f"SELECT f.doc_id, f.rank FROM {a}.evidence_fulltext_top_k("
                        "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) f",
                        *args,
                    )
                    if rep:
                        cpu[a].append((_cpu_ns(pid) - c0) / 1e3)
                    rows[a] = [tuple(r) for r in got]
                for a in arms:
                    differ[a] += rows[a] != rows["public"]
    finally:
        for conn, _ in conns.values():
            await conn.close()
    print(
        f"{len(calls)} questions x {reps} (+1 warm-up), one team's shared space each, per_list "
        f"{per_list}, prune_from {prune_from}; arms rotated; load average {load0:.1f} -> "
        f"{os.getloadavg()[0]:.1f}"
    )
    for a in arms:
        ratio = statistics.median(x / y for x, y in zip(cpu[a], cpu["public"], strict=True))
        print(
            f"  {a:7} CPU p50 {statistics.median(cpu[a]) / 1e3:.2f} ms, mean "
            f"{statistics.mean(cpu[a]) / 1e3:.2f} ms, per-call ratio to the store's "
            f"{ratio:.3f}; lists differing {differ[a]} of {len(calls) * (reps + 1)}"
        )
    return sum(differ.values())


_GROUP_KEY = """SELECT count(*), sum(s) FROM (
  SELECT p.evidence_id, sum(i.idf * p.tf / (p.tf + 0.9)) AS s
  FROM unnest($3::text[], $4::float8[]) AS i (lexeme, idf)
  CROSS JOIN LATERAL (SELECT p.evidence_id, p.tf::float8 AS tf FROM evidence_terms p
      WHERE p.team_id = $1 AND p.space_id = $2 AND p.lexeme = i.lexeme OFFSET 0) p
  GROUP BY p.evidence_id) x"""
_GROUP_BLOCKS = f"""SELECT count(*), sum(s) FROM (
  SELECT u.id, sum(i.idf * u.tf / (u.tf + 0.9)) AS s
  FROM unnest($3::text[], $4::float8[]) AS i (lexeme, idf)
  CROSS JOIN LATERAL (SELECT l.id FROM {LAB}.lexemes l WHERE l.lexeme = i.lexeme) l
  CROSS JOIN LATERAL (SELECT b.evidence_ids, b.tfs FROM {LAB}.blocks_g b
      WHERE b.space_id = $2 AND b.lexeme_id = l.id AND b.team_id = $1 OFFSET 0) b
  CROSS JOIN LATERAL unnest(b.evidence_ids, b.tfs) AS u (id, tf)
  GROUP BY u.id) x"""


async def group(dsn: str, questions: int, reps: int) -> int:
    """The read path's largest step, every query lexeme's postings summed per
    document, from the postings' key and from layout g's blocks: CPU, sums compared."""
    conn0 = await asyncpg.connect(dsn)
    try:
        spaces = await conn0.fetch(
            "SELECT DISTINCT ON (team_id) team_id, space_id FROM evidence ORDER BY team_id, space_id"
        )
        calls: list[tuple[Any, ...]] = []
        for i, q in enumerate(recall_ab._questions(questions)):
            t = spaces[i % len(spaces)]
            found = await conn0.fetchrow(_ARGS, q, t["team_id"], t["space_id"])
            assert found is not None
            lex, idf, *_ = found
            if lex:
                calls.append((t["team_id"], t["space_id"], lex, idf))
    finally:
        await conn0.close()
    arms = {"key": _GROUP_KEY, "blocks": _GROUP_BLOCKS}
    conns = {a: await _connect(dsn) for a in arms}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    differ, load0 = 0, os.getloadavg()[0]
    try:
        for rep in range(reps + 1):
            for j, args in enumerate(calls):
                got = {}
                for a in list(arms) if j % 2 else list(arms)[::-1]:
                    conn, pid = conns[a]
                    c0 = _cpu_ns(pid)
                    row = await conn.fetchrow(arms[a], *args)
                    assert row is not None
                    if rep:
                        cpu[a].append((_cpu_ns(pid) - c0) / 1e3)
                    got[a] = (row[0], round(row[1], 6))
                differ += got["key"] != got["blocks"]
    finally:
        for conn, _ in conns.values():
            await conn.close()
    print(
        f"{len(calls)} questions x {reps} (+1 warm-up), every query lexeme's postings summed per "
        f"document; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; sums differing {differ}"
    )
    for a in arms:
        ratio = statistics.median(x / y for x, y in zip(cpu[a], cpu["key"], strict=True))
        print(f"  {a:7} CPU p50 {statistics.median(cpu[a]) / 1e3:.2f} ms, ratio to key {ratio:.3f}")
    return differ


_MIGRATION = [
    (
        "b: the key rebuilt (the heap kept)",
        f"CREATE UNIQUE INDEX mig_b ON {LAB}.terms_a (space_id, lexeme, evidence_id) "
        "INCLUDE (team_id, recorded_at, tf)",
    ),
    (
        "c: the dictionary built",
        f"CREATE TABLE {LAB}.mig_lexemes AS SELECT row_number() OVER "
        '(ORDER BY lexeme COLLATE "C")::integer AS id, lexeme FROM (SELECT DISTINCT lexeme '
        "FROM evidence_terms UNION SELECT DISTINCT lexeme FROM relationship_terms) x",
    ),
    (
        "c: its keys",
        f"ALTER TABLE {LAB}.mig_lexemes ADD PRIMARY KEY (id), ADD UNIQUE (lexeme)",
    ),
    (
        "c: the postings rewritten in key order",
        f"CREATE TABLE {LAB}.mig_c AS SELECT t.space_id, l.id AS lexeme_id, t.evidence_id, "
        f"t.team_id, t.tf, t.recorded_at FROM evidence_terms t JOIN {LAB}.mig_lexemes l "
        "USING (lexeme) ORDER BY 1, 2, 3",
    ),
    (
        "c: their key built",
        f"ALTER TABLE {LAB}.mig_c ADD PRIMARY KEY (space_id, lexeme_id, evidence_id) "
        "INCLUDE (team_id, recorded_at, tf)",
    ),
    (
        "c: the statistics rewritten",
        f"CREATE TABLE {LAB}.mig_stats AS SELECT s.space_id, l.id AS lexeme_id, s.shard, "
        f"s.team_id, s.df, s.max_tf FROM evidence_lexeme_stats s JOIN {LAB}.mig_lexemes l "
        "USING (lexeme)",
    ),
]


async def migration(dsn: str) -> None:
    """What a migration to layout b or c costs on this store: server CPU and wall per step
    (the evidence postings only; scratch objects, dropped after)."""
    conn, pid = await _connect(dsn)
    cleanup = (
        f"DROP INDEX IF EXISTS {LAB}.mig_b; "
        f"DROP TABLE IF EXISTS {LAB}.mig_lexemes, {LAB}.mig_c, {LAB}.mig_stats"
    )
    try:
        await conn.execute(cleanup)
        await conn.execute("SET maintenance_work_mem = '1GB'; SET work_mem = '256MB'")
        n = await conn.fetchval("SELECT count(*) FROM evidence_terms")
        print(f"{n:,} evidence postings; load average {os.getloadavg()[0]:.1f}")
        for name, sql in _MIGRATION:
            c0, t0 = _cpu_ns(pid), time.perf_counter()
            await conn.execute(sql)
            print(
                f"  {name:40} CPU {(_cpu_ns(pid) - c0) / 1e9:6.2f} s, "
                f"wall {time.perf_counter() - t0:6.2f} s"
            )
        print(f"  (load average {os.getloadavg()[0]:.1f})")
        await conn.execute(cleanup)
    finally:
        await conn.close()


async def drop(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"DROP SCHEMA IF EXISTS {LAB} CASCADE; DROP SCHEMA IF EXISTS lab_a CASCADE; "
            "DROP SCHEMA IF EXISTS lab_b CASCADE; DROP SCHEMA IF EXISTS lab_c CASCADE"
        )
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["setup", "insert", "read", "group", "migration", "drop"])
    parser.add_argument("--data-dir", type=Path, required=True, help="a COPY of a kept dataset")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--docs", type=int, default=500)
    parser.add_argument("--team", default="bench-03")
    parser.add_argument("--cold", action="store_true")
    parser.add_argument(
        "--arms", default="a,b,b_sorted,c,c_sorted,d,g,a_notrig,b_notrig,heap_notrig"
    )
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prune-from", type=int, default=20_000)
    args = parser.parse_args()
    arms = args.arms.split(",")
    if unknown := set(arms) - set(INSERT_ARMS):
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    with rb.database(args.data_dir) as dsn:
        if args.step == "setup":
            asyncio.run(setup(dsn))
        elif args.step == "insert":
            asyncio.run(insert(dsn, arms, args.rounds, args.docs, args.team, args.cold))
        elif args.step == "read":
            sys.exit(1 if asyncio.run(read(dsn, args.questions, args.reps, args.prune_from)) else 0)
        elif args.step == "migration":
            asyncio.run(migration(dsn))
        elif args.step == "group":
            sys.exit(1 if asyncio.run(group(dsn, args.questions, args.reps)) else 0)
        else:
            asyncio.run(drop(dsn))


if __name__ == "__main__":
    main()
