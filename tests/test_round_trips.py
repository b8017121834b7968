"""The combined statements of a recall answer what their separate statements do.

gateway/store/round_trips.py sends several statements of a recall as one; each
keeps its own SQL, renumbered. These tests run both ways on the same data, in
one transaction (one snapshot, one instant), against the real PostgreSQL, with
both branches (shared and private), every list and discovery, and compare
everything that comes back.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from gateway.embeddings import EmbeddingProvider, embed_queries
from gateway.services.recall_types import overfetch
from gateway.services.writes import WriteService
from gateway.store import conflicts, hypotheses, related, round_trips, search
from gateway.store import recall as hydration
from gateway.store.database import Database
from gateway.store.feedback import NewRecallEvent

from .conftest import load_jsonl, unique
from .factories import jsonl
from .test_conflicts import ownership_case
from .test_recall import more_evidence

QUERY = "who owns the billing service and its invoices"


async def _setup(
    writes: WriteService, db: Database
) -> tuple[str, list[search.BranchSearch], list[asyncpg.Record]]:
    team = unique("rt")
    records = (
        ownership_case(team)  # the team's records and a relationship conflict case
        + more_evidence(team, 12)
        + more_evidence(team, 4, space="private:alice")
    )
    await load_jsonl(writes, jsonl(records))
    async with db.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT s.id, s.kind, max(g.generation) AS generation FROM memory_spaces s "
            "JOIN space_generations g ON g.team_id = s.team_id AND g.space_id = s.id "
            "WHERE s.team_id = $1 AND (s.kind = 'shared' OR s.owner_principal_id = 'alice') "
            "GROUP BY s.id, s.kind ORDER BY s.kind DESC",
            team,
        )
    branches = [search.BranchSearch(r["kind"], r["id"], r["generation"]) for r in rows]
    assert [b.branch for b in branches] == ["shared", "private"]
    return team, branches, rows


async def test_first_round_is_the_three_statements(
    writes: WriteService, db: Database, embedder: EmbeddingProvider
) -> None:
    team, branches, _ = await _setup(writes, db)
    vector = np.asarray((await embed_queries(embedder, [QUERY]))[0], dtype=np.float32)
    spaces = [b.space_id for b in branches]
    shared = branches[0]
    async with db.tenant(team, spaces) as conn:
        now = await conn.fetchval("SELECT now()")
        cq = search.CandidateQuery(
            team, tuple(branches), QUERY, vector, ("billing",), (), overfetch(10), now
        )
        dq = related.DiscoveryQuery(
            team,
            shared.space_id,
            shared.generation,
            spaces,
            now,
            now,
            QUERY,
            vector,
            overfetch(5),
            [],
            [],
            [],
        )
        combined = await round_trips.first_round(conn, cq, now, dq)
        lists = await search.evidence_candidates(conn, cq)
        ids = list(dict.fromkeys(i for ranked in lists.values() for i in ranked))
        eligible = await hydration.eligible_evidence(conn, team, ids, spaces, now, now)
        returned = sorted({rid for e in eligible.values() for rid in e.relationship_ids})
        alone = await related.discover(conn, dq)
        with_returned = await related.discover(
            conn,
            related.DiscoveryQuery(
                team,
                shared.space_id,
                shared.generation,
                spaces,
                now,
                now,
                QUERY,
                vector,
                overfetch(5),
                returned,
                [],
                [],
            ),
        )
    assert combined is not None and combined.discovery is not None
    assert {k for k, v in lists.items() if v} >= {
        ("shared", "fulltext"),
        ("shared", "vector"),
        ("shared", "entity"),
        ("private", "fulltext"),
    }
    assert combined.lists == lists
    assert combined.eligible == eligible and eligible
    assert combined.discovery == alone and alone.lists
    # Coverage by returned evidence, applied afterwards from the path groups, is
    # the coverage discovery computes when it is given the returned IDs.
    assert set(combined.path_groups) == set(returned)
    applied = combined.discovery.covered_groups | {combined.path_groups[r] for r in returned}
    assert applied == with_returned.covered_groups and applied


async def test_answer_and_last_rounds_are_their_statements(
    writes: WriteService, db: Database
) -> None:
    team, branches, _ = await _setup(writes, db)
    spaces = [b.space_id for b in branches]
    shared = branches[0]
    async with db.tenant(team, spaces) as conn:
        now = await conn.fetchval("SELECT now()")
        evidence = await conn.fetch("SELECT id FROM evidence WHERE team_id = $1 ORDER BY id", team)
        rels = await conn.fetch(
            "SELECT id, subject_entity_id FROM relationships WHERE team_id = $1 ORDER BY id", team
        )
        ev_reach = {r["id"]: i for i, r in enumerate(evidence, start=1)}
        rel_reach = {r["id"]: i for i, r in enumerate(rels, start=1)}
        hq = hypotheses.HypothesisQuery(
            team, shared.space_id, shared.generation, now, ev_reach, rel_reach, QUERY, 40
        )
        cq = conflicts.ConflictQuery(team, spaces, ev_reach, rel_reach, now, 10, 5)
        got = await round_trips.answer_round(conn, hq, cq)
        cases = await conflicts.relationship_cases(
            conn, team, spaces, rel_reach, now, cap=10, supporter_cap=5
        )
        ev_conflicts = await conflicts.evidence_conflicts(conn, team, spaces, ev_reach, now, cap=10)
        hyps = await hypotheses.related_hypotheses(conn, hq)
        assert got.cases == cases and cases
        assert got.evidence_conflicts == ev_conflicts
        assert got.hypotheses == hyps
        nq = hydration.NestedQuery(
            team,
            ["src-handbook", "src-bulk"],
            list(rel_reach),
            [rels[0]["subject_entity_id"]],
            spaces,
            now,
        )
        nested, recorded = await round_trips.last_round(conn, nq, None)
        assert recorded is None
        assert nested == await hydration.nested_rows(conn, nq)
        assert nested.sources and nested.relationships and nested.entities
    # With the recall event: written by the same statement, and read back.
    event = NewRecallEvent(
        team,
        uuid.uuid4(),
        "alice",
        "tok-none",
        None,
        ["shared"],
        now,
        now,
        [("evidence", evidence[0]["id"], 1)],
    )
    async with db.tenant(team, spaces, readonly=False) as conn:
        again, recorded = await round_trips.last_round(conn, nq, event)
        assert recorded is not None and again == nested
        items = await conn.fetch(
            "SELECT frontier, item_id, rank FROM recall_event_items WHERE team_id = $1 "
            "AND recall_event_id = $2",
            team,
            event.id,
        )
        assert [tuple(r) for r in items] == [("evidence", evidence[0]["id"], 1)]


@pytest.mark.parametrize(
    "failing",
    [
        ("scope_round", "first_round", "answer_round", "last_round"),
        ("scope_round",),
        ("first_round",),
    ],
)
async def test_a_failed_combined_statement_falls_back_to_the_same_answer(
    client: httpx.AsyncClient,
    gateway_app: Starlette,
    writes: WriteService,
    monkeypatch: pytest.MonkeyPatch,
    failing: tuple[str, ...],
) -> None:
    """When a combined statement fails, its parts run one by one (each with its
    own fallbacks): the answer is the same, it only costs more statements. The
    scope round failing leaves the view alone, then the whole first round; the
    first round failing after the scope round (the vector parts) leaves every
    list to the frontiers' own statements. Each question is a fresh one for
    the query embedding (the LRU emptied), so that both rounds run."""
    import asyncpg

    from .test_recall import recall, token

    team = unique("rtfb")
    await load_jsonl(writes, jsonl(ownership_case(team) + more_evidence(team, 8)))
    tok = await token(writes, team, "alice")
    counter = gateway_app.state.services.db.counter
    q = "who owns the billing service"

    embeddings = gateway_app.state.services.recall.embeddings

    async def asked() -> tuple[dict[str, Any], int]:
        embeddings._cache.clear()
        before = counter.count
        answer = await recall(client, tok, q=q, limit=5)
        answer.pop("recallId", None)
        answer.pop("recallEventId", None)
        answer.pop("suggestedActions", None)
        return answer, counter.count - before

    await asked()  # warm: type introspection of new statements
    combined, combined_count = await asked()

    async def fails(*args: Any, **kwargs: Any) -> Any:
        raise asyncpg.PostgresError("injected")

    for name in failing:
        monkeypatch.setattr(round_trips, name, fails)
    alone, alone_count = await asked()
    assert alone == combined and combined["results"]
    assert alone_count > combined_count, (alone_count, combined_count)


async def test_a_first_round_that_finds_nothing_has_empty_lists_and_groups(
    writes: WriteService, db: Database
) -> None:
    """The combined statement's empty shapes: no candidate (each list's record
    absent, the lists' array NULL), nothing hydrated, and discovery asked for with
    no support path to group (the groups' record of two NULL arrays) parse to
    what the separate statements give: empty lists, no group."""
    team, branches, _ = await _setup(writes, db)
    spaces = [b.space_id for b in branches]
    shared = branches[0]
    text = "zyxwvutsrq qponmlkjih"  # no document of the team has either word
    async with db.tenant(team, spaces) as conn:
        now = await conn.fetchval("SELECT now()")
        cq = search.CandidateQuery(team, tuple(branches), text, None, (), (), overfetch(10), now)
        dq = related.DiscoveryQuery(
            team,
            shared.space_id,
            shared.generation,
            spaces,
            now,
            now,
            text,
            None,
            overfetch(5),
            [],
            [],
            [],
        )
        combined = await round_trips.first_round(conn, cq, now, dq)
        lists = await search.evidence_candidates(conn, cq)
        alone = await related.discover(conn, dq)
    assert combined is not None and combined.discovery is not None
    assert lists and not any(lists.values())
    assert combined.lists == lists
    assert combined.eligible == {} and combined.path_groups == {}
    assert combined.discovery == alone


async def test_hydration_and_discovery_come_as_columns_not_records(
    writes: WriteService, db: Database, embedder: EmbeddingProvider
) -> None:
    """The first round's hydrated rows and discovery's rows come back as one array
    per column, each a column of the statement's own row: the driver decodes a
    column with the codec its prepared statement resolved once, where an array of
    anonymous records costs it a codec lookup per field (docs/benchmarks.md,
    "Hydration and discovery as columns"). Only the candidate lists (a record per
    list) and the support paths' groups (one record) stay records. The answer is
    the separate statements' (test_first_round_is_the_three_statements)."""
    team, branches, _ = await _setup(writes, db)
    # A second relationship that the old chart's evidence supports: a hydrated row
    # with two support paths (their flattened array and their counts).
    second = {
        "kind": "relationship",
        "team": team,
        "id": "rel-alt-maintainer",
        "subject": "billing",
        "predicate": "maintained_by",
        "object": "ledger",
        "owner": "bob",
        "supports": [{"id": "sup-alt-maintainer", "evidence": "ev-alt"}],
    }
    await load_jsonl(writes, jsonl([second]))
    vector = np.asarray((await embed_queries(embedder, [QUERY]))[0], dtype=np.float32)
    spaces = [b.space_id for b in branches]
    shared = branches[0]
    sent: list[str] = []
    async with db.tenant(team, spaces) as conn:
        now = await conn.fetchval("SELECT now()")
        cq = search.CandidateQuery(
            team, tuple(branches), QUERY, vector, ("billing",), (), overfetch(10), now
        )
        dq = related.DiscoveryQuery(
            team,
            shared.space_id,
            shared.generation,
            spaces,
            now,
            now,
            QUERY,
            vector,
            overfetch(5),
            [],
            [],
            [],
        )
        conn.add_query_logger(lambda record: sent.append(record.query))
        combined = await round_trips.first_round(conn, cq, now, dq)
        assert combined is not None
        await asyncio.sleep(0)  # query loggers are called soon, not at once
        (sql,) = [q for q in sent if q.startswith("WITH cands")]
        columns = (await conn.prepare(sql)).get_attributes()
        ids = list(dict.fromkeys(i for ranked in combined.lists.values() for i in ranked))
        eligible = await hydration.eligible_evidence(conn, team, ids, spaces, now, now)
    assert (
        combined is not None
        and combined.eligible == eligible
        and combined.eligible
        and combined.discovery is not None
    )
    assert any(len(e.relationship_ids) > 1 for e in combined.eligible.values())
    types = [c.type.name for c in columns]
    assert types[0] == "record[]" and types[-1] == "record", types  # the lists, the groups
    assert types[1:-1] == [
        "text[]",  # hydration: evidence IDs
        "uuid[]",
        "text[]",
        "text[]",
        "timestamptz[]",
        "timestamptz[]",
        "int4[]",  # support paths per row
        "text[]",  # the support paths, flattened
        "text[]",  # discovery: list names
        "int8[]",
        "text[]",
        "text[]",
    ], types


async def test_hydrated_columns_keep_each_rows_support_paths(db: Database) -> None:
    """Hydration's columns line up whatever order ``hyd``'s rows come in: a row's
    support paths are flattened into one array, cut again by the per-row counts,
    so both must follow one order (the evidence ID in code-point order), not the
    rows' physical order, which the server's collation and plan decide (the
    embedded server's C collation happens to hand them over in ID order). Here
    ``hyd`` comes deliberately out of that order, with 0 to 3 paths per row and
    IDs whose order differs between collations."""
    space = uuid.uuid4()
    wanted = {  # ID -> support paths, listed in the order hyd hands them over
        "ev-b": ("rel-9", "rel-1", "rel-5"),
        "EV-1": (),
        "B.ev": ("rel-2",),
        "b-ev": ("rel-3", "rel-4"),
        "ev:a": ("rel-6",),
        "Zeta-ev": ("rel-7", "rel-8"),
        "ev-a": (),
    }
    values = ",\n".join(
        f"({n}, '{i}', '{space}'::uuid, 'src-{i}', 'text of {i}', "
        + ("NULL::timestamptz" if n % 2 else "'2026-01-02T03:04:05Z'::timestamptz")
        + ", '2026-02-03T04:05:06Z'::timestamptz, ARRAY["
        + ", ".join(f"'{p}'" for p in paths)
        + "]::text[])"
        for n, (i, paths) in enumerate(wanted.items())
    )
    hyd = (
        "WITH hyd AS MATERIALIZED (\n"
        "SELECT v.id, v.space_id, v.source_id, v.content, v.observed_at, v.recorded_at,"
        " v.relationship_ids\n"
        f"FROM (VALUES {values}) AS v (n, id, space_id, source_id, content, observed_at,"
        " recorded_at, relationship_ids)\n"
        "ORDER BY v.n\n)"
    )
    sql = (
        hyd
        + ",\n"
        + round_trips._HYD_COLUMNS
        + "\nSELECT "
        + ", ".join(round_trips._columns("hyd_columns", round_trips._HYD_NAMES))
    )
    async with db.pool.acquire() as conn:
        # The premise: hyd's rows are not in the ID order the columns follow.
        physical = await conn.fetchval(hyd + "\nSELECT array_agg(h.id) FROM hyd h")
        row = await conn.fetchrow(sql)
    assert physical == list(wanted) != sorted(wanted)
    assert row is not None
    got = round_trips._parse_hydrated(tuple(row))
    assert {i: e.relationship_ids for i, e in got.items()} == wanted
    assert {i: e.source_id for i, e in got.items()} == {i: f"src-{i}" for i in wanted}
    assert sum(e.observed_at is None for e in got.values()) == len(wanted) // 2
