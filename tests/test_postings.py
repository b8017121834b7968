"""The full-text columns and BM25 postings of evidence and relationships (db/0055).

Postings are written once per statement (a loader batch's COPY, a mutation's
single-row INSERT) and each text is parsed once. Every stored row is checked
here against what the definitions before db/0055 made from the same text: the
generated columns ``to_tsvector('english', text)`` and
``tsvector_token_count(to_tsvector('english', text))``, and the row trigger's
postings (one per lexeme, tf from its positions, the document's team, space,
id and system time). ``tests/test_load_paths.py`` compares the set-based and
the record-at-a-time load field by field, postings included.
"""

from __future__ import annotations

import httpx

from gateway.embeddings import EmbeddingProvider
from gateway.services.writes import WriteService
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_load_paths import _generated, _retarget
from .test_mutations import incident_memory, remember
from .test_recall import token

# (table, text column, postings table, postings' id column)
_DOCUMENTS = (
    ("evidence", "content", "evidence_terms", "evidence_id"),
    ("relationships", "statement", "relationship_terms", "relationship_id"),
)


async def _as_before_0055(conn: Conn, team: str) -> dict[str, int]:
    """For each table, rows that differ from what the old definitions made (0 each),
    and the number of postings checked (more than 0 each)."""
    out: dict[str, int] = {}
    for table, text, terms, key in _DOCUMENTS:
        out[f"{table} columns"] = await conn.fetchval(
            f"SELECT count(*) FROM {table} WHERE team_id = $1 AND ("
            f"search_document IS DISTINCT FROM to_tsvector('english'::regconfig, {text}) OR "
            f"doc_length IS DISTINCT FROM "
            f"tsvector_token_count(to_tsvector('english'::regconfig, {text})))",
            team,
        )
        stored = (
            f"SELECT team_id, space_id, lexeme, {key} AS doc, tf, recorded_at "
            f"FROM {terms} WHERE team_id = $1"
        )
        expected = (
            f"SELECT d.team_id, d.space_id, u.lexeme, d.id AS doc, "
            f"coalesce(array_length(u.positions, 1), 1) AS tf, d.recorded_at "
            f"FROM {table} d CROSS JOIN LATERAL "
            f"unnest(to_tsvector('english'::regconfig, d.{text})) AS u WHERE d.team_id = $1"
        )
        out[f"{terms} extra"] = await conn.fetchval(
            f"SELECT count(*) FROM (({stored}) EXCEPT ALL ({expected})) x", team
        )
        out[f"{terms} missing"] = await conn.fetchval(
            f"SELECT count(*) FROM (({expected}) EXCEPT ALL ({stored})) x", team
        )
        out[f"{terms} checked"] = await conn.fetchval(
            f"SELECT count(*) FROM {terms} WHERE team_id = $1", team
        )
    return out


def _assert_as_before(found: dict[str, int]) -> None:
    for name, n in found.items():
        if name.endswith("checked"):
            assert n > 0, f"{name}: the comparison saw no rows"
        else:
            assert n == 0, f"{name}: {n}"


async def test_bulk_load_writes_the_rows_the_old_definitions_made(
    writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("post")
    # batches of 60 records: COPYs of many evidence and relationships at once,
    # in two spaces, some documents sharing lexemes
    await load_jsonl(writes, _retarget(_generated(40), team), batch_size=60)
    n_evidence = await admin_conn.fetchval("SELECT count(*) FROM evidence WHERE team_id = $1", team)
    assert n_evidence == 40
    _assert_as_before(await _as_before_0055(admin_conn, team))


async def test_single_writes_write_the_rows_the_old_definitions_made(
    client: httpx.AsyncClient, writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("postm")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "bob")
    for suffix, space in (("-a", "SHARED"), ("-b", "PRIVATE")):
        body = await remember(client, tok, incident_memory(space, suffix))
        assert "errors" not in body, body
    _assert_as_before(await _as_before_0055(admin_conn, team))


async def test_postings_are_written_per_statement(admin_conn: Conn) -> None:
    """The bulk path's premise: one trigger call per COPY, not per row."""
    rows = await admin_conn.fetch(
        "SELECT tgname, (tgtype & 1) = 1 AS per_row FROM pg_trigger "
        "WHERE tgname IN ('evidence_terms_fill', 'relationship_terms_fill') ORDER BY tgname"
    )
    assert [(r["tgname"], r["per_row"]) for r in rows] == [
        ("evidence_terms_fill", False),
        ("relationship_terms_fill", False),
    ]


async def test_a_first_load_leaves_the_foreign_key_checks_lookups_by_key(
    fresh_dsn: str, embedder: EmbeddingProvider
) -> None:
    """On a new store, a load gives the referenced tables planner statistics
    (autovacuum would analyse them only a minute or more later). Why: without
    them a posting's check of its evidence was once planned as a scan of the
    space through another (team_id, space_id, ...) index; docs/data-model.md
    ("Planner statistics on a new store") says when. This test pins that the
    statistics are there, not the plan itself, which a small store does not
    reproduce; tests/test_load_statistics.py covers locks and failures."""
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    try:
        writes = WriteService(db, embedder)
        team = unique("plan")
        await load_jsonl(writes, _retarget(_generated(30), team), batch_size=50)
        async with db.pool.acquire() as conn:
            stats = await conn.fetch(
                "SELECT c.relname, c.reltuples, "
                "EXISTS (SELECT 1 FROM pg_stats s WHERE s.tablename = c.relname "
                "AND s.attname = 'id') AS has_id_stats "
                "FROM pg_class c WHERE c.relname IN ('evidence', 'relationships') "
                "ORDER BY c.relname"
            )
    finally:
        await db.close()
    assert [(r["relname"], r["reltuples"] > 0, r["has_id_stats"]) for r in stats] == [
        ("evidence", True, True),
        ("relationships", True, True),
    ]


async def test_the_search_document_does_not_depend_on_the_writers_search_path(
    admin_conn: Conn,
) -> None:
    """db/0056: the triggers find tsvector_token_count and the postings tables
    whatever the inserting session's search_path (here one without public),
    like the generated columns they replaced. Run on a temporary table of the
    same columns, rolled back."""
    async with admin_conn.transaction():
        for function, text in (
            ("evidence_search_document", "content"),
            ("relationship_search_document", "statement"),
        ):
            await admin_conn.execute(
                f"CREATE TEMP TABLE t_{text} ({text} text, search_document tsvector, "
                f"doc_length integer) ON COMMIT DROP; "
                f"CREATE TRIGGER t BEFORE INSERT ON pg_temp.t_{text} "
                f"FOR EACH ROW EXECUTE FUNCTION public.{function}()"
            )
        await admin_conn.execute("SET LOCAL search_path = pg_catalog")
        for text in ("content", "statement"):
            row = await admin_conn.fetchrow(
                f"INSERT INTO pg_temp.t_{text} ({text}) VALUES ('Pumps pump the pumped water') "
                "RETURNING search_document::text AS doc, doc_length"
            )
            assert row is not None
            assert (row["doc"], row["doc_length"]) == ("'pump':1,2,4 'water':5", 4)
