"""The later rounds of a recall read what the answer reaches, not the whole space.

The hypothesis, conflict and community statements run with the generic plan a
recall's connection keeps (gateway/services/recall.py), whose estimates are those
of an average team. Written as plain joins, those plans read every hypothesis,
conflict case or evidence conflict of the space (and looked up each
hypothesis's latest status) to find the few that the answer's IDs reach, and
the community snapshot read every member of a run once per community. These
tests run each statement under ``EXPLAIN (ANALYZE)`` with its generic plan as
the tenant, in a space with many more of them than the answer reaches, and
count the rows read from each table (docs/benchmarks.md, "Hypotheses, conflicts
and communities per recall"). The answers themselves are checked by the
frontiers' own tests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from gateway.services import communities as community_builder
from gateway.services.writes import WriteService
from gateway.store import communities as community_store
from gateway.store import conflicts as conflict_store
from gateway.store import hypotheses as hypothesis_store
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import analyze, load_jsonl, unique
from .factories import jsonl, team_records
from .test_hypotheses import hypothesis
from .test_recall import more_evidence
from .test_related import load_graph

CASES = 20
COPIES = 300


async def _copy(
    admin_conn: Conn, table: str, where: str, renames: dict[str, str], *args: Any
) -> None:
    """COPIES copies of ``table``'s rows that match ``where``, each column in
    ``renames`` computed by its expression (``g``: the copy's number), so that
    the tables have the size a store has and the plans are those of such a store
    (on a few rows, every plan reads whole tables)."""
    columns = [
        r["attname"]
        for r in await admin_conn.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 "
            "AND NOT attisdropped AND attgenerated = '' AND attidentity = '' ORDER BY attnum",
            table,
        )
    ]
    exprs = ", ".join(renames.get(c, c) for c in columns)
    await admin_conn.execute(
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {exprs} "
        f"FROM {table}, generate_series(1, {COPIES}) AS g WHERE {where}",
        *args,
    )


async def _explain(conn: Conn, sql: str, args: Sequence[Any]) -> dict[str, Any]:
    """The statement's generic plan as JSON, run (``EXPLAIN (ANALYZE)`` of a
    ``PREPARE``d copy; its parameters as literals of their types)."""
    types = [
        t.name if t.schema == "pg_catalog" else f"{t.schema}.{t.name}"
        for t in (await conn.prepare(sql)).get_parameters()
    ]
    literals = []
    for type_, value in zip(types, args, strict=True):
        text = await conn.fetchval(f"SELECT quote_nullable($1::{type_}::text)", value)
        literals.append(f"{text}::{type_}")
    await conn.execute(f"PREPARE answer_plan ({', '.join(types)}) AS {sql}")
    try:
        raw = await conn.fetchval(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE answer_plan ({', '.join(literals)})"
        )
    finally:
        await conn.execute("DEALLOCATE answer_plan")
    plan: dict[str, Any] = json.loads(raw)[0]["Plan"]
    return plan


def _read(plan: dict[str, Any], table: str) -> tuple[int, int]:
    """Rows that the plan's scans of ``table`` returned and removed by a filter,
    over all their loops."""
    returned = removed = 0
    stack = [plan]
    while stack:
        node = stack.pop()
        if node.get("Relation Name") == table:
            loops = int(node.get("Actual Loops", 1))
            returned += round(node.get("Actual Rows", 0) * loops)
            removed += round(node.get("Rows Removed by Filter", 0) * loops)
        stack.extend(node.get("Plans", ()))
    return returned, removed


async def _generic_plan(
    db: Database,
    admin_conn: Conn,
    tables: Sequence[str],
    team: str,
    spaces: Sequence[UUID],
    sql: str,
    args: Sequence[Any],
) -> dict[str, Any]:
    """The plan a recall's connection keeps, as the tenant, with statistics that
    know the tables' sizes."""
    await analyze(admin_conn, *tables)
    async with db.unit(team, list(spaces), plan_cache_mode="force_generic_plan") as unit:
        async with unit.step() as conn:
            return await _explain(conn, sql, args)


async def _shared(admin_conn: Conn, team: str) -> tuple[UUID, int, datetime]:
    row = await admin_conn.fetchrow(
        "SELECT s.id, max(g.generation) AS generation, now() AS now "
        "FROM memory_spaces s JOIN space_generations g ON g.space_id = s.id "
        "WHERE s.team_id = $1 AND s.kind = 'shared' GROUP BY s.id",
        team,
    )
    assert row is not None
    return row["id"], row["generation"], row["now"]


def _conflict_records(team: str) -> list[dict[str, Any]]:
    """2 * CASES supported relationships and evidence (with an occurrence each),
    a relationship case and an evidence conflict over each pair."""
    records = team_records(team) + more_evidence(team, 2 * CASES)
    for r in records:
        if r["kind"] == "evidence" and r["id"].startswith("ev-bulk-"):
            r["occurrences"] = [{"id": "o-" + r["id"], "start": 0, "end": 12}]
    for i in range(0, 2 * CASES, 2):
        a, b = f"{i:03d}", f"{i + 1:03d}"
        records.append(
            {
                "kind": "conflict_case",
                "team": team,
                "id": f"case-{a}",
                "question": f"Batch {a} or {b}?",
                "positions": [
                    {"id": f"pa-{a}", "label": "a", "relationships": [f"rel-bulk-{a}"]},
                    {"id": f"pb-{a}", "label": "b", "relationships": [f"rel-bulk-{b}"]},
                ],
            }
        )
        records.append(
            {
                "kind": "evidence_conflict",
                "team": team,
                "id": f"evc-{a}",
                "question": f"Note {a} or {b}?",
                "positions": [
                    {
                        "id": f"ep-{x}",
                        "label": x,
                        "evidence": f"ev-bulk-{x}",
                        "occurrence": f"o-ev-bulk-{x}",
                    }
                    for x in (a, b)
                ],
            }
        )
    return records


async def test_conflicts_are_found_from_the_answers_ids(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """One case and one evidence conflict reached, of CASES each in the space:
    the statements read the reached ones only (before: every case and every
    evidence conflict of the space, and their positions)."""
    team = unique("cfplan")
    await load_jsonl(writes, jsonl(_conflict_records(team)))
    space, _, now = await _shared(admin_conn, team)
    last = f"{2 * CASES - 2:03d}"  # copies of the last pair's, which the answer does not reach
    suffix = {"id": "id || '-' || g"}
    await _copy(admin_conn, "conflict_cases", f"team_id = $1 AND id = 'case-{last}'", suffix, team)
    await _copy(
        admin_conn,
        "conflict_positions",
        f"team_id = $1 AND case_id = 'case-{last}'",
        {**suffix, "case_id": "case_id || '-' || g"},
        team,
    )
    await _copy(
        admin_conn,
        "conflict_position_relationships",
        f"team_id = $1 AND case_id = 'case-{last}'",
        {"case_id": "case_id || '-' || g", "position_id": "position_id || '-' || g"},
        team,
    )
    await _copy(
        admin_conn,
        "conflict_case_events",
        f"team_id = $1 AND case_id = 'case-{last}'",
        {"case_id": "case_id || '-' || g", "event_id": "NULL"},
        team,
    )
    await _copy(
        admin_conn, "evidence_conflicts", f"team_id = $1 AND id = 'evc-{last}'", suffix, team
    )
    await _copy(
        admin_conn,
        "evidence_conflict_positions",
        f"team_id = $1 AND conflict_id = 'evc-{last}'",
        {**suffix, "conflict_id": "conflict_id || '-' || g"},
        team,
    )
    query = conflict_store.ConflictQuery(
        team, [space], {"ev-bulk-004": 1}, {"rel-bulk-006": 1}, now, cap=10, supporter_cap=5
    )
    cases = conflict_store.cases_statement(query)
    evidence = conflict_store.evidence_statement(query)
    assert cases is not None and evidence is not None
    tables = [
        "conflict_cases",
        "conflict_case_events",
        "conflict_positions",
        "conflict_position_relationships",
        "evidence_conflicts",
        "evidence_conflict_positions",
    ]
    case_plan = await _generic_plan(db, admin_conn, tables, team, [space], *cases)
    evidence_plan = await _generic_plan(db, admin_conn, tables, team, [space], *evidence)
    assert _read(case_plan, "conflict_cases") == (1, 0), case_plan
    assert _read(evidence_plan, "evidence_conflicts") == (1, 0), evidence_plan
    # and what they return is the reached ones
    async with db.unit(team, [space]) as unit:
        async with unit.step() as conn:
            got_cases = conflict_store.parse_cases(await conn.fetch(cases[0], *cases[1]))
            got_ev = conflict_store.parse_evidence_conflicts(
                await conn.fetch(evidence[0], *evidence[1])
            )
    assert [c.id for c in got_cases] == ["case-006"]
    assert [c.id for c in got_ev] == ["evc-004"]


async def test_hypotheses_look_up_the_status_of_candidates_only(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """Of 303 hypotheses in the space, one is linked and one shares a lexeme with
    the query: the latest status is looked up for those (before: for every
    hypothesis of the space, by the lexical list, before its lexeme test)."""
    team = unique("hyplan")
    records = team_records(team) + [hypothesis(team, "h-other", "Quokka ribbon lantern.")]
    records.append(hypothesis(team, "h-linked", "Walrus velvet compass.", evidence=["ev-owner"]))
    records.append(hypothesis(team, "h-word", "Zeppelin marmalade."))
    await load_jsonl(writes, jsonl(records))
    space, generation, now = await _shared(admin_conn, team)
    await _copy(
        admin_conn, "hypotheses", "team_id = $1 AND id = 'h-other'", {"id": "id || '-' || g"}, team
    )
    await _copy(
        admin_conn,
        "hypothesis_feedback",
        "team_id = $1 AND hypothesis_id = 'h-other'",
        {"hypothesis_id": "hypothesis_id || '-' || g", "feedback_id": "NULL"},
        team,
    )
    query = hypothesis_store.HypothesisQuery(
        team, space, generation, now, {"ev-owner": 1}, {}, "zeppelin", per_list=24
    )
    sql, args = hypothesis_store.statement(query)
    tables = ["hypotheses", "hypothesis_feedback", "hypothesis_evidence"]
    plan = await _generic_plan(db, admin_conn, tables, team, [space], sql, args)
    looked_up = _read(plan, "hypothesis_feedback")[0]
    assert looked_up <= 4, plan  # the two listed, each once per list and once for its row
    async with db.unit(team, [space]) as unit:
        async with unit.step() as conn:
            found = hypothesis_store.parse(await conn.fetch(sql, *args))
    assert (found.linked, found.lexical) == (("h-linked",), ("h-word",))


async def test_community_members_are_read_by_community(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """The snapshot reads each touched community's members by its ordinal
    (db/0185), not every member of the run once per community."""
    team = unique("complan")
    await load_graph(writes, team)
    built = await community_builder.build_communities(db, team, max_nodes=1000, max_edges=10_000)
    assert built.status == "succeeded"
    space, _, _ = await _shared(admin_conn, team)
    # older runs of the same graph, so that the team's members are many
    run = "md5(id::text || g)::uuid"
    await _copy(
        admin_conn,
        "community_runs",
        "team_id = $1 AND id = $2",
        {"id": run, "started_at": "started_at - g * interval '1 minute'"},
        team,
        built.run_id,
    )
    await _copy(
        admin_conn,
        "communities",
        "team_id = $1 AND run_id = $2",
        {"run_id": "md5(run_id::text || g)::uuid"},
        team,
        built.run_id,
    )
    await _copy(
        admin_conn,
        "community_members",
        "team_id = $1 AND run_id = $2",
        {"run_id": "md5(run_id::text || g)::uuid"},
        team,
        built.run_id,
    )
    groups = [
        r["semantic_group_key"]
        for r in await admin_conn.fetch(
            "SELECT DISTINCT semantic_group_key FROM community_members WHERE run_id = $1",
            built.run_id,
        )
    ]
    ordinals = await admin_conn.fetchval(
        "SELECT count(DISTINCT ordinal) FROM community_members WHERE run_id = $1", built.run_id
    )
    assert ordinals >= 2  # else every member is its community's
    plan = await _generic_plan(
        db,
        admin_conn,
        ["community_members", "communities", "community_runs"],
        team,
        [space],
        community_store._SNAPSHOT,
        [team, space, groups],
    )
    members = await admin_conn.fetchval(
        "SELECT count(*) FROM community_members WHERE run_id = $1", built.run_id
    )
    returned, removed = _read(plan, "community_members")
    # the touched communities' members once (plus the anchors' lookup), none read and dropped
    assert removed == 0, plan
    assert returned <= 2 * members, plan
