"""Rank fusion: the bottom layer of recall ranking.

Pure functions over ID lists (numpy inside, no I/O, nothing else from the
gateway), so the ranking rules can be tested exhaustively without a database:

* :func:`fuse_evidence` / :func:`fuse_weighted`: weighted RRF of a branch's
  candidate lists (full text 1, vector 1, entity 0.5, k 60), known IDs
  removed first.
* :func:`fuse_equal`: equal-weight RRF, e.g. lexical + vector relationship
  discovery.
* :func:`fuse_branches`: equal-weight RRF of the private and shared branches'
  final orders; ties prefer private, then shared, then ID.

Equal scores are always broken by ID ascending, decided on exact scores.
"""

from __future__ import annotations

from gateway.fusion.branches import Branch, BranchHit, fuse_branches
from gateway.fusion.rrf import (
    EVIDENCE_WEIGHTS,
    RRF_K,
    fuse_equal,
    fuse_equal_scores,
    fuse_evidence,
    fuse_weighted,
    fuse_weighted_scores,
    last_reachable_rank,
)

__all__ = [
    "EVIDENCE_WEIGHTS",
    "RRF_K",
    "Branch",
    "BranchHit",
    "fuse_branches",
    "fuse_equal",
    "fuse_equal_scores",
    "fuse_evidence",
    "fuse_weighted",
    "fuse_weighted_scores",
    "last_reachable_rank",
]
