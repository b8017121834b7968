"""The loader against the real database: every kind, idempotency, bad input, history."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gateway.embeddings.base import Vectors
from gateway.errors import EmbeddingMismatch
from gateway.services import loader
from gateway.services.records import RECORD_KINDS
from gateway.services.writes import Actor, WriteService
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import REPO, load_jsonl, unique
from .factories import jsonl, team_records

EXAMPLE = REPO / "docs" / "examples" / "loading-example.jsonl"


def _retarget(text: str, team: str) -> str:
    """The example file with its team IDs made unique for this test."""
    out = []
    teams: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec["kind"] == "team":
            teams[rec["id"]] = f"{team}-{len(teams)}"
            rec["id"] = teams[rec["id"]]
        else:
            rec["team"] = teams[rec["team"]]
        if rec["kind"] == "token":
            rec["id"] = unique("tok")  # token IDs are global, not per team
        out.append(json.dumps(rec))
    return "\n".join(out)


async def test_example_file_round_trips_every_kind(writes: WriteService, admin_conn: Conn) -> None:
    text = _retarget(EXAMPLE.read_text(), unique("ex"))
    kinds = {json.loads(line)["kind"] for line in text.splitlines()}
    assert kinds == set(RECORD_KINDS), "the documented example uses every record kind"

    first = await load_jsonl(writes, text, batch_size=7)
    assert sum(first.unchanged.values()) == 0
    assert set(first.created) == set(RECORD_KINDS)

    teams = [json.loads(line)["id"] for line in text.splitlines() if '"kind": "team"' in line]
    snapshot = await _snapshot(admin_conn, teams)
    second = await load_jsonl(writes, text, batch_size=3)
    assert sum(second.created.values()) == 0
    assert sum(second.unchanged.values()) == len(text.splitlines())
    assert await _snapshot(admin_conn, teams) == snapshot, "loading twice changes nothing"


_TABLES = (
    "principals",
    "api_tokens",
    "memory_spaces",
    "space_generations",
    "sources",
    "source_lifecycle_events",
    "evidence",
    "evidence_occurrences",
    "evidence_entity_mentions",
    "evidence_embeddings",
    "evidence_terms",
    "entities",
    "relationships",
    "relationship_status_events",
    "relationship_embeddings",
    "supports",
    "support_decisions",
    "conflict_cases",
    "conflict_positions",
    "conflict_position_relationships",
    "conflict_case_events",
    "evidence_conflicts",
    "evidence_conflict_positions",
    "hypotheses",
    "hypothesis_relationships",
    "hypothesis_evidence",
    "hypothesis_feedback",
    "write_log",
)


async def _snapshot(conn: Conn, teams: list[str]) -> dict[str, int]:
    counts = {}
    for table in _TABLES:
        counts[table] = await conn.fetchval(
            f"SELECT count(*) FROM {table} WHERE team_id = ANY($1::text[])", teams
        )
    return counts


async def test_every_kind_lands_in_its_tables(writes: WriteService, admin_conn: Conn) -> None:
    team = unique("kinds")
    text = _retarget(EXAMPLE.read_text(), team)
    await load_jsonl(writes, text)
    teams = [json.loads(line)["id"] for line in text.splitlines() if '"kind": "team"' in line]
    counts = await _snapshot(admin_conn, teams)
    for table, count in counts.items():
        assert count > 0, f"{table} got nothing from the example"
    # embeddings are real: unit vectors of the store's model
    row = await admin_conn.fetchrow(
        "SELECT model, dimensions, embedding FROM evidence_embeddings WHERE team_id = $1 LIMIT 1",
        teams[0],
    )
    assert row is not None
    assert row["dimensions"] == 384
    assert abs(float(np.linalg.norm(row["embedding"].to_numpy())) - 1.0) < 1e-3


async def test_bad_lines_write_nothing(writes: WriteService, admin_conn: Conn) -> None:
    team = unique("bad")
    good = team_records(team)
    lines = [json.dumps(r) for r in good]
    lines.insert(3, "{not json")
    bad_span = dict(good[6], id="ev-bad", occurrences=[{"id": "o", "start": 5, "end": 2}])
    lines.insert(6, json.dumps(bad_span))
    lines.append(json.dumps({"kind": "gossip", "team": team, "id": "x"}))
    with pytest.raises(loader.LoadError) as caught:
        loader.parse(lines)
    errors = {(e.line, e.field) for e in caught.value.errors}
    assert (4, None) in errors
    assert (7, "occurrences[0]") in errors
    assert (len(lines), "kind") in errors
    assert caught.value.committed == 0
    assert "unknown kind 'gossip'" in str(next(e for e in caught.value.errors if e.field == "kind"))
    assert await admin_conn.fetchval("SELECT count(*) FROM teams WHERE id = $1", team) == 0


async def test_database_refusal_rolls_back_its_batch_only(
    writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("refuse")
    records = team_records(team)
    # line 12: a relationship whose support cites an evidence that does not exist
    records.insert(
        11,
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-ghost",
            "subject": "billing",
            "predicate": "depends_on",
            "object": "payments-team",
            "owner": "alice",
            "supports": [{"id": "sup-ghost", "evidence": "ev-missing"}],
        },
    )
    parsed = loader.parse(jsonl(records).splitlines())
    with pytest.raises(loader.LoadError) as caught:
        await loader.load(writes, parsed, batch_size=5, actor=Actor.operator())
    error = caught.value.errors[0]
    assert error.line == 12
    assert error.field == "supports[0].evidence"
    assert "ev-missing" in error.message
    # two whole batches before the refused one: the team and its principals (a
    # batch of their own, as records that create spaces always are), lines 4-8
    assert caught.value.committed == 8
    assert "lines 9-13 were not written" in caught.value.message
    present = {
        r["id"] for r in await admin_conn.fetch("SELECT id FROM evidence WHERE team_id=$1", team)
    }
    assert present == {"ev-owner"}  # line 7 (batch 2) is in, lines 9-13 are not
    assert (
        await admin_conn.fetchval("SELECT count(*) FROM relationships WHERE team_id = $1", team)
        == 1
    )
    # After fixing the input, loading again completes and skips what is in.
    del records[11]
    report = await load_jsonl(writes, jsonl(records), batch_size=5)
    assert sum(report.unchanged.values()) == 8
    assert sum(report.created.values()) == len(records) - 8


async def test_same_id_other_content_is_refused(writes: WriteService) -> None:
    team = unique("idem")
    await load_jsonl(writes, jsonl(team_records(team)))
    changed = {
        "kind": "entity",
        "team": team,
        "id": "billing",
        "name": "Billing v2",
        "type": "system",
    }
    with pytest.raises(loader.LoadError) as caught:
        await load_jsonl(writes, jsonl([changed]))
    assert caught.value.errors[0].code == "IDEMPOTENCY_CONFLICT"
    assert caught.value.errors[0].field == "id"


async def test_lifecycle_history_is_kept(writes: WriteService, admin_conn: Conn) -> None:
    team = unique("hist")
    await load_jsonl(writes, jsonl(team_records(team)))
    changes = [
        {
            "kind": "source_lifecycle",
            "team": team,
            "id": "w1",
            "source": "src-handbook",
            "status": "withdrawn",
            "reason": "outdated",
        },
        {
            "kind": "support_decision",
            "team": team,
            "id": "d1",
            "support": "sup-owner",
            "decision": "revoke",
        },
        {
            "kind": "relationship_transition",
            "team": team,
            "id": "t1",
            "relationship": "rel-owner",
            "status": "retracted",
        },
        {
            "kind": "evidence_lifecycle",
            "team": team,
            "id": "q1",
            "evidence": "ev-owner",
            "status": "quarantined",
        },
    ]
    for change in changes:  # one transaction each: distinct system times
        await load_jsonl(writes, jsonl([change]))
    restore = [
        {
            "kind": "source_lifecycle",
            "team": team,
            "id": "w2",
            "source": "src-handbook",
            "status": "active",
        },
        {
            "kind": "support_decision",
            "team": team,
            "id": "d2",
            "support": "sup-owner",
            "decision": "reinstate",
        },
    ]
    await load_jsonl(writes, jsonl(restore))
    events = await admin_conn.fetch(
        "SELECT status, recorded_at FROM source_lifecycle_events WHERE team_id = $1 "
        "AND source_id = 'src-handbook' ORDER BY recorded_at, seq",
        team,
    )
    assert [e["status"] for e in events] == ["active", "withdrawn", "active"]
    withdrawn_at = events[1]["recorded_at"]
    # The state as known just before and at the withdrawal is reconstructable.
    state_at = await admin_conn.fetchval(
        "SELECT status FROM source_lifecycle_events WHERE team_id = $1 AND recorded_at <= $2 "
        "ORDER BY recorded_at DESC, seq DESC LIMIT 1",
        team,
        withdrawn_at,
    )
    assert state_at == "withdrawn"
    decisions = await admin_conn.fetch(
        "SELECT decision FROM support_decisions WHERE team_id = $1 AND support_id = 'sup-owner' "
        "ORDER BY recorded_at, seq",
        team,
    )
    assert [d["decision"] for d in decisions] == ["grant", "revoke", "reinstate"]
    statuses = await admin_conn.fetch(
        "SELECT status FROM relationship_status_events WHERE team_id = $1 "
        "AND relationship_id = 'rel-owner' ORDER BY recorded_at, seq",
        team,
    )
    assert [s["status"] for s in statuses] == ["active", "retracted"]


async def test_transitions_are_checked(writes: WriteService) -> None:
    team = unique("trans")
    await load_jsonl(writes, jsonl(team_records(team)))
    cases = [
        (
            {
                "kind": "support_decision",
                "team": team,
                "id": "x1",
                "support": "sup-owner",
                "decision": "reinstate",
            },
            "decision",
            "granted",
        ),
        (
            {
                "kind": "source_lifecycle",
                "team": team,
                "id": "x2",
                "source": "src-handbook",
                "status": "active",
            },
            "status",
            "already active",
        ),
    ]
    for record, field, text in cases:
        with pytest.raises(loader.LoadError) as caught:
            await load_jsonl(writes, jsonl([record]))
        assert caught.value.errors[0].field == field
        assert text in caught.value.errors[0].message


async def test_space_reset_hides_old_generation(writes: WriteService) -> None:
    team = unique("reset")
    await load_jsonl(writes, jsonl(team_records(team)))
    await load_jsonl(
        writes,
        jsonl([{"kind": "space_reset", "team": team, "id": "r1", "space": "private:alice"}]),
    )
    late = {
        "kind": "support",
        "team": team,
        "id": "sup-late",
        "relationship": "rel-private",
        "evidence": "ev-private",
    }
    with pytest.raises(loader.LoadError) as caught:
        await load_jsonl(writes, jsonl([late]))
    assert caught.value.errors[0].code == "NOT_FOUND"


async def test_references_never_cross_teams_or_spaces(writes: WriteService) -> None:
    team_a, team_b = unique("x-a"), unique("x-b")
    await load_jsonl(writes, jsonl(team_records(team_a) + team_records(team_b)))
    foreign = {
        "kind": "support",
        "team": team_b,
        "id": "s-x",
        "relationship": "rel-owner",
        "evidence": "ev-private",
    }
    with pytest.raises(loader.LoadError) as caught:
        await load_jsonl(writes, jsonl([foreign]))
    assert caught.value.errors[0].code == "NOT_FOUND"  # alice's private evidence, other space
    mixed = {
        "kind": "relationship",
        "team": team_a,
        "id": "rel-mix",
        "subject": "billing",
        "predicate": "noted_in",
        "object": "p-billing",
        "owner": "alice",
    }
    with pytest.raises(loader.LoadError) as caught:
        await load_jsonl(writes, jsonl([mixed]))
    assert caught.value.errors[0].field == "object"


async def test_principal_authorisation(writes: WriteService) -> None:
    team_a, team_b = unique("auth-a"), unique("auth-b")
    await load_jsonl(writes, jsonl(team_records(team_a) + team_records(team_b)))
    bob = Actor.for_principal(team_a, "bob", private_bound=True)
    alice_shared_only = Actor.for_principal(team_a, "alice", private_bound=False)

    def src(team: str, space: str, ident: str) -> dict[str, str]:
        return {
            "kind": "source",
            "team": team,
            "id": ident,
            "space": space,
            "type": "tool",
            "title": "t",
        }

    async def apply(actor: Actor, record: dict[str, str]) -> None:
        await loader.load(writes, loader.parse([json.dumps(record)]), batch_size=1, actor=actor)

    await apply(bob, src(team_a, "shared", "s-bob"))
    await apply(bob, src(team_a, "private:bob", "s-bob-private"))
    refusals = [
        (bob, src(team_a, "private:alice", "s-1"), "NOT_FOUND"),  # another owner's space
        (bob, src(team_b, "shared", "s-2"), "NOT_FOUND"),  # another team
        (alice_shared_only, src(team_a, "private:alice", "s-3"), "NOT_FOUND"),
        (bob, {"kind": "team", "id": unique("t"), "name": "x"}, "FORBIDDEN"),
        (
            bob,
            {
                "kind": "evidence",
                "team": team_a,
                "id": "e-1",
                "source": "src-notes",
                "content": "peek",
            },
            "NOT_FOUND",
        ),
    ]
    for actor, record, code in refusals:
        with pytest.raises(loader.LoadError) as caught:
            await apply(actor, record)
        assert caught.value.errors[0].code == code, record


class _OtherModel:
    model = "another-model"
    dimensions = 384

    async def embed(self, texts: Sequence[str]) -> Vectors:
        v = np.ones((len(texts), 384), dtype=np.float32)
        unit: Vectors = v / np.linalg.norm(v, axis=1, keepdims=True)
        return unit

    async def aclose(self) -> None:
        return None


async def test_embedding_model_mismatch_is_refused(writes: WriteService, db: Database) -> None:
    team = unique("mix")
    await load_jsonl(writes, jsonl(team_records(team)))  # the store now holds MiniLM vectors
    other = WriteService(db, _OtherModel())
    record = {
        "kind": "evidence",
        "team": team,
        "id": "ev-mix",
        "source": "src-handbook",
        "content": "More text.",
    }
    with pytest.raises(loader.LoadError) as caught:
        await load_jsonl(other, jsonl([record]))
    assert caught.value.errors[0].code == EmbeddingMismatch.code
    with pytest.raises(loader.LoadError):
        await load_jsonl(other, jsonl([record]))  # nothing half-written: still refused, not 'same'


def test_documented_kinds() -> None:
    doc = (REPO / "docs" / "loading.md").read_text()
    for kind in RECORD_KINDS:
        assert f"`{kind}`" in doc, f"docs/loading.md does not document {kind}"


def test_example_is_in_the_docs() -> None:
    assert Path(EXAMPLE).is_file()
