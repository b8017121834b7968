"""The per-space lexeme statistics kept by the write path (db/0106).

The current view's BM25 reads each query lexeme's document frequency and
largest term frequency from ``evidence_lexeme_stats`` and
``relationship_lexeme_stats`` (sharded running totals, summed at read time)
instead of counting the postings. They must be exactly what that count gave:
per (team, space, lexeme), the number of postings and their largest ``tf``,
over every generation. Checked here after loads of several statements, single
writes through the API, concurrent loads into one space, in shared and private
spaces; a broken trigger (each way it could go wrong) is caught by the same
comparison; and the rows are walled like the postings. The lists themselves
are compared with BM25 over every document in ``tests/test_bm25_top_k.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.services.writes import WriteService
from gateway.store import migrations
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_mutations import incident_memory, remember
from .test_recall import token

# (statistics table, postings table, postings' document column, document table)
_TABLES = (
    ("evidence_lexeme_stats", "evidence_terms", "evidence_id", "evidence"),
    ("relationship_lexeme_stats", "relationship_terms", "relationship_id", "relationships"),
)


async def _mismatches(conn: Conn, team: str) -> dict[str, int]:
    """Per statistics table: the (space, lexeme) rows where the kept df or max_tf
    differs from a count of the postings (0 each), and the number compared."""
    out: dict[str, int] = {}
    for stats, terms, _, _ in _TABLES:
        counted = (
            f"SELECT space_id, lexeme, count(*) AS df, max(tf) AS max_tf FROM {terms} "
            "WHERE team_id = $1 GROUP BY space_id, lexeme"
        )
        kept = (
            f"SELECT space_id, lexeme, sum(df)::bigint AS df, max(max_tf) AS max_tf FROM {stats} "
            "WHERE team_id = $1 GROUP BY space_id, lexeme"
        )
        out[f"{stats} differ"] = await conn.fetchval(
            f"SELECT count(*) FROM ((({counted}) EXCEPT ({kept})) "
            f"UNION ALL (({kept}) EXCEPT ({counted}))) x",
            team,
        )
        out[f"{stats} compared"] = await conn.fetchval(f"SELECT count(*) FROM ({counted}) x", team)
    return out


def _notes(team: str, prefix: str, n: int, space: str = "shared") -> str:
    """``n`` evidence of a source of their own in ``space`` (``shared`` or
    ``private:<principal>``), each supporting a relationship, their words shared
    so that every statement adds to the rows of the others (team_records' team,
    entities and principals)."""
    shared = space == "shared"
    records: list[dict[str, Any]] = [
        {
            "kind": "source",
            "team": team,
            "id": f"{prefix}src",
            "space": space,
            "type": "document",
            "title": f"Notes {prefix}",
        }
    ]
    if not shared:
        records.append(
            {
                "kind": "entity",
                "team": team,
                "id": f"{prefix}billing",
                "space": space,
                "name": "Billing service",
                "type": "system",
            }
        )
    for i in range(n):
        words = " ".join(["billing"] * (1 + i % 3))
        records += [
            {
                "kind": "evidence",
                "team": team,
                "id": f"{prefix}ev{i}",
                "source": f"{prefix}src",
                "content": f"Note {i}: the {words} service retries the hub every {i % 7} minutes.",
            },
            {
                "kind": "relationship",
                "team": team,
                "id": f"{prefix}rel{i}",
                "space": space,
                **({"owner": "alice"} if shared else {}),
                "subject": "billing" if shared else f"{prefix}billing",
                "predicate": "notes",
                "object_value": f"{words} retries {i % 5} {prefix}",
                "supports": [{"id": f"{prefix}sup{i}", "evidence": f"{prefix}ev{i}"}],
            },
        ]
    return jsonl(records)


def _assert_exact(found: dict[str, int]) -> None:
    for name, n in found.items():
        if name.endswith("compared"):
            assert n > 0, f"{name}: the comparison saw no rows"
        else:
            assert n == 0, f"{name}: {n}"


async def test_statistics_are_the_count_of_the_postings(
    client: httpx.AsyncClient, writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("lexstat")
    await load_jsonl(writes, jsonl(team_records(team)))
    # Batches of 10 records: many statements, each adding to the others' lexemes.
    await load_jsonl(writes, _notes(team, "a-", 30), batch_size=10)
    # Two loads at once into the same space (other connections, other shards).
    await asyncio.gather(
        load_jsonl(writes, _notes(team, "b-", 20), batch_size=8),
        load_jsonl(writes, _notes(team, "c-", 20), batch_size=8),
    )
    # Single writes through the API, shared and private.
    tok = await token(writes, team, "bob")
    for suffix, space in (("-a", "SHARED"), ("-b", "PRIVATE")):
        body = await remember(client, tok, incident_memory(space, suffix))
        assert "errors" not in body, body
    _assert_exact(await _mismatches(admin_conn, team))
    # Several statements did add to one lexeme's row (else a trigger that overwrote
    # its row would pass the comparison above).
    for stats, _, _, _ in _TABLES:
        many = await admin_conn.fetchval(f"SELECT max(df) FROM {stats} WHERE team_id = $1", team)
        assert many > 10, stats


# Each breaks the statistics trigger in one way it could go wrong.
BREAKAGES = {
    "df overwritten instead of added": ("df = s.df + excluded.df", "df = excluded.df"),
    "max_tf not raised": ("greatest(s.max_tf, excluded.max_tf)", "excluded.max_tf"),
    "a statement counted once per lexeme": ("count(*)", "1"),
    "a statement's smallest tf kept for its largest": ("max(n.tf)", "min(n.tf)"),
}


async def _insert_postings(conn: Conn, team: str, table: int) -> None:
    """Postings of a new lexeme for documents already stored, in two statements of
    several rows each: three documents with tf 3, 2 and 3, then two more with tf 1.
    The first statement's tfs differ, so that a trigger keeping a statement's
    smallest tf where its largest belongs is caught (2 kept, 3 counted)."""
    _, terms, key, documents = _TABLES[table]
    docs = await conn.fetch(
        f"SELECT team_id, space_id, id, recorded_at FROM {documents} WHERE team_id = $1 "
        "ORDER BY space_id, id LIMIT 5",
        team,
    )
    assert len(docs) == 5
    for part, tfs in ((docs[:3], [3, 2, 3]), (docs[3:], [1, 1])):
        await conn.execute(
            f"INSERT INTO {terms} (team_id, space_id, lexeme, {key}, tf, recorded_at) "
            f"SELECT d.team_id, d.space_id, 'zzlexstat', d.id, p.tf, d.recorded_at "
            f"FROM {documents} d JOIN unnest($2::text[], $3::integer[]) AS p (id, tf) "
            "ON p.id = d.id WHERE d.team_id = $1",
            team,
            [d["id"] for d in part],
            tfs,
        )


@pytest.mark.parametrize("table", [0, 1], ids=["evidence", "relationships"])
@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
async def test_a_broken_trigger_is_caught(
    writes: WriteService, admin_conn: Conn, table: int, breakage: str
) -> None:
    """The comparison above fails when the trigger is wrong: the trigger function
    replaced by a broken copy and postings inserted, in a transaction rolled back;
    the real trigger, with the same postings, passes it."""
    stats = _TABLES[table][0]
    function = stats.replace("_stats", "_stats_add")
    team = unique("lexbroken")
    await load_jsonl(writes, jsonl(team_records(team)))
    await load_jsonl(writes, _notes(team, "a-", 6))
    definition = await admin_conn.fetchval(f"SELECT pg_get_functiondef('{function}'::regproc)")
    old, new = BREAKAGES[breakage]
    assert old in definition, old
    for broken in (False, True):
        tx = admin_conn.transaction()
        await tx.start()
        try:
            if broken:
                await admin_conn.execute(definition.replace(old, new))
            await _insert_postings(admin_conn, team, table)
            found = await _mismatches(admin_conn, team)
        finally:
            await tx.rollback()
        assert (found[f"{stats} differ"] > 0) == broken, (breakage, broken, found)


async def test_statistics_are_walled_like_the_postings(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """The application role sees the rows of its team's allowed spaces only."""
    team_a, team_b = unique("lexwall-a"), unique("lexwall-b")
    await load_jsonl(writes, jsonl(team_records(team_a) + team_records(team_b)))
    spaces = {
        r["owner"]: r["id"]
        for r in await admin_conn.fetch(
            "SELECT owner_principal_id AS owner, id FROM memory_spaces WHERE team_id = $1",
            team_a,
        )
    }
    for stats, _, _, _ in _TABLES:
        seen = f"SELECT DISTINCT team_id, space_id FROM {stats}"
        async with db.tenant(team_a, [spaces[None]]) as conn:
            assert {tuple(r) for r in await conn.fetch(seen)} == {(team_a, spaces[None])}
        async with db.tenant(team_b, [spaces[None]]) as conn:
            assert await conn.fetch(seen) == []
        private = await admin_conn.fetchval(
            f"SELECT count(*) FROM {stats} WHERE space_id = $1", spaces["alice"]
        )
        assert private > 0 or stats.startswith("relationship")


@pytest.mark.parametrize("table", [0, 1], ids=["evidence", "relationships"])
async def test_owner_delete_and_update_of_postings_keep_them_exact(
    writes: WriteService, admin_conn: Conn, table: int
) -> None:
    """db/0107: an owner's DELETE or UPDATE of postings recounts the lexemes it
    touched (df and max_tf exact again), and a lexeme left with no posting has no
    row. Each change is checked against a count of the postings."""
    stats, terms, key, _ = _TABLES[table]
    team = unique("lexdel")
    await load_jsonl(writes, jsonl(team_records(team)))
    await load_jsonl(writes, _notes(team, "a-", 8), batch_size=4)
    await _insert_postings(admin_conn, team, table)  # 'zzlexstat': tf 3, 2, 3, 1, 1
    one = await admin_conn.fetchval(
        f"SELECT {key} FROM {terms} WHERE team_id = $1 AND lexeme = 'zzlexstat' AND tf = 3 "
        f"ORDER BY {key} LIMIT 1",
        team,
    )
    changes = (
        # one posting of a lexeme others share: df down by one
        (f"DELETE FROM {terms} WHERE team_id = $1 AND lexeme = 'zzlexstat' AND {key} = $2", one),
        # tf lowered: the largest tf goes down, an upper bound would not
        f"UPDATE {terms} SET tf = 2 WHERE team_id = $1 AND lexeme = 'zzlexstat' AND tf = 3",
        # a posting moved to another lexeme: one down, one up
        (
            f"UPDATE {terms} SET lexeme = 'zzlexmoved' WHERE team_id = $1 "
            f"AND lexeme = 'zzlexstat' AND tf = 1 AND {key} = (SELECT min({key}) FROM {terms} "
            "WHERE team_id = $1 AND lexeme = 'zzlexstat' AND tf = 1)"
        ),
        # every posting of a document's lexemes at once (many lexemes, several statements' rows)
        f"DELETE FROM {terms} WHERE team_id = $1 AND {key} = (SELECT max({key}) FROM {terms} "
        "WHERE team_id = $1)",
        # the lexeme's last postings: no row left for it
        f"DELETE FROM {terms} WHERE team_id = $1 AND lexeme IN ('zzlexstat', 'zzlexmoved')",
    )
    for change in changes:
        sql, *args = change if isinstance(change, tuple) else (change,)
        status = await admin_conn.execute(sql, team, *args)
        assert not status.endswith(" 0"), (sql, status)
        _assert_exact(await _mismatches(admin_conn, team))
    assert not await admin_conn.fetchval(
        f"SELECT count(*) FROM {stats} WHERE team_id = $1 AND lexeme LIKE 'zzlex%'", team
    )


async def test_truncate_of_postings_empties_their_statistics(
    writes: WriteService, admin_conn: Conn
) -> None:
    """db/0107: TRUNCATE of a postings table (docs/data-model.md tells the owner to
    name them in a TRUNCATE of documents) leaves no statistics row behind; in a
    transaction rolled back, so other tests' data stays."""
    team = unique("lextrunc")
    await load_jsonl(writes, jsonl(team_records(team)))
    await load_jsonl(writes, _notes(team, "a-", 4))
    for stats, terms, _, _ in _TABLES:
        tx = admin_conn.transaction()
        await tx.start()
        try:
            assert await admin_conn.fetchval(f"SELECT count(*) FROM {stats}")
            await admin_conn.execute(f"TRUNCATE {terms}")
            left = await admin_conn.fetchval(f"SELECT count(*) FROM {stats}")
        finally:
            await tx.rollback()
        assert left == 0, (terms, left)


async def test_statistics_reference_their_space(writes: WriteService, admin_conn: Conn) -> None:
    """db/0107: a statistics row must name an existing space (as db/0002's
    evidence_search_stats must), so a TRUNCATE of spaces CASCADE reaches them."""
    team = unique("lexfk")
    await load_jsonl(writes, jsonl(team_records(team)))
    for stats, _, _, _ in _TABLES:
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            await admin_conn.execute(
                f"INSERT INTO {stats} (team_id, space_id, lexeme, shard, df, max_tf) "
                "VALUES ($1, gen_random_uuid(), 'zzlexfk', 0, 1, 1)",
                team,
            )


async def test_rebuild_recounts_the_statistics(writes: WriteService, admin_conn: Conn) -> None:
    """db/0107's recall_rebuild_lexeme_stats() puts back exact rows after they were
    made wrong behind the triggers' back."""
    team = unique("lexrebuild")
    await load_jsonl(writes, jsonl(team_records(team)))
    await load_jsonl(writes, _notes(team, "a-", 6), batch_size=3)
    for stats, _, _, _ in _TABLES:
        await admin_conn.execute(
            f"UPDATE {stats} SET df = df + 3, max_tf = max_tf + 1 WHERE team_id = $1", team
        )
    broken = await _mismatches(admin_conn, team)
    assert all(n > 0 for n in broken.values()), broken
    await admin_conn.execute("SELECT recall_rebuild_lexeme_stats()")
    _assert_exact(await _mismatches(admin_conn, team))


def _backfill_of_0106() -> str:
    """db/0106's count of the postings already stored, as the migration runs it:
    its text from the lock of the postings tables up to the creation of the
    triggers (the two INSERT ... SELECT of the statistics)."""
    text = (migrations.migrations_dir() / "0106_lexeme_statistics.sql").read_text("utf-8")
    start = text.index("LOCK TABLE evidence_terms, relationship_terms")
    end = text.index("CREATE TRIGGER", start)
    backfill = text[start:end]
    assert backfill.count("INSERT INTO") == 2, backfill
    return backfill


async def test_backfill_and_rebuild_count_a_store_that_holds_postings(
    fresh_dsn: str, embedder: EmbeddingProvider
) -> None:
    """db/0106's backfill (the migration applied to a store that already holds
    postings) and db/0107's recall_rebuild_lexeme_stats(), each run on a store of
    two teams with postings in several spaces each (shared, two private ones),
    written by many statements of two backends at once: emptied statistics are counted back exactly, as one row per (space, lexeme)
    in shard 0, committed (the deferred foreign key checked), and writes after
    it add to those rows. A database of the test's own: the count covers every
    posting of the store, and nothing else writes meanwhile."""
    db = await Database.open(fresh_dsn, min_size=1, max_size=4)
    try:
        writes = WriteService(db, embedder)
        teams = (unique("lexfill-a"), unique("lexfill-b"))
        for team in teams:
            await load_jsonl(writes, jsonl(team_records(team)))
            await asyncio.gather(
                load_jsonl(writes, _notes(team, "a-", 12), batch_size=4),
                load_jsonl(writes, _notes(team, "b-", 8, "private:bob"), batch_size=4),
            )
        async with db.acquire() as conn:
            for _, terms, _, _ in _TABLES:
                spaces = await conn.fetch(
                    f"SELECT team_id, count(DISTINCT space_id) AS n FROM {terms} GROUP BY 1"
                )
                assert {r["team_id"]: r["n"] for r in spaces} == {t: 3 for t in teams}, terms
            for way in ("db/0106's backfill", "recall_rebuild_lexeme_stats()"):
                async with conn.transaction():
                    for stats, _, _, _ in _TABLES:
                        await conn.execute(f"DELETE FROM {stats}")
                    assert (await _mismatches(conn, teams[0]))["evidence_lexeme_stats differ"]
                    if way.startswith("db/0106"):
                        await conn.execute(_backfill_of_0106())
                    else:
                        await conn.execute("SELECT recall_rebuild_lexeme_stats()")
                for team in teams:
                    _assert_exact(await _mismatches(conn, team))
                for stats, terms, _, _ in _TABLES:
                    rows = await conn.fetchrow(
                        f"SELECT count(*) AS n, count(*) FILTER (WHERE shard <> 0) AS sharded, "
                        f"count(DISTINCT team_id) AS teams FROM {stats}"
                    )
                    assert rows is not None
                    keys = await conn.fetchval(
                        f"SELECT count(*) FROM (SELECT DISTINCT team_id, space_id, lexeme "
                        f"FROM {terms}) k"
                    )
                    assert (rows["n"], rows["sharded"], rows["teams"]) == (keys, 0, 2), (way, stats)
        # the triggers add to the counted rows
        await load_jsonl(writes, _notes(teams[1], "c-", 6), batch_size=3)
        async with db.acquire() as conn:
            for team in teams:
                _assert_exact(await _mismatches(conn, team))
    finally:
        await db.close()


async def _stats_rows(conn: Conn, stats: str) -> dict[tuple[Any, ...], set[tuple[Any, ...]]]:
    """Every row of ``stats`` by key (team, space, lexeme): its shard, counts, and
    where and by which transaction it was written (a rewrite changes both)."""
    rows = await conn.fetch(
        f"SELECT team_id, space_id, lexeme, shard, df, max_tf, xmin::text AS x, ctid::text AS c "
        f"FROM {stats}"
    )
    out: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
    for r in rows:
        out.setdefault((r["team_id"], r["space_id"], r["lexeme"]), set()).add(
            (r["shard"], r["df"], r["max_tf"], r["x"], r["c"])
        )
    return out


async def _damage(conn: Conn, stats: str, team: str, seed: int) -> set[tuple[Any, ...]]:
    """Make some keys of ``team`` wrong behind the triggers' back, each way a key can
    be wrong, and spread one right key over two shards (right sums: it must be
    left alone). Returns the damaged keys."""
    keys = await conn.fetch(
        f"SELECT team_id, space_id, lexeme, sum(df) AS df FROM {stats} WHERE team_id = $1 "
        "GROUP BY 1, 2, 3 ORDER BY md5(lexeme || $2), 1, 2, 3",
        team,
        str(seed),
    )
    assert len(keys) >= 12, len(keys)
    damaged: set[tuple[Any, ...]] = set()

    def key(r: asyncpg.Record) -> tuple[Any, ...]:
        return (r["team_id"], r["space_id"], r["lexeme"])

    where = "team_id = $1 AND space_id = $2 AND lexeme = $3"
    for r in keys[0:3]:  # df too large: changed
        await conn.execute(f"UPDATE {stats} SET df = df + 2 WHERE {where}", *key(r))
        damaged.add(key(r))
    for r in keys[3:6]:  # max_tf too large: changed
        await conn.execute(f"UPDATE {stats} SET max_tf = max_tf + 1 WHERE {where}", *key(r))
        damaged.add(key(r))
    for r in keys[6:9]:  # rows lost: to be added
        await conn.execute(f"DELETE FROM {stats} WHERE {where}", *key(r))
        damaged.add(key(r))
    space = keys[0]["space_id"]
    for lexeme in ("zzghost-a", "zzghost-b"):  # rows of no posting: to be deleted
        await conn.execute(
            f"INSERT INTO {stats} (team_id, space_id, lexeme, shard, df, max_tf) "
            "VALUES ($1, $2, $3, 3, 2, 1)",
            team,
            space,
            lexeme,
        )
        damaged.add((team, space, lexeme))
    spread = await conn.fetchrow(  # a right key of one row, to spread over two shards
        f"SELECT team_id, space_id, lexeme, shard FROM {stats} WHERE team_id = $1 AND df >= 2 "
        "AND shard < 7 AND lexeme NOT LIKE 'zzghost%' AND NOT (lexeme = ANY ($2::text[])) "
        f"AND NOT EXISTS (SELECT 1 FROM {stats} o WHERE o.team_id = {stats}.team_id "
        f"AND o.space_id = {stats}.space_id AND o.lexeme = {stats}.lexeme AND o.shard = 7) "
        "ORDER BY lexeme LIMIT 1",
        team,
        [r["lexeme"] for r in keys[:9]],
    )
    assert spread is not None
    await conn.execute(
        f"UPDATE {stats} SET df = df - 1 WHERE {where} AND shard = $4",
        *key(spread),
        spread["shard"],
    )
    await conn.execute(
        f"INSERT INTO {stats} (team_id, space_id, lexeme, shard, df, max_tf) "
        "VALUES ($1, $2, $3, 7, 1, 1)",  # a shard every version of the table allows
        *key(spread),
    )
    return damaged


async def test_rebuild_writes_only_the_keys_that_differ(
    fresh_dsn: str, embedder: EmbeddingProvider
) -> None:
    """db/0161: recall_rebuild_lexeme_stats() on a store of two teams with postings
    in several spaces (shared and two private ones each), whose statistics were
    made wrong in every way a key can be (counts too large, rows lost, rows of no
    posting) and one right key spread over two shards: afterwards every key sums
    to the count of its postings (what db/0107's full rewrite gave), each damaged
    key is one row in shard 0 (or none), and every other row is the very row it
    was (same transaction, same place: not rewritten). Run again, it writes
    nothing."""
    db = await Database.open(fresh_dsn, min_size=1, max_size=4)
    try:
        writes = WriteService(db, embedder)
        teams = (unique("lexdiff-a"), unique("lexdiff-b"))
        for team in teams:
            await load_jsonl(writes, jsonl(team_records(team)))
            await asyncio.gather(
                load_jsonl(writes, _notes(team, "a-", 10), batch_size=4),
                load_jsonl(writes, _notes(team, "b-", 6, "private:bob"), batch_size=3),
            )
        async with db.acquire() as conn:
            damaged: dict[str, set[tuple[Any, ...]]] = {}
            for i, (stats, _, _, _) in enumerate(_TABLES):
                damaged[stats] = set()
                for j, team in enumerate(teams):
                    damaged[stats] |= await _damage(conn, stats, team, 10 * i + j)
            for team in teams:
                found = await _mismatches(conn, team)
                assert all(found[f"{s} differ"] for s, _, _, _ in _TABLES), found
            before = {stats: await _stats_rows(conn, stats) for stats, _, _, _ in _TABLES}
            await conn.execute("SELECT recall_rebuild_lexeme_stats()")
            for team in teams:
                _assert_exact(await _mismatches(conn, team))
            after = {stats: await _stats_rows(conn, stats) for stats, _, _, _ in _TABLES}
            for stats, _, _, _ in _TABLES:
                kept = {k: v for k, v in before[stats].items() if k not in damaged[stats]}
                assert {k: after[stats].get(k) for k in kept} == kept, f"{stats}: rows rewritten"
                for k in damaged[stats]:
                    rows = after[stats].get(k, set())
                    if k[2].startswith("zzghost"):
                        assert not rows, (stats, k)
                    else:
                        assert [r[0] for r in rows] == [0], (stats, k, rows)
                assert set(after[stats]) - set(before[stats]) <= damaged[stats]
                assert any(len({r[0] for r in v}) > 1 for v in after[stats].values())
            await conn.execute("SELECT recall_rebuild_lexeme_stats()")
            again = {stats: await _stats_rows(conn, stats) for stats, _, _, _ in _TABLES}
            assert again == after, "a second rebuild wrote rows"
    finally:
        await db.close()
