"""The community builder: Louvain clustering of a team's shared relationship graph.

**The graph.** Nodes are the semantic groups of the relationships of the
team's shared space that are eligible *now* (the rule of recall: active,
valid, supported through an eligible path, not on the losing side of a
resolved conflict). Two groups are joined by an edge whose weight is the
number of evidence fragments that support both (shared evidence) plus the
number of entities both have as subject or object (shared entities). A
group is a node, not a relationship, so equivalent statements by different
owners count once.

**Clustering.** networkx's Louvain (``louvain_communities``) with a fixed seed
over a graph whose nodes and edges are added in sorted order, so the same
graph always gives the same communities. Singleton communities (a group with
no edge, or one Louvain left alone) are dropped: a community of one adds
nothing that the direct relationship fallback does not.

**Summaries** are deterministic, made from the community's top entities (by
the number of its groups that touch them, then name) and top predicates (by
the number of its relationships, then predicate): no language model.

**Limits.** A graph above ``max_nodes`` groups or ``max_edges`` edges is not
clustered; the run is stored as ``too_large`` so that recall can say so.
Neither limit needs the whole graph: the groups are counted first, only up to
``max_nodes + 1``, so that a space far above the node limit is not read at
all (its run records ``max_nodes + 1`` nodes and no edges); then the graph is
read by a cursor and its edges counted as it comes (:class:`GraphBuilder`),
and the read stops as soon as there are more than ``max_edges`` (the run
records the groups and ``max_edges + 1`` edges). So a space over either limit
answers ``too_large`` promptly instead of running into the statement timeout.

**The snapshot** records what it was built from: the graph change counter of
the space (db/0003) read in the same repeatable-read snapshot as the graph,
the time of the last counted change (``graph_watermark``), the next instant
at which a relationship's validity begins or ends (after which the graph of
"now" differs without any write), and a SHA-256 fingerprint of the nodes,
edges and members. A recall uses a run only while the counter is unchanged
and that instant has not passed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from uuid import UUID

import networkx as nx
from networkx.algorithms.community import louvain_communities

from gateway.errors import GatewayError, NotFound
from gateway.store import communities as store
from gateway.store.database import Database

log = logging.getLogger("gateway.communities")

ALGORITHM = "louvain"
SEED = 42
TOP_ENTITIES = 5
TOP_PREDICATES = 5

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Graph:
    """The weighted group graph of one team's shared space."""

    nodes: tuple[str, ...]  # semantic groups, sorted
    edges: dict[tuple[str, str], int]  # (a, b) with a < b -> weight
    complete: bool  # False: edge counting stopped at the limit


@dataclass
class BuildReport:
    team: str
    run_id: UUID | None
    status: str  # succeeded | too_large | failed
    node_count: int = 0
    edge_count: int = 0
    communities: int = 0
    members: int = 0
    error: str | None = None
    sizes: list[int] = field(default_factory=list)


class CommunityBuildFailed(GatewayError):
    """Clustering failed; the run is stored as failed with the reason."""

    code = "COMMUNITY_BUILD_FAILED"


class GraphBuilder:
    """The weighted group graph, built one relationship at a time, so that the
    builder can stop reading the graph as soon as it has more than ``max_edges``
    edges.

    Each evidence fragment and each entity keeps the groups that touch it; a
    group that joins one is paired with every group already there (a pair is
    counted once per shared fragment or entity: the weight). That is, pair by
    pair, the weight of every pair within each fragment's and entity's groups,
    whatever the order of the relationships; and the number of distinct pairs
    only grows, so a graph that exceeds the limit part-way exceeds it whole.
    """

    def __init__(self, max_edges: int | None = None) -> None:
        self.max_edges = max_edges
        self.groups: set[str] = set()
        self.edges: Counter[tuple[str, str]] = Counter()
        self._touching: dict[tuple[str, str], set[str]] = defaultdict(set)

    @property
    def over_limit(self) -> bool:
        return self.max_edges is not None and len(self.edges) > self.max_edges

    def add(self, r: store.GraphRelationship) -> bool:
        """Add one relationship; False (and the rest of it unadded) once the
        graph has more than ``max_edges`` edges."""
        self.groups.add(r.group)
        keys = [("evidence", e) for e in r.evidence_ids] + [("entity", r.subject_id)]
        if r.object_id is not None:
            keys.append(("entity", r.object_id))
        for key in keys:
            there = self._touching[key]
            if r.group in there:  # paired with all of them when it joined or they did
                continue
            for other in there:
                self.edges[(other, r.group) if other < r.group else (r.group, other)] += 1
                if self.over_limit:
                    return False
            there.add(r.group)
        return True

    def graph(self) -> Graph:
        return Graph(tuple(sorted(self.groups)), dict(self.edges), not self.over_limit)


def build_graph(rels: Iterable[store.GraphRelationship], max_edges: int | None = None) -> Graph:
    """Nodes and weighted edges; stops counting once ``max_edges`` is exceeded."""
    rels = list(rels)
    builder = GraphBuilder(max_edges)
    for r in rels:
        if not builder.add(r):
            break
    graph = builder.graph()
    return Graph(tuple(sorted({r.group for r in rels})), graph.edges, graph.complete)


def cluster(graph: Graph, seed: int = SEED) -> list[list[str]]:
    """Louvain communities without singletons, each sorted, largest first (then by
    first group): the order is the communities' ordinal."""
    g = nx.Graph()
    g.add_nodes_from(graph.nodes)
    g.add_weighted_edges_from((a, b, w) for (a, b), w in sorted(graph.edges.items()))
    found = louvain_communities(g, weight="weight", seed=seed)
    groups = [sorted(c) for c in found if len(c) > 1]
    groups.sort(key=lambda c: (-len(c), c[0]))
    return groups


def fingerprint(graph: Graph, rels: Iterable[store.GraphRelationship]) -> str:
    h = hashlib.sha256()
    for node in graph.nodes:
        h.update(f"n\t{node}\n".encode())
    for (a, b), w in sorted(graph.edges.items()):
        h.update(f"e\t{a}\t{b}\t{w}\n".encode())
    for r in sorted(rels, key=lambda r: r.id):
        h.update(f"m\t{r.group}\t{r.id}\n".encode())
    return h.hexdigest()


def describe(
    groups: list[str],
    rels: list[store.GraphRelationship],
    names: dict[str, str],
    ordinal: int,
) -> store.NewCommunity:
    """Top entities, top predicates, counts, members and the summary of one community."""
    members = set(groups)
    in_it = [r for r in rels if r.group in members]
    touching: dict[str, set[str]] = defaultdict(set)
    for r in in_it:
        touching[r.subject_id].add(r.group)
        if r.object_id is not None:
            touching[r.object_id].add(r.group)
    entity_order = sorted(touching, key=lambda e: (-len(touching[e]), names.get(e, e), e))
    top_entities = tuple(names.get(e, e) for e in entity_order[:TOP_ENTITIES])
    predicates = Counter(r.predicate for r in in_it)
    top_predicates = tuple(
        p for p, _ in sorted(predicates.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_PREDICATES]
    )
    summary = (
        f"{_join(top_entities[:3])}: {_join([p.replace('_', ' ') for p in top_predicates[:3]])} "
        f"({len(groups)} statements, {len(in_it)} relationships)"
    )
    return store.NewCommunity(
        ordinal=ordinal,
        summary=summary,
        top_entities=top_entities,
        top_predicates=top_predicates,
        group_count=len(groups),
        relationship_count=len(in_it),
        members=tuple(sorted((r.group, r.id) for r in in_it)),
    )


def _join(items: Iterable[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


async def build_communities(
    db: Database,
    team: str,
    *,
    max_nodes: int,
    max_edges: int,
    seed: int = SEED,
    progress: Progress | None = None,
) -> BuildReport:
    """Build and store one community snapshot of the team's shared space."""
    say = progress or (lambda _stage: None)
    say("counting the shared graph's groups")
    async with db.admin(isolation="repeatable_read", readonly=True) as conn:
        state = await store.graph_state(conn, team)
        if state is None:
            raise NotFound(f"no team '{team}' (or it has no shared space)")
        # A bounded count first: a space far above the limit answers too_large
        # after reading max_nodes + 1 groups, not after the whole graph (whose
        # read, with every relationship's support paths, outlasted the statement
        # timeout at 100,000 relationships per space).
        nodes = await store.count_groups_upto(conn, team, state, max_nodes + 1)
        rels: list[store.GraphRelationship] = []
        names: dict[str, str] = {}
        graph = Graph((), {}, False)
        if nodes <= max_nodes:
            # Then the edges, counted as the graph is read, which stops at the
            # edge limit: a space under the node limit but with many
            # relationships per group answers too_large without reading on.
            say("reading the shared relationship graph")
            builder = GraphBuilder(max_edges)
            async for r in store.shared_graph(conn, team, state):
                rels.append(r)
                if not builder.add(r):
                    break
            graph = builder.graph()
            say(f"read {len(rels)} relationships: {len(graph.edges)} edges")
            if graph.complete:
                rels.sort(key=lambda r: r.id)
                entity_ids = sorted(
                    {r.subject_id for r in rels} | {r.object_id for r in rels if r.object_id}
                )
                names = await store.entity_names(conn, team, state.space_id, entity_ids)
                nodes = len(graph.nodes)
    async with db.admin() as conn:
        run_id = await store.start_run(conn, team, state.space_id, ALGORITHM, seed)
    report = BuildReport(team, run_id, "running", nodes, len(graph.edges))
    if nodes > max_nodes or not graph.complete:
        report.status = "too_large"
        report.error = (
            f"more than {max_nodes} semantic groups (limit {max_nodes})"
            if nodes > max_nodes
            else f"more than {max_edges} edges"
        )
        async with db.admin() as conn:
            await store.finish_run(
                conn,
                team,
                run_id,
                status="too_large",
                state=state,
                node_count=nodes,
                edge_count=len(graph.edges),
                fingerprint=None,
                error=report.error,
            )
        return report
    say(f"clustering {nodes} groups, {len(graph.edges)} edges (Louvain, seed {seed})")
    try:
        clusters = await asyncio.to_thread(cluster, graph, seed)
        found = [describe(c, rels, names, i) for i, c in enumerate(clusters)]
    except Exception as exc:  # a clustering bug must be recorded, not leave a 'running' run
        log.exception("community detection failed for team %s", team)
        async with db.admin() as conn:
            await store.fail_run(conn, team, run_id, f"{type(exc).__name__}: {exc}")
        report.status, report.error = "failed", str(exc)
        raise CommunityBuildFailed(f"community detection failed: {exc}") from exc
    say(f"writing {len(found)} communities")
    async with db.admin() as conn:
        await store.finish_run(
            conn,
            team,
            run_id,
            status="succeeded",
            state=state,
            node_count=nodes,
            edge_count=len(graph.edges),
            fingerprint=fingerprint(graph, rels),
            communities=found,
        )
    report.status = "succeeded"
    report.communities = len(found)
    report.members = sum(len(c.members) for c in found)
    report.sizes = [c.group_count for c in found]
    return report


async def build_all(
    db: Database,
    teams: Iterable[str],
    *,
    max_nodes: int,
    max_edges: int,
    progress: Progress | None = None,
) -> list[BuildReport]:
    """One snapshot per team; a team whose clustering fails does not stop the others
    (its run is stored as failed and reported)."""
    reports = []
    for t in teams:
        try:
            reports.append(
                await build_communities(
                    db, t, max_nodes=max_nodes, max_edges=max_edges, progress=progress
                )
            )
        except CommunityBuildFailed as exc:
            reports.append(BuildReport(t, None, "failed", error=exc.message))
    return reports
