"""A recall's statements are prepared once per connection and planned once.

The combined first round (gateway/store/round_trips.py) is longer than asyncpg's
default limit for statements it keeps prepared (15 KiB); unprepared, it cost
every recall a round trip to parse and describe it and a fresh plan. The pool
keeps longer statements (gateway/store/database.py), and a recall's transaction
asks PostgreSQL for generic plans (gateway/services/recall.py), so a second
recall of the same shape on the same connection reuses both.
"""

from __future__ import annotations

import re
import typing

import asyncpg
import httpx
import pydantic
import pytest

from gateway import cli
from gateway.embeddings import EmbeddingProvider
from gateway.services.recall import PLAN_CACHE_MODES, plan_cache_mode
from gateway.services.writes import WriteService
from gateway.settings import Settings
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import analyze, app_for, fetch_one, load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import ids, more_evidence, recall, token

FIRST_ROUND = "WITH cands AS MATERIALIZED%"
SCOPE_ROUND = "WITH scope AS MATERIALIZED%"
# Questions new to a gateway's query embedding LRU, so each recall sends both
# rounds: the scope round (the view with the full-text lists) while the question
# is embedded, the first round (the vector lists) after it.
FRESH = ("billing note invoices", "billing service owner", "invoice batch")


async def test_a_recall_reuses_its_prepared_statement_and_generic_plan(
    dsn: str, writes: WriteService
) -> None:
    team = unique("plans")
    await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, 5)))
    tok = await token(writes, team, "alice")
    app = app_for(dsn, pool_max_size=1)  # one connection: every recall meets its own statements
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            first = await recall(client, tok, q="billing note invoices")
            for q in ("billing service owner", "invoice batch", "who owns billing"):
                assert (await recall(client, tok, q=q))["results"]
            again = await recall(client, tok, q="billing note invoices")
            async with app.state.services.db.pool.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE $1",
                    FIRST_ROUND,
                )
                scopes = await conn.fetch(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE $1 ORDER BY generic_plans DESC",
                    SCOPE_ROUND,
                )
                # Outside a recall's transaction the server's own mode is back.
                mode = await conn.fetchval("SELECT current_setting('plan_cache_mode')")
    assert ids(again) == ids(first)
    # One prepared text per round for the recalls of one shape (shared and private
    # branch, full text and vector lists, discovery). The four fresh questions
    # send the scope round with the full-text lists, then the vector round; the
    # repeated one has its embedding at once (the LRU): a scope round with every
    # list, and no first round. The scope round with the full-text lists and
    # hydration is longer than asyncpg's default limit for prepared statements.
    assert len(rows) == 1, [r["statement"][:200] for r in rows]
    assert len(scopes) == 2, [r["statement"][:200] for r in scopes]
    assert max(len(r["statement"]) for r in scopes) > 15 * 1024
    # Each planned once, generically, and that plan reused by the recalls after it.
    assert (rows[0]["generic_plans"], rows[0]["custom_plans"]) == (4, 0)
    assert [(r["generic_plans"], r["custom_plans"]) for r in scopes] == [(4, 0), (1, 0)]
    assert mode == "auto"


async def test_other_transactions_keep_the_servers_plan_mode(db: Database) -> None:
    """The recall's plan mode is set for its own transaction: a unit without it,
    and the next transaction on the same connection, plan as the server says."""
    async with db.unit("t-plans", [], plan_cache_mode="force_generic_plan") as unit:
        async with unit.step() as conn:
            inside = await conn.fetchval("SELECT current_setting('plan_cache_mode')")
            pid = await conn.fetchval("SELECT pg_backend_pid()")
    async with db.unit("t-plans", []) as unit:
        async with unit.step() as conn:
            plain = await conn.fetchval("SELECT current_setting('plan_cache_mode')")
    assert inside == "force_generic_plan"
    assert plain == "auto"
    assert isinstance(pid, int)


async def test_the_setting_chooses_how_recalls_are_planned(dsn: str, writes: WriteService) -> None:
    """RECALL_PLAN_CACHE_MODE=force_custom_plan: every recall plans its statements
    for its own values (one generic plan serves every team otherwise); the answers
    are those of the default mode."""
    team = unique("plans")
    await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, 5)))
    tok = await token(writes, team, "alice")
    answers: dict[str, list[list[str]]] = {}
    counts: dict[str, set[tuple[int, int]]] = {}
    for mode in ("force_custom_plan", "force_generic_plan"):
        app = app_for(dsn, pool_max_size=1, plan_cache_mode=mode)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                for q in FRESH:
                    answers.setdefault(mode, []).append(ids(await recall(client, tok, q=q)))
                async with app.state.services.db.pool.acquire() as conn:
                    rows = await conn.fetch(
                        "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                        "WHERE statement LIKE $1 OR statement LIKE $2",
                        FIRST_ROUND,
                        SCOPE_ROUND,
                    )
        counts[mode] = {(r["generic_plans"], r["custom_plans"]) for r in rows}
        assert len(rows) == 2
    assert counts == {"force_custom_plan": {(0, 3)}, "force_generic_plan": {(3, 0)}}
    assert answers["force_custom_plan"] == answers["force_generic_plan"]
    assert answers["force_custom_plan"][0]


def test_an_unknown_plan_mode_is_refused_with_the_allowed_values(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo must not silently fall back to a default: the settings refuse it and
    the CLI says which setting and which values, before doing anything."""
    typo: typing.Any = "generic"  # not a value of the setting's Literal, on purpose
    with pytest.raises(pydantic.ValidationError) as caught:
        Settings(plan_cache_mode=typo)
    assert "plan_cache_mode" in str(caught.value)
    assert "force_generic_plan" in str(caught.value)
    monkeypatch.setenv("RECALL_PLAN_CACHE_MODE", "fast")
    assert cli.main(["export-schema", "-o", "-"]) == 2
    err = capsys.readouterr().err
    # named as the user set it: the environment variable, and the value given
    assert "invalid settings: RECALL_PLAN_CACHE_MODE:" in err and "force_custom_plan" in err
    assert "(got 'fast')" in err
    # the settings and the recall service agree on the values
    assert typing.get_args(Settings.model_fields["plan_cache_mode"].annotation) == PLAN_CACHE_MODES
    assert plan_cache_mode("server") is None
    assert plan_cache_mode("auto") == "auto"


async def test_server_mode_leaves_the_databases_own_setting(
    fresh_dsn: str, embedder: EmbeddingProvider
) -> None:
    """RECALL_PLAN_CACHE_MODE=server: the gateway sets nothing, so the setting a
    connection got at login applies, here the database's (ALTER DATABASE, this
    test's own database). Without ``server`` honoured, the gateway's default
    (force_generic_plan) would give (3, 0)."""
    team = unique("server")
    owner = await asyncpg.connect(fresh_dsn)
    try:
        name = await owner.fetchval("SELECT current_database()")
        await owner.execute(f'ALTER DATABASE "{name}" SET plan_cache_mode = force_custom_plan')
    finally:
        await owner.close()
    db = await Database.open(fresh_dsn, min_size=1, max_size=1)
    try:
        writes = WriteService(db, embedder)
        await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, 5)))
        tok = await token(writes, team, "alice")
    finally:
        await db.close()
    app = app_for(fresh_dsn, pool_max_size=1, plan_cache_mode="server")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            for q in FRESH:
                assert ids(await recall(client, tok, q=q))
        async with app.state.services.db.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE $1 OR statement LIKE $2",
                FIRST_ROUND,
                SCOPE_ROUND,
            )
    assert [(r["generic_plans"], r["custom_plans"]) for r in rows] == [(0, 3), (0, 3)]


async def test_hydration_looks_candidates_up_and_groups_paths_once(
    db: Database, writes: WriteService
) -> None:
    """The hydration statement's generic plan (the one a recall's connection
    keeps) looks each candidate up by the evidence primary key and groups the
    support paths without joining them back to the candidates: written as
    ``e.id = ANY (...)`` beside the space's predicates, a generic plan read a
    whole space of 1,000 evidence to find 120 candidates, and the join of the
    candidates with their paths, both estimated at one row, rescanned the paths
    once per candidate (docs/benchmarks.md, "What a recall costs the server").
    The answer is unchanged: the same rows as the statement returns anyway."""
    from gateway.store import recall as recall_store

    team = unique("hydplan")
    await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, 5)))
    async with db.pool.acquire() as conn:
        spaces = [
            r["id"]
            for r in await conn.fetch("SELECT id FROM memory_spaces WHERE team_id = $1", team)
        ]
        # a space of about 2,000 evidence (without supports: never eligible), and
        # statistics that know it, so that reading the space is not a cheap plan
        columns = await conn.fetchval(
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) "
            "FROM pg_attribute WHERE attrelid = 'evidence'::regclass AND attnum > 0 "
            "AND NOT attisdropped AND attname <> 'id'"
        )
        await conn.execute(
            f"INSERT INTO evidence (id, {columns}) SELECT id || '-' || g, {columns} "
            "FROM evidence, generate_series(1, 300) AS g WHERE team_id = $1",
            team,
        )
        await analyze(conn, "evidence")
    async with db.unit(team, spaces, plan_cache_mode="force_generic_plan") as unit:
        async with unit.step() as conn:
            await conn.execute(f"PREPARE hydplan AS {recall_store.ELIGIBLE_SQL}")
            plan = "\n".join(
                r[0]
                for r in await conn.fetch(
                    f"EXPLAIN EXECUTE hydplan('{team}', ARRAY['ev-owner'], "
                    "ARRAY[gen_random_uuid()], now(), now())"
                )
            )
            await conn.execute("DEALLOCATE hydplan")
            now = await conn.fetchval("SELECT now()")
            rows = await recall_store.eligible_evidence(
                conn, team, ["ev-owner", "ev-owner", "ev-private", "nope"], spaces, now, now
            )
    lines = plan.splitlines()
    scan = next(i for i, line in enumerate(lines) if " on evidence e " in line)
    assert "Index Scan" in lines[scan] and "((id)::text = w.id)" in lines[scan + 1], plan
    assert plan.count("CTE Scan on ev ") == 1, plan  # read by the paths only
    assert plan.count("CTE Scan on paths") == 1, plan  # read once, by the grouping
    assert set(rows) == {"ev-owner", "ev-private"}
    assert rows["ev-owner"].relationship_ids == ("rel-owner",)


async def test_hydration_checks_each_source_once(db: Database) -> None:
    """Hydration's generic plan reads a candidate's source lifecycle once per
    distinct source (``active_sources``), not once per candidate: the candidates
    of a recall mostly share a few sources (every candidate of a benchmark team
    shares one), and before, each of the 60 to 120 candidates ran the same
    lookup (a scan and a sort of the source's events; docs/benchmarks.md, "The
    scope round's evidence parts at 100k"). Same rows: tests/test_recall.py
    (``ev-withdrawn-src``) and tests/test_scope_round.py."""
    from gateway.store import recall as recall_store

    async with db.unit("t-plan", [], plan_cache_mode="force_generic_plan") as unit:
        async with unit.step() as conn:
            await conn.execute(f"PREPARE hydsrc AS {recall_store.ELIGIBLE_SQL}")
            plan = "\n".join(
                r[0]
                for r in await conn.fetch(
                    "EXPLAIN EXECUTE hydsrc('t-plan', ARRAY['ev-a', 'ev-b'], "
                    "ARRAY[gen_random_uuid()], now(), now())"
                )
            )
            await conn.execute("DEALLOCATE hydsrc")
    assert "CTE active_sources" in plan, plan
    # the table's scans (an index scan, or a bitmap heap scan over its index's
    # bitmap scan, which names the index, not the table): one
    assert len(re.findall(r" on source_lifecycle_events\s", plan)) == 1, plan
    assert "source_lifecycle_events" in _cte(plan, "active_sources"), plan
    assert "source_lifecycle_events" not in _cte(plan, "ev_any_source"), plan


async def _function_body_plan(
    conn: Conn,
    function: str,
    args: list[str],
    which: int = 0,
    statement: typing.Callable[[str], str] | None = None,
) -> str:
    """The generic plan of a ``RETURN QUERY`` function's query, as the function keeps
    it (its body prepared with the arguments as parameters; the function's plan is
    not in EXPLAIN of a call). ``args``: SQL literals, one per argument; ``which``:
    the function's ``which``-th ``RETURN QUERY`` (from 0), to the semicolon that
    ends it (the one before ``END``, ``RETURN`` or ``EXIT``); or ``statement`` of the
    function's source. The function's declared variables are parameters too, at
    their initial values."""
    src, names, types, settings = await fetch_one(
        conn,
        "SELECT prosrc, proargnames, "
        "ARRAY(SELECT format_type(t, NULL) FROM unnest(proargtypes) AS t), proconfig "
        "FROM pg_proc WHERE oid = $1::regproc",
        function,
    )
    for setting in settings or ():  # the function's own SET clauses
        name, _, value = setting.partition("=")
        await conn.execute("SELECT set_config($1, $2, true)", name, value)
    if statement is not None:
        body = statement(src)
    else:
        start = [m.end() for m in re.finditer("RETURN QUERY", src)][which]
        end = re.compile(r";\s*(?:END|RETURN|EXIT)\b").search(src, start)
        assert end is not None, src
        body = src[start : end.start()]
    for i, (name, type_) in enumerate(zip(names[: len(types)], types, strict=True), 1):
        body = re.sub(rf"\b{name}\b", f"${i}::{type_}", body)
    # The function's own variables (``DECLARE v_x type := value;``) are parameters
    # of its query too, bound to their initial values.
    types = list(types)
    args = list(args)
    for name, type_, value in re.findall(r"^\s*(v_\w+)\s+([^:;]+?)\s*:=\s*([^;]+);", src, re.M):
        types.append(type_)
        args.append(f"({value})::{type_}")
        body = re.sub(rf"\b{name}\b", f"${len(types)}::{type_}", body)
    await conn.execute(f"PREPARE body_plan ({', '.join(types)}) AS {body}")
    try:
        rows = await conn.fetch(f"EXPLAIN EXECUTE body_plan({', '.join(args)})")
    finally:
        await conn.execute("DEALLOCATE body_plan")
    return "\n".join(r[0] for r in rows)


def _cte(plan: str, name: str) -> str:
    """The lines of one CTE of a plan: from ``CTE name`` to the next line as little
    indented."""
    lines = plan.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"CTE {name}")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if len(lines[i]) - len(lines[i].lstrip()) <= indent
        ),
        len(lines),
    )
    return "\n".join(lines[start:end])


@pytest.mark.parametrize(
    ("function", "view"),
    [
        ("evidence_fulltext_top_k", ["NULL::timestamptz", "'{}'::text[]"]),
        ("relationship_fulltext_top_k", ["now()"]),
    ],
)
async def test_fulltext_survivors_are_grouped_once_not_joined(
    db: Database, function: str, view: list[str]
) -> None:
    """The full-text functions' step ``whole`` (the survivors whose bound plus their
    minor lexemes' term parts reaches theta) in the generic plan the function
    keeps: one grouping, no join. Written as a LEFT JOIN of the survivors with
    the grouped minor parts (db/0105), the plan was a nested loop that ran the
    grouping again for every survivor, filtering the joined rows by ID: 1.2
    million rows compared, 274 ms instead of 11 for a list of 60 on a space of
    10,000 evidence (db/0150; docs/benchmarks.md, "The full-text list's
    survivors"). The lists are unchanged (tests/test_bm25_top_k.py)."""
    space = "'00000000-0000-0000-0000-000000000000'::uuid"
    args = [
        "'t-plan'",
        space,
        "1",
        *view,
        "60",
        "0",
        "'{a,b}'::text[]",
        "'{1,2}'::float8[]",
        "'{5,9}'::float8[]",
        "'{1,2}'::integer[]",
        "10.0",
    ]
    async with db.unit("t-plan", [], plan_cache_mode="force_generic_plan") as unit:
        async with unit.step() as conn:
            plan = await _function_body_plan(conn, function, args)
    whole = _cte(plan, "whole")
    assert "Join" not in whole, whole
    assert "Aggregate" in whole, whole  # grouped once per document
    assert plan.count("CTE Scan on surv") >= 2, plan  # the bounds and the IDs read


@pytest.mark.parametrize(
    ("function", "view", "postings", "documents", "limit"),
    [
        (
            "evidence_fulltext_top_k",
            ["NULL::timestamptz", "'{}'::text[]"],
            "evidence_terms",
            "evidence",
            "60",
        ),
        ("relationship_fulltext_top_k", ["now()"], "relationship_terms", "relationships", "40"),
    ],
)
async def test_fulltext_scores_each_document_once_from_its_lexemes(
    db: Database, function: str, view: list[str], postings: str, documents: str, limit: str
) -> None:
    """The full-text functions (db/0197, db/0198) in the generic plan their query
    keeps:

    - a scored document's term frequencies come from its own ``search_document``
      (looked up anyway for its length and visibility; the postings' tf is
      defined from it, db/0055, and cannot disagree with it since db/0196): the
      postings are read by the grouping and the survivors' minor lexemes only.
      Before db/0195 (evidence) and db/0197 (relationships) every set of scored
      documents read every query lexeme's postings again for their IDs, then
      sorted and grouped them: about a third of the evidence list's server CPU;
    - each document is scored once: best's scores are read by theta and by the
      answer, which scores only the documents of whole outside best (db/0175;
      before it, and before db/0197 for relationships, most of best was looked
      up and scored twice);
    - every lookup is the function's ``*_fulltext_document`` inlined (no
      function call per document), three in the query: best, best_visible, the
      answer's;
    - the grouping is hashed (db/0151: sorting its text keys was most of it);
    - one query serves both paths: the first floor and the lexeme bounds are a
      statement of their own, run from ``PRUNE_FROM_POSTINGS`` on (db/0170 and
      db/0195 had a second copy of the query for the path without them).

    The lists are unchanged (tests/test_bm25_top_k.py, both paths)."""
    args = [
        "'t-plan'",
        "'00000000-0000-0000-0000-000000000000'::uuid",
        "1",
        *view,
        limit,
        "20000",
        "'{a,b}'::text[]",
        "'{1,2}'::float8[]",
        "'{5,9}'::float8[]",
        "'{1,2}'::integer[]",
        "10.0",
    ]
    async with db.unit("t-plan", [], plan_cache_mode="force_generic_plan") as unit:
        async with unit.step() as conn:
            src = await conn.fetchval(
                "SELECT prosrc FROM pg_proc WHERE oid = $1::regproc", function
            )
            plan = await _function_body_plan(conn, function, args)
    assert src.count("RETURN QUERY") == 1, "one query for both paths"
    floor = src.index("IF (SELECT sum(d) FROM unnest(p_dfs) AS d) >= p_prune_from THEN")
    assert (
        floor < src.index("seed AS MATERIALIZED") < src.index("END IF") < src.index("RETURN QUERY")
    )
    # The floor's statement (run from the threshold on): its lookups inlined too.
    async with db.unit("t-plan", [], plan_cache_mode="force_generic_plan") as unit:
        async with unit.step() as conn:
            floor_plan = await _function_body_plan(
                conn,
                function,
                args,
                statement=lambda text: (
                    text[text.index("THEN", floor) + 4 : text.index("END IF")]
                    .strip()
                    .rstrip(";")
                    .replace("INTO v_theta0, v_rest, v_minor", "")
                ),
            )
    assert "CTE seed" in floor_plan and "CTE theta0" in floor_plan, floor_plan
    assert "_fulltext_document" not in floor_plan, floor_plan  # inlined
    assert floor_plan.count(f"on {documents} ") == 2, floor_plan  # the walk's, theta0's
    # grp, the minor parts of whole; no scoring step reads the postings
    assert plan.count(f"on {postings}") == 2, plan
    assert f"on {postings}" in _cte(plan, "grp"), plan
    for step in ("best_scores", "best_visible"):
        assert postings not in _cte(plan, step), plan
        assert f"on {documents} " in _cte(plan, step), plan
    assert plan.count(f"on {documents} ") == 3, plan  # best, best_visible, the answer's
    assert "_fulltext_document" not in plan, plan  # inlined, never a Function Scan
    assert plan.count("CTE Scan on best_scores") == 2, plan  # by theta and by the answer
    assert "Filter: (NOT in_best)" in plan, plan
    for step in ("seed", "theta0", "ranked", "rest"):
        assert f"CTE {step}" not in plan, plan
    assert "WindowAgg" not in plan.split("CTE grp")[0], plan  # no lexeme bounds
    grp = _cte(plan, "grp")
    assert grp.splitlines()[1].strip().startswith("->  HashAggregate"), grp
    assert "Sort" not in grp, grp
    # db/0204 (evidence): grp keeps only the groups whose bound reaches the cut
    # (read from the CTE cut by the grouping's filter), the answer is guarded by
    # theta >= cut, and the query runs a second time, with no cut, when the guard
    # fails. The relationship function has no cut (db/0197).
    if postings == "relationship_terms":
        assert "CTE cut" not in plan, plan
        return
    assert "CTE cut" in plan, plan
    assert "CTE Scan on cut" in grp, grp
    assert plan.count("CTE Scan on cut") == 2, plan  # the grouping's filter, the guard
    assert re.search(r"EXIT WHEN FOUND OR NOT v_cut;\s*v_cut := false;\s*END LOOP;", src), src
