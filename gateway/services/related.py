"""recallMemory, part 2: the related-relationship and community frontiers.

Both read the **shared space only** (the design note: do not infer a private
graph frontier from searchable private evidence). The order of work:

1. **Discovery**, one statement (gateway/store/related.py): a BM25 list and a
   vector list of eligible shared relationships, each with its semantic group,
   the groups already *covered* for this answer, and the projection state.
   The lists are fused by equal-weight RRF (k 60, ties by relationship ID); a
   group takes the rank of its best relationship. That fused group order is
   the *anchor order* of both frontiers.
2. **Coverage**: a group is covered when a returned evidence supports one of
   its relationships (any branch), when a known evidence ID supports one
   (support granted at the view's time), or when a known relationship ID is
   in it. Covered groups are never emitted again.
3. **Communities** (their own budget): from the newest finished snapshot, if
   it is current, the communities that contain an anchor group, ordered by
   their best anchor's rank (ties: the snapshot's ordinal). A community is
   returned only if it has novel groups (neither covered nor emitted by an
   earlier community); its members are those novel groups, anchors first in
   anchor order, then the others by group key, cut at
   ``communityRelationshipLimit`` (``membersTruncated`` says so).
4. **Direct fallback**: the anchor groups in order that are neither covered
   nor emitted in a community, cut at ``relationshipLimit``. Members that a
   community limit cut off, and groups in no community, remain eligible here.
   So one semantic group is never in two frontiers of one answer.
5. **Handles**: one statement loads every eligible relationship of the emitted
   groups (in a recall, the orchestrator's answer round, beside the hypotheses
   and the conflicts that the handles reach). The representative is the group's best-ranked discovered
   relationship, else its lowest ID; the others are its equivalent IDs (ID
   order). Owners are never merged: each relationship keeps its own.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from uuid import UUID

import numpy as np

from gateway.errors import DatabaseUnavailable
from gateway.fusion import fuse_equal
from gateway.services.recall_input import RecallRequest
from gateway.services.recall_types import (
    CommunityHit,
    Degradation,
    Handle,
    ListState,
    ReadView,
    SearchState,
    overfetch,
)
from gateway.store import communities as community_store
from gateway.store import related as store
from gateway.store.database import STORE_FAILURES, Unit
from gateway.store.recall import RelationshipRow

log = logging.getLogger("gateway.recall.related")

__all__ = [
    "HandleLoader",
    "RelatedFrontiers",
    "RelatedOutcome",
    "SharedBranch",
    "direct_fallback",
    "discovers",
    "discovery_query",
    "select_communities",
]


@dataclass
class RelatedOutcome:
    relationships: list[Handle] = field(default_factory=list)
    communities: list[CommunityHit] = field(default_factory=list)
    degradations: list[Degradation] = field(default_factory=list)
    states: dict[str, SearchState] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SharedBranch:
    space_id: UUID
    generation: int


def select_communities(
    communities: Sequence[community_store.SnapshotCommunity],
    anchors: Sequence[str],
    covered: frozenset[str],
    limit: int,
    member_limit: int,
) -> list[tuple[community_store.SnapshotCommunity, list[str], bool]]:
    """Communities in anchor order with their novel groups (shown, truncated?)."""
    rank = {g: i for i, g in enumerate(anchors)}
    # Each community's best anchor rank, computed once (it was computed for the
    # sort and again in the loop: a scan of every member, twice).
    best = {
        c.ordinal: min((rank[g] for g, _ in c.members if g in rank), default=math.inf)
        for c in communities
    }

    emitted: set[str] = set()
    chosen: list[tuple[community_store.SnapshotCommunity, list[str], bool]] = []
    for c in sorted(communities, key=lambda c: (best[c.ordinal], c.ordinal)):
        if len(chosen) >= limit:
            break
        if best[c.ordinal] == math.inf:
            continue
        groups = list(dict.fromkeys(g for g, _ in c.members))
        novel = [g for g in groups if g not in covered and g not in emitted]
        if not novel:
            continue
        novel.sort(key=lambda g: (rank.get(g, math.inf), g))
        shown = novel[:member_limit]
        emitted.update(shown)
        chosen.append((c, shown, len(novel) > member_limit))
    return chosen


def direct_fallback(
    anchors: Sequence[str], covered: frozenset[str], emitted: set[str], limit: int
) -> list[str]:
    return [g for g in anchors if g not in covered and g not in emitted][:limit]


def discovers(request: RecallRequest) -> bool:
    """Whether :func:`discovery_query` builds a discovery for ``request`` (given a
    shared space): the relationships asked for, or communities outside a temporal
    view; the related frontiers ask the same. Known before the view is read, so
    that a recall can decide at its start whether to take a side connection for
    it; that also needs a question (without one, discovery asks for no list:
    gateway/services/recall.py, ``_DiscoveryBeside.taken``)."""
    return request.relationship_limit > 0 or (request.community_limit > 0 and not request.temporal)


def discovery_query(
    view: ReadView,
    shared: SharedBranch | None,
    request: RecallRequest,
    vector: np.ndarray | None,
    returned_relationship_ids: Sequence[str] = (),
) -> store.DiscoveryQuery | None:
    """The discovery the frontiers will run for this request, or None if they run
    none (both off, communities only in a temporal view, no shared space): so
    that the orchestrator can send it beside the evidence search. Coverage by
    ``returned_relationship_ids`` is empty when they are not known yet."""
    if not discovers(request) or shared is None:
        return None
    return store.DiscoveryQuery(
        team_id=view.team_id,
        space_id=shared.space_id,
        generation=shared.generation,
        readable_space_ids=view.space_ids,
        t_sys=view.t_sys,
        t_valid=view.t_valid,
        text=request.query,
        vector=vector,
        per_list=overfetch(max(request.relationship_limit, request.community_limit)),
        returned_relationship_ids=returned_relationship_ids,
        known_evidence_ids=request.known_evidence_ids,
        known_relationship_ids=request.known_relationship_ids,
        # A knownAt view ranks with the statistics of its instant (never moves).
        as_of=view.t_sys if request.known_at is not None else None,
    )


HandleLoader = Callable[
    [Sequence[str], dict[str, str]], Awaitable[dict[str, list[RelationshipRow]] | None]
]
"""Reads the handles' relationships of the given groups (in the order the answer
returns them) for the frontiers, with what else the caller sends in the same
statement; None: not read (the frontiers then read them themselves)."""


class RelatedFrontiers:
    """Both frontiers of one recall, read in the recall's unit of work.

    ``load_handles``: how the handles' relationships are read (the orchestrator
    reads them in its answer round: gateway/services/recall.py); without it, or
    when it returns None, by a statement of their own."""

    def __init__(self, unit: Unit, load_handles: HandleLoader | None = None) -> None:
        self.unit = unit
        self.load_handles = load_handles

    async def recall(
        self,
        view: ReadView,
        shared: SharedBranch | None,
        request: RecallRequest,
        vector: np.ndarray | None,
        returned_relationship_ids: Sequence[str],
        discovered: store.Discovery | None = None,
    ) -> RelatedOutcome:
        """``discovered``: the discovery of :func:`discovery_query`, already read
        (with its coverage by the returned evidence applied); None: read it here."""
        out = RelatedOutcome()
        rel_on = request.relationship_limit > 0
        com_on = request.community_limit > 0
        out.states["relationships"] = SearchState(
            "relationships", "complete" if rel_on else "disabled"
        )
        out.states["communities"] = SearchState("communities", "complete" if com_on else "disabled")
        if com_on and request.temporal:
            self._skip_communities(
                out,
                "community_temporal_not_supported",
                "communities are snapshots of the current graph; a validAt or knownAt "
                "recall skips them",
            )
            com_on = False
        if not discovers(request):
            return out
        if shared is None:  # no shared space in the view (before the team existed)
            for name, on in (("relationships", rel_on), ("communities", com_on)):
                if on:
                    out.states[name] = SearchState(name, "skipped")
            return out
        query = discovery_query(view, shared, request, vector, returned_relationship_ids)
        assert query is not None  # discovers() and a shared space
        per_list = query.per_list
        found, vector_status = await self._discover(query, out, discovered)
        lists = found.lists
        fused = fuse_equal({name: [rid for rid, _ in hits] for name, hits in lists.items()})
        group_of = {rid: g for hits in lists.values() for rid, g in hits}
        anchors = list(dict.fromkeys(group_of[rid] for rid in fused))
        first_ranked: dict[str, str] = {}
        for rid in fused:
            first_ranked.setdefault(group_of[rid], rid)
        covered = found.covered_groups

        chosen: list[tuple[community_store.SnapshotCommunity, list[str], bool]] = []
        run_id: UUID | None = None
        if com_on:
            chosen, run_id = await self._communities(view, shared, request, anchors, covered, out)
        emitted = {g for _, shown, _ in chosen for g in shown}
        direct = (
            direct_fallback(anchors, covered, emitted, request.relationship_limit) if rel_on else []
        )
        # The groups in the order the answer returns them (their handles reach
        # conflicts in that order): the direct fallback, then each community's.
        ordered = [*direct, *(g for _, shown, _ in chosen for g in shown)]
        handles = await self._handles(view, shared, ordered, first_ranked)
        out.relationships = [handles[g] for g in direct if g in handles]
        for c, shown, truncated in chosen:
            members = tuple(handles[g] for g in shown if g in handles)
            out.communities.append(
                CommunityHit(
                    id=f"{run_id}:{c.ordinal}",
                    summary=c.summary,
                    top_entities=c.top_entities,
                    top_predicates=c.top_predicates,
                    relationship_count=c.relationship_count,
                    members=members,
                    members_truncated=truncated,
                )
            )
        if rel_on:
            starved = len(out.relationships) < request.relationship_limit and any(
                len(hits) >= per_list for hits in lists.values()
            )
            lost = any(d.frontier == "relationships" for d in out.degradations) or (
                request.query is not None and vector is None
            )
            list_states = [
                ListState(
                    "shared",
                    "fulltext",
                    "complete" if "fulltext" in lists else "skipped",
                    len(lists.get("fulltext", ())),
                ),
                ListState("shared", "vector", vector_status, len(lists.get("vector", ()))),
            ]
            out.states["relationships"] = SearchState(
                "relationships", "partial" if lost or starved else "complete", tuple(list_states)
            )
        return out

    async def _discover(
        self, query: store.DiscoveryQuery, out: RelatedOutcome, read: store.Discovery | None
    ) -> tuple[store.Discovery, str]:
        """Discovery with the vector list if possible; without it if that is what fails."""
        try:
            if read is not None:
                found = read
            else:
                async with self.unit.step() as conn:
                    found = await store.discover(conn, query)
        except STORE_FAILURES as exc:
            if query.vector is None:
                raise DatabaseUnavailable("relationships could not be searched") from exc
            log.warning("relationship discovery failed (%s); retrying without vectors", exc)
            try:
                async with self.unit.step() as conn:
                    found = await store.discover(conn, _without_vector(query))
            except STORE_FAILURES as again:
                raise DatabaseUnavailable("relationships could not be searched") from again
            out.degradations.append(
                Degradation(
                    "relationships",
                    "relationship_vector_failed",
                    "the relationship vector search failed; lexical discovery still answers",
                )
            )
            return found, "failed"
        if query.vector is None:
            return found, "skipped"
        if found.projection_status == "active":
            return found, "complete"
        if found.projection_status == "failed":
            out.degradations.append(
                Degradation(
                    "relationships",
                    "relationship_vector_failed",
                    "the relationship vector projection failed; lexical discovery still answers",
                )
            )
            return found, "failed"
        out.degradations.append(
            Degradation(
                "relationships",
                "relationship_vector_warming",
                "relationship vectors are not ready (no active projection generation); "
                "lexical discovery still answers",
            )
        )
        return found, "skipped"

    async def _communities(
        self,
        view: ReadView,
        shared: SharedBranch,
        request: RecallRequest,
        anchors: list[str],
        covered: frozenset[str],
        out: RelatedOutcome,
    ) -> tuple[list[tuple[community_store.SnapshotCommunity, list[str], bool]], UUID | None]:
        def skip(code: str, message: str) -> None:
            self._skip_communities(out, code, message)

        try:
            async with self.unit.step() as conn:
                snap = await community_store.snapshot(conn, view.team_id, shared.space_id, anchors)
        except STORE_FAILURES as exc:
            log.warning("community snapshot could not be read: %s", exc)
            skip("community_snapshot_unavailable", "the community snapshot could not be read")
            return [], None
        if snap.run_id is None:
            skip(
                "community_snapshot_unavailable",
                "no community snapshot has been built for this team",
            )
            return [], None
        if snap.status == "failed":
            skip("community_detection_failed", "the latest community detection run failed")
            return [], None
        if snap.status == "too_large":
            skip(
                "community_graph_too_large",
                "the shared relationship graph exceeds the configured community limits",
            )
            return [], None
        if not snap.current:
            skip(
                "community_snapshot_stale",
                "the shared relationship graph changed since the community snapshot was built",
            )
            return [], None
        chosen = select_communities(
            snap.communities,
            anchors,
            covered,
            request.community_limit,
            request.community_relationship_limit,
        )
        return chosen, snap.run_id

    @staticmethod
    def _skip_communities(out: RelatedOutcome, code: str, message: str) -> None:
        out.degradations.append(Degradation("communities", code, message))
        out.states["communities"] = SearchState("communities", "skipped")

    async def _handles(
        self,
        view: ReadView,
        shared: SharedBranch,
        groups: list[str],
        first_ranked: dict[str, str],
    ) -> dict[str, Handle]:
        if not groups:
            return {}
        members = (
            await self.load_handles(groups, first_ranked) if self.load_handles is not None else None
        )
        if members is None:
            try:
                async with self.unit.step() as conn:
                    members = await store.eligible_group_members(
                        conn,
                        view.team_id,
                        shared.space_id,
                        shared.generation,
                        groups,
                        view.t_sys,
                        view.t_valid,
                    )
            except STORE_FAILURES as exc:
                raise DatabaseUnavailable("related relationships could not be loaded") from exc
        handles = {}
        for group, rows in members.items():
            by_id = {r.id: r for r in rows}
            rep_id = first_ranked.get(group)
            rep = by_id.get(rep_id) if rep_id is not None else None
            rep = rep or rows[0]  # rows come in ID order
            handles[group] = Handle(
                group=group,
                representative=rep,
                equivalent_ids=tuple(r.id for r in rows if r.id != rep.id),
            )
        return handles


def _without_vector(q: store.DiscoveryQuery) -> store.DiscoveryQuery:
    return replace(q, vector=None)
