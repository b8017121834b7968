"""recallMemory: the orchestrator that runs the frontiers in the design note's order.

1. **Scope**: the readable spaces and their generations at the view's time,
   side by side with the **query embedding** (computed once per request and
   reused by every branch; repeated queries come from a bounded LRU).
2. **Evidence** (:mod:`gateway.services.evidence`): candidate lists per
   branch, fusion, canonical hydration, branch fusion.
3. **Related relationships and communities** (:mod:`gateway.services.related`,
   shared branch only): discovery, coverage by the returned evidence, the
   community frontier, the direct fallback.
4. **Hypotheses** (:mod:`gateway.services.hypotheses`, shared only).
5. **Conflicts** (:mod:`gateway.services.conflicts`) reachable from every
   relationship the answer returns.
6. **Feedback snapshot** (:mod:`gateway.services.feedback`), when enabled.

Every statement of every stage runs in one unit of work: one pooled
connection and one tenant transaction (``BEGIN``, the tenant settings and
``COMMIT`` once per recall; :class:`gateway.store.database.Unit`), on the pool
the read router chooses (:mod:`gateway.store.replicas`: a read replica that has
replayed what the recall needs, else the primary). Read on a replica, the
feedback snapshot is written on the primary in a transaction of its own. The stages
depend only on the value types of :mod:`gateway.services.recall_types` and on
the store; this module is the only one that knows all of them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

import numpy as np

from gateway.embeddings import EmbeddingProvider, StoreModel, embed_queries, embedding_epoch
from gateway.errors import EmbeddingError, EmbeddingMalformed
from gateway.services import conflicts as conflict_frontier
from gateway.services import hypotheses as hypothesis_frontier
from gateway.services.auth import Principal
from gateway.services.evidence import search_evidence
from gateway.services.feedback import FeedbackService
from gateway.services.recall_input import RecallRequest
from gateway.services.recall_types import (
    ConflictView,
    Degradation,
    EvidenceResult,
    ListState,
    ReadView,
    RecallOutcome,
    RelationshipConflictView,
    SearchState,
    answer_reach,
)
from gateway.services.related import RelatedFrontiers, RelatedOutcome, SharedBranch
from gateway.stages import stage
from gateway.store import recall as store
from gateway.store import search
from gateway.store.database import STORE_FAILURES, Database, Unit
from gateway.store.replicas import ReadRouter

log = logging.getLogger("gateway.recall")

__all__ = ["QUERY_EMBEDDING_CACHE", "RecallService"]

MODEL_MISMATCH: Final = "query_embedding_model_mismatch"

QUERY_EMBEDDING_CACHE: Final = 1024
"""Query embeddings kept per process (about 1.5 MB at 384 dimensions): agents
and type-ahead frontends repeat queries, and an embedding is the largest
single step of a recall."""


class QueryEmbeddings:
    """The query vector of a text, from a bounded LRU or the provider."""

    def __init__(
        self,
        embedder: EmbeddingProvider,
        size: int = QUERY_EMBEDDING_CACHE,
        store_model: StoreModel | None = None,
    ) -> None:
        self.embedder = embedder
        self.size = size
        self.store_model = store_model
        self._cache: OrderedDict[tuple[int, str], np.ndarray] = OrderedDict()

    @stage("query_embedding")
    async def vector(self, query: str | None, degradations: list[Degradation]) -> np.ndarray | None:
        if query is None:
            return None
        # Never compare a question of one model with vectors of another: without
        # the question's vector, neither the evidence nor the relationship
        # vector lists run (the caller adds the relationships' degradation).
        mismatch = self.store_model.mismatch() if self.store_model is not None else None
        if mismatch is not None:
            degradations.append(
                Degradation(
                    "evidence",
                    MODEL_MISMATCH,
                    f"{mismatch}; vector lists skipped, full-text and entity lists still answer",
                )
            )
            return None
        # The provider's epoch changes when the store moves to another model
        # (reembed): vectors cached before then belong to the old model.
        key = (embedding_epoch(self.embedder), query)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
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
        vector = np.array(vectors[0], dtype=np.float32)
        vector.setflags(write=False)
        self._cache[key] = vector
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return vector


class RecallService:
    def __init__(
        self,
        db: Database,
        embedder: EmbeddingProvider,
        feedback: FeedbackService | None = None,
        store_model: StoreModel | None = None,
        reads: ReadRouter | None = None,
    ) -> None:
        self.db = db
        # Which pool each recall reads from; without replicas, always ``db``.
        self.reads = reads or ReadRouter(db)
        self.embedder = embedder
        # store_model: the store's model as the process last read it (None: unchecked).
        self.embeddings = QueryEmbeddings(embedder, store_model=store_model)
        # None: recalls are not persisted for feedback (no snapshot, no suggestion).
        self.feedback = feedback

    async def recall(self, principal: Principal, request: RecallRequest) -> RecallOutcome:
        persist = self.feedback is not None and self.feedback.enabled
        on_primary = False

        async def read(db: Database, primary: bool) -> RecallOutcome:
            nonlocal on_primary
            on_primary = primary
            return await self._recall_on(db, principal, request, snapshot=persist and primary)

        outcome = await self.reads.run(read, known_at=request.known_at)
        if persist and not on_primary and self.feedback is not None:
            await self.feedback.attach(principal, request, outcome)
        return outcome

    async def _recall_on(
        self, db: Database, principal: Principal, request: RecallRequest, *, snapshot: bool
    ) -> RecallOutcome:
        """The recall on ``db``; ``snapshot``: write the feedback snapshot in the
        recall's own transaction (``db`` is the primary)."""
        degradations: list[Degradation] = []
        async with db.unit(
            principal.team_id, principal.readable_space_ids, readonly=not snapshot
        ) as unit:
            # 1. Scope, while the query is embedded (in the provider's thread or remotely).
            embedding = asyncio.ensure_future(self.embeddings.vector(request.query, degradations))
            try:
                view, branches = await self._scope(unit, principal, request)
            except BaseException:
                embedding.cancel()
                raise
            vector = await embedding
            # 2. Evidence.
            evidence = await search_evidence(unit, view, branches, request, vector, degradations)
            results = evidence.results
            # 3. Related relationships and communities.
            related = await self._related(unit, view, branches, request, vector, results)
            degradations += related.degradations
            if any(d.code == MODEL_MISMATCH for d in degradations) and related.states[
                "relationships"
            ].status not in ("disabled", "skipped"):
                degradations.append(
                    Degradation(
                        "relationships",
                        MODEL_MISMATCH,
                        "the query's embedding model is not the store's; relationship "
                        "vectors skipped, lexical discovery still answers",
                    )
                )
            # 4. Hypotheses.
            hyps = await hypothesis_frontier.related_hypotheses(
                unit, view, branches, request, results
            )
            if hyps.loss is not None:
                degradations.append(Degradation("hypotheses", *hyps.loss))
            # 5. Conflicts, reachable from every relationship the answer returns:
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
                unit, view, answer_reach(results, more)
            )
            outcome = RecallOutcome(
                recall_id=str(uuid.uuid4()),
                view=view,
                results=results,
                degradations=degradations,
                search_states={
                    "evidence": evidence.state,
                    "relationships": related.states["relationships"],
                    "communities": related.states["communities"],
                    "hypotheses": SearchState(
                        "hypotheses",
                        hyps.status,
                        tuple(ListState("shared", n, st, c) for n, st, c in hyps.lists),
                    ),
                },
                related_relationships=related.relationships,
                related_communities=related.communities,
                hypotheses=hyps.hypotheses,
                conflicts=conflicts,
                hypothesis_ids=[h.id for h in hyps.hypotheses],
            )
            outcome.nested = await self._nested(unit, view, results, related, conflicts)
            # 6. Feedback snapshot.
            if self.feedback is not None and snapshot:
                await self._snapshot(unit, principal, request, outcome, self.feedback)
        return outcome

    @stage("scope")
    async def _scope(
        self, unit: Unit, principal: Principal, request: RecallRequest
    ) -> tuple[ReadView, list[search.BranchSearch]]:
        """The view (instants, readable spaces) and the branches to search in it."""
        team = principal.team_id
        async with unit.step() as conn:
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
        return view, branches

    @staticmethod
    @stage("related")
    async def _related(
        unit: Unit,
        view: ReadView,
        branches: Sequence[search.BranchSearch],
        request: RecallRequest,
        vector: np.ndarray | None,
        results: Sequence[EvidenceResult],
    ) -> RelatedOutcome:
        shared = next((b for b in branches if b.branch == "shared"), None)
        return await RelatedFrontiers(unit).recall(
            view,
            SharedBranch(shared.space_id, shared.generation) if shared else None,
            request,
            vector,
            sorted({rid for r in results for rid in r.evidence.relationship_ids}),
        )

    @staticmethod
    @stage("nested")
    async def _nested(
        unit: Unit,
        view: ReadView,
        results: Sequence[EvidenceResult],
        related: RelatedOutcome,
        conflicts: Sequence[ConflictView],
    ) -> store.NestedRows | None:
        """The sources and supporting relationships of the results, the relationships
        of the conflicts' positions, and the entities of every returned relationship,
        in one statement, so that the nested fields cost no transaction of their own
        (and the statements of a recall stay independent of its limit). Only an
        optimisation: if it fails, the request's loaders read the rows on demand."""
        handles = [
            *related.relationships,
            *(m for c in related.communities for m in c.members),
        ]
        entities = {
            e
            for h in handles
            for e in (h.representative.subject_entity_id, h.representative.object_entity_id)
            if e is not None
        }
        try:
            async with unit.step() as conn:
                return await store.nested_rows(
                    conn,
                    view.team_id,
                    sorted({r.evidence.source_id for r in results}),
                    sorted(
                        {rid for r in results for rid in r.evidence.relationship_ids}
                        | {
                            rid
                            for c in conflicts
                            if isinstance(c, RelationshipConflictView)
                            for p in c.positions
                            for rid in p.relationship_ids
                        }
                    ),
                    sorted(entities),
                    view.space_ids,
                    view.t_sys,
                )
        except STORE_FAILURES as exc:
            log.warning("nested rows not preloaded: %s", exc)
            return None

    @staticmethod
    @stage("feedback")
    async def _snapshot(
        unit: Unit,
        principal: Principal,
        request: RecallRequest,
        outcome: RecallOutcome,
        feedback: FeedbackService,
    ) -> None:
        """The recall event, written and committed in the recall's own transaction."""
        await feedback.attach(principal, request, outcome, unit)
        if outcome.recall_event_id is None:
            return
        try:
            await unit.commit()
        except STORE_FAILURES as exc:
            feedback.lost(outcome, exc)
