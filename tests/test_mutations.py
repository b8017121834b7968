"""The write mutations over HTTP against the real database: the loader's records
through the same WriteService, authorised, transactional, idempotent and
history-keeping; with other principals and another team."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from starlette.applications import Starlette

from gateway.embeddings.base import Vectors
from gateway.errors import EmbeddingError
from gateway.services.writes import WriteService
from gateway.store.database import Database

from .conftest import app_for, fetch_one, load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import (
    _hold_lock,
    ids,
    recall,
    token,
)

RECEIPT = "kind id created recordedAt"


async def mutate(
    client: httpx.AsyncClient,
    tok: str,
    name: str,
    input_type: str,
    data: dict[str, Any],
    selection: str = RECEIPT,
) -> dict[str, Any]:
    query = f"mutation M($input: {input_type}!) {{ {name}(input: $input) {{ {selection} }} }}"
    r = await client.post(
        "/graphql",
        json={"query": query, "variables": {"input": data}},
        headers={"Authorization": f"Bearer {tok}"},
    )
    assert "Traceback" not in r.text and "SELECT" not in r.text and "INSERT" not in r.text
    body: dict[str, Any] = r.json()
    return body


async def ok(
    client: httpx.AsyncClient, tok: str, name: str, input_type: str, data: Any
) -> dict[str, Any]:
    body = await mutate(client, tok, name, input_type, data)
    assert "errors" not in body, body
    result: dict[str, Any] = body["data"][name]
    return result


async def refused(
    client: httpx.AsyncClient, tok: str, name: str, input_type: str, data: Any
) -> dict[str, Any]:
    body = await mutate(client, tok, name, input_type, data)
    assert body.get("errors") and body.get("data") is None, body
    error: dict[str, Any] = body["errors"][0]
    return error


REMEMBER_SELECTION = f"receipts {{ {RECEIPT} }}"


async def remember(client: httpx.AsyncClient, tok: str, data: dict[str, Any]) -> dict[str, Any]:
    return await mutate(client, tok, "remember", "RememberInput", data, REMEMBER_SELECTION)


def incident_memory(space: str = "SHARED", suffix: str = "") -> dict[str, Any]:
    """A complete remember input: source, entities, evidence with an occurrence and
    mentions, and a relationship supported by the evidence."""
    s = suffix
    content = "The nightly export job of the warehouse runs on the ingest cluster."
    return {
        "space": space,
        "source": {
            "id": f"src-runbook{s}",
            "type": "DOCUMENT",
            "title": "Runbook",
            "authority": "HIGH",
        },
        "entities": [
            {"id": f"export-job{s}", "name": "Nightly export job", "type": "job"},
            {"id": f"ingest{s}", "name": "Ingest cluster", "type": "system"},
        ],
        "evidence": [
            {
                "id": f"ev-export{s}",
                "content": content,
                "occurrences": [{"id": f"occ-export{s}", "start": 4, "end": 21}],
                "mentions": [
                    {"entity": f"export-job{s}", "occurrence": f"occ-export{s}"},
                    {"entity": f"ingest{s}"},
                ],
            }
        ],
        "relationships": [
            {
                "id": f"rel-export{s}",
                "subject": f"export-job{s}",
                "predicate": "runs_on",
                "object": f"ingest{s}",
                "supports": [
                    {
                        "id": f"sup-export{s}",
                        "evidence": f"ev-export{s}",
                        "occurrence": f"occ-export{s}",
                    }
                ],
            }
        ],
    }


async def count(db: Database, table: str, team: str) -> int:
    async with db.pool.acquire() as conn:
        n: int = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE team_id = $1", team)
        return n


# --- remember -----------------------------------------------------------------------------------


async def test_remember_writes_everything_with_embeddings_and_is_idempotent(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("mrem")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "bob")
    data = incident_memory()
    body = await remember(client, tok, data)
    assert "errors" not in body, body
    receipts = body["data"]["remember"]["receipts"]
    assert [(r["kind"], r["id"], r["created"]) for r in receipts] == [
        ("source", "src-runbook", True),
        ("entity", "export-job", True),
        ("entity", "ingest", True),
        ("evidence", "ev-export", True),
        ("relationship", "rel-export", True),
    ]
    assert len({r["recordedAt"] for r in receipts}) == 1  # one transaction
    # embeddings exist as soon as the call returned
    async with db.pool.acquire() as conn:
        assert await conn.fetchval(
            "SELECT count(*) FROM evidence_embeddings WHERE team_id = $1 AND evidence_id = $2",
            team,
            "ev-export",
        )
        assert await conn.fetchval(
            "SELECT count(*) FROM relationship_embeddings WHERE team_id = $1 "
            "AND relationship_id = $2",
            team,
            "rel-export",
        )
        owner, by = await fetch_one(
            conn,
            "SELECT owner_principal_id, recorded_by FROM relationships WHERE team_id = $1 "
            "AND id = $2",
            team,
            "rel-export",
        )
    assert (owner, by) == ("bob", "principal:bob")
    found = await recall(client, tok, q="which cluster does the nightly export job run on")
    assert ids(found)[0] == "ev-export"
    top = found["results"][0]
    assert top["spaceKind"] == "SHARED" and top["source"]["id"] == "src-runbook"
    assert [r["id"] for r in top["supportingRelationships"]] == ["rel-export"]
    # the same call again: the earlier result, nothing written
    rows = await count(db, "write_log", team)
    again = (await remember(client, tok, data))["data"]["remember"]["receipts"]
    assert again == [{**r, "created": False} for r in receipts]
    assert await count(db, "write_log", team) == rows
    # the same ID with other content is refused, and nothing of the call is written
    changed = incident_memory()
    changed["evidence"][0]["content"] = changed["evidence"][0]["content"].replace(
        "nightly", "weekly"
    )
    changed["relationships"] = []
    error = (await remember(client, tok, changed))["errors"][0]
    assert error["extensions"] == {"code": "IDEMPOTENCY_CONFLICT", "field": "evidence[0].id"}
    assert await count(db, "write_log", team) == rows


async def test_remember_is_all_or_nothing(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("matomic")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    data = incident_memory()
    data["relationships"][0]["object"] = "no-such-entity"
    error = (await remember(client, tok, data))["errors"][0]
    assert error["extensions"] == {"code": "NOT_FOUND", "field": "relationships[0].object"}
    async with db.pool.acquire() as conn:
        for table in ("sources", "entities", "evidence", "relationships"):
            n = await conn.fetchval(
                f"SELECT count(*) FROM {table} WHERE team_id = $1 "
                "AND (id LIKE '%export%' OR id IN ('src-runbook', 'ingest'))",
                team,
            )
            assert n == 0, table
        assert not await conn.fetchval(
            "SELECT count(*) FROM evidence_embeddings WHERE team_id = $1 AND evidence_id = $2",
            team,
            "ev-export",
        )


async def test_remember_bad_input_names_the_input_field(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("mbad")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    cases: list[tuple[Any, str]] = []
    bad_predicate = incident_memory()
    bad_predicate["relationships"][0]["predicate"] = "Runs On"
    cases.append((bad_predicate, "relationships[0].predicate"))
    bad_id = incident_memory()
    bad_id["entities"][0]["id"] = "has space"
    cases.append((bad_id, "entities[0].id"))
    past_end = incident_memory()
    past_end["evidence"][0]["occurrences"][0]["end"] = 500
    cases.append((past_end, "evidence[0]"))
    both_sources = {**incident_memory(), "sourceId": "src-handbook"}
    cases.append((both_sources, "sourceId"))
    no_source = {**incident_memory(), "source": None}
    cases.append((no_source, "source"))
    naive_time = incident_memory()
    naive_time["relationships"][0]["validFrom"] = "2026-01-01T00:00:00"
    cases.append((naive_time, "relationships[0].validFrom"))
    too_many = {"evidence": [], "entities": [{"id": f"e{i}", "name": "x"} for i in range(51)]}
    cases.append((too_many, "entities"))
    cases.append(({}, "evidence"))
    for data, field in cases:
        error = (await remember(client, tok, data))["errors"][0]
        assert error["extensions"]["code"] == "BAD_USER_INPUT", (field, error)
        assert error["extensions"]["field"] == field, (field, error)


# --- spaces and authorisation ---------------------------------------------------------------------


async def test_private_memory_goes_to_the_callers_own_space(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("mpriv")
    await load_jsonl(writes, jsonl(team_records(team)))
    alice = await token(writes, team, "alice")
    alice_shared = await token(writes, team, "alice", "shared_only")
    bob = await token(writes, team, "bob")
    body = await remember(client, bob, incident_memory("PRIVATE", "-b"))
    assert "errors" not in body, body
    q = "which cluster does the nightly export job run on"
    found = await recall(client, bob, q=q)
    assert ids(found)[0] == "ev-export-b" and found["results"][0]["spaceKind"] == "PRIVATE"
    assert "ev-export-b" not in ids(await recall(client, alice, q=q))
    # a shared-only token writes only into shared memory
    rows = await count(db, "write_log", team)
    error = (await remember(client, alice_shared, incident_memory("PRIVATE", "-a")))["errors"][0]
    assert error["extensions"] == {"code": "NOT_FOUND", "field": "space"}
    assert await count(db, "write_log", team) == rows


async def test_foreign_and_unreadable_ids_look_missing(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team, other = unique("mauth"), unique("mauthx")
    await load_jsonl(writes, jsonl(team_records(team) + team_records(other)))
    alice = await token(writes, team, "alice")
    bob = await token(writes, team, "bob")
    stranger = await token(writes, other, "bob")

    async def withdraw(tok: str, source: str, event: str) -> dict[str, Any]:
        return await refused(
            client,
            tok,
            "withdrawSource",
            "SourceLifecycleInput",
            {"id": event, "source": source},
        )

    def shape(e: dict[str, Any], ident: str) -> tuple[str, Any]:
        return e["message"].replace(ident, "ID"), e["extensions"]

    # alice's private source, seen by bob; a source of another team; a made-up one
    private = await withdraw(bob, "src-notes", "w1")
    missing = await withdraw(bob, "src-none", "w2")
    assert "errors" not in await remember(client, alice, incident_memory())  # only in team
    foreign = await withdraw(stranger, "src-runbook", "w3")
    foreign_missing = await withdraw(stranger, "src-none", "w4")
    assert shape(private, "src-notes") == shape(missing, "src-none")
    assert shape(foreign, "src-runbook") == shape(foreign_missing, "src-none")
    assert private["extensions"] == {"code": "NOT_FOUND", "field": "source"}
    # alice may withdraw her own private source; bob's attempts wrote nothing
    done = await ok(
        client, alice, "withdrawSource", "SourceLifecycleInput", {"id": "w5", "source": "src-notes"}
    )
    assert done["created"] is True
    # without a token
    r = await client.post(
        "/graphql",
        json={"query": 'mutation { resetSpace(input: {id: "r", space: SHARED}) { id } }'},
    )
    assert r.status_code == 401 and r.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_a_replay_by_another_writer_is_not_the_same_write(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    """Otherwise bob could confirm the exact content of alice's private writes."""
    team = unique("mrep")
    await load_jsonl(writes, jsonl(team_records(team)))
    alice = await token(writes, team, "alice")
    bob = await token(writes, team, "bob")
    change = {"id": "w-notes", "source": "src-notes", "reason": "stale"}
    await ok(client, alice, "withdrawSource", "SourceLifecycleInput", change)
    error = await refused(client, bob, "withdrawSource", "SourceLifecycleInput", change)
    assert error["extensions"] == {"code": "IDEMPOTENCY_CONFLICT", "field": "id"}
    replay = await ok(client, alice, "withdrawSource", "SourceLifecycleInput", change)
    assert replay["created"] is False


async def test_id_collisions_do_not_tell_which_space_holds_the_id(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    """Occurrence, support and position IDs are unique per team: a collision with an
    ID in alice's private space reads exactly like one in bob's own shared space."""
    team = unique("mcoll")
    await load_jsonl(writes, jsonl(team_records(team)))
    bob = await token(writes, team, "bob")

    async def grant(support_id: str) -> dict[str, Any]:
        return await refused(
            client,
            bob,
            "grantSupport",
            "GrantSupportInput",
            {"id": support_id, "relationship": "rel-owner", "evidence": "ev-owner"},
        )

    # sup-private is in alice's private space, sup-owner in the shared space
    hidden, visible = await grant("sup-private"), await grant("sup-owner")
    assert hidden == visible
    assert hidden["extensions"]["code"] == "BAD_USER_INPUT"
    occ = incident_memory(suffix="-c")
    occ["evidence"][0]["occurrences"][0]["id"] = "occ-owner"  # taken in the shared space
    occ["evidence"][0]["mentions"][0]["occurrence"] = "occ-owner"
    occ["relationships"][0]["supports"][0]["occurrence"] = "occ-owner"
    first = (await remember(client, bob, occ))["errors"][0]
    assert first["extensions"]["code"] == "BAD_USER_INPUT"
    assert "already used in this team" in first["message"]


# --- the lifecycle mutations, and knownAt views that stay as they were ------------------------------


async def test_lifecycle_mutations_and_earlier_views_stay_exact(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("mlife")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    assert "errors" not in await remember(client, tok, incident_memory())
    more = incident_memory(suffix="-2")
    more["source"] = None
    more["sourceId"] = "src-runbook"
    more["evidence"][0]["content"] = "The export job also writes a report to the ingest cluster."
    more["evidence"][0]["occurrences"] = [{"id": "occ-export-2", "start": 4, "end": 14}]
    more["evidence"][0]["mentions"] = []
    assert "errors" not in await remember(client, tok, more)
    q = "export job ingest cluster report; billing service owned by payments"
    before = await recall(client, tok, q=q, limit=20)
    assert {"ev-export", "ev-export-2", "ev-owner", "ev-private"} <= set(ids(before))
    await asyncio.sleep(0.01)
    t = datetime.now(UTC).isoformat()
    await asyncio.sleep(0.01)

    def step(name: str, input_type: str, data: dict[str, Any]) -> Awaitable[dict[str, Any]]:
        return ok(client, tok, name, input_type, data)

    await step("withdrawSource", "SourceLifecycleInput", {"id": "c1", "source": "src-handbook"})
    await step(
        "quarantineEvidence", "EvidenceLifecycleInput", {"id": "c2", "evidence": "ev-export-2"}
    )
    await step("revokeSupport", "SupportDecisionInput", {"id": "c3", "support": "sup-export"})
    assert "ev-export" not in ids(await recall(client, tok, q=q, limit=20))
    await step("reinstateSupport", "SupportDecisionInput", {"id": "c4", "support": "sup-export"})
    await step(
        "grantSupport",
        "GrantSupportInput",
        {
            "id": "c5",
            "relationship": "rel-export",
            "evidence": "ev-export-2",
            "quote": "export job",
            "start": 4,
            "end": 14,
        },
    )
    await step(
        "transitionRelationship",
        "RelationshipTransitionInput",
        {
            "id": "c6",
            "relationship": "rel-export-2",
            "status": "SUPERSEDED",
            "supersededBy": "rel-export",
        },
    )
    await step(
        "openConflictCase",
        "OpenConflictCaseInput",
        {
            "id": "case-x",
            "question": "Where does the export run?",
            "positions": [
                {"id": "p1", "label": "ingest", "relationships": ["rel-export"]},
                {"id": "p2", "label": "other", "relationships": ["rel-export-2"]},
            ],
        },
    )
    await step(
        "resolveConflictCase",
        "ResolveConflictCaseInput",
        {"id": "c7", "case": "case-x", "preferredPosition": "p2"},
    )
    await step("reopenConflictCase", "ReopenConflictCaseInput", {"id": "c8", "case": "case-x"})
    await step(
        "openEvidenceConflict",
        "OpenEvidenceConflictInput",
        {
            "id": "evc-x",
            "question": "Which text is right?",
            "positions": [
                {
                    "id": "ep1",
                    "label": "runbook",
                    "evidence": "ev-export",
                    "occurrence": "occ-export",
                },
                {
                    "id": "ep2",
                    "label": "copy",
                    "evidence": "ev-export-2",
                    "occurrence": "occ-export-2",
                },
            ],
        },
    )
    await step(
        "proposeHypothesis",
        "ProposeHypothesisInput",
        {
            "id": "h-x",
            "statement": "exports slow ingest",
            "relationships": ["rel-export"],
            "evidence": ["ev-export"],
        },
    )
    await step(
        "resetSpace", "ResetSpaceInput", {"id": "c9", "space": "PRIVATE", "reason": "clean slate"}
    )
    await step(
        "restoreEvidence", "EvidenceLifecycleInput", {"id": "c10", "evidence": "ev-export-2"}
    )
    now = ids(await recall(client, tok, q=q, limit=20))
    assert "ev-owner" not in now  # its source is withdrawn
    assert "ev-private" not in now  # the private space was reset
    assert "ev-export" in now
    past = await recall(client, tok, q=q, limit=20, knownAt=t)

    def strip(r: dict[str, Any]) -> list[Any]:
        return [
            (
                x["evidenceId"],
                x["rank"],
                x["context"],
                x["spaceKind"],
                x["source"],
                x["supportingRelationships"],
            )
            for x in r["results"]
        ]

    assert strip(past) == strip(before)
    async with db.pool.acquire() as conn:
        hyp = await conn.fetchrow(
            "SELECT proposed_by, recorded_by FROM hypotheses WHERE team_id = $1 AND id = 'h-x'",
            team,
        )
        assert hyp is not None
    assert tuple(hyp) == ("alice", "principal:alice")


async def test_transitions_are_checked(client: httpx.AsyncClient, writes: WriteService) -> None:
    team = unique("mtrans")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    await ok(
        client, tok, "withdrawSource", "SourceLifecycleInput", {"id": "a", "source": "src-handbook"}
    )
    twice = await refused(
        client, tok, "withdrawSource", "SourceLifecycleInput", {"id": "b", "source": "src-handbook"}
    )
    assert twice["extensions"] == {"code": "BAD_USER_INPUT", "field": "source"}
    assert "already withdrawn" in twice["message"]
    granted = await refused(
        client, tok, "reinstateSupport", "SupportDecisionInput", {"id": "c", "support": "sup-owner"}
    )
    assert granted["extensions"] == {"code": "BAD_USER_INPUT", "field": "support"}
    reopen = await refused(
        client,
        tok,
        "reopenConflictCase",
        "ReopenConflictCaseInput",
        {"id": "d", "case": "no-case"},
    )
    assert reopen["extensions"] == {"code": "NOT_FOUND", "field": "case"}
    self_supersede = await refused(
        client,
        tok,
        "transitionRelationship",
        "RelationshipTransitionInput",
        {
            "id": "e",
            "relationship": "rel-owner",
            "status": "SUPERSEDED",
            "supersededBy": "rel-owner",
        },
    )
    assert self_supersede["extensions"]["code"] == "BAD_USER_INPUT"


async def test_principal_writes_run_under_row_level_security(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    """The role of a principal's write transaction sees only its team and spaces,
    and may register the embedding model of an empty store."""
    team, other = unique("mrls"), unique("mrlsx")
    await load_jsonl(writes, jsonl(team_records(team) + team_records(other)))
    async with db.pool.acquire() as conn:
        shared = await conn.fetchval(
            "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", team
        )
        foreign = await conn.fetchval(
            "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", other
        )
    async with db.tenant(team, [shared], readonly=False) as conn:
        assert await conn.fetchval("SELECT current_user") == "recall_app"
        teams = await conn.fetch("SELECT DISTINCT team_id FROM sources")
        assert [r["team_id"] for r in teams] == [team]
        assert {r["id"] for r in await conn.fetch("SELECT id FROM sources")} == {"src-handbook"}
        await conn.execute(
            "INSERT INTO embedding_models (name, dimensions) VALUES ('m', 384) "
            "ON CONFLICT DO NOTHING"
        )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(
                "INSERT INTO sources (team_id, id, space_id, generation, kind, title, authority) "
                "VALUES ($1, 'sneak', $2, 1, 'document', 't', 'low')",
                other,
                foreign,
            )


async def test_remember_without_embeddings_writes_nothing(
    client: httpx.AsyncClient,
    gateway_app: Starlette,
    writes: WriteService,
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Evidence is never stored without its vector: when the provider fails, the call
    fails with EMBEDDING_UNAVAILABLE and nothing of it is written."""
    team = unique("memb")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")

    async def down(texts: Sequence[str]) -> Vectors:
        raise EmbeddingError("the embedding provider did not answer")

    # the provider is the seam: the database and the write path are real
    monkeypatch.setattr(gateway_app.state.services.writes.embedder, "embed", down)
    rows = await count(db, "write_log", team)
    body = await remember(client, tok, incident_memory())
    error = body["errors"][0]
    assert error["extensions"] == {"code": "EMBEDDING_UNAVAILABLE"}
    assert "Traceback" not in str(body)
    assert await count(db, "write_log", team) == rows
    assert await count(db, "sources", team) == 2  # the handbook and alice's notes only


async def test_a_busy_database_is_not_bad_input(
    dsn: str, writes: WriteService, db: Database
) -> None:
    """A write that cannot get its lock within the statement timeout is refused as
    DATABASE_UNAVAILABLE with nothing written; the same call later succeeds."""
    team = unique("mbusy")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    change = {"id": "w-busy", "source": "src-handbook"}
    app = app_for(dsn, statement_timeout_ms=500)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            ready, release = asyncio.Event(), asyncio.Event()
            holder = asyncio.create_task(_hold_lock(db, "write_log", ready, release))
            await ready.wait()
            try:
                busy = await refused(c, tok, "withdrawSource", "SourceLifecycleInput", change)
            finally:
                release.set()
                await holder
            assert busy["extensions"] == {"code": "DATABASE_UNAVAILABLE"}
            assert await count(db, "source_lifecycle_events", team) == 2  # the two creations
            done = await ok(c, tok, "withdrawSource", "SourceLifecycleInput", change)
            assert done["created"] is True


async def test_concurrent_identical_remembers_write_once(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    """Two clients retrying the same call at once: one writes, the other gets the
    earlier result when the first commits; nothing is written twice."""
    team = unique("mrace")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    first, second = await asyncio.gather(
        remember(client, tok, incident_memory()), remember(client, tok, incident_memory())
    )
    assert "errors" not in first and "errors" not in second, (first, second)
    a = first["data"]["remember"]["receipts"]
    b = second["data"]["remember"]["receipts"]
    assert sorted([a[0]["created"], b[0]["created"]]) == [False, True]
    assert all(x["created"] == a[0]["created"] for x in a)
    assert [x["recordedAt"] for x in a] == [x["recordedAt"] for x in b]
    async with db.pool.acquire() as conn:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM evidence_embeddings WHERE team_id = $1 AND evidence_id = $2",
                team,
                "ev-export",
            )
            == 1
        )


def test_every_mutation_is_documented() -> None:
    from gateway.schema import build_schema

    from .conftest import REPO

    docs = (REPO / "docs" / "writes.md").read_text(encoding="utf-8") + (
        REPO / "docs" / "feedback.md"
    ).read_text(encoding="utf-8")
    mutation = build_schema()._schema.mutation_type
    assert mutation is not None
    for name in mutation.fields:
        assert f"`{name}" in docs or f"{name}(" in docs, f"{name} is not in docs/writes.md"
