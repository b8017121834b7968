"""recallMemory, part 1: the evidence frontier across space branches.

Per allowed branch (shared, and the caller's private space): candidate lists
(full text, vector, entity expansion) are fused by weighted RRF, reloaded from
the canonical tables and kept only with an eligible support path for the view;
then the branches' final orders are fused. Optional losses (query embedding,
vector list, the private branch) degrade the answer and say so; losing the
shared branch or canonical hydration fails the call.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING
from uuid import UUID

import numpy as np

from gateway.embeddings import EmbeddingProvider, embed_queries
from gateway.errors import DatabaseUnavailable, EmbeddingError, EmbeddingMalformed
from gateway.fusion import fuse_branches, fuse_weighted
from gateway.services import conflicts as conflict_frontier
from gateway.services import hypotheses as hypothesis_frontier
from gateway.services.auth import Principal
from gateway.services.feedback import FeedbackService, SuggestedAction
from gateway.services.recall_input import RecallRequest
from gateway.store import recall as store
from gateway.store import search
from gateway.store.database import STORE_FAILURES, Database
from gateway.store.hypotheses import HypothesisRow

if TYPE_CHECKING:
    from gateway.services.related import CommunityHit, Handle

log = logging.getLogger("gateway.recall")


# Candidates per list per branch: enough that hits discarded by hydration do not
# starve the result, bounded so that one recall stays cheap.
OVERFETCH_FACTOR = 4
OVERFETCH_EXTRA = 20
MAX_CONTEXT_CHARS = 2000


def overfetch(limit: int) -> int:
    return limit * OVERFETCH_FACTOR + OVERFETCH_EXTRA


@dataclass(frozen=True, slots=True)
class Degradation:
    frontier: str
    code: str
    message: str
    optional: bool = True


@dataclass(frozen=True, slots=True)
class ListState:
    branch: str
    list: str
    status: str  # complete | failed | skipped
    candidates: int


@dataclass(frozen=True, slots=True)
class SearchState:
    frontier: str
    status: str  # complete | partial | skipped | disabled
    lists: tuple[ListState, ...] = ()

    @property
    def complete(self) -> bool:
        return self.status == "complete"


@dataclass(frozen=True, slots=True)
class ReadView:
    """What the request may read and at which instants; loaders read through it."""

    team_id: str
    space_kinds: dict[UUID, str]
    t_sys: datetime
    t_valid: datetime

    @property
    def space_ids(self) -> tuple[UUID, ...]:
        return tuple(self.space_kinds)


@dataclass(frozen=True, slots=True)
class EvidenceResult:
    rank: int
    space_kind: str
    evidence: store.EligibleEvidence

    @property
    def context(self) -> str:
        return self.evidence.content[:MAX_CONTEXT_CHARS]

    @property
    def context_truncated(self) -> bool:
        return len(self.evidence.content) > MAX_CONTEXT_CHARS


@dataclass
class RecallOutcome:
    recall_id: str
    view: ReadView
    results: list[EvidenceResult]
    degradations: list[Degradation] = field(default_factory=list)
    search_states: dict[str, SearchState] = field(default_factory=dict)
    related_relationships: list[Handle] = field(default_factory=list)
    related_communities: list[CommunityHit] = field(default_factory=list)
    hypotheses: tuple[HypothesisRow, ...] = ()
    conflicts: list[conflict_frontier.ConflictView] = field(default_factory=list)
    # Returned hypotheses in rank order (filled by the hypotheses frontier).
    hypothesis_ids: list[str] = field(default_factory=list)
    # Set when the recall was persisted for feedback (gateway/services/feedback.py).
    recall_event_id: str | None = None
    suggested_actions: list[SuggestedAction] = field(default_factory=list)


class RecallService:
    def __init__(
        self, db: Database, embedder: EmbeddingProvider, feedback: FeedbackService | None = None
    ) -> None:
        self.db = db
        self.embedder = embedder
        # None: recalls are not persisted for feedback (no snapshot, no suggestion).
        self.feedback = feedback

    async def recall(self, principal: Principal, request: RecallRequest) -> RecallOutcome:
        degradations: list[Degradation] = []
        team = principal.team_id
        async with self.db.tenant(team, principal.readable_space_ids) as conn:
            now, spaces = await store.resolve_view(
                conn, team, principal.readable_space_ids, request.known_at
            )
        t_sys = request.known_at or now
        view = ReadView(
            team_id=team,
            space_kinds={s.space_id: s.kind for s in spaces},
            t_sys=t_sys,
            t_valid=request.valid_at or t_sys,
        )
        branches = [
            search.BranchSearch(s.kind, s.space_id, s.generation)
            for s in sorted(spaces, key=lambda s: s.kind != "shared")
            if s.generation is not None
        ]
        vector = await self._embed(request.query, degradations)
        per_list = overfetch(request.limit)
        lists, list_states = await self._candidates(
            team, branches, request, vector, per_list, t_sys, degradations
        )
        fused = {
            b.branch: fuse_weighted(
                {name: ids for (branch, name), ids in lists.items() if branch == b.branch},
                known=request.known_evidence_ids,
            )
            for b in branches
            if any(branch == b.branch for branch, _ in lists)
        }
        eligible = await self._hydrate(team, view, branches, fused, degradations)
        per_branch: dict[str, list[str]] = {}
        starved = False
        for branch, ids in fused.items():
            kept = [i for i in ids if i in eligible]
            per_branch[branch] = kept[: request.limit]
            full_lists = any(len(v) >= per_list for (b, _), v in lists.items() if b == branch)
            if len(kept) < request.limit and full_lists:
                starved = True
        order = fuse_branches(
            private=per_branch.get("private", ()),
            shared=per_branch.get("shared", ()),
            limit=request.limit,
        )
        results = [
            EvidenceResult(rank=i, space_kind=str(hit.branch), evidence=eligible[hit.item_id])
            for i, hit in enumerate(order, start=1)
        ]
        lost = any(d.frontier == "evidence" for d in degradations)
        status = "partial" if lost or starved else "complete"
        # Related relationships and communities (shared branch only): a module of
        # their own; imported here because it builds on this module's types.
        from gateway.services.related import RelatedFrontiers, SharedBranch

        shared = next((b for b in branches if b.branch == "shared"), None)
        # Independent reads on their own connections: run them side by side.
        related, hyps = await asyncio.gather(
            RelatedFrontiers(self.db).recall(
                view,
                SharedBranch(shared.space_id, shared.generation) if shared else None,
                request,
                vector,
                sorted({rid for r in results for rid in r.evidence.relationship_ids}),
            ),
            hypothesis_frontier.related_hypotheses(self.db, view, branches, request, results),
        )
        degradations += related.degradations
        if hyps.loss is not None:
            degradations.append(Degradation("hypotheses", *hyps.loss))
        # Conflicts are reachable from every relationship the answer returns:
        # evidence support paths first, then the related and community frontiers.
        more = [
            rid
            for handle in [
                *related.relationships,
                *(m for c in related.communities for m in c.members),
            ]
            for rid in (handle.representative.id, *handle.equivalent_ids)
        ]
        conflicts = await conflict_frontier.reachable_conflicts(
            self.db, view, conflict_frontier.answer_reach(results, more)
        )
        states = {
            "evidence": SearchState("evidence", status, tuple(list_states)),
            "relationships": related.states["relationships"],
            "communities": related.states["communities"],
            "hypotheses": SearchState(
                "hypotheses",
                hyps.status,
                tuple(ListState("shared", n, st, c) for n, st, c in hyps.lists),
            ),
        }
        outcome = RecallOutcome(
            recall_id=str(uuid.uuid4()),
            view=view,
            results=results,
            degradations=degradations,
            search_states=states,
            related_relationships=related.relationships,
            related_communities=related.communities,
            hypotheses=hyps.hypotheses,
            conflicts=conflicts,
            hypothesis_ids=[h.id for h in hyps.hypotheses],
        )
        if self.feedback is not None:
            await self.feedback.attach(principal, request, outcome)
        return outcome

    async def _embed(self, query: str | None, degradations: list[Degradation]) -> np.ndarray | None:
        """The query vector, computed once and reused by every branch."""
        if query is None:
            return None
        try:
            vectors = await embed_queries(self.embedder, [query])
        except EmbeddingError as exc:
            malformed = isinstance(exc, EmbeddingMalformed)
            code = "query_embedding_malformed" if malformed else "query_embedding_unavailable"
            log.warning("query embedding lost: %s", exc.message)
            degradations.append(
                Degradation(
                    "evidence",
                    code,
                    "the query could not be embedded; full-text and entity lists still answer",
                )
            )
            return None
        if vectors.shape != (1, self.embedder.dimensions) or not np.isfinite(vectors).all():
            degradations.append(
                Degradation(
                    "evidence",
                    "query_embedding_malformed",
                    "the query embedding was malformed; full-text and entity lists still answer",
                )
            )
            return None
        return np.asarray(vectors[0], dtype=np.float32)

    async def _search(
        self,
        team: str,
        branches: Sequence[search.BranchSearch],
        request: RecallRequest,
        vector: np.ndarray | None,
        per_list: int,
        t_sys: datetime,
    ) -> dict[tuple[str, str], list[str]]:
        query = search.CandidateQuery(
            team_id=team,
            branches=tuple(branches),
            text=request.query,
            vector=vector,
            entity_ids=request.expand_from_entity_ids,
            exclude_ids=request.known_evidence_ids,
            per_list=per_list,
            known_at=t_sys,
        )
        async with self.db.tenant(team, [b.space_id for b in branches]) as conn:
            return await search.evidence_candidates(conn, query)

    async def _candidates(
        self,
        team: str,
        branches: Sequence[search.BranchSearch],
        request: RecallRequest,
        vector: np.ndarray | None,
        per_list: int,
        t_sys: datetime,
        degradations: list[Degradation],
    ) -> tuple[dict[tuple[str, str], list[str]], list[ListState]]:
        """All lists of all branches in one round trip; on failure, branch by branch,
        then without the vector list, so that what still works still answers."""
        wanted = [
            name
            for name, on in (
                ("fulltext", request.query is not None),
                ("vector", vector is not None),
                ("entity", bool(request.expand_from_entity_ids)),
            )
            if on
        ]
        states: list[ListState] = []
        try:
            lists = await self._search(team, branches, request, vector, per_list, t_sys)
        except STORE_FAILURES as exc:
            log.warning("combined candidate search failed (%s); retrying per branch", exc)
            lists = {}
            for b in branches:
                got = await self._branch_candidates(
                    team, b, request, vector, per_list, t_sys, degradations
                )
                if got is None:
                    states += [ListState(b.branch, n, "failed", 0) for n in wanted]
                    continue
                lists.update(got)
        for b in branches:
            for name in ("fulltext", "vector", "entity"):
                if (b.branch, name) in lists:
                    states.append(ListState(b.branch, name, "complete", len(lists[b.branch, name])))
                elif name in wanted and not any(
                    s.branch == b.branch and s.list == name for s in states
                ):
                    states.append(ListState(b.branch, name, "failed", 0))
                elif name not in wanted:
                    states.append(ListState(b.branch, name, "skipped", 0))
        return lists, states

    async def _branch_candidates(
        self,
        team: str,
        branch: search.BranchSearch,
        request: RecallRequest,
        vector: np.ndarray | None,
        per_list: int,
        t_sys: datetime,
        degradations: list[Degradation],
    ) -> dict[tuple[str, str], list[str]] | None:
        try:
            return await self._search(team, [branch], request, vector, per_list, t_sys)
        except STORE_FAILURES as exc:
            first = exc
        if vector is not None:
            try:
                got = await self._search(team, [branch], request, None, per_list, t_sys)
            except STORE_FAILURES:
                pass
            else:
                degradations.append(
                    Degradation(
                        "evidence",
                        "vector_branch_failed",
                        f"the vector search of the {branch.branch} space failed; "
                        "full-text and entity lists still answer",
                    )
                )
                log.warning("vector list of %s lost: %s", branch.branch, first)
                return got
        if branch.branch == "shared":
            raise DatabaseUnavailable("the shared memory space could not be searched") from first
        log.warning("private branch lost: %s", first)
        degradations.append(
            Degradation(
                "evidence",
                "space_branch_unavailable",
                "the private memory space could not be searched; shared results only",
            )
        )
        return None

    async def _hydrate(
        self,
        team: str,
        view: ReadView,
        branches: Sequence[search.BranchSearch],
        fused: dict[str, list[str]],
        degradations: list[Degradation],
    ) -> dict[str, store.EligibleEvidence]:
        """Canonical state of every fused candidate, one statement for all branches."""
        ids = [i for ranked in fused.values() for i in ranked]
        spaces = [b.space_id for b in branches if b.branch in fused]
        try:
            async with self.db.tenant(team, spaces) as conn:
                return await store.eligible_evidence(
                    conn, team, ids, spaces, view.t_sys, view.t_valid
                )
        except STORE_FAILURES as exc:
            if "private" not in fused:
                raise DatabaseUnavailable("canonical evidence could not be loaded") from exc
            log.warning("hydration of both branches failed (%s); retrying shared only", exc)
        shared = [b for b in branches if b.branch == "shared"]
        try:
            async with self.db.tenant(team, [b.space_id for b in shared]) as conn:
                got = await store.eligible_evidence(
                    conn,
                    team,
                    fused.get("shared", []),
                    [b.space_id for b in shared],
                    view.t_sys,
                    view.t_valid,
                )
        except STORE_FAILURES as exc:
            raise DatabaseUnavailable("canonical evidence could not be loaded") from exc
        fused.pop("private", None)
        degradations.append(
            Degradation(
                "evidence",
                "space_branch_unavailable",
                "the private memory space could not be loaded; shared results only",
            )
        )
        return got
