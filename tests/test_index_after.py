"""``load --index-after``: vectors indexed once at the end, into empty spaces only.

Each test loads supplied vectors into its own team on the real PostgreSQL and
checks the catalogue (detached, then attached with an HNSW index), the rows
against a load through the default path, the refusals, and a load aborted
between batches that a second run (or ``build-vector-indexes``) finishes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import numpy as np
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.services import loader, vector_indexes
from gateway.services.writes import WriteService
from gateway.store import vector_partitions
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import unique
from .factories import jsonl
from .held_loads import StopAfter, Stopped

_DOCS = 30


def _unit(seed: int) -> list[float]:
    row = np.random.default_rng(seed).standard_normal(384)
    return [float(x) for x in row / np.linalg.norm(row)]


def _records(team: str, model: str, docs: int = _DOCS, start: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"kind": "embedding_model", "model": model, "dimensions": 384}]
    if start == 0:
        out += [
            {"kind": "team", "id": team, "name": "Index after"},
            {"kind": "principal", "team": team, "id": "ann", "display_name": "Ann"},
            {"kind": "source", "team": team, "id": "s", "type": "document", "title": "Doc"},
            {"kind": "entity", "team": team, "id": "e", "name": "Engine"},
        ]
    for i in range(start, start + docs):
        out.append(
            {
                "kind": "evidence",
                "team": team,
                "id": f"ev{i}",
                "source": "s",
                "content": f"Engine note {i}: the pump runs at {i} rpm.",
                "embedding": _unit(i),
            }
        )
        out.append(
            {
                "kind": "relationship",
                "team": team,
                "id": f"r{i}",
                "subject": "e",
                "predicate": "runs_at",
                "object_value": f"{i} rpm",
                "owner": "ann",
                "supports": [{"id": f"sup{i}", "evidence": f"ev{i}"}],
                "embedding": _unit(1000 + i),
            }
        )
    return out


def _parsed(lines: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    return loader.parse(loader.split_lines(jsonl(lines)))


async def _build(db: Database, progress: list[int] | None = None) -> vector_indexes.IndexReport:
    items = await vector_indexes.pending(db)
    return await vector_indexes.build_pending(
        db,
        items,
        maintenance_work_mem_mb=64,
        workers=1,
        progress=None if progress is None else progress.append,
    )


async def _space(conn: Conn, team: str) -> UUID:
    space = await conn.fetchval(
        "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", team
    )
    assert isinstance(space, UUID)
    return space


async def _vectors(conn: Conn, table: str, key: str, team: str) -> dict[str, Any]:
    rows = await conn.fetch(f"SELECT {key} AS id, embedding FROM {table} WHERE team_id = $1", team)
    return {r["id"]: r["embedding"].to_numpy() for r in rows}


async def _state(conn: Conn, space: UUID) -> Iterator[tuple[str, bool, list[str]]]:
    """(table, attached, its index access methods) of the space's vector tables."""
    out = []
    for parent in vector_partitions.VECTOR_TABLES:
        table = vector_partitions.partition_name(parent, space)
        attached = await conn.fetchval(
            "SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)", table
        )
        methods = await conn.fetch(
            "SELECT a.amname, i.indisvalid FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam "
            "WHERE i.indrelid = to_regclass($1) ORDER BY a.amname",
            table,
        )
        out.append((table, attached, [f"{m['amname']}:{m['indisvalid']}" for m in methods]))
    return iter(out)


async def _constraints(conn: Conn, table: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT contype, pg_get_constraintdef(oid) AS def FROM pg_constraint "
        "WHERE conrelid = to_regclass($1) ORDER BY 1, 2",
        table,
    )
    return [f"{r['contype']} {r['def']}" for r in rows]


async def _neighbours(conn: Conn, team: str, space: UUID, seed: int) -> list[str]:
    """The vector list as recall reads it, through the partition's HNSW index."""
    rows = await conn.fetch(
        "SELECT evidence_id FROM evidence_vector_candidates($1, $2, 1, $3, 10, "
        "NULL, ARRAY[]::text[], 0)",
        team,
        space,
        np.array(_unit(seed), dtype=np.float32),
    )
    return [r["evidence_id"] for r in rows]


async def test_index_after_stores_the_same_vectors_and_attaches_indexed_partitions(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn
) -> None:
    plain, after = unique("ixplain"), unique("ixafter")
    await loader.load(writes, _parsed(_records(plain, embedder.model)), batch_size=20)
    report = await loader.load(
        writes, _parsed(_records(after, embedder.model)), batch_size=20, index_after=True
    )
    assert report.created["evidence"] == _DOCS
    space = await _space(admin_conn, after)
    # Between the load and the build: detached, without an HNSW index, unreadable
    # through the parent (recall's vector list is empty, its full text is not).
    for _table, attached, methods in await _state(admin_conn, space):
        assert attached is False
        assert all(not m.startswith("hnsw") for m in methods)
    assert await _vectors(admin_conn, "evidence_embeddings", "evidence_id", after) == {}
    assert await _neighbours(admin_conn, after, space, 3) == []
    pending = {(d.parent, d.space, d.rows) for d in await vector_indexes.pending(writes.db)}
    assert ("evidence_embeddings", space, _DOCS) in pending
    assert ("relationship_embeddings", space, _DOCS) in pending

    shown: list[int] = []
    built = await _build(writes.db, shown)
    assert built.vectors >= 2 * _DOCS and sum(shown) == built.vectors
    assert await vector_indexes.pending(writes.db) == []

    plain_space = await _space(admin_conn, plain)
    for (table, attached, methods), (other, _, other_methods) in zip(
        await _state(admin_conn, space), await _state(admin_conn, plain_space), strict=True
    ):
        assert attached is True
        assert methods == other_methods and "hnsw:True" in methods
        mine = [c.replace(space.hex, "S") for c in await _constraints(admin_conn, table)]
        theirs = [c.replace(plain_space.hex, "S") for c in await _constraints(admin_conn, other)]
        assert mine == theirs
    for table, key in (
        ("evidence_embeddings", "evidence_id"),
        ("relationship_embeddings", "relationship_id"),
    ):
        a = await _vectors(admin_conn, table, key, plain)
        b = await _vectors(admin_conn, table, key, after)
        assert a.keys() == b.keys() and len(a) == _DOCS
        assert all(np.array_equal(a[k], b[k]) for k in a)
    for seed in (3, 17, 29):
        expected = await _neighbours(admin_conn, plain, plain_space, seed)
        assert await _neighbours(admin_conn, after, space, seed) == expected
        assert expected[0] == f"ev{seed}"


async def test_a_space_whose_vectors_readers_find_is_refused_and_kept(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn
) -> None:
    team = unique("ixfull")
    await loader.load(writes, _parsed(_records(team, embedder.model, docs=5)), batch_size=50)
    more = _records(team, embedder.model, docs=5, start=5)
    with pytest.raises(loader.LoadError) as caught:
        await loader.load(writes, _parsed(more), batch_size=50, index_after=True)
    error = caught.value.errors[0]
    assert error.code == "SPACE_HAS_VECTORS"
    assert f"space 'shared' of team '{team}' already holds vectors" in error.message
    space = await _space(admin_conn, team)
    for _table, attached, methods in await _state(admin_conn, space):
        assert attached is True and "hnsw:True" in methods
    assert len(await _vectors(admin_conn, "evidence_embeddings", "evidence_id", team)) == 5
    assert await admin_conn.fetchval("SELECT count(*) FROM evidence WHERE team_id = $1", team) == 5


async def test_a_load_aborted_between_batches_loses_nothing_and_a_rerun_finishes(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn
) -> None:
    team = unique("ixcrash")
    lines = _records(team, embedder.model)
    with pytest.raises(Stopped):
        await loader.load(
            writes, _parsed(lines), batch_size=20, index_after=True, progress=StopAfter(batches=2)
        )
    space = await _space(admin_conn, team)
    held = await admin_conn.fetchval(
        f'SELECT count(*) FROM "{vector_partitions.partition_name("evidence_embeddings", space)}"'
    )
    written = await admin_conn.fetchval("SELECT count(*) FROM evidence WHERE team_id = $1", team)
    assert 0 < held == written < _DOCS, "every committed evidence has its vector, detached"

    # Meanwhile a write through the default path (a remember, a plain load) is refused
    # with a stable code, writes nothing, and names the way out.
    extra = [
        lines[0],
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-extra",
            "source": "s",
            "content": "Written while the index waits.",
            "embedding": _unit(5000),
        },
    ]
    with pytest.raises(loader.LoadError) as caught:
        await loader.load(writes, _parsed(extra), batch_size=50)
    assert caught.value.errors[0].code == "VECTOR_INDEX_PENDING"
    assert "build-vector-indexes" in caught.value.errors[0].message
    assert (
        await admin_conn.fetchval(
            "SELECT count(*) FROM evidence WHERE team_id = $1 AND id = 'ev-extra'", team
        )
        == 0
    )

    # The application role cannot read the detached table at all.
    async with admin_conn.transaction():
        await admin_conn.execute("SET LOCAL ROLE recall_app")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await admin_conn.fetchval(
                f'SELECT count(*) FROM "{vector_partitions.partition_name("evidence_embeddings", space)}"'
            )

    # The same load again: what was committed is skipped, the rest written, then built.
    again = await loader.load(writes, _parsed(lines), batch_size=20, index_after=True)
    assert again.unchanged["evidence"] == written
    assert again.created["evidence"] == _DOCS - written
    await _build(writes.db)
    for _table, attached, methods in await _state(admin_conn, space):
        assert attached is True and "hnsw:True" in methods
    assert len(await _vectors(admin_conn, "evidence_embeddings", "evidence_id", team)) == _DOCS
    assert len(await _vectors(admin_conn, "relationship_embeddings", "relationship_id", team)) == (
        _DOCS
    )
    assert (await _neighbours(admin_conn, team, space, 11))[0] == "ev11"
    # and now the default path writes into the space again
    report = await loader.load(writes, _parsed(extra), batch_size=50)
    assert report.created["evidence"] == 1


def test_the_command_loads_then_indexes_and_the_finishing_command_is_idle_after(
    dsn: str, embedder: EmbeddingProvider, tmp_path: Path
) -> None:
    from .test_cli import run

    team = unique("ixcli")
    path = tmp_path / "memory.jsonl"
    path.write_text(jsonl(_records(team, embedder.model, docs=8)))
    result = run(["load", "--index-after", str(path)], dsn)
    assert result.returncode == 0, result.stderr
    assert re.search(r"indexed \d+ vector\(s\) of \d+ table\(s\)", result.stdout), result.stdout
    finish = run(["build-vector-indexes"], dsn)
    assert finish.returncode == 0, finish.stderr
    assert finish.stdout == ""


def _kill_once_rows_are_committed(path: Path, dsn: str) -> int:
    """Run ``load --index-after`` and SIGKILL it at its first progress line that
    counts committed records past the team and principal (a batch of their own,
    before any vector); returns its exit status."""
    from .test_cli import CLI

    environ = {k: v for k, v in os.environ.items() if k != "RECALL_DATABASE_URL"}
    environ.update(DATABASE_URL=dsn, RECALL_LOAD_PROGRESS_INTERVAL_S="0.01")
    proc = subprocess.Popen(
        [*CLI, "load", "--index-after", "--batch-size", "10", str(path)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=environ,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            match = re.match(r"loading: ([\d,]+)/", line)
            if match and int(match.group(1).replace(",", "")) > 2:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    return proc.returncode


async def test_a_killed_load_is_finished_by_running_it_again(
    dsn: str, embedder: EmbeddingProvider, admin_conn: Conn, tmp_path: Path
) -> None:
    """SIGKILL in the middle of a load (whatever its batch was doing): every
    committed evidence keeps its vector, detached; the same command again
    finishes the rows and the indexes."""
    from .test_cli import run

    team = unique("ixkill")
    docs = 300
    path = tmp_path / "memory.jsonl"
    path.write_text(jsonl(_records(team, embedder.model, docs=docs)))
    assert _kill_once_rows_are_committed(path, dsn) == -signal.SIGKILL
    space = await _space(admin_conn, team)
    table = vector_partitions.partition_name("evidence_embeddings", space)
    written = await admin_conn.fetchval("SELECT count(*) FROM evidence WHERE team_id = $1", team)
    assert 0 < written < docs, "killed in the middle"
    assert await admin_conn.fetchval(f'SELECT count(*) FROM "{table}"') == written
    assert (
        await admin_conn.fetchval(
            "SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)", table
        )
        is False
    )

    again = run(["load", "--index-after", "--batch-size", "10", str(path)], dsn)
    assert again.returncode == 0, again.stderr
    assert "indexed" in again.stdout
    for _table, attached, methods in await _state(admin_conn, space):
        assert attached is True and "hnsw:True" in methods
    assert len(await _vectors(admin_conn, "evidence_embeddings", "evidence_id", team)) == docs
