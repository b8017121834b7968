"""The set-based write path against the record-at-a-time path: same rows, same refusals.

Each test loads the same records twice, into two teams that differ only in
their IDs: once with ``set_based=False`` (the record-at-a-time path) and once
through the default path. The rows of every table are then compared field by
field, with the team ID and the space UUIDs (made per team) mapped, and the
system times checked against the transactions that wrote them.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import pytest

from gateway.services import loader
from gateway.services.writes import Actor, WriteService
from gateway.store.connection import Conn

from .conftest import REPO, unique
from .factories import jsonl

EXAMPLE = REPO / "docs" / "examples" / "loading-example.jsonl"

# Every table a load writes, with the columns that identify a row's order.
_TABLES = {
    "write_log": "kind, client_id",
    "memory_spaces": "kind, owner_principal_id",
    # a team's spaces all start at generation 1: their (kind, owner) decides the order
    "space_generations": "generation, reset_id, (SELECT m.kind || ':' || coalesce("
    "m.owner_principal_id, '') FROM memory_spaces m WHERE m.id = space_id)",
    "sources": "id",
    "source_lifecycle_events": "source_id, seq",
    "entities": "id",
    "evidence": "id",
    "evidence_terms": "evidence_id, lexeme",
    "evidence_lifecycle_events": "evidence_id, seq",
    "evidence_occurrences": "id",
    "evidence_entity_mentions": "evidence_id, entity_id",
    "evidence_embeddings": "evidence_id",
    "relationships": "id",
    "relationship_terms": "relationship_id, lexeme",
    "relationship_status_events": "relationship_id, seq",
    "relationship_embeddings": "relationship_id",
    "supports": "id",
    "support_decisions": "support_id, seq",
    "conflict_cases": "id",
    "conflict_case_events": "case_id, seq",
    "hypotheses": "id",
    "hypothesis_feedback": "hypothesis_id, seq",
    "evidence_search_stats": "space_id",
    "relationship_search_stats": "space_id",
}
# Made per row by the database: identities and surrogate keys (compared by order).
# payload_sha256 hashes the record with its team ID, which differs by design.
_IGNORED = {"seq", "recorded_at", "activated_at", "changed_at", "shard", "payload_sha256"}


def _retarget(lines: list[dict[str, Any]], team: str) -> str:
    out = []
    for rec in lines:
        rec = dict(rec)
        if rec["kind"] == "team":
            rec["id"] = team
        else:
            rec["team"] = team
        if rec["kind"] == "token":
            rec["id"] = unique("tok")
        out.append(rec)
    return jsonl(out)


async def _load(
    writes: WriteService, text: str, *, set_based: bool, batch_size: int = 50
) -> loader.LoadReport:
    records = loader.parse(loader.split_lines(text))
    return await loader.load(
        writes, records, batch_size=batch_size, actor=Actor.operator(), set_based=set_based
    )


async def _rows(conn: Conn, team: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of the team, with its space UUIDs replaced by (kind, owner)."""
    spaces = {
        r["id"]: f"{r['kind']}:{r['owner_principal_id']}"
        for r in await conn.fetch(
            "SELECT id, kind, owner_principal_id FROM memory_spaces WHERE team_id = $1", team
        )
    }
    out: dict[str, list[dict[str, Any]]] = {}
    for table, order in _TABLES.items():
        rows = await conn.fetch(
            f"SELECT * FROM {table} WHERE team_id = $1 ORDER BY {order}",
            team,
        )
        cleaned = []
        for row in rows:
            item: dict[str, Any] = {}
            for key, value in dict(row).items():
                if key in _IGNORED or key == "team_id":
                    continue
                if isinstance(value, UUID):
                    value = spaces.get(value, "?")
                elif value == team:
                    value = "T"
                elif isinstance(value, str) and value.startswith("tok-"):
                    value = "tok"  # token IDs are global, so made unique per load
                elif hasattr(value, "to_list"):
                    value = [round(x, 6) for x in value.to_list()]
                item[key] = value
            cleaned.append(item)
        if table.endswith("_search_stats"):
            # sharded by the writing backend: compare the sums per space
            totals: dict[str, list[int]] = {}
            for item in cleaned:
                acc = totals.setdefault(item["space_id"], [0, 0])
                acc[0] += item["doc_count"]
                acc[1] += item["total_length"]
            cleaned = [{"space": k, "totals": v} for k, v in sorted(totals.items())]
        out[table] = cleaned
    return out


def _generated(docs: int) -> list[dict[str, Any]]:
    """Records of every shape the set-based path takes: private and shared spaces,
    occurrences, mentions, spans with and without quotes, object entities and values,
    references to earlier batches and to earlier lines of the same batch."""
    out: list[dict[str, Any]] = [
        {"kind": "team", "id": "T", "name": "Paths"},
        {"kind": "principal", "team": "T", "id": "ann", "display_name": "Ann"},
        {"kind": "principal", "team": "T", "id": "bob", "display_name": "Bob"},
        {"kind": "entity", "team": "T", "id": "hub", "name": "The hub", "type": "system"},
    ]
    for i in range(docs):
        private = i % 5 == 0
        space = "private:ann" if private else "shared"
        content = (
            f"Document {i} says the service number {i} talks to the hub every {i + 1} minutes."
        )
        out += [
            {
                "kind": "source",
                "team": "T",
                "id": f"s{i}",
                "space": space,
                "type": "document",
                "title": f"Doc {i}",
                "uri": f"https://example.com/{i}" if i % 2 else None,
                "created_at": f"2026-01-0{1 + i % 9}T10:00:00+02:00",
            },
            {
                "kind": "entity",
                "team": "T",
                "id": f"e{i}",
                "space": space,
                "name": f"Service {i}",
                "aliases": [f"svc{i}"] if i % 3 else [],
            },
            {
                "kind": "evidence",
                "team": "T",
                "id": f"ev{i}",
                "source": f"s{i}",
                "content": content,
                "observed_at": "2026-02-01T00:00:00Z" if i % 4 else None,
                "occurrences": [{"id": f"ev{i}:o1", "start": 0, "end": 8, "quote": "Document"}],
                "mentions": [{"entity": f"e{i}", "occurrence": f"ev{i}:o1"}]
                + ([] if private else [{"entity": "hub"}]),
            },
            {
                "kind": "relationship",
                "team": "T",
                "id": f"r{i}",
                "space": space,
                "subject": f"e{i}",
                "predicate": "talks_to",
                **(
                    {"object_value": f"{i + 1} minutes", "object_unit": "interval"}
                    if private
                    else {"object": "hub", "owner": "bob" if i % 2 else "ann"}
                ),
                "polarity": "negative" if i % 7 == 3 else "positive",
                "supports": [
                    {"id": f"sup{i}", "evidence": f"ev{i}"},
                    *(
                        [{"id": f"sup{i}b", "evidence": f"ev{i}", "start": 0, "end": 8}]
                        if i % 2
                        else []
                    ),
                ],
            },
        ]
    # a later batch refers back, and a support for an older relationship
    out.append(
        {"kind": "support", "team": "T", "id": "late", "relationship": "r1", "evidence": "ev3"}
    )
    return out


@pytest.mark.parametrize("source", ["example", "generated"])
async def test_both_paths_write_the_same_rows(
    writes: WriteService, admin_conn: Conn, source: str
) -> None:
    if source == "example":
        lines = [json.loads(x) for x in EXAMPLE.read_text().splitlines() if x.strip()]
    else:
        lines = _generated(30)
    old_team, new_team = unique("old"), unique("new")
    counter = writes.db.counter
    start = counter.count
    old = await _load(writes, _retarget(lines, old_team), set_based=False, batch_size=9)
    middle = counter.count
    new = await _load(writes, _retarget(lines, new_team), set_based=True, batch_size=9)
    if source == "generated":
        # the runs really went set-based (a silent fallback would send more, not fewer:
        # the set-based try and then every statement of the record-at-a-time path)
        assert counter.count - middle < (middle - start) / 2
    assert old.created == new.created
    assert old.batches == new.batches
    old_rows, new_rows = await _rows(admin_conn, old_team), await _rows(admin_conn, new_team)
    for table in _TABLES:
        assert new_rows[table] == old_rows[table], table
    assert new_rows["evidence"], "the comparison saw rows"


async def test_rows_carry_their_batch_transaction_time(
    writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("time")
    await _load(writes, _retarget(_generated(6), team), set_based=True, batch_size=10)
    # every row of a record carries the time of the transaction that claimed it
    mismatched = await admin_conn.fetchval(
        "SELECT count(*) FROM evidence e JOIN write_log w ON w.team_id = e.team_id "
        "AND w.kind = 'evidence' AND w.client_id = e.id "
        "JOIN evidence_lifecycle_events l ON l.team_id = e.team_id AND l.evidence_id = e.id "
        "WHERE e.team_id = $1 AND (e.recorded_at <> w.recorded_at OR l.recorded_at <> w.recorded_at)",
        team,
    )
    assert mismatched == 0
    times = await admin_conn.fetchval(
        "SELECT count(DISTINCT recorded_at) FROM write_log WHERE team_id = $1", team
    )
    # one system time per batch: the team and principals (3 records, a batch of
    # their own), then 10, 10 and 6
    assert times == 4, "one system time per batch"


async def test_rerun_writes_nothing_and_says_so(writes: WriteService, admin_conn: Conn) -> None:
    team = unique("rerun")
    text = _retarget(_generated(8), team)
    first = await _load(writes, text, set_based=True)
    before = await _rows(admin_conn, team)
    second = await _load(writes, text, set_based=True)
    assert sum(second.created.values()) == 0
    assert sum(second.unchanged.values()) == sum(first.created.values())
    assert await _rows(admin_conn, team) == before


def _broken(lines: list[dict[str, Any]], index: int, **change: Any) -> list[dict[str, Any]]:
    out = [dict(x) for x in lines]
    out[index].update(change)
    return out


@pytest.mark.parametrize(
    "case",
    [
        "missing source",
        "later source",
        "foreign space entity",
        "quote mismatch",
        "span past end",
        "owner not a principal",
        "reused occurrence id",
        "reused support id",
        "idempotency conflict",
    ],
)
async def test_refusals_are_the_same_and_write_nothing_of_their_batch(
    writes: WriteService, admin_conn: Conn, case: str
) -> None:
    base = _generated(4)
    # records 4.. are per document: source, entity, evidence, relationship
    ev, rel = 4 + 4 * 2 + 2, 4 + 4 * 2 + 3  # document 2 (shared space)
    prefix: list[dict[str, Any]] = []
    if case == "missing source":
        lines = _broken(base, ev, source="nope")
    elif case == "later source":
        lines = _broken(base, ev, source="s3")
    elif case == "foreign space entity":
        lines = _broken(base, rel, object="e0")  # e0 lives in ann's private space
    elif case == "quote mismatch":
        sup = {"id": "supq", "evidence": "ev2", "start": 0, "end": 8, "quote": "Documant"}
        lines = _broken(base, rel, supports=[sup])
    elif case == "span past end":
        lines = _broken(
            base, rel, supports=[{"id": "supx", "evidence": "ev2", "start": 0, "end": 999}]
        )
    elif case == "owner not a principal":
        lines = _broken(base, rel, owner="zed")
    elif case == "reused occurrence id":
        occ = [{"id": "ev1:o1", "start": 0, "end": 8}]
        lines = _broken(base, ev, occurrences=occ, mentions=[])
    elif case == "reused support id":
        lines = _broken(base, rel, supports=[{"id": "sup1", "evidence": "ev2"}])
    else:
        prefix = base[:8]
        lines = _broken(base, 5, name="Another name")  # entity e0 again, other content
    results = []
    for set_based in (False, True):
        team = unique("refuse")
        if prefix:
            await _load(writes, _retarget(prefix, team), set_based=set_based)
        with pytest.raises(loader.LoadError) as caught:
            await _load(writes, _retarget(lines, team), set_based=set_based, batch_size=100)
        evidence = await admin_conn.fetchval(
            "SELECT count(*) FROM evidence WHERE team_id = $1", team
        )
        error = caught.value.errors[0]
        results.append(
            (error.line, error.field, error.code, error.message.replace(team, "T"), evidence)
        )
    assert results[0] == results[1]
    assert results[1][4] == (1 if prefix else 0), "the refused batch wrote nothing"
