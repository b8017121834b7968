"""Fusion of the private and shared space branches of one recall.

Each branch is searched, fused and hydrated on its own; what arrives here is
each branch's *final* order. The two are merged by equal-weight RRF on those
ranks (``1 / (k + rank)``, ``k = 60``), so the top of each branch interleaves
instead of one branch burying the other. On equal scores private comes
first, then shared, then ID ascending: the principal's own memory wins a tie
because it is the more specific context.

An ID should never be in both branches (IDs are per team and an evidence
lives in one space). If it is, the result stays deterministic rather than
failing: the item appears once, its score is the sum over both branches as
in any RRF, and it is reported from the branch where it ranks better, private
on equal ranks. A repeated ID inside one branch keeps its first rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

from gateway.fusion import _core
from gateway.fusion.rrf import RRF_K


class Branch(StrEnum):
    """Which space branch a fused item came from. Declaration order is the tie order."""

    PRIVATE = "private"
    SHARED = "shared"


class BranchHit(NamedTuple):
    """One fused item: its ID and the branch it is reported from."""

    item_id: str
    branch: Branch


_BRANCHES = (Branch.PRIVATE, Branch.SHARED)


def fuse_branches(
    *,
    private: Sequence[str] = (),
    shared: Sequence[str] = (),
    k: float = RRF_K,
    limit: int | None = None,
) -> list[BranchHit]:
    """Merge the branches' final ranked IDs into one ranked list of :class:`BranchHit`.

    ``private`` and ``shared`` are IDs best first; a branch that was not
    searched (shared-only principal, private branch unavailable) is left
    empty. ``k`` must be finite and ``> 0``, ``limit`` ``None`` or ``>= 0``.
    """
    exact_k = _core.check_k(k)
    checked_limit = _core.check_limit(limit)
    ranked = [
        _core.check_ids("private", private),
        _core.check_ids("shared", shared),
    ]
    if sum(map(len, ranked)) <= _core.SMALL_ENTRIES:
        ids, _, branches = _core.fuse_small(
            ranked, [1.0, 1.0], exact_k, frozenset(), checked_limit, best_list_first=True
        )
        return [
            BranchHit(item, _BRANCHES[branch]) for item, branch in zip(ids, branches, strict=True)
        ]
    encoded = _core.encode(ranked, frozenset())
    branch_of = _core.best_list(encoded, len(ranked))
    order, _ = _core.fused_order(
        encoded,
        [1.0, 1.0],
        exact_k,
        [branch_of, encoded.id_order()],
        checked_limit,
    )
    return [
        BranchHit(encoded.ids[code], _BRANCHES[branch])
        for code, branch in zip(order.tolist(), branch_of[order].tolist(), strict=True)
    ]
