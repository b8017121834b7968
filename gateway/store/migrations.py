"""A small migration runner over asyncpg.

Why not a library: the well-kept SQL migration tools (yoyo, alembic) need a
synchronous driver (psycopg) that the gateway does not otherwise use, and our
migrations are plain ordered SQL files. The runner is idempotent, records each
applied file with its SHA-256 in ``schema_migrations``, refuses a file that
changed after it was applied, and serialises concurrent runs with an advisory
lock. Each file runs in its own transaction with its bookkeeping row.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

from gateway.errors import MigrationError
from gateway.store import vector_partitions
from gateway.store.connection import Conn

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# An arbitrary constant: the key of the advisory lock that serialises migrators.
_LOCK_KEY = 7_202_612_020


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations_dir() -> Path:
    """The SQL files: packaged in the wheel, or the repository's ``db/`` folder."""
    packaged = resources.files("gateway") / "_migrations"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "db"


def discover(folder: Path | None = None) -> list[Migration]:
    folder = folder or migrations_dir()
    found: list[Migration] = []
    for path in sorted(folder.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration file name {path.name!r} is not NNNN_name.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if len(versions) != len(set(versions)):
        raise MigrationError("two migration files share a version number")
    if not found:
        raise MigrationError(f"no migrations found in {folder}")
    return found


_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


async def applied(conn: Conn) -> dict[int, str]:
    """Applied versions and their checksums; empty when the table is missing."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return {}
    rows = await conn.fetch("SELECT version, sha256 FROM schema_migrations")
    return {r["version"]: r["sha256"] for r in rows}


def check_history(done: dict[int, str], known: list[Migration]) -> list[Migration]:
    """The migrations still to apply; raises if the history disagrees with the files."""
    by_version = {m.version: m for m in known}
    for version, digest in done.items():
        m = by_version.get(version)
        if m is None:
            raise MigrationError(
                f"the database has migration {version:04d}, which this gateway does not know: "
                "is the gateway older than the database?"
            )
        if m.sha256 != digest:
            raise MigrationError(
                f"migration {version:04d}_{m.name}.sql changed after it was applied; "
                "write a new migration instead of editing an applied one"
            )
    return [m for m in known if m.version not in done]


async def migrate(conn: Conn, folder: Path | None = None) -> list[Migration]:
    """Apply what is pending; returns what was applied (empty when current)."""
    known = discover(folder)
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(_BOOKKEEPING)
        pending = check_history(await applied(conn), known)
        await _record_unrecorded(conn)
        for m in pending:
            # before each: db/0083 (vector_deferrals) may have been applied just now
            await _record_unrecorded(conn)
            await _refuse_while_detached(conn)
            try:
                async with conn.transaction():
                    await conn.execute(m.sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name, sha256) VALUES ($1, $2, $3)",
                        m.version,
                        m.name,
                        m.sha256,
                    )
            except asyncpg.PostgresError as exc:
                raise MigrationError(
                    f"migration {m.version:04d}_{m.name}.sql failed: {exc}"
                ) from exc
        return pending
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)


async def _record_unrecorded(conn: Conn) -> None:
    """Record the vector tables a ``load --index-after`` from before db/0083
    detached (:func:`gateway.store.vector_partitions.record_unrecorded`), so that
    ``build-vector-indexes`` finishes them and no migration runs past them."""
    async with conn.transaction():
        await vector_partitions.record_unrecorded(conn)


async def _refuse_while_detached(conn: Conn) -> None:
    """A migration changes the vector tables' parents and their partitions, not a
    table ``load --index-after`` detached: attaching it after would fail (a new
    column) or keep an obsolete constraint beside the new one (a changed foreign
    key). So nothing is migrated while such tables wait for their index."""
    spaces = await vector_partitions.deferred_spaces(conn)
    if spaces:
        raise MigrationError(
            f"not migrating, a migration would miss them: {vector_partitions.pending_message(spaces)}"
            ", then migrate"
        )


async def pending(conn: Conn, folder: Path | None = None) -> list[Migration]:
    """What :func:`migrate` would apply; raises if the history disagrees."""
    return check_history(await applied(conn), discover(folder))
