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
   relationship the answer returns. The related frontiers' handles, the
   hypotheses and the conflicts are read in one statement (the handles reach
   relationship cases, numbered in SQL; see ``_AnswerWithHandles`` below).
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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np

from gateway import deadline
from gateway.embeddings import EmbeddingProvider, StoreModel, embed_queries, query_model
from gateway.errors import EmbeddingError, EmbeddingMalformed, GatewayError
from gateway.fusion import EVIDENCE_WEIGHTS, RRF_K
from gateway.services import conflicts as conflict_frontier
from gateway.services import hypotheses as hypothesis_frontier
from gateway.services.auth import Principal
from gateway.services.evidence import (
    Prefetched,
    candidate_query,
    search_evidence,
    vector_hydration_bounds,
)
from gateway.services.feedback import FeedbackService
from gateway.services.recall_input import RecallRequest
from gateway.services.recall_types import (
    ConflictView,
    Degradation,
    EvidenceResult,
    ListState,
    Reach,
    ReadView,
    RecallOutcome,
    RelationshipConflictView,
    SearchState,
    answer_reach,
)
from gateway.services.related import (
    HandleLoader,
    RelatedFrontiers,
    RelatedOutcome,
    SharedBranch,
    discovers,
    discovery_query,
)
from gateway.stages import stage
from gateway.store import recall as store
from gateway.store import related as related_store
from gateway.store import round_trips, search
from gateway.store.database import APP_ROLE, STORE_FAILURES, Database, SideTicket, Unit
from gateway.store.recall import RelationshipRow
from gateway.store.replicas import ReadRouter

log = logging.getLogger("gateway.recall")

__all__ = ["QUERY_EMBEDDING_CACHE", "RecallService"]

# Degradation codes the orchestrator raises itself (the frontiers' modules raise
# theirs; the schema's DegradationCode lists them all).
MODEL_MISMATCH: Final = "query_embedding_model_mismatch"
VECTOR_INDEX_PENDING: Final = "vector_index_pending"
"""A searched space's vectors wait for an unfinished ``load --index-after``."""

RECALL_PLAN_CACHE_MODE: Final = "force_generic_plan"
"""How PostgreSQL plans a recall's statements (set for its transaction only;
the default of ``RECALL_PLAN_CACHE_MODE``, see :func:`plan_cache_mode`).
Each connection prepares a recall's statements once (their texts depend only on
the recall's shape); with a generic plan it also plans them once, instead of
once per recall: the combined first round took about 5 ms to plan, a fifth of
its time, and its generic plan ran no slower (docs/benchmarks.md, "Prepared
once, planned once"). The vector searches inside it are functions that plan
their own query with every call (``force_custom_plan`` in their definitions),
and no statement of a recall reads a partitioned table outside them."""

PLAN_CACHE_MODES: Final = ("force_generic_plan", "auto", "force_custom_plan", "server")
"""The values of ``RECALL_PLAN_CACHE_MODE`` (gateway/settings.py checks them)."""


def plan_cache_mode(setting: str) -> str | None:
    """The ``plan_cache_mode`` a recall's transaction sets for ``setting``, or None
    for ``server``: then none is set, and the connection keeps the one it got at
    login (the server's, the database's or the login role's; not ``recall_app``'s,
    which ``SET ROLE`` does not apply).

    One generic plan serves every team, so its estimates are those of an average
    team; a store with one team far larger than the others may answer it faster
    with ``force_custom_plan``, at the cost of planning every recall
    (docs/deploy.md). The answers are the same whatever the mode."""
    if setting not in PLAN_CACHE_MODES:
        raise ValueError(f"plan_cache_mode must be one of {', '.join(PLAN_CACHE_MODES)}")
    return None if setting == "server" else setting


Asker = tuple[str, str, str]
"""Who asks a question: (team ID, principal ID, the token's binding: a
principal's shared_only token must not time its private-bound token's questions)."""

QUERY_EMBEDDING_CACHE: Final = 1024
"""Query embeddings kept per process (about 1.5 MB at 384 dimensions): agents
and type-ahead frontends repeat queries, and an embedding is the largest
single step of a recall."""


class QueryEmbeddings:
    """The query vector of a text, from a bounded LRU or the provider.

    The LRU is keyed by the vector space as well as the text: the model the
    provider's next vector comes from (:func:`gateway.embeddings.query_model`:
    for a provider that follows the store, the store's model, which it
    switches to at its next call). The model identifier fixes the dimensions
    (a local model's are its own; an OpenAI-compatible endpoint's requested
    size is a setting, fixed for the process's life), so they are not part of
    the key. What leaves the space unchanged (a store's first vectors, seen by
    the store-model watcher) keeps the LRU.

    It is keyed by who asks too (team, principal, the token's binding): a question found in the
    LRU is answered about 10 ms sooner (the model does not run), so one LRU for
    every caller would tell a caller, by timing, which questions another team
    or another principal had asked lately. A caller's own repeated questions
    still hit.

    A store moving to another model (``reembed``) never gets an old model's
    vector from here: a following provider's key changes with the store's
    model; a process that names its model keeps its key, and is kept from its
    old vectors by the mismatch check, which must stay *before* the LRU in
    :meth:`known` and :meth:`vector` (tests/test_query_lru.py). A vector is
    filed only if the provider still embeds with the model of its key once it
    returns, so one from a model switched to during the call is not filed
    under the old name.
    """

    def __init__(
        self,
        embedder: EmbeddingProvider,
        size: int = QUERY_EMBEDDING_CACHE,
        store_model: StoreModel | None = None,
    ) -> None:
        self.embedder = embedder
        self.size = size
        self.store_model = store_model
        self._cache: OrderedDict[tuple[str, str, str, str, str], np.ndarray] = OrderedDict()

    def known(self, query: str | None, asker: Asker) -> tuple[bool, np.ndarray | None]:
        """``(True, vector)`` when :meth:`vector` would answer without running the
        model and without a degradation (no query; a query in the LRU), else
        ``(False, None)``: what a recall may send before the embedding is done."""
        if query is None:
            return True, None
        # Before the LRU: a process that names its model keeps its key when the
        # store moves to another model; only this keeps its old vectors out.
        if self.store_model is not None and self.store_model.mismatch() is not None:
            return False, None
        cached = self._cache.get(self._key(query, asker))
        return (True, cached) if cached is not None else (False, None)

    def _key(self, query: str, asker: Asker) -> tuple[str, str, str, str, str]:
        """Who asks (see the class), then what decides a query's vector: the model it
        will be embedded with, and the text."""
        return (*asker, query_model(self.embedder), query)

    @stage("query_embedding")
    async def vector(
        self, query: str | None, degradations: list[Degradation], asker: Asker
    ) -> np.ndarray | None:
        if query is None:
            return None
        # Never compare a question of one model with vectors of another: without
        # the question's vector, neither the evidence nor the relationship
        # vector lists run (the caller adds the relationships' degradation).
        # Before the LRU, as in known(): it is what keeps a cached vector of a
        # named model from a store that moved to another one.
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
        # Keyed by the model the vector will come from: after a store moved to
        # another model (reembed), vectors cached before belong to the old one.
        key = self._key(query, asker)
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
        if self.embedder.model == key[3]:
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
        plan_mode: str | None = RECALL_PLAN_CACHE_MODE,
    ) -> None:
        self.db = db
        # Which pool each recall reads from; without replicas, always ``db``.
        self.reads = reads or ReadRouter(db)
        self.embedder = embedder
        # store_model: the store's model as the process last read it (None: unchecked).
        self.embeddings = QueryEmbeddings(embedder, store_model=store_model)
        # None: recalls are not persisted for feedback (no snapshot, no suggestion).
        self.feedback = feedback
        # PostgreSQL's plan_cache_mode for each recall's transaction (None: unset).
        self.plan_cache_mode: str | None = plan_mode

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
        async with (
            db.unit(
                principal.team_id,
                principal.readable_space_ids,
                readonly=not snapshot,
                plan_cache_mode=self.plan_cache_mode,
            ) as unit,
            _DiscoveryBeside.taken(db, unit, principal, request) as beside,
        ):
            # 1. Scope, while the query is embedded (in the provider's thread or
            # remotely): the view, and with it every list whose input is known
            # already (full text and entities; the vector lists too when the
            # embedding is, from the LRU), so that their work runs on the server
            # during the model run instead of after it. Relationship discovery,
            # when a side connection is free, runs there instead, as soon as the
            # view's instant and the embedding are known (_DiscoveryBeside).
            asker = (principal.team_id, principal.principal_id, principal.binding)
            ready, known = self.embeddings.known(request.query, asker)
            embedding = asyncio.ensure_future(
                self.embeddings.vector(request.query, degradations, asker)
            )
            if beside is not None:
                beside.start(embedding)
            try:
                view, branches, early = await self._scope_round(
                    unit, principal, request, known if ready else None, beside is not None
                )
            except BaseException:
                embedding.cancel()
                raise
            vector = await embedding
            shared = next(
                (SharedBranch(b.space_id, b.generation) for b in branches if b.branch == "shared"),
                None,
            )
            pending = _vectors_pending(view, branches)
            if pending is not None and vector is not None:
                degradations.append(Degradation("evidence", VECTOR_INDEX_PENDING, pending))
            # 2. Evidence, with relationship discovery beside it: what the scope
            # round did not read (the vector parts), in one more round trip.
            first = await self._first_round(
                unit, view, branches, request, vector, shared, early, ready, beside is not None
            )
            evidence = await search_evidence(
                unit,
                view,
                branches,
                request,
                vector,
                degradations,
                Prefetched(first.lists, first.eligible) if first is not None else None,
            )
            results = evidence.results
            returned = sorted({rid for r in results for rid in r.evidence.relationship_ids})
            # 3. Related relationships and communities; discovery's coverage by the
            # returned evidence is applied now that the evidence is known.
            discovered = None
            if first is not None:
                found = first.discovery
                if beside is not None:
                    # None when it failed or read another view: the frontiers then
                    # discover on the unit, as when a combined round failed.
                    found = await beside.result(view, shared, request, vector)
                if found is not None:
                    covered = {first.path_groups[r] for r in returned if r in first.path_groups}
                    discovered = replace(found, covered_groups=found.covered_groups | covered)
            # The handles' relationships are read in the answer round (hypotheses and
            # conflicts, with the handles' reach of cases in SQL): one round trip less.
            answer = _AnswerWithHandles(unit, view, branches, request, results, shared)
            related = await self._related(
                unit, view, shared, request, vector, returned, discovered, answer.load_handles
            )
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
            if (
                pending is not None
                and vector is not None
                and related.states["relationships"].status not in ("disabled", "skipped")
            ):
                degradations.append(Degradation("relationships", VECTOR_INDEX_PENDING, pending))
            # 4. Hypotheses and 5. conflicts (reachable from every relationship the
            # answer returns: evidence support paths first, then the related and
            # community frontiers), in one round trip.
            more = [
                rid
                for handle in [
                    *related.relationships,
                    *(m for c in related.communities for m in c.members),
                ]
                for rid in (handle.representative.id, *handle.equivalent_ids)
            ]
            if answer.read is not None:
                hyps, conflicts = self._answered(view, branches, request, results, answer.read)
            else:
                hyps, conflicts = await self._answer_round(
                    unit, view, branches, request, results, answer_reach(results, more)
                )
            if hyps.loss is not None:
                degradations.append(Degradation("hypotheses", *hyps.loss))
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
            # 6. The nested fields' rows and the feedback snapshot, in one round trip.
            feedback = self.feedback if snapshot else None
            await self._last_round(unit, principal, request, outcome, related, feedback)
        return outcome

    @staticmethod
    async def _first_round(
        unit: Unit,
        view: ReadView,
        branches: Sequence[search.BranchSearch],
        request: RecallRequest,
        vector: np.ndarray | None,
        shared: SharedBranch | None,
        early: round_trips.FirstRound | None,
        ready: bool,
        beside: bool = False,
    ) -> round_trips.FirstRound | None:
        """The candidate lists, their hydration and discovery: those the scope round
        read (``early``; ``ready``: with the query's vector, so all of them), and
        the vector parts after it. None when nothing is to be searched, or when a
        combined statement failed: the frontiers then read their own statements,
        each with its fallbacks and degradations. ``beside``: discovery runs on a
        side connection; these rounds read only the support paths' groups its
        coverage needs."""
        candidates = candidate_query(view.team_id, branches, request, vector, view.t_sys)
        discovery = discovery_query(view, shared, request, vector)
        groups = None
        if beside and discovery is not None:
            discovery, groups = None, round_trips.PathGroups(view.space_ids, view.t_sys)
        if early is None or not candidates.branches:
            # No scope round's lists (it failed, or the view disagreed): all at once.
            return await RecallService._search_round(
                unit, candidates, view.t_valid, discovery, groups=groups
            )
        if ready or vector is None:
            return round_trips.merge_rounds(candidates, discovery, early, None)
        late = await RecallService._search_round(
            unit,
            replace(candidates, text=None, entity_ids=()),
            view.t_valid,
            # The groups the known IDs cover came with the scope round's discovery.
            replace(discovery, text=None, known_evidence_ids=(), known_relationship_ids=())
            if discovery is not None
            else None,
            groups=groups,
            checked=sorted({i for ids in early.lists.values() for i in ids}),
            # Vector candidates that cannot reach the answer are not hydrated.
            vector_ranks=vector_hydration_bounds(
                early.lists,
                early.eligible,
                [b.branch for b in candidates.branches],
                request.known_evidence_ids,
                request.limit,
            ),
        )
        if late is None:
            return None
        return round_trips.merge_rounds(candidates, discovery, early, late)

    @staticmethod
    @stage("search")
    async def _search_round(
        unit: Unit,
        candidates: search.CandidateQuery,
        t_valid: datetime,
        discovery: related_store.DiscoveryQuery | None,
        checked: Sequence[str] = (),
        vector_ranks: Mapping[str, int] | None = None,
        groups: round_trips.PathGroups | None = None,
    ) -> round_trips.FirstRound | None:
        """Candidates, hydration and discovery in one statement (``checked``: already
        hydrated; ``vector_ranks``: the vector candidates hydrated, per branch;
        ``groups``: the support paths' groups without discovery); None when it fails
        or when there is nothing to search."""
        try:
            async with unit.step() as conn:
                return await round_trips.first_round(
                    conn,
                    candidates,
                    t_valid,
                    discovery,
                    checked=checked,
                    vector_ranks=vector_ranks,
                    groups=groups,
                )
        except STORE_FAILURES as exc:
            log.warning("combined evidence search failed (%s); searching step by step", exc)
            return None

    @staticmethod
    def _answered(
        view: ReadView,
        branches: Sequence[search.BranchSearch],
        request: RecallRequest,
        results: Sequence[EvidenceResult],
        got: round_trips.AnswerRound,
    ) -> tuple[hypothesis_frontier.HypothesisFrontier, list[ConflictView]]:
        """The hypothesis and conflict frontiers from a combined statement's rows."""
        conflicts = conflict_frontier.nearest(got.cases, got.evidence_conflicts)
        query = hypothesis_frontier.hypothesis_query(view, branches, request, results)
        if isinstance(query, hypothesis_frontier.HypothesisFrontier):
            return query, conflicts
        assert got.hypotheses is not None
        return hypothesis_frontier.ranked(request, got.hypotheses), conflicts

    @staticmethod
    @stage("answer")
    async def _answer_round(
        unit: Unit,
        view: ReadView,
        branches: Sequence[search.BranchSearch],
        request: RecallRequest,
        results: Sequence[EvidenceResult],
        reach: Reach,
    ) -> tuple[hypothesis_frontier.HypothesisFrontier, list[ConflictView]]:
        """Hypotheses and conflicts in one statement; if it fails, each in its own
        (a lost hypothesis frontier degrades, lost conflicts fail the call)."""
        query = hypothesis_frontier.hypothesis_query(view, branches, request, results)
        conflict_query = conflict_frontier.conflict_query(view, reach)
        if conflict_query is not None:
            try:
                async with unit.step() as conn:
                    got = await round_trips.answer_round(
                        conn,
                        None
                        if isinstance(query, hypothesis_frontier.HypothesisFrontier)
                        else query,
                        conflict_query,
                    )
            except STORE_FAILURES as exc:
                log.warning("combined hypotheses and conflicts failed (%s); one by one", exc)
            else:
                return RecallService._answered(view, branches, request, results, got)
        hyps = await hypothesis_frontier.related_hypotheses(unit, view, branches, request, results)
        conflicts = await conflict_frontier.reachable_conflicts(unit, view, reach)
        return hyps, conflicts

    @stage("scope")
    async def _scope_round(
        self,
        unit: Unit,
        principal: Principal,
        request: RecallRequest,
        vector: np.ndarray | None,
        beside: bool = False,
    ) -> tuple[ReadView, list[search.BranchSearch], round_trips.FirstRound | None]:
        """The view, the branches to search in it, and the first round's parts sent
        with it (``vector``: the query's, when already known): one statement
        (round_trips.scope_round). If it fails, the view alone, and no parts (the
        first round then reads them all). ``beside``: discovery runs on a side
        connection; only the support paths' groups its coverage needs are read."""
        spaces = principal.readable_space_ids
        # The queries as the view will make them: a branch per readable space (the
        # statement takes their generations from the view), the view's instants
        # where the request gives them (else the statement's now()).
        t_sys = request.known_at or _UNTIL_THE_VIEW
        provisional = ReadView(
            team_id=principal.team_id,
            space_kinds=dict(zip(spaces, principal.space_kinds, strict=True)),
            t_sys=t_sys,
            t_valid=request.valid_at or t_sys,
        )
        candidates = candidate_query(
            principal.team_id,
            [search.BranchSearch(k, s, 0) for s, k in provisional.space_kinds.items()],
            request,
            vector,
            t_sys,
        )
        discovery = discovery_query(
            provisional, SharedBranch(principal.shared_space_id, 0), request, vector
        )
        groups = None
        if beside and discovery is not None:
            discovery, groups = None, round_trips.PathGroups(provisional.space_ids, t_sys)
        scope = round_trips.ScopeQuery(
            principal.team_id, spaces, request.known_at, request.valid_at
        )
        try:
            async with unit.step() as conn:
                got = await round_trips.scope_round(
                    conn,
                    scope,
                    candidates,
                    discovery,
                    # With the vector lists (the embedding known): vector candidates
                    # that cannot reach the answer are not hydrated.
                    round_trips.VectorBound(request.limit, EVIDENCE_WEIGHTS, RRF_K),
                    groups=groups,
                )
        except STORE_FAILURES as exc:
            log.warning("view with the first lists failed (%s); the view alone", exc)
            view, branches = await self._scope(unit, principal, request)
            return view, branches, None
        view, branches = self._view(principal, request, got.now, got.spaces)
        first = got.first
        if first is not None:
            # The lists of the branches the view has (a space without a generation
            # then has none); any other disagreement: read the lists again.
            assumed = {(b.branch, b.space_id) for b in candidates.branches}
            if not {(b.branch, b.space_id) for b in branches} <= assumed:
                first = None
            else:
                names = {b.branch for b in branches}
                first = replace(
                    first, lists={k: v for k, v in first.lists.items() if k[0] in names}
                )
        return view, branches, first

    async def _scope(
        self, unit: Unit, principal: Principal, request: RecallRequest
    ) -> tuple[ReadView, list[search.BranchSearch]]:
        """The view (instants, readable spaces) and the branches to search in it,
        from the view statement alone."""
        async with unit.step() as conn:
            now, spaces = await store.resolve_view(
                conn, principal.team_id, principal.readable_space_ids, request.known_at
            )
        return self._view(principal, request, now, spaces)

    @staticmethod
    def _view(
        principal: Principal,
        request: RecallRequest,
        now: datetime,
        spaces: Sequence[store.SpaceView],
    ) -> tuple[ReadView, list[search.BranchSearch]]:
        team = principal.team_id
        t_sys = request.known_at or now
        view = ReadView(
            team_id=team,
            space_kinds={s.space_id: s.kind for s in spaces},
            t_sys=t_sys,
            t_valid=request.valid_at or t_sys,
            vectors_pending=frozenset(s.space_id for s in spaces if s.vectors_pending),
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
        shared: SharedBranch | None,
        request: RecallRequest,
        vector: np.ndarray | None,
        returned: Sequence[str],
        discovered: related_store.Discovery | None,
        load_handles: HandleLoader | None = None,
    ) -> RelatedOutcome:
        return await RelatedFrontiers(unit, load_handles).recall(
            view, shared, request, vector, returned, discovered
        )

    @staticmethod
    def _nested_query(
        view: ReadView,
        results: Sequence[EvidenceResult],
        related: RelatedOutcome,
        conflicts: Sequence[ConflictView],
    ) -> store.NestedQuery:
        """The sources and supporting relationships of the results, the relationships
        of the conflicts' positions, and the entities of every returned relationship,
        so that the nested fields cost no statement of their own (and the statements
        of a recall stay independent of its limit)."""
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
        return store.NestedQuery(
            team=view.team_id,
            source_ids=sorted({r.evidence.source_id for r in results}),
            relationship_ids=sorted(
                {rid for r in results for rid in r.evidence.relationship_ids}
                | {
                    rid
                    for c in conflicts
                    if isinstance(c, RelationshipConflictView)
                    for p in c.positions
                    for rid in p.relationship_ids
                }
            ),
            entity_ids=sorted(entities),
            space_ids=view.space_ids,
            t_sys=view.t_sys,
        )

    @stage("nested")
    async def _last_round(
        self,
        unit: Unit,
        principal: Principal,
        request: RecallRequest,
        outcome: RecallOutcome,
        related: RelatedOutcome,
        feedback: FeedbackService | None,
    ) -> None:
        """The nested rows (only an optimisation: without them the request's loaders
        read on demand) and the recall event (written and committed in the recall's
        own transaction; lost, it degrades) in one statement; if that fails, each
        in its own."""
        nested = self._nested_query(outcome.view, outcome.results, related, outcome.conflicts)
        event = feedback.event(principal, request, outcome) if feedback is not None else None
        try:
            async with unit.step() as conn:
                outcome.nested, _ = await round_trips.last_round(conn, nested, event)
        except STORE_FAILURES as exc:
            log.warning("nested rows and recall event failed together (%s); one by one", exc)
            try:
                async with unit.step() as conn:
                    outcome.nested = await store.nested_rows(conn, nested)
            except STORE_FAILURES as again:
                log.warning("nested rows not preloaded: %s", again)
            if feedback is not None:
                await feedback.attach(principal, request, outcome, unit)
        else:
            if feedback is not None:
                feedback.recorded(outcome)
        if feedback is None or outcome.recall_event_id is None:
            return
        try:
            await unit.commit()
        except STORE_FAILURES as exc:
            feedback.lost(outcome, exc)


@dataclass(slots=True)
class _AnswerWithHandles:
    """A recall's answer round when the related frontiers ask for their handles:
    the handles, the hypotheses and the conflicts in one statement (the handles
    reach relationship cases after every evidence result, numbered in SQL), sent
    from :meth:`load_handles`, the frontiers' :data:`HandleLoader`.

    It holds what the statement needs from the stages before (the evidence
    results among them), and ``read``: the round it read, which the
    orchestrator then takes its hypotheses and conflicts from; None while the
    frontiers have not asked (no shared branch, no handle to read) or when the
    statement failed, and the orchestrator then sends an answer round of its own."""

    unit: Unit
    view: ReadView
    branches: Sequence[search.BranchSearch]
    request: RecallRequest
    results: Sequence[EvidenceResult]
    shared: SharedBranch | None
    read: round_trips.AnswerRound | None = None

    async def load_handles(
        self, groups: Sequence[str], first_ranked: dict[str, str]
    ) -> dict[str, list[RelationshipRow]] | None:
        """The handles' relationships of ``groups`` (in the order the answer returns
        them), read in the answer round; None when it was not sent (the frontiers
        then read them with a statement of their own)."""
        got = await self._send(groups, first_ranked)
        if got is None:
            return None
        self.read = got
        return got.members

    @stage("answer")
    async def _send(
        self, groups: Sequence[str], first_ranked: dict[str, str]
    ) -> round_trips.AnswerRound | None:
        """The handles, hypotheses and conflicts in one statement; None without a
        shared branch or when it fails (the handles, then the answer round, are
        then read as without it)."""
        if self.shared is None:
            return None
        view, results = self.view, self.results
        query = hypothesis_frontier.hypothesis_query(view, self.branches, self.request, results)
        try:
            async with self.unit.step() as conn:
                return await round_trips.answer_round(
                    conn,
                    None if isinstance(query, hypothesis_frontier.HypothesisFrontier) else query,
                    conflict_frontier.conflict_query(view, answer_reach(results), always=True),
                    round_trips.HandlesQuery(
                        team=view.team_id,
                        space_id=self.shared.space_id,
                        generation=self.shared.generation,
                        t_sys=view.t_sys,
                        t_valid=view.t_valid,
                        groups=list(groups),
                        representatives=[first_ranked.get(g) for g in groups],
                        # Numbered after the last evidence result's rank.
                        after=max((r.rank for r in results), default=0),
                    ),
                )
        except STORE_FAILURES as exc:
            log.warning("combined handles, hypotheses and conflicts failed (%s); one by one", exc)
            return None


class _DiscoveryBeside:
    """Relationship discovery on a side connection, beside the unit's evidence path.

    A full recall's statements run one after another on its unit's connection,
    and discovery (both of its lists and their eligibility, about a fifth of a
    recall's server CPU at 100k) depends on nothing the evidence path reads but
    the view's instants and the query embedding. So when a side connection is
    free now (:meth:`gateway.store.database.SideConnections.take`: never waited
    for), discovery runs there as one statement
    (:func:`gateway.store.round_trips.side_discovery`), sent as soon as the
    embedding is known and the unit's transaction has begun (its ``now()`` is a
    current view's instant; a ``knownAt`` view's is the request's), while the
    unit reads the view, the evidence lists and their hydration (and the
    support paths' groups coverage needs). The frontiers wait for it after the
    evidence.

    Its answer is used only if it read the discovery the unit would have read:
    the same query, built by the same function, from the view the unit read
    (same instants, the same generation of the shared space) and the same
    vector, read as ``recall_app``. Anything else (it failed, a view read again
    in a later transaction, a reset committed between the two reads) returns
    None, and the frontiers discover on the unit, with their own fallbacks and
    degradations, as when a combined round fails. Evidence-only recalls (both
    related limits 0), recalls without a question, and temporal recalls without
    relationships take no side connection."""

    def __init__(
        self,
        db: Database,
        ticket: SideTicket,
        unit: Unit,
        principal: Principal,
        request: RecallRequest,
    ) -> None:
        self.db = db
        self.ticket = ticket
        self.unit = unit
        self.principal = principal
        self.request = request
        self.task: asyncio.Future[tuple[related_store.DiscoveryQuery, round_trips.SideDiscovery]]
        self.task = asyncio.get_running_loop().create_future()

    @classmethod
    @asynccontextmanager
    async def taken(
        cls, db: Database, unit: Unit, principal: Principal, request: RecallRequest
    ) -> AsyncIterator[_DiscoveryBeside | None]:
        """A side discovery for this recall, or None (no discovery to run, no side
        connection free now). On exit its statement is cancelled if still running
        and its connection given back."""
        ticket = None
        if db.side is not None and request.query is not None and discovers(request):
            ticket = db.side.take()
        if ticket is None:
            yield None
            return
        beside = cls(db, ticket, unit, principal, request)
        try:
            yield beside
        finally:
            task = beside.task
            if not task.done():
                # Cancelled: its statement is cancelled on the server, and its
                # connection given back by the ticket (also when the task never
                # reached it). Waited for without taking its outcome, so that a
                # cancellation of this recall still propagates from here.
                task.cancel()
                task.add_done_callback(_release_after(ticket))
                await asyncio.wait([task])
            else:
                _release_after(ticket)(task)

    def start(self, embedding: asyncio.Future[np.ndarray | None]) -> None:
        self.task = asyncio.ensure_future(self._run(embedding))

    async def _run(
        self, embedding: asyncio.Future[np.ndarray | None]
    ) -> tuple[related_store.DiscoveryQuery, round_trips.SideDiscovery]:
        # shield: cancelling this task must not cancel the recall's embedding.
        vector = await asyncio.shield(embedding)
        request, principal = self.request, self.principal
        t_sys = request.known_at or await self.unit.began()
        view = ReadView(
            team_id=principal.team_id,
            space_kinds=dict(zip(principal.readable_space_ids, principal.space_kinds, strict=True)),
            t_sys=t_sys,
            t_valid=request.valid_at or t_sys,
        )
        query = discovery_query(view, SharedBranch(principal.shared_space_id, 0), request, vector)
        assert query is not None  # discovers(request), checked by taken()
        async with self.ticket.connection() as conn:
            got = await round_trips.side_discovery(
                conn,
                principal.team_id,
                principal.readable_space_ids,
                query,
                budget_s=deadline.remaining(),
            )
        return query, got

    @stage("related_beside")
    async def result(
        self,
        view: ReadView,
        shared: SharedBranch | None,
        request: RecallRequest,
        vector: np.ndarray | None,
    ) -> related_store.Discovery | None:
        """The side's discovery if it is the one the unit would have read for
        ``view`` and ``vector``, else None (the frontiers then read their own)."""
        try:
            query, got = await self.task
        except _BESIDE_FAILURES as exc:
            # Counted for the read router, as a failed step of the unit is.
            self.db.note(exc)
            log.warning("relationship discovery beside the recall failed (%s); on the unit", exc)
            return None
        expected = discovery_query(view, shared, request, vector)
        if expected is None or got.role != APP_ROLE or got.generation is None:
            return None
        if not _same_discovery(replace(query, generation=got.generation), expected):
            log.info("relationship discovery beside the recall read another view; on the unit")
            return None
        self.ticket.used()
        return got.discovery


def _release_after(ticket: SideTicket) -> Callable[[asyncio.Future[Any]], None]:
    """A done callback: the side task's outcome is read (a failure the recall did
    not wait for is not reported as never retrieved) and its ticket released."""

    def done(task: asyncio.Future[Any]) -> None:
        if not task.cancelled():
            task.exception()
        ticket.release()

    return done


_BESIDE_FAILURES: Final[tuple[type[BaseException], ...]] = (*STORE_FAILURES, GatewayError)
"""What a side discovery may fail with (a statement, the connection, the deadline)."""


def _same_discovery(a: related_store.DiscoveryQuery, b: related_store.DiscoveryQuery) -> bool:
    """Whether two discovery queries read the same: every field equal (the readable
    spaces as a set), the query vector the same object."""
    return (
        a.vector is b.vector
        and set(a.readable_space_ids) == set(b.readable_space_ids)
        and replace(a, vector=None, readable_space_ids=())
        == replace(b, vector=None, readable_space_ids=())
    )


_UNTIL_THE_VIEW: Final = datetime(1, 1, 1, tzinfo=UTC)
"""A current view's instant before the view is read: a placeholder that the scope
round never sends (the statement's now() stands in its place)."""


def _vectors_pending(view: ReadView, branches: Sequence[search.BranchSearch]) -> str | None:
    """The degradation's message when a searched space's vectors wait for an
    unfinished ``load --index-after`` (its vector lists are empty until then)."""
    kinds = sorted({b.branch for b in branches if b.space_id in view.vectors_pending})
    if not kinds:
        return None
    return (
        f"the {' and '.join(kinds)} space's vectors wait for their index (an unfinished "
        "'load --index-after'): its vector list is empty until then; full text and "
        "entities still answer"
    )
