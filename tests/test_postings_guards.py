"""The postings' references to their documents, checked per statement (db/0115).

``evidence_terms`` and ``relationship_terms`` lost their per-posting foreign
keys; statement-level triggers keep the same guard. Shown here against the
database itself (a posting naming no document, or a document of another team
or space, is refused with the foreign key's error; a document that postings
name cannot be deleted, re-keyed or truncated away; the check locks the
document as the foreign key's did), and over every write path: the loader on
both paths, the mutations, supersede, retract, withdraw, quarantine, space
reset and history, with other teams in the same store, leave no posting
without its document and no document without its postings. The application
role may not write postings itself (db/0130): its documents' triggers do.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import asyncpg
import httpx
import pytest

from gateway.services.writes import WriteService
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import fetch_one, load_jsonl, unique
from .factories import jsonl, team_records
from .test_lexeme_statistics import _assert_exact, _mismatches
from .test_load_paths import EXAMPLE, _generated, _load, _retarget
from .test_mutations import incident_memory, ok, remember
from .test_postings import _as_before_0055, _assert_as_before
from .test_recall import token

# (document table, postings table, postings' document column, former foreign key)
_POSTINGS = (
    (
        "evidence",
        "evidence_terms",
        "evidence_id",
        "evidence_terms_team_id_space_id_evidence_id_fkey",
    ),
    (
        "relationships",
        "relationship_terms",
        "relationship_id",
        "relationship_terms_team_id_space_id_relationship_id_fkey",
    ),
)


async def _team_with_memory(writes: WriteService, conn: Conn) -> tuple[str, Any]:
    team = unique("guard")
    await load_jsonl(writes, jsonl(team_records(team)))
    shared = await conn.fetchval(
        "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", team
    )
    return team, shared


async def test_the_postings_are_checked_per_statement(admin_conn: Conn) -> None:
    """No per-posting foreign key is left; statement-level triggers over the
    statement's rows check new postings and keep documents that postings name."""
    fks = await admin_conn.fetch(
        "SELECT conrelid::regclass::text AS t FROM pg_constraint WHERE contype = 'f' "
        "AND conrelid IN ('evidence_terms'::regclass, 'relationship_terms'::regclass)"
    )
    assert fks == []
    rows = await admin_conn.fetch(
        "SELECT tgrelid::regclass::text AS t, tgname, (tgtype & 1) = 1 AS per_row, "
        "tgnewtable IS NOT NULL AS new_rows, tgoldtable IS NOT NULL AS old_rows "
        "FROM pg_trigger WHERE tgname LIKE '%check_documents%' OR tgname LIKE '%keep_postings%' "
        "ORDER BY 1, 2"
    )
    assert [tuple(r) for r in rows] == [
        ("evidence", "evidence_keep_postings", False, False, True),
        ("evidence", "evidence_keep_postings_truncate", False, False, False),
        ("evidence", "evidence_keep_postings_update", True, False, False),
        ("evidence_terms", "evidence_terms_check_documents", False, True, False),
        ("evidence_terms", "evidence_terms_check_documents_update", False, True, False),
        ("relationship_terms", "relationship_terms_check_documents", False, True, False),
        ("relationship_terms", "relationship_terms_check_documents_update", False, True, False),
        ("relationships", "relationships_keep_postings", False, False, True),
        ("relationships", "relationships_keep_postings_truncate", False, False, False),
        ("relationships", "relationships_keep_postings_update", True, False, False),
    ]


@pytest.mark.parametrize("which", [0, 1], ids=["evidence", "relationships"])
async def test_a_posting_must_name_a_document_of_its_team_and_space(
    writes: WriteService, admin_conn: Conn, which: int
) -> None:
    table, terms, column, constraint = _POSTINGS[which]
    team, shared = await _team_with_memory(writes, admin_conn)
    other, other_shared = await _team_with_memory(writes, admin_conn)
    doc = "ev-owner" if table == "evidence" else "rel-owner"
    private = await admin_conn.fetchval(
        "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'private' "
        "AND owner_principal_id = 'alice'",
        team,
    )
    insert = (
        f"INSERT INTO {terms} (team_id, space_id, lexeme, {column}, tf, recorded_at) "
        "SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[]) "
        "AS t(team_id, space_id, lexeme, doc), LATERAL (VALUES (1, now())) AS v(tf, at)"
    )
    wrong = {
        "no such document": (team, shared, "zz-guard", "nope"),
        "its team's id, another space": (team, private, "zz-guard", doc),
        "another team's document": (team, other_shared, "zz-guard", doc),
        "another team's key": (other, shared, "zz-guard", doc),
    }
    for label, (t, s, lexeme, d) in wrong.items():
        async with admin_conn.transaction():
            # one good posting in the same statement: the statement is refused whole
            with pytest.raises(asyncpg.ForeignKeyViolationError) as caught:
                await admin_conn.execute(
                    insert, [team, t], [shared, s], ["zz-good", lexeme], [doc, d]
                )
            assert caught.value.constraint_name == constraint, label
            assert caught.value.table_name == terms, label
    async with admin_conn.transaction():
        await admin_conn.execute(insert, [team], [shared], ["zz-good"], [doc])
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            await admin_conn.execute(
                f"UPDATE {terms} SET {column} = 'nope' WHERE team_id = $1 AND lexeme = 'zz-good'",
                team,
            )
    assert await admin_conn.fetchval(f"SELECT count(*) FROM {terms} WHERE lexeme LIKE 'zz-%'") == 0


async def test_the_application_role_writes_postings_only_through_their_documents(
    client: httpx.AsyncClient, writes: WriteService, db: Database, admin_conn: Conn
) -> None:
    """db/0130: the application role (a principal's transaction, recall_app under
    row-level security) reads the postings but may not insert, update, delete or
    truncate them, in its own team's space or another team's; nothing changes.
    Its writes of documents still fill them, as the text makes them, with exact
    statistics: a row of evidence inserted in its transaction, and ``remember``
    (evidence and relationships) in the shared and the private space."""
    team, shared = await _team_with_memory(writes, admin_conn)
    other, other_shared = await _team_with_memory(writes, admin_conn)
    for _table, terms, column, _constraint in _POSTINGS:
        doc = "ev-owner" if terms == "evidence_terms" else "rel-owner"
        grants = await admin_conn.fetchrow(
            "SELECT has_table_privilege('recall_app', $1, 'SELECT') AS s, "
            "has_table_privilege('recall_app', $1, 'INSERT') AS i, "
            "has_table_privilege('recall_app', $1, 'UPDATE') AS u, "
            "has_table_privilege('recall_app', $1, 'DELETE') AS d, "
            "has_table_privilege('recall_app', $1, 'TRUNCATE') AS t",
            terms,
        )
        assert grants is not None
        assert tuple(grants) == (True, False, False, False, False), terms
        counted = f"SELECT count(*), sum(tf) FROM {terms} WHERE team_id = ANY ($1::text[])"
        before = tuple(await fetch_one(admin_conn, counted, [team, other]))
        for victim, space in ((team, shared), (other, other_shared)):
            changes = (
                (
                    f"INSERT INTO {terms} (team_id, space_id, lexeme, {column}, tf, recorded_at) "
                    "VALUES ($1, $2, 'zz-app', $3, 1, now())",
                    (victim, space, doc),
                ),
                (f"UPDATE {terms} SET tf = tf + 1 WHERE team_id = $1", (victim,)),
                (f"DELETE FROM {terms} WHERE team_id = $1", (victim,)),
                (f"TRUNCATE {terms}", ()),
            )
            for sql, args in changes:
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    async with db.tenant(team, [shared], readonly=False) as conn:
                        assert await conn.fetchval("SELECT current_user") == "recall_app"
                        await conn.execute(sql, *args)
        assert tuple(await fetch_one(admin_conn, counted, [team, other])) == before, terms
        async with db.tenant(team, [shared]) as conn:
            assert await conn.fetchval(f"SELECT count(*) FROM {terms}") > 0

    async with db.tenant(team, [shared], readonly=False) as conn:
        assert await conn.fetchval("SELECT current_user") == "recall_app"
        await conn.execute(
            "INSERT INTO evidence (team_id, id, space_id, generation, source_id, content, "
            "content_sha256) VALUES ($1, 'ev-app', $2, 1, 'src-handbook', $3, "
            "sha256(convert_to($3, 'UTF8')))",
            team,
            shared,
            "Refunds of the billing service are batched every night.",
        )
    assert await admin_conn.fetchval(
        "SELECT count(*) FROM evidence_terms WHERE team_id = $1 AND evidence_id = 'ev-app'", team
    ) == len("refund billing servic batch everi night".split())
    tok = await token(writes, team, "bob")
    for suffix, space in (("-a", "SHARED"), ("-b", "PRIVATE")):
        body = await remember(client, tok, incident_memory(space, suffix))
        assert "errors" not in body, body
    assert await admin_conn.fetchval(
        "SELECT count(*) FROM relationship_terms WHERE team_id = $1 "
        "AND relationship_id LIKE 'rel-export-%'",
        team,
    )
    _assert_as_before(await _as_before_0055(admin_conn, team))
    _assert_exact(await _mismatches(admin_conn, team))


@pytest.mark.parametrize("which", [0, 1], ids=["evidence", "relationships"])
async def test_a_document_that_postings_name_cannot_go(
    writes: WriteService, admin_conn: Conn, which: int
) -> None:
    """The foreign key's NO ACTION: a document goes only once no posting names it."""
    table, terms, column, constraint = _POSTINGS[which]
    team, _shared = await _team_with_memory(writes, admin_conn)
    await _team_with_memory(writes, admin_conn)  # another team's postings stay as they are
    doc = "ev-owner" if table == "evidence" else "rel-owner"
    # the rows that other foreign keys keep with the document go first (the
    # owner may; the application role may delete none of these)
    others = await admin_conn.fetch(
        "SELECT conrelid::regclass::text AS t, "
        "(SELECT attname FROM pg_attribute WHERE attrelid = conrelid AND attnum = conkey[array_length(conkey, 1)]) AS c "
        "FROM pg_constraint WHERE contype = 'f' AND confrelid = $1::regclass "
        "AND conparentid = 0 ORDER BY conrelid::regclass::text <> 'supports', 1",
        table,
    )

    async def clear_others() -> None:
        # rows that reference the referencing rows (support decisions, ...) first
        if table == "relationships":
            await admin_conn.execute(
                "DELETE FROM support_decisions d USING supports s WHERE s.team_id = $1 "
                "AND s.relationship_id = $2 AND d.team_id = s.team_id AND d.support_id = s.id",
                team,
                doc,
            )
        else:
            await admin_conn.execute(
                "DELETE FROM support_decisions d USING supports s WHERE s.team_id = $1 "
                "AND s.evidence_id = $2 AND d.team_id = s.team_id AND d.support_id = s.id",
                team,
                doc,
            )
            await admin_conn.execute(
                "DELETE FROM evidence_entity_mentions WHERE team_id = $1 AND evidence_id = $2",
                team,
                doc,
            )
        for row in others:
            await admin_conn.execute(
                f"DELETE FROM {row['t']} WHERE team_id = $1 AND {row['c']} = $2", team, doc
            )

    statements = {
        "delete": f"DELETE FROM {table} WHERE team_id = $1 AND id = $2",
        "new key": f"UPDATE {table} SET id = id || '-moved' WHERE team_id = $1 AND id = $2",
    }
    for label, sql in statements.items():
        async with admin_conn.transaction():
            await clear_others()
            with pytest.raises(asyncpg.ForeignKeyViolationError) as caught:
                await admin_conn.execute(sql, team, doc)
            assert caught.value.constraint_name == constraint, label
        tx = admin_conn.transaction()
        await tx.start()
        try:
            await clear_others()
            await admin_conn.execute(
                f"DELETE FROM {terms} WHERE team_id = $1 AND {column} = $2", team, doc
            )
            assert await admin_conn.execute(sql, team, doc) == (
                "DELETE 1" if label == "delete" else "UPDATE 1"
            )
        finally:
            await tx.rollback()
    async with admin_conn.transaction():
        # an update that keeps the key is no change to the postings' reference
        await admin_conn.execute(
            f"UPDATE {table} SET recorded_by = recorded_by WHERE team_id = $1 AND id = $2",
            team,
            doc,
        )
        # the whole table's lock and scan on the tests' shared database: beyond the
        # pool's 5 s on a busy machine (QueryCanceledError, not the refusal)
        await admin_conn.execute("SET LOCAL statement_timeout = '60s'")
        with pytest.raises(asyncpg.ForeignKeyViolationError) as caught:
            await admin_conn.execute(f"TRUNCATE {table} CASCADE")
        assert caught.value.constraint_name == constraint
    assert await admin_conn.fetchval(
        f"SELECT count(*) FROM {terms} WHERE team_id = $1 AND {column} = $2", team, doc
    )


async def test_the_check_locks_the_document_as_the_foreign_key_did(
    writes: WriteService, db: Database, admin_conn: Conn
) -> None:
    """FOR KEY SHARE on the document until the writer ends: another session cannot
    delete it or change its key meanwhile, but may update its other columns."""
    team, shared = await _team_with_memory(writes, admin_conn)
    async with db.pool.acquire() as other:
        tx = admin_conn.transaction()
        await tx.start()
        try:
            await admin_conn.execute(
                "INSERT INTO evidence_terms (team_id, space_id, lexeme, evidence_id, tf, "
                "recorded_at) VALUES ($1, $2, 'zz-lock', 'ev-owner', 1, now())",
                team,
                shared,
            )
            lock = "SELECT 1 FROM evidence WHERE team_id = $1 AND id = 'ev-owner' FOR {}"
            async with other.transaction():
                await other.execute("SET LOCAL lock_timeout = '200ms'")
                await other.execute(lock.format("NO KEY UPDATE"), team)
            with pytest.raises(asyncpg.LockNotAvailableError):
                async with other.transaction():
                    await other.execute("SET LOCAL lock_timeout = '200ms'")
                    await other.execute(lock.format("UPDATE"), team)
        finally:
            await tx.rollback()


async def test_no_write_path_leaves_an_orphan_or_a_missing_posting(
    client: httpx.AsyncClient, writes: WriteService, admin_conn: Conn
) -> None:
    """Loads on both paths (every record kind: supersede, withdraw, quarantine,
    space reset, conflicts, hypotheses, a retraction), then the mutations (remember
    in both spaces, withdraw, quarantine, supersede, retract, reset, restore), in
    several teams of one store: every document has exactly the postings its text
    makes, and no posting anywhere names a missing document."""
    lines = [json.loads(x) for x in EXAMPLE.read_text().splitlines() if x.strip()]
    retract = {
        "kind": "relationship_transition",
        "team": "acme",
        "id": "tr-retract",
        "relationship": "rel-docks-b",
        "status": "retracted",
        "reason": "scout withdrew it",
    }
    teams = []
    for set_based in (False, True):
        team = unique("gpath")
        await _load(writes, _retarget([*lines, retract], team), set_based=set_based, batch_size=7)
        teams.append(team)
        gen = unique("ggen")
        await _load(writes, _retarget(_generated(12), gen), set_based=set_based, batch_size=9)
        teams.append(gen)
    team = unique("gmut")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    for suffix, space in (("-a", "SHARED"), ("-b", "PRIVATE"), ("-c", "SHARED")):
        body = await remember(client, tok, incident_memory(space, suffix))
        assert "errors" not in body, body
    steps: list[tuple[str, str, dict[str, Any]]] = [
        ("withdrawSource", "SourceLifecycleInput", {"id": "m1", "source": "src-handbook"}),
        ("quarantineEvidence", "EvidenceLifecycleInput", {"id": "m2", "evidence": "ev-export-a"}),
        (
            "transitionRelationship",
            "RelationshipTransitionInput",
            {
                "id": "m3",
                "relationship": "rel-export-a",
                "status": "SUPERSEDED",
                "supersededBy": "rel-export-c",
            },
        ),
        (
            "transitionRelationship",
            "RelationshipTransitionInput",
            {"id": "m4", "relationship": "rel-owner", "status": "RETRACTED"},
        ),
        ("resetSpace", "ResetSpaceInput", {"id": "m5", "space": "PRIVATE", "reason": "clean"}),
        ("restoreEvidence", "EvidenceLifecycleInput", {"id": "m6", "evidence": "ev-export-a"}),
    ]
    for name, input_type, data in steps:
        await ok(client, tok, name, input_type, data)
    # a write after the reset, into the new generation of the private space
    body = await remember(client, tok, incident_memory("PRIVATE", "-d"))
    assert "errors" not in body, body
    teams.append(team)
    present = await admin_conn.fetchval("SELECT count(DISTINCT team_id) FROM evidence_terms")
    assert present > len(teams), "other teams share the store"
    for t in teams:
        _assert_as_before(await _as_before_0055(admin_conn, t))
    for table, terms, column, _constraint in _POSTINGS:
        orphans = await admin_conn.fetchval(
            f"SELECT count(*) FROM {terms} p WHERE NOT EXISTS (SELECT 1 FROM {table} d "
            f"WHERE d.team_id = p.team_id AND d.space_id = p.space_id AND d.id = p.{column})"
        )
        assert orphans == 0, terms


async def _bare_document(conn: Conn, table: str, team: str, doc: str) -> str:
    """A copy of ``doc`` under a new ID that nothing but its own postings name
    (made by the document's fill trigger), so that it may be deleted."""
    new = unique("zz-race")
    columns = [
        r["column_name"]
        for r in await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
            "AND table_name = $1 AND is_generated = 'NEVER' AND column_name <> 'id' "
            "ORDER BY ordinal_position",
            table,
        )
    ]
    listed = ", ".join(columns)
    await conn.execute(
        f"INSERT INTO {table} (id, {listed}) SELECT $3, {listed} FROM {table} "
        "WHERE team_id = $1 AND id = $2",
        team,
        doc,
        new,
    )
    return new


async def _waiting(admin: Conn, pid: int) -> None:
    """Until the backend ``pid`` waits for a lock (it has reached the conflict)."""
    for _ in range(400):
        if await admin.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        ):
            return
        await asyncio.sleep(0.025)
    raise AssertionError("the second session never waited for the first")


@pytest.mark.parametrize("which", [0, 1], ids=["evidence", "relationships"])
@pytest.mark.parametrize("change", ["delete", "new key"])
@pytest.mark.parametrize(
    "isolation, first",
    [
        ("read_committed", "posting"),
        ("read_committed", "document"),
        ("repeatable_read", "posting"),
        ("repeatable_read", "document"),
        ("serializable", "posting"),
    ],
)
async def test_no_orphan_when_a_posting_and_a_delete_race(
    writes: WriteService,
    dsn: str,
    admin_conn: Conn,
    which: int,
    change: str,
    isolation: Literal["read_committed", "repeatable_read", "serializable"],
    first: str,
) -> None:
    """Two sessions (review H1): one writes a posting naming a document (READ
    COMMITTED, as the gateway writes), the other removes the document (its own
    postings first, then the row, or its key), at ``isolation``; ``first`` is the
    session whose statement runs first, uncommitted, while the other one waits
    for its lock. READ COMMITTED: whichever commits second gets the foreign key's
    23503, as with the foreign key. REPEATABLE READ / SERIALIZABLE: the removal
    is refused (0A000; its snapshot could not see the posting committed while it
    waited). Either way no posting is left without its document."""
    table, terms, column, constraint = _POSTINGS[which]
    team, shared = await _team_with_memory(writes, admin_conn)
    doc = await _bare_document(
        admin_conn, table, team, "ev-owner" if table == "evidence" else "rel-owner"
    )
    insert = (
        f"INSERT INTO {terms} (team_id, space_id, lexeme, {column}, tf, recorded_at) "
        "VALUES ($1, $2, 'zz-race', $3, 1, now())"
    )
    removal = [
        f"DELETE FROM {terms} WHERE team_id = $1 AND {column} = $2",
        f"DELETE FROM {table} WHERE team_id = $1 AND id = $2"
        if change == "delete"
        else f"UPDATE {table} SET id = id || '-moved' WHERE team_id = $1 AND id = $2",
    ]
    writer = await asyncpg.connect(dsn)
    remover = await asyncpg.connect(dsn)
    try:
        wtx = writer.transaction()
        rtx = remover.transaction(isolation=isolation)
        await wtx.start()
        await rtx.start()
        await remover.fetchval("SELECT 1")  # the remover's snapshot, before the posting

        async def remove() -> None:
            for sql in removal:
                await remover.execute(sql, team, doc)

        async def write() -> None:
            await writer.execute(insert, team, shared, doc)

        if isolation != "read_committed" and first == "document":
            # refused at once, whether or not a posting is on its way
            with pytest.raises(asyncpg.FeatureNotSupportedError) as refused:
                await remove()
            await rtx.rollback()
            await write()
            await wtx.commit()
        else:
            await (write() if first == "posting" else remove())
            # the other session reaches the document's lock and waits there
            second = asyncio.create_task(remove() if first == "posting" else write())
            await _waiting(admin_conn, (remover if first == "posting" else writer).get_server_pid())
            await (wtx if first == "posting" else rtx).commit()
            if isolation == "read_committed":
                with pytest.raises(asyncpg.ForeignKeyViolationError) as caught:
                    await second
                assert caught.value.constraint_name == constraint
                await (rtx if first == "posting" else wtx).rollback()
            else:
                # the posting committed after the remover's snapshot was taken
                with pytest.raises(asyncpg.FeatureNotSupportedError) as refused:
                    await second
                await rtx.rollback()
        if isolation != "read_committed":
            assert refused.value.sqlstate == "0A000"
            assert refused.value.constraint_name == constraint
            assert refused.value.table_name == table
            assert "READ COMMITTED" in str(refused.value)
    finally:
        await writer.close()
        await remover.close()
    orphans = await admin_conn.fetchval(
        f"SELECT count(*) FROM {terms} p WHERE p.team_id = $1 AND NOT EXISTS (SELECT 1 "
        f"FROM {table} d WHERE d.team_id = p.team_id AND d.space_id = p.space_id "
        f"AND d.id = p.{column})",
        team,
    )
    assert orphans == 0


async def test_only_a_key_change_fires_the_document_update_guard(
    writes: WriteService, admin_conn: Conn
) -> None:
    """An UPDATE that keeps every key fires no guard (review L2: it captured
    every updated row and anti-joined them); it even passes under REPEATABLE
    READ, where a key change is refused. Nobody may call the SECURITY DEFINER
    guards directly (review L3): EXECUTE is not granted to PUBLIC."""
    team, _shared = await _team_with_memory(writes, admin_conn)
    for table, _terms, _column, _constraint in _POSTINGS:
        doc = await _bare_document(
            admin_conn, table, team, "ev-owner" if table == "evidence" else "rel-owner"
        )
        async with admin_conn.transaction(isolation="repeatable_read"):
            assert (
                await admin_conn.execute(
                    f"UPDATE {table} SET recorded_by = recorded_by WHERE team_id = $1", team
                )
            ).startswith("UPDATE ")
            with pytest.raises(asyncpg.FeatureNotSupportedError):
                await admin_conn.execute(
                    f"UPDATE {table} SET id = id || '-moved' WHERE team_id = $1 AND id = $2",
                    team,
                    doc,
                )
    guards = await admin_conn.fetch(
        "SELECT DISTINCT p.oid::regprocedure::text AS f, "
        "has_function_privilege('recall_app', p.oid, 'EXECUTE') AS app, p.prosecdef, "
        "p.provolatile::text AS provolatile FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
        "WHERE t.tgname LIKE '%check_documents%' OR t.tgname LIKE '%keep_postings%' ORDER BY 1"
    )
    assert len(guards) == 6
    for g in guards:
        # VOLATILE: each query of the guard takes a new snapshot in READ COMMITTED
        assert (g["app"], g["prosecdef"], g["provolatile"]) == (False, True, "v"), g["f"]


@pytest.mark.parametrize(
    ("table", "text"), [("evidence", "content"), ("relationships", "statement")]
)
async def test_a_document_text_cannot_change_after_it_is_written(
    writes: WriteService, admin_conn: Conn, table: str, text: str
) -> None:
    """The postings are written from a row's parsed text at insert only (db/0130),
    and the evidence full-text function scores a picked document from its
    search_document (db/0195): an UPDATE of the text, even by the owner, left
    postings naming lexemes the row no longer held (a NULL score, ranked first).
    db/0196 refuses it, and an update of another column keeps the parsed text
    (the parse trigger ran on every UPDATE). Before: the UPDATE went through."""
    team, _ = await _team_with_memory(writes, admin_conn)
    doc, parsed = await fetch_one(
        admin_conn,
        f"SELECT id, search_document FROM {table} WHERE team_id = $1 ORDER BY id LIMIT 1",
        team,
    )
    for column, value in (
        (text, "'completely unrelated words'"),
        ("search_document", "to_tsvector('english', 'completely unrelated words')"),
        ("doc_length", "doc_length + 1"),
    ):
        async with admin_conn.transaction():
            with pytest.raises(asyncpg.FeatureNotSupportedError) as caught:
                await admin_conn.execute(
                    f"UPDATE {table} SET {column} = {value} WHERE team_id = $1 AND id = $2",
                    team,
                    doc,
                )
            assert "cannot change after it is written" in str(caught.value), column
    # Another column: allowed, and the row keeps the parsed text its postings came
    # from even where parsing again would give another (here: the parse function
    # replaced inside the transaction, as a dictionary change would do).
    parse = "evidence_search_document" if table == "evidence" else "relationship_search_document"
    tx = admin_conn.transaction()
    await tx.start()
    try:
        await admin_conn.execute(
            f"CREATE OR REPLACE FUNCTION {parse}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN NEW.search_document := to_tsvector('english', 'parsed again'); "
            "NEW.doc_length := 2; RETURN NEW; END $$"
        )
        await admin_conn.execute(
            f"UPDATE {table} SET recorded_by = recorded_by || '-x' WHERE team_id = $1 AND id = $2",
            team,
            doc,
        )
        assert (
            await admin_conn.fetchval(
                f"SELECT search_document FROM {table} WHERE team_id = $1 AND id = $2", team, doc
            )
            == parsed
        )
    finally:
        await tx.rollback()
