"""Vector tables that ``load --index-after`` detached before db/0083 existed.

That first version kept no record: the catalogue was its state, and its
``build-vector-indexes`` attached any plain table named like a space's
partition. db/0083 made ``vector_deferrals`` the only state, so such a table,
left by an interrupted load, would have stayed detached for ever: the space
refusing every write, recall without its vector list, and migrations changing
the parents without it. The migration runner (at every start and ``migrate``)
now records the tables that can only be such leftovers, and refuses to migrate
until they are built; a copy made under such a name is left alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from uuid import UUID

import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.errors import MigrationError
from gateway.services import loader, vector_indexes
from gateway.services.writes import WriteService
from gateway.store import migrations, vector_partitions
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import unique
from .test_index_after import _build, _parsed, _space, _state
from .test_index_after_safety import _setup_only


async def _detach_as_before_0083(conn: Conn, space: UUID) -> None:
    """What the first ``load --index-after`` did to an empty space: detach both
    partitions and drop their HNSW indexes, recording nothing."""
    async with conn.transaction():
        for parent in vector_partitions.VECTOR_TABLES:
            table = vector_partitions.partition_name(parent, space)
            await conn.execute(f'ALTER TABLE {parent} DETACH PARTITION "{table}"')
            names = await conn.fetch(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = to_regclass($1) "
                "AND a.amname = 'hnsw'",
                table,
            )
            for row in names:
                await conn.execute(f'DROP INDEX "{row["relname"]}"')


async def _copy_under_the_name(conn: Conn, space: UUID) -> None:
    """Someone's backup: the partition detached and renamed, and a copy made with
    CREATE TABLE ... AS under its name (no constraint, no key)."""
    table = vector_partitions.partition_name("evidence_embeddings", space)
    async with conn.transaction():
        await conn.execute(f'ALTER TABLE evidence_embeddings DETACH PARTITION "{table}"')
        await conn.execute(f'ALTER TABLE "{table}" RENAME TO "{table[:50]}_kept"')
        await conn.execute(f'CREATE TABLE "{table}" AS SELECT * FROM "{table[:50]}_kept"')


async def test_tables_detached_before_0083_are_recorded_built_and_block_migrations(
    fresh_dsn: str, embedder: EmbeddingProvider, tmp_path: Path
) -> None:
    db = await Database.open(fresh_dsn, min_size=1, max_size=4)
    try:
        writes = WriteService(db, embedder)
        team, other = unique("old0083"), unique("copy0083")
        for t in (team, other):
            await loader.load(writes, _parsed(_setup_only(t, embedder.model)), batch_size=50)
        async with db.acquire() as conn:
            space, copied = await _space(conn, team), await _space(conn, other)
            await _detach_as_before_0083(conn, space)
            await _copy_under_the_name(conn, copied)
            assert await vector_indexes.deferred_spaces(db) == []  # nobody knows of them

            # at a start with nothing to migrate: recorded, the copy left alone
            assert await migrations.migrate(conn) == []
        assert [s.space for s in await vector_indexes.deferred_spaces(db)] == [space]

        folder = tmp_path / "db"
        shutil.copytree(migrations.migrations_dir(), folder)
        (folder / "9999_probe.sql").write_text(
            "ALTER TABLE evidence_embeddings ADD COLUMN probe_note text;"
        )
        async with db.acquire() as conn:
            with pytest.raises(MigrationError) as caught:
                await migrations.migrate(conn, folder)
            assert f"space 'shared' of team '{team}'" in caught.value.message
            assert other not in caught.value.message
            assert [m.name for m in await migrations.pending(conn, folder)] == ["probe"]

        report = await _build(db)
        assert report.tables == 2 and report.failed == []
        async with db.acquire() as conn:
            for _table, attached, methods in await _state(conn, space):
                assert attached is True and "hnsw:True" in methods
            assert [m.name for m in await migrations.migrate(conn, folder)] == ["probe"]
            assert await vector_indexes.deferred_spaces(db) == []
            assert (
                await conn.fetchval(
                    "SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)",
                    vector_partitions.partition_name("evidence_embeddings", copied),
                )
                is False
            )
    finally:
        await db.close()


async def test_a_store_migrated_across_0083_is_stopped_right_after_it(
    fresh_dsn: str, embedder: EmbeddingProvider, tmp_path: Path
) -> None:
    """An upgrade from before db/0083 with such tables: the runner applies
    db/0083, records them, and refuses the migrations after it (which would
    change the parents without them) until they are built."""
    db = await Database.open(fresh_dsn, min_size=1, max_size=4)
    try:
        writes = WriteService(db, embedder)
        team = unique("up0083")
        await loader.load(writes, _parsed(_setup_only(team, embedder.model)), batch_size=50)
        folder = tmp_path / "db"
        shutil.copytree(migrations.migrations_dir(), folder)
        (folder / "9999_probe.sql").write_text(
            "ALTER TABLE evidence_embeddings ADD COLUMN probe_note text;"
        )
        async with db.acquire() as conn:
            space = await _space(conn, team)
            await _detach_as_before_0083(conn, space)
            # the store as it was before db/0083 (its table and its history row gone),
            # with a migration after it pending
            await conn.execute("DROP TABLE vector_deferrals")
            await conn.execute("DELETE FROM schema_migrations WHERE version = 83")
            with pytest.raises(MigrationError) as caught:
                await migrations.migrate(conn, folder)
            assert f"space 'shared' of team '{team}'" in caught.value.message
            assert [m.name for m in await migrations.pending(conn, folder)] == ["probe"]
        await _build(db)
        async with db.acquire() as conn:
            assert [m.name for m in await migrations.migrate(conn, folder)] == ["probe"]
    finally:
        await db.close()
