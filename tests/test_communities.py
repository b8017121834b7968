"""Community snapshots and the community frontier against the real database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypedDict
from uuid import UUID

import httpx
import pytest
from starlette.applications import Starlette

from gateway.services import communities
from gateway.services.communities import CommunityBuildFailed, build_communities
from gateway.services.writes import WriteService
from gateway.store import communities as community_store
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl
from .test_cli import run
from .test_recall import token
from .test_related import all_ids, codes, graph_records, load_graph, rel, related


class Limits(TypedDict):
    """The builder's size limits, as keyword arguments of ``build_communities``."""

    max_nodes: int
    max_edges: int


LIMITS: Limits = {"max_nodes": 1000, "max_edges": 10_000}


async def snapshot_rows(conn: Conn, run_id: UUID) -> list[tuple[Any, ...]]:
    communities_ = await conn.fetch(
        "SELECT ordinal, summary, top_entities, top_predicates, group_count, relationship_count "
        "FROM communities WHERE run_id = $1 ORDER BY ordinal",
        run_id,
    )
    members = await conn.fetch(
        "SELECT ordinal, semantic_group_key, relationship_id FROM community_members "
        "WHERE run_id = $1 ORDER BY ordinal, semantic_group_key, relationship_id",
        run_id,
    )
    return [tuple(r) for r in communities_] + [tuple(r) for r in members]


async def members_by_relationship(conn: Conn, run_id: UUID) -> dict[str, tuple[int, str]]:
    rows = await conn.fetch(
        "SELECT ordinal, semantic_group_key, relationship_id FROM community_members "
        "WHERE run_id = $1",
        run_id,
    )
    return {r["relationship_id"]: (r["ordinal"], r["semantic_group_key"]) for r in rows}


async def test_builder_is_deterministic_drops_singletons_and_reads_only_eligible_shared(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    team = unique("com")
    await load_graph(writes, team)
    first = await build_communities(db, team, **LIMITS)
    second = await build_communities(db, team, **LIMITS)
    assert first.status == second.status == "succeeded"
    assert first.run_id is not None and second.run_id is not None
    assert first.run_id != second.run_id
    # eligible shared groups: ownership (2 owners), stripe, invoice->billing,
    # invoice->ledger, ledger, orders, pool, zebra
    assert first.node_count == 8
    assert await snapshot_rows(admin_conn, first.run_id) == await snapshot_rows(
        admin_conn, second.run_id
    )
    runs = await admin_conn.fetch(
        "SELECT status, algorithm, seed, node_count, edge_count, graph_fingerprint, "
        "graph_changes, finished_at FROM community_runs WHERE team_id = $1 ORDER BY started_at",
        team,
    )
    assert len(runs) == 2 and runs[0]["graph_fingerprint"] == runs[1]["graph_fingerprint"]
    assert runs[0]["status"] == "succeeded" and runs[0]["algorithm"] == "louvain"
    assert runs[0]["graph_changes"] > 0 and runs[0]["finished_at"] is not None
    members = await members_by_relationship(admin_conn, first.run_id)
    # the singleton, ineligible and private relationships are no members
    for never in ("r-zebra", "r-retracted", "r-revoked", "r-unsupported", "r-private"):
        assert never not in members, never
    # equivalents by two owners are one node: both are members of the same community
    assert members["r-own-alice"] == members["r-own-bob"]
    assert members["r-orders"][0] == members["r-pool"][0]
    assert members["r-orders"][0] != members["r-own-alice"][0]
    # a group is in one community only
    group_ordinals: dict[str, set[int]] = {}
    for ordinal, group in members.values():
        group_ordinals.setdefault(group, set()).add(ordinal)
    assert all(len(o) == 1 for o in group_ordinals.values())
    rows = await admin_conn.fetch(
        "SELECT summary, top_entities, top_predicates, group_count, relationship_count "
        "FROM communities WHERE run_id = $1 ORDER BY ordinal",
        first.run_id,
    )
    orders = next(r for r in rows if "Connection pool" in r["top_entities"])
    assert orders["top_entities"][0] == "Connection pool"  # touches both of its groups
    assert set(orders["top_predicates"]) == {"accessed_through", "max_connections"}
    assert orders["group_count"] == 2 and orders["relationship_count"] == 2
    assert orders["summary"].startswith("Connection pool")
    assert [r["group_count"] for r in rows] == sorted(
        (r["group_count"] for r in rows), reverse=True
    )


def test_clustering_is_pure_and_seeded() -> None:
    rels = [
        community_store.GraphRelationship(f"r{i}", f"g{i}", "p", f"e{i // 3}", None, ())
        for i in range(9)
    ]
    graph = communities.build_graph(rels)
    # three entities, each shared by three groups: three triangles, no edge between them
    assert len(graph.edges) == 9 and graph.complete
    assert communities.cluster(graph) == [
        ["g0", "g1", "g2"],
        ["g3", "g4", "g5"],
        ["g6", "g7", "g8"],
    ]
    assert communities.cluster(graph, seed=7) == communities.cluster(graph, seed=7)
    assert not communities.build_graph(rels, max_edges=4).complete


async def test_missing_snapshot_degrades(client: httpx.AsyncClient, writes: WriteService) -> None:
    team = unique("comm")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")
    result = await related(client, tok, q="billing ledger", limit=1)
    assert codes(result, "COMMUNITIES") == ["community_snapshot_unavailable"]
    assert result["relatedCommunities"] == []
    assert result["searchStates"]["communities"]["complete"] is False
    off = await related(client, tok, q="billing ledger", limit=1, com=0)
    assert (
        codes(off, "COMMUNITIES") == []
        and off["searchStates"]["communities"]["status"] == "DISABLED"
    )


async def test_too_large_and_failed_runs_degrade(
    client: httpx.AsyncClient, writes: WriteService, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = unique("comt")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")
    report = await build_communities(db, team, max_nodes=3, max_edges=10_000)
    assert report.status == "too_large" and report.node_count == 4  # counted up to limit + 1
    assert report.error == "more than 3 semantic groups (limit 3)"
    result = await related(client, tok, q="billing ledger", limit=1)
    assert codes(result, "COMMUNITIES") == ["community_graph_too_large"]
    async with db.admin(readonly=True) as conn:
        stored = await conn.fetchrow(
            "SELECT status, node_count, edge_count FROM community_runs WHERE id = $1", report.run_id
        )
        assert stored is not None
    assert tuple(stored) == ("too_large", 4, 0)
    report = await build_communities(db, team, max_nodes=100, max_edges=2)
    assert report.status == "too_large"

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("clustering exploded")

    monkeypatch.setattr(communities, "cluster", broken)
    with pytest.raises(CommunityBuildFailed):
        await build_communities(db, team, **LIMITS)
    result = await related(client, tok, q="billing ledger", limit=1)
    assert codes(result, "COMMUNITIES") == ["community_detection_failed"]
    assert result["relatedCommunities"] == []


async def test_node_limit_is_decided_before_the_graph_is_read(
    writes: WriteService, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared graph has 8 eligible groups (and ineligible relationships of other
    groups, which must not count): 7 is too_large without reading the graph, 8 builds."""
    team = unique("comlim")
    await load_graph(writes, team)
    read = community_store.shared_graph

    def unread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the whole graph was read for a space above the node limit")

    monkeypatch.setattr(community_store, "shared_graph", unread)
    above = await build_communities(db, team, max_nodes=7, max_edges=10_000)
    assert (above.status, above.node_count, above.edge_count) == ("too_large", 8, 0)
    assert above.error == "more than 7 semantic groups (limit 7)"
    monkeypatch.setattr(community_store, "shared_graph", read)
    at = await build_communities(db, team, max_nodes=8, max_edges=10_000)
    assert (at.status, at.node_count) == ("succeeded", 8)
    assert at.communities == 3 and at.sizes == [3, 2, 2]


def hub_records(team: str, n: int) -> list[dict[str, Any]]:
    """``n`` relationships of ``n`` semantic groups that all have the entity ``hub``
    as object, each supported by evidence of its own: C(n, 2) edges, all through
    the hub, whichever relationships are read first."""
    records: list[dict[str, Any]] = [
        {"kind": "team", "id": team, "name": f"Team {team}"},
        {"kind": "principal", "team": team, "id": "alice", "display_name": "Alice"},
        {"kind": "source", "team": team, "id": "src", "type": "document", "title": "Wiki"},
        {"kind": "entity", "team": team, "id": "hub", "name": "Hub", "type": "thing"},
    ]
    for i in range(n):
        records += [
            {
                "kind": "entity",
                "team": team,
                "id": f"leaf-{i}",
                "name": f"Leaf {i}",
                "type": "thing",
            },
            {
                "kind": "evidence",
                "team": team,
                "id": f"e-{i}",
                "source": "src",
                "content": f"Leaf {i} feeds the hub.",
            },
            rel(team, f"r-{i:02d}", f"leaf-{i}", "feeds", "hub", evidence=(f"e-{i}",)),
        ]
    return records


async def test_edge_limit_is_decided_while_the_graph_is_read(
    writes: WriteService, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 groups under the node limit, 780 edges: with an edge limit of 100 the
    builder stops reading the graph at the relationship that makes the 101st edge
    (the 15th: C(14, 2) = 91, C(15, 2) = 105) and stores too_large, instead of
    reading every relationship and its support paths first (which outlasted the
    statement timeout at 100,000 relationships per space)."""
    team = unique("comedge")
    await load_jsonl(writes, jsonl(hub_records(team, 40)))
    read = community_store.shared_graph
    seen: list[str] = []

    async def counted(*args: Any, **kwargs: Any) -> Any:
        async for r in read(*args, **kwargs):
            seen.append(r.id)
            yield r

    monkeypatch.setattr(community_store, "shared_graph", counted)
    above = await build_communities(db, team, max_nodes=1000, max_edges=100)
    assert (above.status, above.node_count, above.edge_count) == ("too_large", 40, 101)
    assert above.error == "more than 100 edges"
    assert len(seen) == 15
    async with db.admin(readonly=True) as conn:
        stored = await conn.fetchrow(
            "SELECT status, node_count, edge_count, graph_fingerprint FROM community_runs "
            "WHERE id = $1",
            above.run_id,
        )
        assert stored is not None
    assert tuple(stored) == ("too_large", 40, 101, None)


async def test_edge_limit_just_above_and_at_the_graph(writes: WriteService, db: Database) -> None:
    """The same graph of 780 edges: a limit of 779 is too_large, 780 builds it
    whole (one community of the 40 groups), the same as with no near limit."""
    team = unique("comedge")
    await load_jsonl(writes, jsonl(hub_records(team, 40)))
    below = await build_communities(db, team, max_nodes=1000, max_edges=779)
    assert (below.status, below.node_count, below.edge_count) == ("too_large", 40, 780)
    at = await build_communities(db, team, max_nodes=40, max_edges=780)
    assert (at.status, at.node_count, at.edge_count) == ("succeeded", 40, 780)
    assert at.sizes == [40]
    free = await build_communities(db, team, **LIMITS)
    assert (free.status, free.edge_count, free.sizes) == ("succeeded", 780, [40])
    async with db.admin(readonly=True) as conn:
        prints = await conn.fetch(
            "SELECT graph_fingerprint FROM community_runs WHERE id = ANY ($1::uuid[])",
            [at.run_id, free.run_id],
        )
    assert len({r["graph_fingerprint"] for r in prints}) == 1


def test_graph_builder_matches_whole_graph_pairs_in_any_order() -> None:
    """Edges and weights do not depend on the order the relationships come in:
    a pair sharing two evidence fragments and an entity weighs 3."""
    rel_ = community_store.GraphRelationship
    rels = [
        rel_("r1", "g1", "p", "a", "b", ("e1", "e2")),
        rel_("r2", "g2", "p", "a", None, ("e1", "e2")),
        rel_("r3", "g1", "q", "c", None, ("e3",)),  # a second relationship of g1
        rel_("r4", "g3", "p", "c", "b", ("e3",)),
        rel_("r5", "g4", "p", "d", "d", ()),  # subject and object the same: no self edge
    ]
    expected = {("g1", "g2"): 3, ("g1", "g3"): 3}
    for order in (rels, rels[::-1], rels[2:] + rels[:2]):
        graph = communities.build_graph(order)
        assert graph.edges == expected and graph.complete
        assert graph.nodes == ("g1", "g2", "g3", "g4")
    assert not communities.build_graph(rels, max_edges=1).complete
    assert communities.build_graph(rels, max_edges=2).complete


async def test_stale_snapshot_degrades_until_rebuilt(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("coms")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")
    await build_communities(db, team, **LIMITS)
    q = "billing ledger invoices"
    fresh = await related(client, tok, q=q, limit=1)
    assert codes(fresh, "COMMUNITIES") == [] and fresh["relatedCommunities"]
    assert fresh["searchStates"]["communities"]["status"] == "COMPLETE"
    # a support decision alone changes the graph: the snapshot is stale
    await load_jsonl(
        writes,
        jsonl(
            [
                {
                    "kind": "support_decision",
                    "team": team,
                    "id": "d-stale",
                    "support": "sup-r-stripe-e-stripe",
                    "decision": "revoke",
                }
            ]
        ),
    )
    stale = await related(client, tok, q=q, limit=1)
    assert codes(stale, "COMMUNITIES") == ["community_snapshot_stale"]
    assert stale["relatedCommunities"] == []
    await build_communities(db, team, **LIMITS)
    again = await related(client, tok, q=q, limit=1)
    assert codes(again, "COMMUNITIES") == [] and again["relatedCommunities"]
    # a write to another team does not make this team's snapshot stale
    await load_graph(writes, unique("comso"))
    assert codes(await related(client, tok, q=q, limit=1), "COMMUNITIES") == []


async def test_temporal_recall_skips_communities(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    team = unique("comv")
    await load_graph(writes, team)
    tok = await token(writes, team, "bob")
    await build_communities(db, team, **LIMITS)
    now = datetime.now(UTC).isoformat()
    for view in ({"knownAt": now}, {"validAt": "2026-01-01T00:00:00Z"}):
        result = await related(client, tok, q="billing ledger", limit=1, **view)
        assert codes(result, "COMMUNITIES") == ["community_temporal_not_supported"]
        assert result["relatedCommunities"] == []


def frontier_groups(result: dict[str, Any]) -> dict[str, list[str]]:
    return {
        "evidence": sorted(
            {r["semanticGroup"] for x in result["results"] for r in x["supportingRelationships"]}
        ),
        "relationships": [h["semanticGroup"] for h in result["relatedRelationships"]],
        "communities": [
            m["semanticGroup"] for c in result["relatedCommunities"] for m in c["members"]
        ],
    }


async def test_community_and_direct_frontiers_are_disjoint_when_they_overlap(
    client: httpx.AsyncClient, writes: WriteService, db: Database, admin_conn: Conn
) -> None:
    """Community members cut by communityRelationshipLimit fall back to the direct
    frontier; no semantic group is ever in two frontiers of one answer."""
    team, other = unique("comd"), unique("comdo")
    await load_graph(writes, team)
    await load_graph(writes, other, secret=True)
    await build_communities(db, team, **LIMITS)
    await build_communities(db, other, **LIMITS)
    tok = await token(writes, team, "alice")
    q = "billing ledger invoices payments stripe"
    result = await related(client, tok, q=q, limit=1, rel=20, com=1, comRel=1)
    [community] = result["relatedCommunities"]
    assert len(community["members"]) == 1 and community["membersTruncated"] is True
    run_id, ordinal = community["id"].rsplit(":", 1)
    in_community = {
        r["semantic_group_key"]
        for r in await admin_conn.fetch(
            "SELECT semantic_group_key FROM community_members "
            "WHERE team_id = $1 AND run_id = $2::uuid AND ordinal = $3",
            team,
            run_id,
            int(ordinal),
        )
    }
    groups = frontier_groups(result)
    # the overlap exists: members the limit cut are in the direct fallback
    assert set(groups["relationships"]) & (in_community - set(groups["communities"]))
    flat = [g for gs in groups.values() for g in gs]
    assert len(flat) == len(set(flat)), groups
    # with a larger community budget those groups move into the community
    wide = await related(client, tok, q=q, limit=1, rel=20, com=3, comRel=20)
    wide_groups = frontier_groups(wide)
    flat = [g for gs in wide_groups.values() for g in gs]
    assert len(flat) == len(set(flat)), wide_groups
    assert set(wide_groups["communities"]) >= in_community - set(wide_groups["evidence"])
    # never another team's, never private material
    for res in (result, wide):
        assert "r-secret" not in all_ids(res) and "r-private" not in all_ids(res)
        for c in res["relatedCommunities"]:
            owner = await admin_conn.fetchval(
                "SELECT team_id FROM community_runs WHERE id = $1::uuid", c["id"].rsplit(":", 1)[0]
            )
            assert owner == team
            assert all(m["representative"]["spaceKind"] == "SHARED" for m in c["members"])


async def test_statements_do_not_grow_with_related_limits(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService, db: Database
) -> None:
    team = unique("comn")
    await load_graph(writes, team)
    await build_communities(db, team, **LIMITS)
    tok = await token(writes, team, "bob")
    counter = gateway_app.state.services.db.counter
    counts = {}
    # the question's embedding in the LRU first: every recall below reads it
    # there alike (a fresh question costs one statement more, whatever the limits)
    await related(client, tok, q="billing ledger invoices")
    # a small evidence limit leaves groups uncovered for the related frontiers
    for limits in ((1, 1, 1, 1), (3, 20, 10, 20), (2, 5, 3, 5)):
        limit, rel_limit, com, com_rel = limits
        before = counter.count
        result = await related(
            client,
            tok,
            q="billing ledger invoices",
            limit=limit,
            rel=rel_limit,
            com=com,
            comRel=com_rel,
        )
        counts[limits] = counter.count - before
        assert result["relatedRelationships"] or result["relatedCommunities"]
    assert len(set(counts.values())) == 1, counts


def test_cli_builds_one_team_and_reports_too_large(dsn: str) -> None:
    team = unique("comcli")
    records = graph_records(team) + [
        rel(team, "r-extra", "zebra", "likes", "billing", evidence=("e-zebra",))
    ]
    assert run(["load", "-"], dsn, stdin=jsonl(records)).returncode == 0
    built = run(["communities", "build", "--team", team], dsn)
    assert built.returncode == 0, built.stderr
    assert f"communities of team {team}: succeeded (11 groups" in built.stdout
    small = run(["communities", "build", "--team", team], dsn, RECALL_COMMUNITY_MAX_NODES="2")
    assert small.returncode == 1
    assert "too_large" in small.stdout and "limit 2" in small.stdout
    missing = run(["communities", "build", "--team", unique("nobody")], dsn)
    assert missing.returncode == 1 and "no team" in missing.stderr


async def test_unreadable_snapshot_degrades(
    client: httpx.AsyncClient, gateway_app: Starlette, writes: WriteService, db: Database
) -> None:
    import asyncio

    from .test_recall import _hold_lock

    team = unique("comu")
    await load_graph(writes, team)
    await build_communities(db, team, **LIMITS)
    tok = await token(writes, team, "bob")
    services = gateway_app.state.services
    services.db.lock_timeout = "300ms"
    try:
        ready, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold_lock(db, "community_members", ready, release))
        await ready.wait()
        try:
            result = await related(client, tok, q="billing ledger invoices", limit=1)
        finally:
            release.set()
            await holder
    finally:
        services.db.lock_timeout = "2s"
    assert codes(result, "COMMUNITIES") == ["community_snapshot_unavailable"]
    assert result["relatedCommunities"] == [] and result["relatedRelationships"]


def test_cli_shows_progress_on_a_terminal(dsn: str) -> None:
    import os
    import pty
    import subprocess

    from .conftest import REPO
    from .test_cli import CLI

    team = unique("compty")
    assert run(["load", "-"], dsn, stdin=jsonl(graph_records(team))).returncode == 0
    controller, terminal = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k != "RECALL_DATABASE_URL"}
    environ.update(DATABASE_URL=dsn, COLUMNS="120", TERM="xterm")
    proc = subprocess.run(
        [*CLI, "communities", "build", "--team", team],
        stdout=subprocess.PIPE,
        stderr=terminal,
        env=environ,
        cwd=REPO,
        timeout=120,
        text=True,
    )
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    text = shown.decode(errors="replace")
    assert proc.returncode == 0, text
    assert f"{team}: " in text  # the task line: "<team>: <stage>"
    assert "succeeded" in proc.stdout


def test_selection_order_tie_breaks_and_disjointness() -> None:
    """The documented rules of community selection and the direct fallback, by hand."""
    from gateway.services.related import direct_fallback, select_communities
    from gateway.store.communities import SnapshotCommunity

    def community(ordinal: int, groups: list[str]) -> SnapshotCommunity:
        return SnapshotCommunity(
            ordinal, "s", (), (), len(groups), tuple((g, f"r-{g}") for g in groups)
        )

    c0 = community(0, ["a", "b", "c", "d", "e"])  # largest, best anchor "c" (rank 2)
    c1 = community(1, ["x", "y"])  # best anchor "x" (rank 0)
    c2 = community(2, ["p", "q"])  # no anchor: not related to this answer
    c3 = community(3, ["k", "covered"])  # only its covered group... and "k"
    anchors = ["x", "covered", "c", "e", "k", "y"]
    covered = frozenset({"covered", "y"})
    chosen = select_communities([c0, c1, c2, c3], anchors, covered, limit=10, member_limit=2)
    # c1 (anchor rank 0) first though it is smaller; c1's "y" is covered
    assert [(c.ordinal, shown, cut) for c, shown, cut in chosen] == [
        (1, ["x"], False),
        (3, ["k"], False),  # anchored by "covered" (rank 1): covered groups anchor too
        (0, ["c", "e"], True),  # anchors first in anchor order, cut at 2 of 5
    ]
    # c2 has no anchor: never selected
    emitted = {g for _, shown, _ in chosen for g in shown}
    fallback = direct_fallback(anchors + ["a", "b"], covered, emitted, limit=5)
    assert fallback == ["a", "b"]  # members cut from c0 remain eligible here
    assert not set(fallback) & emitted and not set(fallback) & covered
    # the community limit and a group emitted by an earlier community
    assert [c.ordinal for c, _, _ in select_communities([c0, c1], anchors, covered, 1, 20)] == [1]
    dup = community(4, ["x", "z"])
    later = select_communities([c1, dup], ["x", "z"], frozenset(), 5, 5)
    assert [(c.ordinal, shown) for c, shown, _ in later] == [(1, ["x", "y"]), (4, ["z"])]
