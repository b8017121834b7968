"""The visibility filter inside db/0085's full-text functions is the rule of the
rest of the read path.

``evidence_fulltext_top_k`` and ``relationship_fulltext_top_k`` check each
document they look up against the view (team, space, generation, system time,
and for evidence the caller's exclusions): in the first floor's walk, each set
of documents scored for a floor, and the final scoring. Since db/0197 and
db/0198 every such lookup is one SQL function (``evidence_fulltext_document``,
``relationship_fulltext_document``), so the filter is written once; before, in
each step. It must say what the rest of the read path says: for evidence the
filter of every candidate list (``gateway/store/search.py``, ``_visible``), for
relationships the visibility part of discovery's eligibility
(``gateway/store/related.py``, ``visible_relationship``). A filter that drifts
may change no list on a small store and silently break one on a large store.

So, on a store holding everything a view must hide or keep (an earlier
generation, rows recorded after a ``knownAt`` instant, rows of another team and
of a private space, excluded IDs) and rows that candidates deliberately keep
(withdrawn evidence, superseded and retracted relationships, relationships not
yet valid: eligibility decides about those later), and in the current, a
``validAt`` and two ``knownAt`` views as the services build them:

- the filter, read from the installed functions and run on its own against
  the store, selects exactly the rule's set;
- the functions' lists at a length above the number of hits hold exactly the
  rule's set.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pytest

from gateway.services.evidence import candidate_query
from gateway.services.recall_input import RecallRequest
from gateway.services.recall_types import ReadView
from gateway.services.related import SharedBranch, discovery_query
from gateway.services.writes import WriteService
from gateway.store import related
from gateway.store.connection import Conn
from gateway.store.database import Database
from gateway.store.params import Params
from gateway.store.recall import resolve_view
from gateway.store.search import MAX_PER_LIST, BranchSearch, _visible, evidence_candidates

from .conftest import load_jsonl, unique
from .factories import jsonl
from .test_search import _ev, _spaces, _team

QUERY = "kafka replica"  # every text below holds "kafka": every document is a hit


def _relationship(
    team: str, rid: str, text: str, *, entity: str, source: str, **extra: Any
) -> list[dict[str, Any]]:
    """A relationship "<entity> notes <text>" supported by an evidence of its own."""
    return [
        _ev(team, f"ev-{rid}", f"Evidence for {rid}.", source=source),
        {
            "kind": "relationship",
            "team": team,
            "id": rid,
            "space": "shared",
            "owner": "alice",
            "subject": entity,
            "predicate": "notes",
            "object_value": text,
            "supports": [{"id": f"sup-{rid}", "evidence": f"ev-{rid}"}],
            **extra,
        },
    ]


async def _last_recorded(conn: Conn, team: str) -> datetime:
    at: datetime = await conn.fetchval(
        "SELECT greatest((SELECT max(recorded_at) FROM evidence WHERE team_id = $1),"
        " (SELECT max(recorded_at) FROM relationships WHERE team_id = $1))",
        team,
    )
    return at


@dataclass(frozen=True)
class Store:
    team: str
    before_reset: datetime  # a knownAt instant in the first generation
    known: datetime  # a knownAt instant before the late rows
    excluded: tuple[str, ...]


WORDS = ["kafka replica lag", "kafka broker", "kafka", "kafka offset leader replica"]


def _text(i: int) -> str:
    return WORDS[i % len(WORDS)]


@pytest.fixture
async def store(writes: WriteService, admin_conn: Conn) -> Store:
    team, other = unique("vis"), unique("vis-other")
    # Generation 1 of the shared space, then a reset.
    gen1 = _team(team, "alice") + [
        {"kind": "entity", "team": team, "id": "zebra", "name": "zebra", "type": "thing"}
    ]
    gen1 += [_ev(team, f"old-{i}", _text(i)) for i in range(6)]
    for i in range(4):
        gen1 += _relationship(team, f"rel-old-{i}", _text(i), entity="zebra", source="src")
    await load_jsonl(writes, jsonl(gen1))
    before_reset = await _last_recorded(admin_conn, team)
    await load_jsonl(
        writes, jsonl([{"kind": "space_reset", "team": team, "id": "reset-1", "space": "shared"}])
    )
    # Generation 2: kept, withdrawn and excluded evidence; active, superseded,
    # retracted and not yet valid relationships; a private space's evidence.
    gen2: list[dict[str, Any]] = [
        {"kind": "source", "team": team, "id": "src-2", "type": "document", "title": "N"},
        {"kind": "entity", "team": team, "id": "yak", "name": "yak", "type": "thing"},
        {
            "kind": "source",
            "team": team,
            "id": "src-private",
            "space": "private:alice",
            "type": "conversation",
            "title": "Private notes",
        },
    ]
    gen2 += [_ev(team, f"cur-{i}", _text(i), source="src-2") for i in range(10)]
    gen2 += [_ev(team, f"priv-{i}", _text(i), source="src-private") for i in range(4)]
    for i in range(8):
        # rel-cur-7 is valid only from far in the future.
        extra = {"valid_from": "2999-01-01T00:00:00Z"} if i == 7 else {}
        gen2 += _relationship(team, f"rel-cur-{i}", _text(i), entity="yak", source="src-2", **extra)
    gen2 += [
        {"kind": "evidence_lifecycle", "team": team, "id": "wd-1", "evidence": "cur-1",
         "status": "withdrawn"},
        {"kind": "relationship_transition", "team": team, "id": "tr-1",
         "relationship": "rel-cur-1", "status": "superseded", "superseded_by": "rel-cur-2"},
        {"kind": "relationship_transition", "team": team, "id": "tr-2",
         "relationship": "rel-cur-3", "status": "retracted"},
    ]  # fmt: skip
    await load_jsonl(writes, jsonl(gen2))
    known = await _last_recorded(admin_conn, team)
    # Recorded after the knownAt instant.
    late = [_ev(team, f"late-{i}", _text(i), source="src-2") for i in range(5)]
    for i in range(3):
        late += _relationship(team, f"rel-late-{i}", _text(i), entity="yak", source="src-2")
    await load_jsonl(writes, jsonl(late))
    # Another team: the same words, some of the same IDs.
    theirs = _team(other, "alice") + [
        {"kind": "entity", "team": other, "id": "yak", "name": "yak", "type": "thing"}
    ]
    theirs += [_ev(other, f"cur-{i}", _text(i)) for i in range(3)]
    theirs += [_ev(other, f"their-{i}", _text(i)) for i in range(5)]
    for i in range(3):
        theirs += _relationship(other, f"rel-cur-{i}", _text(i), entity="yak", source="src")
        theirs += _relationship(other, f"rel-their-{i}", _text(i), entity="yak", source="src")
    await load_jsonl(writes, jsonl(theirs))
    return Store(team, before_reset, known, excluded=("cur-4", "cur-5", "old-2", "late-1"))


VIEWS = ("current", "validAt", "knownAt", "knownAt before the reset")


def _request(store: Store, view: str) -> RecallRequest:
    """A recall request of the view, with some of the store's evidence known."""
    known_at = {"knownAt": store.known, "knownAt before the reset": store.before_reset}.get(view)
    return RecallRequest(
        query=QUERY,
        limit=10,
        relationship_limit=10,
        community_limit=0,
        community_relationship_limit=0,
        hypothesis_limit=0,
        valid_at=store.before_reset if view == "validAt" else None,
        known_at=known_at,
        known_evidence_ids=store.excluded,
        known_relationship_ids=(),
        expand_from_entity_ids=(),
    )


async def _view(
    db: Database, store: Store, request: RecallRequest
) -> tuple[ReadView, list[BranchSearch]]:
    """The view and branches as the recall's scope stage builds them."""
    async with db.pool.acquire() as conn:
        spaces = list((await _spaces(conn, store.team)).values())
    async with db.tenant(store.team, spaces) as conn:
        now, views = await resolve_view(conn, store.team, spaces, request.known_at)
    t_sys = request.known_at or now
    view = ReadView(
        team_id=store.team,
        space_kinds={s.space_id: s.kind for s in views},
        t_sys=t_sys,
        t_valid=request.valid_at or t_sys,
    )
    branches = [
        BranchSearch(s.kind, s.space_id, s.generation)
        for s in sorted(views, key=lambda s: s.kind != "shared")
        if s.generation is not None
    ]
    return view, branches


def _expected(view: str, prefix: str, current: int, late: int, old: int) -> set[str]:
    """IDs ``<prefix>cur-i``, ``<prefix>late-i``, ``<prefix>old-i`` the view shows."""
    if view == "knownAt before the reset":
        return {f"{prefix}old-{i}" for i in range(old)}
    shown = {f"{prefix}cur-{i}" for i in range(current)}
    if view != "knownAt":
        shown |= {f"{prefix}late-{i}" for i in range(late)}
    return shown


async def _copies(
    conn: Conn,
    functions: Sequence[str],
    table: str,
    params: dict[str, tuple[str, Any]],
) -> list[tuple[str, list[Any]]]:
    """Every lookup of ``table`` in the installed ``functions`` (a full-text function
    and the lookup function it calls, if any), as a query (and its arguments) of
    the IDs of the rows its filter lets through; ``params``: the functions'
    parameters by name, with their SQL types and values."""
    found = []
    for function in functions:
        body = await conn.fetchval(f"SELECT pg_get_functiondef('{function}'::regproc)")
        here = re.findall(
            rf"FROM (?:public\.)?{table} d\s+WHERE (.*?)\s+OFFSET 0", body, flags=re.S
        )
        # Every mention of the table is such a lookup: none written another way escapes.
        assert len(here) == len(re.findall(rf"\b{table}\b", body)), function
        found += here
    assert found, functions
    # The looked-up document: a column of the calling step, or the lookup
    # function's parameter (db/0197).
    documents = ("d.id = g.doc_id", "d.id = p_doc_id")
    # And they are one filter, however often written. (Also what catches a copy
    # that drops the team: a space belongs to one team, so no row would show it.)
    unified = {" ".join(p.replace(documents[1], documents[0]).split()) for p in found}
    assert len(unified) == 1, found
    queries = []
    for predicate in found:
        # Every row of the table instead of the looked-up document.
        assert sum(predicate.count(d) for d in documents) == 1, predicate
        for d in documents:
            predicate = predicate.replace(d, "TRUE")
        args = []
        for name, (sql_type, value) in params.items():
            if re.search(rf"\b{name}\b", predicate):
                args.append(value)
                predicate = re.sub(rf"\b{name}\b", f"${len(args)}::{sql_type}", predicate)
        assert not re.search(r"\bp_", predicate), predicate
        queries.append((f"SELECT d.id::text FROM {table} d WHERE {predicate}", args))
    return queries


async def _ids(conn: Conn, sql: str, args: Sequence[Any]) -> set[str]:
    return {r[0] for r in await conn.fetch(sql, *args)}


@pytest.mark.parametrize("view_name", VIEWS)
async def test_evidence_function_filters_like_the_candidate_lists(
    db: Database, admin_conn: Conn, store: Store, view_name: str
) -> None:
    request = _request(store, view_name)
    view, branches = await _view(db, store, request)
    q = candidate_query(store.team, branches, request, None, view.t_sys)
    async with db.tenant(store.team, [b.space_id for b in branches]) as conn:
        lists = await evidence_candidates(conn, replace(q, per_list=MAX_PER_LIST))
    assert [b.branch for b in branches] == ["shared", "private"]
    for b in branches:
        # The rule of every candidate list, run like the copies on the owner's
        # connection: row-level security is not what filters here.
        p = Params()
        p.bind("team", q.team_id, "text")
        p.bind("known_at", q.known_at, "timestamptz")
        p.bind("exclude", list(q.exclude_ids), "text[]")
        p.bind("space", b.space_id, "uuid")
        p.bind("generation", b.generation, "integer")
        rule = f"FROM evidence e WHERE {_visible(p, 'e', p['space'], p['generation'])}"
        want = await _ids(admin_conn, f"SELECT e.id::text {rule}", p.values)
        params = {
            "p_team": ("text", q.team_id),
            "p_space": ("uuid", b.space_id),
            "p_generation": ("integer", b.generation),
            "p_known_at": ("timestamptz", q.known_at),
            "p_exclude": ("text[]", list(q.exclude_ids)),
        }
        # Every step looks its documents up through one function (db/0198): the
        # filter is written there, once.
        functions = ["evidence_fulltext_top_k", "evidence_fulltext_document"]
        copies = await _copies(admin_conn, functions, "evidence", params)
        assert len(copies) == 1
        for i, (copy, args) in enumerate(copies):
            got = await _ids(admin_conn, copy, args)
            assert got == want, (view_name, b.branch, i, sorted(got ^ want))
        # The full-text list longer than the hits: exactly the rule's hits.
        hits = await _ids(
            admin_conn, f"SELECT e.id::text {rule} AND e.content LIKE '%kafka%'", p.values
        )
        listed = lists[(b.branch, "fulltext")]
        assert len(listed) == len(set(listed)) and set(listed) == hits, (view_name, b.branch)
        # What the view shows, so that the comparisons above mean something: the
        # withdrawn cur-1 is a candidate (hydration decides about it), the excluded
        # IDs and the other team's rows are not.
        if b.branch == "shared":
            shown = _expected(view_name, "", 10, 5, 6) - set(store.excluded)
        else:
            shown = (
                set()
                if view_name == "knownAt before the reset"
                else {f"priv-{i}" for i in range(4)}
            )
        assert hits == shown, (view_name, b.branch)


@pytest.mark.parametrize("view_name", VIEWS)
async def test_relationship_function_filters_like_discovery(
    db: Database, admin_conn: Conn, store: Store, view_name: str
) -> None:
    request = _request(store, view_name)
    view, branches = await _view(db, store, request)
    shared = next(b for b in branches if b.branch == "shared")
    q = discovery_query(view, SharedBranch(shared.space_id, shared.generation), request, None)
    assert q is not None
    q = replace(q, per_list=related.MAX_PER_LIST)
    p = Params()
    p.bind("team", q.team_id, "text")
    p.bind("space", q.space_id, "uuid")
    p.bind("generation", q.generation, "integer")
    p.bind("t_sys", q.t_sys, "timestamptz")
    rule = "FROM relationships r WHERE " + related.visible_relationship(
        "r", p["team"], p["space"], p["generation"], p["t_sys"]
    )
    want = await _ids(admin_conn, f"SELECT r.id::text {rule}", p.values)
    params = {
        "p_team": ("text", q.team_id),
        "p_space": ("uuid", q.space_id),
        "p_generation": ("integer", q.generation),
        "p_t_sys": ("timestamptz", q.t_sys),
    }
    # Every step looks its documents up through one function (db/0197): the
    # filter is written there, once.
    functions = ["relationship_fulltext_top_k", "relationship_fulltext_document"]
    copies = await _copies(admin_conn, functions, "relationships", params)
    assert len(copies) == 1
    for i, (copy, args) in enumerate(copies):
        got = await _ids(admin_conn, copy, args)
        assert got == want, (view_name, i, sorted(got ^ want))
    # The function's whole list, eligible or not: discovery's statement with the
    # eligibility join made optional.
    sql, args = related.build_discovery(q)
    join = "FROM cand c JOIN eligible e ON e.id = c.relationship_id"
    assert join in sql
    sql = sql.replace(join, "FROM cand c LEFT JOIN eligible e ON e.id = c.relationship_id")
    async with db.tenant(store.team, list(view.space_ids)) as conn:
        found = related.parse_discovery(["fulltext"], await conn.fetch(sql, *args))
    listed = [rid for rid, _ in found.lists["fulltext"]]
    hits = await _ids(
        admin_conn, f"SELECT r.id::text {rule} AND r.statement LIKE '%kafka%'", p.values
    )
    assert len(listed) == len(set(listed)) and set(listed) == hits, view_name
    # Superseded (rel-cur-1), retracted (rel-cur-3) and not yet valid (rel-cur-7)
    # relationships are candidates; eligibility decides about them later.
    assert hits == _expected(view_name, "rel-", 8, 3, 4), view_name
