"""The evidence frontier of recallMemory (SPEC section 3, steps 1 to 3).

Per allowed branch (shared, and the caller's private space): candidate lists
(full text, vector, entity expansion) are fused by weighted RRF, reloaded from
the canonical tables and kept only with an eligible support path for the view;
then the branches' final orders are fused. Optional losses (vector list, the
private branch) degrade the answer and say so; losing the shared branch or
canonical hydration fails the call.

Every statement runs in the recall's unit of work (one connection, one
transaction; :class:`gateway.store.database.Unit`). A failed statement's
fallback (per branch, then without the vector list) runs in the fresh
transaction the unit opens after a failure.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from gateway.errors import DatabaseUnavailable
from gateway.fusion import EVIDENCE_WEIGHTS, fuse_branches, fuse_weighted, last_reachable_rank
from gateway.services.recall_input import RecallRequest
from gateway.services.recall_types import (
    Degradation,
    EvidenceResult,
    ListState,
    ReadView,
    SearchState,
    overfetch,
)
from gateway.stages import stage
from gateway.store import recall as store
from gateway.store import search
from gateway.store.database import STORE_FAILURES, Unit

log = logging.getLogger("gateway.recall")

__all__ = [
    "EvidenceFrontier",
    "Prefetched",
    "candidate_query",
    "search_evidence",
    "vector_hydration_bounds",
]


@dataclass(frozen=True, slots=True)
class EvidenceFrontier:
    """The ranked results and how their search went."""

    results: list[EvidenceResult]
    state: SearchState


@dataclass(frozen=True, slots=True)
class Prefetched:
    """The candidate lists and the hydration of all their candidates, already read
    (together with other statements: gateway/store/round_trips.py)."""

    lists: dict[tuple[str, str], list[str]]
    eligible: dict[str, store.EligibleEvidence]


def candidate_query(
    team: str,
    branches: Sequence[search.BranchSearch],
    request: RecallRequest,
    vector: np.ndarray | None,
    t_sys: datetime,
) -> search.CandidateQuery:
    """Every candidate list of the given branches, as one query."""
    return search.CandidateQuery(
        team_id=team,
        branches=tuple(branches),
        text=request.query,
        vector=vector,
        entity_ids=request.expand_from_entity_ids,
        exclude_ids=request.known_evidence_ids,
        per_list=overfetch(request.limit),
        known_at=t_sys,
        # A knownAt view ranks with the statistics of its instant (never moves).
        as_of=t_sys if request.known_at is not None else None,
    )


def vector_hydration_bounds(
    lists: Mapping[tuple[str, str], Sequence[str]],
    eligible: Collection[str],
    branches: Sequence[str],
    known: Collection[str],
    limit: int,
) -> dict[str, int]:
    """Per branch, the last rank of its vector list (known IDs removed) whose
    candidate can still be in the answer, given the lists read before the vector
    list (``lists``: full text and entity, by ``(branch, list)``) and which of
    their candidates are eligible; a branch left out has no such rank (all of its
    vector candidates may count). ``gateway.fusion.last_reachable_rank`` says
    why: a vector candidate below it is not among the branch's first ``limit``
    eligible results, and the branch has ``limit`` eligible either way (not
    starved), so it need not be hydrated (docs/recall.md, "Cost")."""
    bounds: dict[str, int] = {}
    for branch in branches:
        last = last_reachable_rank(
            {name: ids for (b, name), ids in lists.items() if b == branch},
            eligible,
            limit,
            EVIDENCE_WEIGHTS,
            later="vector",
            known=known,
        )
        if last is not None:
            bounds[branch] = last
    return bounds


@stage("evidence")
async def search_evidence(
    unit: Unit,
    view: ReadView,
    branches: Sequence[search.BranchSearch],
    request: RecallRequest,
    vector: np.ndarray | None,
    degradations: list[Degradation],
    prefetched: Prefetched | None = None,
) -> EvidenceFrontier:
    """Candidates, per-branch fusion, canonical hydration, branch fusion.

    With ``prefetched``, the lists and their hydration are not read again; the
    rest (fusion, cut, states) is the same code."""
    per_list = overfetch(request.limit)
    if prefetched is None:
        lists, list_states = await _candidates(
            unit, view.team_id, branches, request, vector, per_list, view.t_sys, degradations
        )
    else:
        lists = prefetched.lists
        list_states = _list_states(branches, _wanted(request, vector), lists, [])
    fused = {
        b.branch: fuse_weighted(
            {name: ids for (branch, name), ids in lists.items() if branch == b.branch},
            known=request.known_evidence_ids,
        )
        for b in branches
        if any(branch == b.branch for branch, _ in lists)
    }
    eligible = (
        await _hydrate(unit, view, branches, fused, degradations)
        if prefetched is None
        else prefetched.eligible
    )
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
    return EvidenceFrontier(results, SearchState("evidence", status, tuple(list_states)))


@stage("candidates")
async def _search(
    unit: Unit,
    team: str,
    branches: Sequence[search.BranchSearch],
    request: RecallRequest,
    vector: np.ndarray | None,
    per_list: int,
    t_sys: datetime,
) -> dict[tuple[str, str], list[str]]:
    query = candidate_query(team, branches, request, vector, t_sys)
    assert query.per_list == per_list
    async with unit.step([b.space_id for b in branches]) as conn:
        return await search.evidence_candidates(conn, query)


async def _candidates(
    unit: Unit,
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
    wanted = _wanted(request, vector)
    states: list[ListState] = []
    try:
        lists = await _search(unit, team, branches, request, vector, per_list, t_sys)
    except STORE_FAILURES as exc:
        log.warning("combined candidate search failed (%s); retrying per branch", exc)
        lists = {}
        for b in branches:
            got = await _branch_candidates(
                unit, team, b, request, vector, per_list, t_sys, degradations
            )
            if got is None:
                states += [ListState(b.branch, n, "failed", 0) for n in wanted]
                continue
            lists.update(got)
    return lists, _list_states(branches, wanted, lists, states)


def _wanted(request: RecallRequest, vector: np.ndarray | None) -> list[str]:
    return [
        name
        for name, on in (
            ("fulltext", request.query is not None),
            ("vector", vector is not None),
            ("entity", bool(request.expand_from_entity_ids)),
        )
        if on
    ]


def _list_states(
    branches: Sequence[search.BranchSearch],
    wanted: Sequence[str],
    lists: dict[tuple[str, str], list[str]],
    states: list[ListState],
) -> list[ListState]:
    """Each list of each branch: complete (with its length), failed or skipped."""
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
    return states


async def _branch_candidates(
    unit: Unit,
    team: str,
    branch: search.BranchSearch,
    request: RecallRequest,
    vector: np.ndarray | None,
    per_list: int,
    t_sys: datetime,
    degradations: list[Degradation],
) -> dict[tuple[str, str], list[str]] | None:
    try:
        return await _search(unit, team, [branch], request, vector, per_list, t_sys)
    except STORE_FAILURES as exc:
        first = exc
    if vector is not None:
        try:
            got = await _search(unit, team, [branch], request, None, per_list, t_sys)
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


@stage("hydration")
async def _hydrate(
    unit: Unit,
    view: ReadView,
    branches: Sequence[search.BranchSearch],
    fused: dict[str, list[str]],
    degradations: list[Degradation],
) -> dict[str, store.EligibleEvidence]:
    """Canonical state of every fused candidate, one statement for all branches."""
    team = view.team_id
    ids = [i for ranked in fused.values() for i in ranked]
    spaces = [b.space_id for b in branches if b.branch in fused]
    try:
        async with unit.step(spaces) as conn:
            return await store.eligible_evidence(conn, team, ids, spaces, view.t_sys, view.t_valid)
    except STORE_FAILURES as exc:
        if "private" not in fused:
            raise DatabaseUnavailable("canonical evidence could not be loaded") from exc
        log.warning("hydration of both branches failed (%s); retrying shared only", exc)
    shared = [b.space_id for b in branches if b.branch == "shared"]
    try:
        async with unit.step(shared) as conn:
            got = await store.eligible_evidence(
                conn, team, fused.get("shared", []), shared, view.t_sys, view.t_valid
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
