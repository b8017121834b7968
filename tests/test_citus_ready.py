"""Ready for Citus: the migrated schema obeys the rules of a table distributed by team.

No Citus package can be installed here, so readiness is checked on the
catalog of the real migrated database: what ``create_distributed_table`` and
``create_reference_table`` would refuse, or what would make a team's rows
leave its shard, fails here first. The plan itself is in docs/deploy.md.

Rules, for every table of the public schema (partitions are checked through
their parent, whose constraints they inherit):

- a table is either a reference table (listed below, with the reason) or is
  distributed by its team column, which it must have, of the one type every
  team column has (co-location needs it);
- every primary key, unique constraint and unique index of a distributed
  table includes the team column (a uniqueness Citus can check inside one
  shard);
- every foreign key between distributed tables maps the team column of one
  to the team column of the other (the rows of both sides live in the same
  shard of co-located tables);
- a reference table references only reference tables (Citus has no foreign
  key from a reference table to a distributed one).

Known gaps are listed with their exact violations: the test fails when a
new violation appears, and also when a listed gap is closed without the
list being updated, so the list always says what the schema is.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import asyncpg
import httpx
import pytest

from gateway.services.writes import WriteService
from gateway.store import database
from gateway.store.connection import Conn

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_feedback import RECALL as RECALL_WITH_EVENT
from .test_feedback import gql, submit
from .test_mutations import incident_memory, remember
from .test_recall import recall, token
from .test_trace import trace

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Replicated whole to every node: small, global, and joined from any shard.
REFERENCE_TABLES: dict[str, str] = {
    "schema_migrations": "the migration runner's bookkeeping: one row per file, for the "
    "whole store (kept on the coordinator with the schema)",
    "embedding_models": "the one model whose vectors the store holds: a store-wide fact "
    "every vector row references",
    "reembed_runs": "an operator's re-embedding run of the whole store (at most one running)",
    "api_tokens": "looked up by token ID before the team is known, on every request: a "
    "reference table answers it on any node without fanning out to every shard",
}

STATEMENT_TRIGGER_NAMES: list[str] = [
    # BM25 postings and statistics (db/0002, db/0003, db/0055)
    "evidence.evidence_search_stats_add",
    "evidence.evidence_terms_fill",
    "relationships.relationship_search_stats_add",
    "relationships.relationship_terms_fill",
    # the postings' guards in place of their foreign keys (db/0115, db/0118)
    "evidence.evidence_keep_postings",
    "evidence.evidence_keep_postings_truncate",
    "evidence_terms.evidence_terms_check_documents",
    "evidence_terms.evidence_terms_check_documents_update",
    "relationship_terms.relationship_terms_check_documents",
    "relationship_terms.relationship_terms_check_documents_update",
    "relationships.relationships_keep_postings",
    "relationships.relationships_keep_postings_truncate",
    # the lexeme statistics kept on the postings (db/0106, db/0107)
    "evidence_terms.evidence_lexeme_stats_add",
    "evidence_terms.evidence_lexeme_stats_on_delete",
    "evidence_terms.evidence_lexeme_stats_on_truncate",
    "evidence_terms.evidence_lexeme_stats_on_update",
    "relationship_terms.relationship_lexeme_stats_add",
    "relationship_terms.relationship_lexeme_stats_on_delete",
    "relationship_terms.relationship_lexeme_stats_on_truncate",
    "relationship_terms.relationship_lexeme_stats_on_update",
    # graph change counters
    "conflict_case_events.graph_change_counters_add",
    "conflict_position_relationships.graph_change_counters_add",
    "evidence_lifecycle_events.graph_change_counters_add",
    "relationship_status_events.graph_change_counters_add",
    "relationships.graph_change_counters_add",
    "source_lifecycle_events.graph_change_counters_add",
    "space_generations.graph_change_counters_add",
    "support_decisions.graph_change_counters_add",
    "supports.graph_change_counters_add",
]

# The team column of each distributed table (the distribution column).
TEAM_COLUMN_EXCEPTIONS: dict[str, str] = {"teams": "id"}
TEAM_COLUMN = "team_id"
# Tables are co-located only when their distribution columns have one type.
TEAM_TYPE = "client_id"

# Violations the Citus conversion handles outside the schema, with the plan in
# docs/deploy.md ("Known gaps"). Each entry is the exact text this test reports.
KNOWN_GAPS: dict[str, str] = {
    "api_tokens: reference table references distributed principals (team_id, principal_id)": "Citus has no foreign key from a reference table to a distributed one: the "
    "conversion drops it, and `tokens issue` checks the principal in its own "
    "transaction (docs/deploy.md, Known gaps)",
}


async def _tables(conn: Conn) -> list[str]:
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition "
        "ORDER BY 1"
    )
    return [r["relname"] for r in rows]


async def _columns(conn: Conn, table: str) -> dict[str, str]:
    """Column name -> type name (a domain's own name, not its base type)."""
    rows = await conn.fetch(
        "SELECT column_name, coalesce(domain_name, data_type) AS kind "
        "FROM information_schema.columns WHERE table_schema = 'public' AND table_name = $1",
        table,
    )
    return {r["column_name"]: r["kind"] for r in rows}


async def _unique_keys(conn: Conn) -> list[asyncpg.Record]:
    """Primary keys, unique constraints and unique indexes (a unique index is a
    constraint Citus must be able to check too), with their column names."""
    return await conn.fetch(
        """
        SELECT c.relname AS table_name, i.relname AS index_name,
               array_agg(a.attname ORDER BY k.ord) FILTER (WHERE a.attname IS NOT NULL)
                   AS columns,
               bool_or(k.attnum = 0) AS has_expression
        FROM pg_index x
        JOIN pg_class c ON c.oid = x.indrelid
        JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
        LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
        WHERE n.nspname = 'public' AND x.indisunique AND NOT c.relispartition
        GROUP BY c.relname, i.relname
        ORDER BY 1, 2
        """
    )


async def _foreign_keys(conn: Conn) -> list[asyncpg.Record]:
    return await conn.fetch(
        """
        SELECT src.relname AS table_name, dst.relname AS referenced,
               array_agg(sa.attname ORDER BY k.ord) AS columns,
               array_agg(da.attname ORDER BY k.ord) AS referenced_columns
        FROM pg_constraint con
        JOIN pg_class src ON src.oid = con.conrelid
        JOIN pg_class dst ON dst.oid = con.confrelid
        JOIN pg_namespace n ON n.oid = src.relnamespace
        CROSS JOIN LATERAL unnest(con.conkey, con.confkey) WITH ORDINALITY AS k(s, d, ord)
        JOIN pg_attribute sa ON sa.attrelid = src.oid AND sa.attnum = k.s
        JOIN pg_attribute da ON da.attrelid = dst.oid AND da.attnum = k.d
        WHERE n.nspname = 'public' AND con.contype = 'f' AND NOT src.relispartition
          AND con.conparentid = 0
        GROUP BY con.oid, src.relname, dst.relname
        ORDER BY 1, 2
        """
    )


def _team_column(table: str) -> str:
    return TEAM_COLUMN_EXCEPTIONS.get(table, TEAM_COLUMN)


async def citus_violations(conn: Conn) -> list[str]:
    """Every breach of the rules above, as readable lines (empty: ready)."""
    tables = await _tables(conn)
    found: list[str] = []
    for name in sorted(set(REFERENCE_TABLES) - set(tables)):
        found.append(f"{name}: listed as a reference table but does not exist")
    distributed = [t for t in tables if t not in REFERENCE_TABLES]
    for table in distributed:
        column = _team_column(table)
        kind = (await _columns(conn, table)).get(column)
        if kind is None:
            found.append(f"{table}: no {column} column")
        elif kind != TEAM_TYPE:
            # Co-location needs one type for every distribution column.
            found.append(f"{table}: {column} is {kind}, not {TEAM_TYPE}")
    for key in await _unique_keys(conn):
        table = key["table_name"]
        if table in REFERENCE_TABLES:
            continue
        if key["has_expression"] or _team_column(table) not in (key["columns"] or []):
            found.append(
                f"{table}: unique key {key['index_name']} ({', '.join(key['columns'] or [])}) "
                f"lacks {_team_column(table)}"
            )
    for fk in await _foreign_keys(conn):
        table, target = fk["table_name"], fk["referenced"]
        pairs = list(zip(fk["columns"], fk["referenced_columns"], strict=True))
        columns = ", ".join(fk["columns"])
        if table in REFERENCE_TABLES:
            if target not in REFERENCE_TABLES:
                found.append(
                    f"{table}: reference table references distributed {target} ({columns})"
                )
            continue
        if target in REFERENCE_TABLES:
            continue  # distributed -> reference: allowed, the target is on every node
        if (_team_column(table), _team_column(target)) not in pairs:
            found.append(
                f"{table}: foreign key ({columns}) to {target} does not map "
                f"{_team_column(table)} to {target}.{_team_column(target)}"
            )
    return found


async def test_schema_is_ready_for_distribution_by_team(
    admin_conn: Conn,
) -> None:
    found = await citus_violations(admin_conn)
    unexpected = [v for v in found if v not in KNOWN_GAPS]
    closed = [g for g in KNOWN_GAPS if g not in found]
    assert not unexpected, "schema breaks the Citus rules:\n" + "\n".join(unexpected)
    assert not closed, "known gaps no longer present (update KNOWN_GAPS and docs/deploy.md):\n" + (
        "\n".join(closed)
    )


# Triggers Citus does not run on a distributed table: statement-level triggers
# and triggers with transition tables. Each is named in docs/deploy.md
# ("Triggers"), which says what replaces it before a conversion; a new one that
# is not listed here and there fails the test below.
STATEMENT_TRIGGERS: frozenset[str] = frozenset(STATEMENT_TRIGGER_NAMES)


def _triggers_in_the_plan() -> str:
    """The "Triggers" item of docs/deploy.md's conversion plan."""
    plan = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    plan = plan[plan.index("- **Triggers.**") :]
    return plan[: plan.index("\n- **", 1)]


async def statement_triggers(conn: Conn) -> list[str]:
    """``table.trigger`` for every statement-level or transition-table trigger of
    the public schema (a partition's clones are checked through their parent)."""
    rows = await conn.fetch(
        "SELECT c.relname || '.' || t.tgname AS name FROM pg_trigger t "
        "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND NOT t.tgisinternal AND t.tgparentid = 0 "
        "AND ((t.tgtype & 1) = 0 OR t.tgoldtable IS NOT NULL OR t.tgnewtable IS NOT NULL) "
        "ORDER BY 1"
    )
    return [r["name"] for r in rows]


async def test_every_statement_trigger_is_in_the_conversion_plan(
    admin_conn: Conn,
) -> None:
    """The write path must do these triggers' work (or, for the postings' guards of
    db/0115, the conversion must put the foreign keys back) before a store is
    distributed: the list here and docs/deploy.md name every one of them."""
    found = await statement_triggers(admin_conn)
    assert sorted(STATEMENT_TRIGGERS - set(found)) == [], "listed but gone"
    assert sorted(set(found) - STATEMENT_TRIGGERS) == [], (
        "statement-level triggers missing from STATEMENT_TRIGGER_NAMES and docs/deploy.md"
    )
    plan = _triggers_in_the_plan()
    missing = [n for n in found if f"`{n.split('.', 1)[1]}`" not in plan]
    assert missing == [], "not named in docs/deploy.md, Triggers"


async def test_the_check_catches_each_kind_of_breach(admin_conn: Conn) -> None:
    """The rules fire on a table that breaks each one (made in a transaction that is
    rolled back, so the shared test database is left as it was)."""
    tx = admin_conn.transaction()
    await tx.start()
    try:
        await admin_conn.execute(
            """
            CREATE TABLE citus_probe_no_team (id text PRIMARY KEY);
            CREATE TABLE citus_probe_type (team_id text NOT NULL, PRIMARY KEY (team_id));
            CREATE TABLE citus_probe_key (team_id text NOT NULL, id text NOT NULL,
                                          PRIMARY KEY (team_id, id), UNIQUE (id));
            CREATE TABLE citus_probe_fk (team_id text NOT NULL, other_team text NOT NULL,
                                         id text NOT NULL,
                                         FOREIGN KEY (other_team, id)
                                             REFERENCES citus_probe_key (team_id, id));
            CREATE UNIQUE INDEX citus_probe_expr ON citus_probe_key ((lower(id)), team_id);
            ALTER TABLE schema_migrations ADD COLUMN probe_team text, ADD COLUMN probe_id text;
            ALTER TABLE schema_migrations ADD FOREIGN KEY (probe_team, probe_id)
                REFERENCES citus_probe_key (team_id, id);
            """
        )
        found = await citus_violations(admin_conn)
    finally:
        await tx.rollback()
    assert "citus_probe_no_team: no team_id column" in found
    assert "citus_probe_type: team_id is text, not client_id" in found
    assert "citus_probe_key: unique key citus_probe_key_id_key (id) lacks team_id" in found
    assert any(v.startswith("citus_probe_key: unique key citus_probe_expr") for v in found)
    assert (
        "citus_probe_fk: foreign key (other_team, id) to citus_probe_key does not map "
        "team_id to citus_probe_key.team_id" in found
    )
    assert (
        "schema_migrations: reference table references distributed citus_probe_key "
        "(probe_team, probe_id)" in found
    )


# --- every statement of a request names one team ------------------------------------------------

# Statements a request sends that bind no team (patterns matched from the start
# of the statement's text), each with why it needs none.
TEAM_FREE_STATEMENTS: dict[str, str] = {
    r"(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE SAVEPOINT)\b": "transaction control "
    "(Citus sends it to the nodes the transaction's statements went to)",
    r"SELECT\b.*\bFROM api_tokens t\b": "the token lookup, which finds the team; under "
    "Citus it becomes two statements, the token from the reference table, then the "
    "principal and spaces routed by its team (docs/deploy.md, Known gaps)",
    r"SELECT name, dimensions FROM embedding_models": "the store's embedding model, a "
    "reference table",
    r"SELECT set_config\('recall\.space_ids', \$1, true\)": "narrows the spaces of a "
    "transaction that already set its team",
}


class _Recording(database.StatementCounter):
    """The pool's statement counter, also keeping each statement's text and arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.statements: list[tuple[str, tuple[object, ...]]] = []

    def __call__(self, record: object) -> None:
        before = self.count
        super().__call__(record)
        if self.count != before:  # not one of the driver's own
            args = tuple(getattr(record, "args", ()) or ())
            self.statements.append((str(getattr(record, "query", "")), args))


def _binds(args: tuple[object, ...], team: str) -> bool:
    def flat(value: object) -> list[object]:
        if isinstance(value, list | tuple):
            return [x for v in value for x in flat(v)]
        return [value]

    return any(isinstance(v, str) and v == team for v in flat(list(args)))


async def test_every_statement_of_a_request_binds_the_callers_team(
    dsn: str, writes: WriteService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run every operation over HTTP (recall with every frontier, trace, remember,
    feedback, a persisted query) and check each statement the gateway sent: it binds
    the caller's team as a parameter (the predicate Citus routes by), never another
    team's, or it is one of the listed team-free statements."""
    team, other = unique("citus-a"), unique("citus-b")
    await load_jsonl(writes, jsonl(team_records(team) + team_records(other)))
    tok = await token(writes, team, "alice")
    monkeypatch.setattr(database, "StatementCounter", _Recording)
    app = app_for(dsn)
    async with app.router.lifespan_context(app):
        recorder = app.state.services.db.counter
        assert isinstance(recorder, _Recording)
        recorder.statements.clear()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            result = await recall(client, tok, q="who owns the billing service", limit=5)
            assert result["results"]
            fb = await gql(client, tok, RECALL_WITH_EVENT, q="billing service owned by payments")
            event = fb["data"]["recallMemory"]["recallEventId"]
            await trace(client, tok, id="rel-owner")
            body = await remember(client, tok, incident_memory())
            assert "errors" not in body, body
            sent = await submit(client, tok, feedbackId="fb-citus", recallEventId=event, used=True)
            assert "errors" not in sent, sent
            query = "{ viewer { principalId } }"
            digest = hashlib.sha256(query.encode()).hexdigest()
            apq = {"persistedQuery": {"version": 1, "sha256Hash": digest}}
            headers = {"Authorization": f"Bearer {tok}"}
            first = await client.post(
                "/graphql", json={"query": query, "extensions": apq}, headers=headers
            )
            again = await client.post("/graphql", json={"extensions": apq}, headers=headers)
            assert "errors" not in first.json() and "errors" not in again.json(), again.text
    statements = recorder.statements
    assert len(statements) > 20  # the workload ran
    unfiltered = [
        sql
        for sql, args in statements
        if not _binds(args, team)
        and not any(re.match(p, sql.strip(), re.S) for p in TEAM_FREE_STATEMENTS)
    ]
    crossing = [sql for sql, args in statements if _binds(args, other)]
    assert not crossing, crossing
    assert not unfiltered, "statements without the caller's team:\n" + "\n---\n".join(
        sorted(set(unfiltered))
    )
