"""The migration runner against a real, empty database."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from gateway.errors import MigrationError
from gateway.store import migrations
from gateway.store.connection import Conn

from .conftest import Server, _with_database


@pytest_asyncio.fixture(loop_scope="session")
async def empty_db(pg_server: Server) -> AsyncIterator[asyncpg.Connection]:
    name = "recall_mig_" + secrets.token_hex(4)
    admin = await asyncpg.connect(pg_server.admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    conn = await asyncpg.connect(_with_database(pg_server.admin_dsn, name))
    try:
        yield conn
    finally:
        await conn.close()
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


async def test_from_empty_then_idempotent(empty_db: Conn) -> None:
    known = migrations.discover()
    first = await migrations.migrate(empty_db)
    assert [m.version for m in first] == [m.version for m in known]
    assert await migrations.migrate(empty_db) == []
    assert await migrations.pending(empty_db) == []
    rows = await empty_db.fetch("SELECT version, sha256 FROM schema_migrations ORDER BY version")
    assert [(r["version"], r["sha256"]) for r in rows] == [(m.version, m.sha256) for m in known]
    tables = {
        r["tablename"]
        for r in await empty_db.fetch("SELECT tablename FROM pg_tables WHERE schemaname='public'")
    }
    for expected in (
        "teams",
        "principals",
        "api_tokens",
        "memory_spaces",
        "space_generations",
        "sources",
        "source_lifecycle_events",
        "evidence",
        "evidence_occurrences",
        "evidence_entity_mentions",
        "evidence_terms",
        "entities",
        "relationships",
        "relationship_status_events",
        "supports",
        "support_decisions",
        "conflict_cases",
        "conflict_positions",
        "conflict_case_events",
        "evidence_conflicts",
        "evidence_conflict_positions",
        "community_runs",
        "communities",
        "community_members",
        "hypotheses",
        "hypothesis_feedback",
        "recall_events",
        "recall_feedback",
        "write_log",
    ):
        assert expected in tables
    indexes = await empty_db.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname='public'"
    )
    defs = {r["indexname"]: r["indexdef"] for r in indexes}
    assert "USING hnsw" in defs["evidence_embeddings_hnsw"]
    # No statement reads a GIN index on the full-text documents (BM25 reads the
    # postings), and every write paid for them: db/0116 drops them.
    assert "evidence_search_document" not in defs
    assert "relationships_search_document" not in defs
    assert not [name for name, d in defs.items() if "USING gin" in d]


async def test_changed_file_is_refused(empty_db: Conn, tmp_path: Path) -> None:
    folder = tmp_path / "db"
    shutil.copytree(migrations.migrations_dir(), folder)
    await migrations.migrate(empty_db, folder)
    first = sorted(folder.glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited\n")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        await migrations.migrate(empty_db, folder)


async def test_unknown_applied_version_is_refused(empty_db: Conn, tmp_path: Path) -> None:
    await migrations.migrate(empty_db)
    await empty_db.execute(
        "INSERT INTO schema_migrations (version, name, sha256) VALUES (9999, 'future', 'x')"
    )
    with pytest.raises(MigrationError, match="does not know"):
        await migrations.pending(empty_db)


async def test_failing_migration_leaves_nothing(empty_db: Conn, tmp_path: Path) -> None:
    folder = tmp_path / "db"
    shutil.copytree(migrations.migrations_dir(), folder)
    (folder / "9000_broken.sql").write_text("CREATE TABLE half_made (x int);\nSELECT 1/0;\n")
    with pytest.raises(MigrationError, match="9000_broken"):
        await migrations.migrate(empty_db, folder)
    assert await empty_db.fetchval("SELECT to_regclass('half_made')") is None
    assert await empty_db.fetchval("SELECT max(version) FROM schema_migrations") < 9000


def test_file_names_are_checked(tmp_path: Path) -> None:
    (tmp_path / "1_bad.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"NNNN_name\.sql"):
        migrations.discover(tmp_path)


async def test_posting_key_checks_use_the_whole_key_on_a_new_store(
    empty_db: Conn,
) -> None:
    """Every new posting's foreign-key check looks its document up by (team, space,
    id). On tables without statistics (a new store's first bulk load) the planner
    once took an index on (team, space, recorded_at) for it, filtering the ID, and
    a load became quadratic (db/0041): the lookup must use the whole key."""
    await migrations.migrate(empty_db)
    for table in ("evidence", "relationships"):
        await empty_db.execute(
            f"PREPARE key_check AS SELECT 1 FROM ONLY {table} x WHERE team_id = $1::text "
            "AND space_id = $2::uuid AND id = $3::text FOR KEY SHARE OF x"
        )
        try:
            await empty_db.execute("SET plan_cache_mode = force_generic_plan")
            plan = "\n".join(
                r[0]
                for r in await empty_db.fetch(
                    "EXPLAIN EXECUTE key_check('t', gen_random_uuid(), 'x')"
                )
            )
        finally:
            await empty_db.execute("DEALLOCATE key_check")
            await empty_db.execute("RESET plan_cache_mode")
        assert "Filter" not in plan and "id)::text = $3" in plan, plan
