"""Reciprocal rank fusion (RRF) of named candidate lists.

``score(id) = sum over the lists that contain id of weight(list) / (k + rank)``
with ranks starting at 1 and ``k = 60`` (Cormack, Clarke and Buettcher,
SIGIR 2009). RRF only looks at ranks, never at raw scores, which is why it
can fuse a full-text rank, a vector distance and an entity expansion that
have no common scale.

Rules, the same for every function here:

* **Known IDs are removed from every list before fusion, and ranks are
  recomputed**: the items below a known ID move up. The design says known
  evidence is excluded before fusion; the caller already holds that
  evidence, and an item ranked under it should not be penalised for a
  neighbour that is not going to be shown.
* **A repeated ID inside one list keeps its first (best) rank only**, and
  later copies do not take a rank, so the items after them move up too. A
  list votes for an item once.
* **Equal scores are ordered by ID ascending**, in plain string order (code
  points). Ties are decided on the exact rational score, not on the float,
  so the order never depends on rounding (see :mod:`gateway.fusion._core`).
* The result is the same whatever the order of the mapping or the lists.
* Every non-known ID that appears in some list is in the result (subject to
  ``limit``), even one that only appears in lists of weight 0; such an item
  scores 0 and comes after every item with a positive score.
* Scores are internal: :func:`fuse_weighted` and :func:`fuse_equal` return
  IDs only. The ``*_scores`` variants exist for tests and benchmarks; never
  expose fusion scores to clients.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType
from typing import Final

from gateway.fusion import _core
from gateway.fusion._core import FloatArray

RRF_K: Final = 60
"""The RRF constant used everywhere in recall."""

EVIDENCE_WEIGHTS: Final[Mapping[str, float]] = MappingProxyType(
    {"fulltext": 1.0, "vector": 1.0, "entity": 0.5}
)
"""Evidence frontier weights: full text and vector count fully; explicit entity
expansion counts half, because it finds evidence near the entities the caller
named rather than evidence that matches the query itself."""


def fuse_weighted(
    lists: Mapping[str, Sequence[str]],
    weights: Mapping[str, float] = EVIDENCE_WEIGHTS,
    *,
    known: Iterable[str] = (),
    k: float = RRF_K,
    limit: int | None = None,
) -> list[str]:
    """Fuse ranked lists by weighted RRF and return the IDs in fused order.

    ``lists`` maps a list name to its IDs, best first. ``weights`` must have a
    weight for every name in ``lists`` (a missing one is a ``ValueError``:
    silently weighting a misspelt list name 1 or 0 would hide the typo); it
    may have more. ``weights`` replaces the defaults as a whole. Every weight
    must be finite and ``>= 0``, ``k`` finite and ``> 0``, ``limit`` ``None``
    or ``>= 0``. ``known`` IDs never appear. Empty input gives ``[]``.
    """
    ids, _ = fuse_weighted_scores(lists, weights, known=known, k=k, limit=limit)
    return ids


def fuse_weighted_scores(
    lists: Mapping[str, Sequence[str]],
    weights: Mapping[str, float] = EVIDENCE_WEIGHTS,
    *,
    known: Iterable[str] = (),
    k: float = RRF_K,
    limit: int | None = None,
) -> tuple[list[str], FloatArray]:
    """Like :func:`fuse_weighted`, plus the float score of each returned ID.

    For tests and benchmarks only. The order is decided on exact scores, so
    two neighbours whose floats differ in the last bit may appear in either
    float order; compare scores with a tolerance.
    """
    checked = {name: _core.check_weight(name, weight) for name, weight in weights.items()}
    missing = sorted(name for name in lists if name not in checked)
    if missing:
        raise ValueError(
            f"no weight for list(s) {missing}; weights are given for {sorted(checked)}"
        )
    return _fuse(lists, checked, known=known, k=k, limit=limit)


def fuse_equal(
    lists: Mapping[str, Sequence[str]],
    *,
    known: Iterable[str] = (),
    k: float = RRF_K,
    limit: int | None = None,
) -> list[str]:
    """Fuse ranked lists by equal-weight RRF (every list weight 1).

    For relationship discovery (a lexical and a vector list) and anywhere else
    the lists are peers. Same rules as :func:`fuse_weighted`; any list name is
    accepted.
    """
    ids, _ = fuse_equal_scores(lists, known=known, k=k, limit=limit)
    return ids


def fuse_equal_scores(
    lists: Mapping[str, Sequence[str]],
    *,
    known: Iterable[str] = (),
    k: float = RRF_K,
    limit: int | None = None,
) -> tuple[list[str], FloatArray]:
    """Like :func:`fuse_equal`, plus float scores; for tests and benchmarks only."""
    return _fuse(lists, dict.fromkeys(lists, 1.0), known=known, k=k, limit=limit)


def fuse_evidence(
    *,
    fulltext: Sequence[str] = (),
    vector: Sequence[str] = (),
    entity: Sequence[str] = (),
    known: Iterable[str] = (),
    limit: int | None = None,
) -> list[str]:
    """The evidence frontier: full text and vector weight 1, entity expansion 0.5, k 60.

    Keyword arguments rather than a mapping, so a misspelt list is a
    ``TypeError`` at the call site. A list that was not searched (no entity
    IDs given, vector search degraded) is simply left empty.
    """
    return fuse_weighted(
        {"fulltext": fulltext, "vector": vector, "entity": entity},
        EVIDENCE_WEIGHTS,
        known=known,
        limit=limit,
    )


def last_reachable_rank(
    lists: Mapping[str, Sequence[str]],
    eligible: Collection[str],
    limit: int,
    weights: Mapping[str, float] = EVIDENCE_WEIGHTS,
    *,
    later: str = "vector",
    known: Iterable[str] = (),
    k: float = RRF_K,
) -> int | None:
    """The last rank of a list read later (``later``) at which an item that none of
    ``lists`` holds can still be among the first ``limit`` eligible items of the
    fusion of ``lists`` and that list; None when any rank can (fewer than
    ``limit`` eligible items in ``lists``, or no positive score among them).

    Such an item scores exactly ``weights[later] / (k + r)``, ``r`` its rank in
    that list (known IDs removed, as fusion removes them). The eligible items of
    ``lists`` score at least their score on ``lists`` alone, computed here as
    fusion computes it (the same encoding: known IDs out, a repeat at its first
    rank; the same exact rationals). When ``limit`` of them score more than the
    item, ``limit`` eligible items precede it whatever it is: it is not among
    the first ``limit``, and there are ``limit`` eligible items either way. An
    equal score is reachable (ties go by ID). Used to skip the hydration of
    such items (gateway/services/evidence.py)."""
    exact_k = _core.check_k(k)
    checked = {name: _core.check_weight(name, weights[name]) for name in (*lists, later)}
    names = sorted(lists)
    ranked = [_core.check_ids(f"list {name!r}", lists[name]) for name in names]
    encoded = _core.encode(ranked, _core.known_set(known))
    codes = _core.candidates(encoded)
    terms = _core.signatures(encoded, [checked[name] for name in names], codes)
    scorer = _core.ExactScorer(exact_k)
    scores = sorted(
        (scorer(terms[code]) for code in codes.tolist() if encoded.ids[code] in eligible),
        reverse=True,
    )
    if limit < 1 or len(scores) < limit or scores[limit - 1] <= 0:
        return None
    # The largest r with weight / (k + r) >= the limit-th score.
    last = math.floor(Fraction(checked[later]) / scores[limit - 1] - Fraction(exact_k))
    return max(last, 0)


def _fuse(
    lists: Mapping[str, Sequence[str]],
    weights: Mapping[str, float],
    *,
    known: Iterable[str],
    k: float,
    limit: int | None,
) -> tuple[list[str], FloatArray]:
    exact_k = _core.check_k(k)
    checked_limit = _core.check_limit(limit)
    known_ids = _core.known_set(known)
    # Sorting the names makes the float summation order, and so everything,
    # independent of the mapping's insertion order.
    names = sorted(lists)
    ranked = [_core.check_ids(f"list {name!r}", lists[name]) for name in names]
    encoded = _core.encode(ranked, known_ids)
    order, scores = _core.fused_order(
        encoded,
        [weights[name] for name in names],
        exact_k,
        [encoded.id_order()],
        checked_limit,
    )
    return [encoded.ids[code] for code in order.tolist()], scores
