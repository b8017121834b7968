"""The hypothesis frontier of recallMemory (SPEC section 3, step 6).

Hypotheses are proposals, not beliefs: they are returned in their own field,
typed as hypotheses, and never enter the evidence results or count as support
(hydration does not read them at all). Only the shared branch has them.

Which hypotheses: those *linked* to the answer (through their source
evidence or source relationships: the returned shared evidence and the
shared relationships it supports; the related-relationship and community
frontiers run beside this one, so theirs do not link) and those matching the
query *lexically*; see :mod:`gateway.store.hypotheses`
for the two lists and the statuses shown (proposed and confirmed). The lists
are fused by equal-weight RRF (k = 60), equal scores by hypothesis ID, and cut
at ``hypothesisLimit``. Each list is read to :func:`list_depth` candidates.

Degradations: a ``knownAt`` view skips the frontier with
``related_hypotheses_temporal_not_supported`` (SPEC section 3, step 8: a
temporal view skips hypotheses; they are a prompt for review now, not a record
of what was believed then); a store failure loses it with
``related_hypotheses_unavailable``. Both keep the rest of the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from gateway.fusion import fuse_equal
from gateway.services.recall_input import RecallRequest
from gateway.services.recall_types import EvidenceResult, ReadView, answer_reach
from gateway.stages import stage
from gateway.store import hypotheses as store
from gateway.store.database import STORE_FAILURES, Unit
from gateway.store.search import BranchSearch

__all__ = [
    "HypothesisFrontier",
    "hypothesis_query",
    "list_depth",
    "lost",
    "ranked",
    "related_hypotheses",
]

log = logging.getLogger("gateway.recall")


TEMPORAL: Final = (
    "related_hypotheses_temporal_not_supported",
    "hypotheses are not returned in a knownAt view",
)
UNAVAILABLE: Final = (
    "related_hypotheses_unavailable",
    "related hypotheses could not be loaded; the rest of the answer is complete as stated",
)


def list_depth(limit: int) -> int:
    """Candidates read per list: deeper than the limit, so fusion can promote an
    item ranked moderately on both lists over one ranked high on only one."""
    return limit * 4 + 20


@dataclass(frozen=True, slots=True)
class HypothesisFrontier:
    """The frontier's hypotheses and how its search went.

    ``status``: complete | partial | skipped | disabled. ``lists``: per list
    of the shared branch, (list, status, candidates). ``loss``: the
    degradation (code, message), if any.
    """

    hypotheses: tuple[store.HypothesisRow, ...] = ()
    status: str = "skipped"
    lists: tuple[tuple[str, str, int], ...] = ()
    loss: tuple[str, str] | None = None


def hypothesis_query(
    view: ReadView,
    branches: Sequence[BranchSearch],
    request: RecallRequest,
    results: Sequence[EvidenceResult],
    more_relationship_ids: Iterable[str] = (),
) -> HypothesisFrontier | store.HypothesisQuery:
    """The statement's query, or the frontier itself when no statement is needed."""
    if request.hypothesis_limit == 0:
        return HypothesisFrontier(status="disabled")
    if request.known_at is not None:
        return HypothesisFrontier(status="skipped", loss=TEMPORAL)
    shared = next((b for b in branches if b.branch == "shared"), None)
    if shared is None:  # no shared space at the view's time: nothing to relate to
        return HypothesisFrontier(status="skipped")
    reach = answer_reach([r for r in results if r.space_kind == "shared"], more_relationship_ids)
    return store.HypothesisQuery(
        team=view.team_id,
        shared_space=shared.space_id,
        generation=shared.generation,
        t_sys=view.t_sys,
        evidence_reach=reach.evidence,
        relationship_reach=reach.relationships,
        query=request.query,
        per_list=list_depth(request.hypothesis_limit),
    )


@stage("hypotheses")
async def related_hypotheses(
    unit: Unit,
    view: ReadView,
    branches: Sequence[BranchSearch],
    request: RecallRequest,
    results: Sequence[EvidenceResult],
    more_relationship_ids: Iterable[str] = (),
) -> HypothesisFrontier:
    """Shared hypotheses related to the answer, ranked; never raises for a store loss."""
    query = hypothesis_query(view, branches, request, results, more_relationship_ids)
    if isinstance(query, HypothesisFrontier):
        return query
    try:
        async with unit.step() as conn:
            found = await store.related_hypotheses(conn, query)
    except STORE_FAILURES as exc:
        log.warning("related hypotheses lost: %s", exc)
        return lost(request)
    return ranked(request, found)


def lost(request: RecallRequest) -> HypothesisFrontier:
    """The frontier when its statement failed."""
    lexical = "failed" if request.query is not None else "skipped"
    return HypothesisFrontier(
        status="partial",
        lists=(("linked", "failed", 0), ("fulltext", lexical, 0)),
        loss=UNAVAILABLE,
    )


def ranked(request: RecallRequest, found: store.HypothesisLists) -> HypothesisFrontier:
    """The frontier from both lists: fused, cut at the limit."""
    lists: dict[str, Sequence[str]] = {"linked": found.linked}
    if request.query is not None:
        lists["lexical"] = found.lexical
    order = fuse_equal(lists, limit=request.hypothesis_limit)
    return HypothesisFrontier(
        hypotheses=tuple(found.rows[i] for i in order),
        status="complete",
        lists=(
            ("linked", "complete", len(found.linked)),
            (
                ("fulltext", "complete", len(found.lexical))
                if request.query is not None
                else ("fulltext", "skipped", 0)
            ),
        ),
    )
