"""The machinery shared by every fusion function: checks, encoding, scoring, ordering.

Fusion has to be fast (it runs once per branch and once for relationship
discovery on every recall) and exact (equal scores are broken by ID, and the
public order must not depend on the accident of floating-point rounding).
The two goals are met separately:

* the bulk work is vectorised: IDs become integer codes, every list entry
  becomes one row of ``(code, list, rank)`` arrays, and scores accumulate with
  :func:`numpy.bincount`;
* the order is decided by the *exact* rational score ``sum weight / (k +
  rank)``. Floats order almost every pair correctly; only runs of neighbours
  whose float scores are closer than a generous bound on the rounding error
  are re-sorted exactly: items with the same score terms are equal outright,
  the others are compared with :class:`fractions.Fraction`. Without that
  step, two items whose scores are equal on paper (``1/61 + 1/62 + 1/67``
  summed in different orders, or ``1/65`` against ``1/70 + 1/910``) would be
  ordered by rounding noise instead of by ID, and the result would depend on
  which list holds which ranks.

Weights and ``k`` are taken at their exact binary value (``Fraction(0.1)``,
not one tenth): that is the value the caller actually passed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_EPS = float(np.finfo(np.float64).eps)
_TINY = float(np.finfo(np.float64).tiny)
_PLAIN_STR = frozenset({str})


def check_k(k: float) -> float:
    """``k`` must be a finite positive number: ``k <= 0`` divides by zero at rank 1
    or gives negative scores, and an infinite ``k`` makes every score zero."""
    if isinstance(k, bool) or not isinstance(k, int | float):
        raise TypeError(f"k must be a number, not {type(k).__name__}")
    value = float(k)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"k must be finite and > 0, got {k!r}")
    return value


def check_weight(name: str, weight: float) -> float:
    """A weight must be finite and ``>= 0``: a negative weight would turn being
    found into a penalty, and NaN or infinity would make the order meaningless."""
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise TypeError(f"weight of list {name!r} must be a number, not {type(weight).__name__}")
    value = float(weight)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"weight of list {name!r} must be finite and >= 0, got {weight!r}")
    return value


def check_limit(limit: int | None) -> int | None:
    """``None`` means no limit; a negative limit is a caller bug, not "nothing"."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int or None, not {type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return limit


def check_ids(where: str, ids: object) -> Sequence[str]:
    """A bare ``str`` is a ``Sequence[str]`` too; taking it for a list of
    one-character IDs would be a silent, baffling bug, so it is refused."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise TypeError(f"{where} must be a sequence of ID strings, not {type(ids).__name__}")
    return ids


def known_set(known: Iterable[str]) -> frozenset[str]:
    """Known IDs as a set; a bare string is refused for the same reason as above."""
    if isinstance(known, str | bytes):
        raise TypeError("known must be a collection of ID strings, not a single string")
    return frozenset(known)


@dataclass(frozen=True, slots=True)
class Encoded:
    """Ranked lists as flat arrays, one row per surviving entry.

    ``ids[c]`` is the ID with code ``c``. Rows are grouped by list, in list
    order, and within a list in rank order. ``ranks`` are recomputed after
    known IDs and repeated IDs were dropped, so they start at 1 and have no
    gaps.
    """

    ids: list[str]
    codes: IntArray
    lists: IntArray
    ranks: IntArray

    @property
    def size(self) -> int:
        return len(self.ids)

    def id_order(self) -> IntArray:
        """Position of each code in plain string order (Python ``str`` comparison,
        i.e. by code point), the final tie-breaker. Sorted in Python rather than
        as a numpy ``str_`` array because numpy drops trailing NUL characters."""
        order = sorted(range(len(self.ids)), key=self.ids.__getitem__)
        position = np.empty(len(self.ids), dtype=np.int64)
        position[np.asarray(order, dtype=np.int64)] = np.arange(len(self.ids), dtype=np.int64)
        return position


def encode(lists: Sequence[Sequence[str]], known: frozenset[str]) -> Encoded:
    """Drop known IDs, keep the first occurrence of a repeated ID, re-rank.

    Known IDs are removed *before* ranking, so the items below them move up:
    the caller already has that evidence, and an item should not be
    penalised for having been ranked under something that is not shown.
    A repeated ID inside one list keeps only its first (best) rank; a list
    can vote for an item once.
    """
    index: dict[str, int] = {}
    per_list: list[list[int]] = []
    for ids in lists:
        if not set(map(type, ids)) <= _PLAIN_STR:  # a subclass of str is a string too
            for item in ids:
                if not isinstance(item, str):
                    raise TypeError(f"IDs must be strings, got {type(item).__name__}")
        kept = [item for item in ids if item not in known] if known else ids
        # A new ID gets the next code: len(index) is read before it is inserted.
        per_list.append([index.setdefault(item, len(index)) for item in kept])
    code_arr = np.fromiter(chain.from_iterable(per_list), dtype=np.int64)
    list_arr = np.repeat(
        np.arange(len(per_list), dtype=np.int64), [len(part) for part in per_list]
    ).astype(np.int64)
    if code_arr.size:
        # One key per (list, item); np.unique reports the first occurrence of each.
        _, first = np.unique(list_arr * len(index) + code_arr, return_index=True)
        keep = np.sort(first)
        code_arr, list_arr = code_arr[keep], list_arr[keep]
    # Rows of one list are contiguous, so a row's rank is its distance from the
    # first row of its list.
    start = np.searchsorted(list_arr, list_arr, side="left")
    ranks = np.arange(code_arr.size, dtype=np.int64) - start + 1
    return Encoded(ids=list(index), codes=code_arr, lists=list_arr, ranks=ranks.astype(np.int64))


def float_scores(encoded: Encoded, weights: Sequence[float], k: float) -> FloatArray:
    """Approximate scores per code. Rows are summed in row order, which is fixed
    by the canonical list order, so the floats themselves are reproducible."""
    weight_arr = np.asarray(weights, dtype=np.float64)
    contributions = weight_arr[encoded.lists] / (k + encoded.ranks.astype(np.float64))
    return np.bincount(encoded.codes, weights=contributions, minlength=encoded.size).astype(
        np.float64
    )


def best_list(encoded: Encoded, list_count: int) -> IntArray:
    """For each code, the list in which it has its best rank; on equal ranks the
    list that comes first. Used to say which branch an item is reported from."""
    best = np.full(encoded.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best, encoded.codes, encoded.ranks * list_count + encoded.lists)
    return best % list_count


def candidates(encoded: Encoded) -> IntArray:
    """Codes that survived in at least one list (known-only IDs have none)."""
    present = np.zeros(encoded.size, dtype=bool)
    present[encoded.codes] = True
    return np.flatnonzero(present).astype(np.int64)


Signature = tuple[tuple[float, int], ...]
"""An item's score terms as sorted ``(weight, rank)`` pairs, zero weights left out."""


def signatures(
    encoded: Encoded, weights: Sequence[float], members: IntArray
) -> dict[int, Signature]:
    """Score terms of the given codes. Two items with the same signature have the
    same exact score, which settles most ties (the same ranks in different
    lists) without any rational arithmetic."""
    wanted = np.zeros(encoded.size, dtype=bool)
    wanted[members] = True
    rows = np.flatnonzero(wanted[encoded.codes])
    terms: dict[int, list[tuple[float, int]]] = {int(code): [] for code in members.tolist()}
    for code, owner, rank in zip(
        encoded.codes[rows].tolist(),
        encoded.lists[rows].tolist(),
        encoded.ranks[rows].tolist(),
        strict=True,
    ):
        if weights[owner] != 0.0:
            terms[code].append((weights[owner], rank))
    return {code: tuple(sorted(pairs)) for code, pairs in terms.items()}


class ExactScorer:
    """Exact value of a signature, ``sum Fraction(weight) / (Fraction(k) + rank)``,
    with the terms and the sums cached (tie runs repeat the same terms)."""

    def __init__(self, k: float) -> None:
        self._k = Fraction(k)
        self._terms: dict[tuple[float, int], Fraction] = {}
        self._sums: dict[Signature, Fraction] = {}

    def __call__(self, signature: Signature) -> Fraction:
        total = self._sums.get(signature)
        if total is None:
            total = Fraction(0)
            for term in signature:
                value = self._terms.get(term)
                if value is None:
                    value = self._terms[term] = Fraction(term[0]) / (self._k + term[1])
                total += value
            self._sums[signature] = total
        return total


def fused_order(
    encoded: Encoded,
    weights: Sequence[float],
    k: float,
    tie_keys: Sequence[IntArray],
    limit: int | None,
) -> tuple[IntArray, FloatArray]:
    """Codes in fused order and their float scores.

    Order: exact score descending, then ``tie_keys`` ascending, in the order
    given (the last one should be :meth:`Encoded.id_order`, which is unique,
    so the order is total and deterministic).
    """
    scores = float_scores(encoded, weights, k)
    codes = candidates(encoded)
    keys = [key[codes] for key in reversed(tie_keys)]
    order = codes[np.lexsort((*keys, -scores[codes]))]
    order = _settle_near_ties(encoded, weights, k, scores, order, tie_keys, limit)
    if limit is not None:
        order = order[:limit]
    return order, scores[order]


def _settle_near_ties(
    encoded: Encoded,
    weights: Sequence[float],
    k: float,
    scores: FloatArray,
    order: IntArray,
    tie_keys: Sequence[IntArray],
    limit: int | None,
) -> IntArray:
    """Re-sort, exactly, every run of neighbours that rounding could have misordered.

    Each score is a sum of at most ``len(weights)`` terms, each one division
    (plus one addition when ``k`` is not an integer); the relative error is
    below ``(len(weights) + 2) * eps / 2``, so two items whose true order
    differs from their float order are closer than that, and so is every
    item between them. The bound used is eight times larger, plus an absolute
    floor for subnormal scores. Runs are usually short (often empty), so the
    exact work is small.

    Most runs are already in their exact order: items with the same score terms
    (the same ranks in different lists) whose floats are equal too, which the
    float sort has put in tie-key order, the order the exact sort would give
    them. Such runs are recognised with array operations (:func:`_settled_runs`)
    and left as they are; only the others are sorted here, in Python.
    """
    sorted_scores = scores[order]
    if sorted_scores.size < 2:
        return order
    if not np.all(np.isfinite(sorted_scores)):
        # Absurdly large weights overflowed: fall back to ordering everything exactly.
        near = np.ones(sorted_scores.size - 1, dtype=bool)
    else:
        bound = 4.0 * (len(weights) + 2) * _EPS
        gaps = sorted_scores[:-1] - sorted_scores[1:]
        near = gaps <= bound * sorted_scores[:-1] + 4.0 * (len(weights) + 2) * _TINY
    if not near.any():
        return order
    flags = np.concatenate(([0], near.astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(flags))
    starts, stops = edges[0::2], edges[1::2] + 1  # item positions [start, stop)
    if limit is not None:
        within = starts < limit
        starts, stops = starts[within], stops[within]
    if starts.size == 0:
        return order
    unsettled = ~_settled_runs(encoded, weights, sorted_scores, order, starts, stops)
    starts, stops = starts[unsettled], stops[unsettled]
    if starts.size == 0:
        return order
    members = np.concatenate([order[a:b] for a, b in zip(starts, stops, strict=True)])
    terms = signatures(encoded, weights, members)
    exact = ExactScorer(k)
    key_lists = [key.tolist() for key in tie_keys]
    settled = order.copy()
    for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
        block = order[a:b].tolist()
        if len({terms[c] for c in block}) == 1:
            # Same terms, same exact score: only the tie keys decide.
            block.sort(key=lambda c: tuple(key[c] for key in key_lists))
        else:
            block.sort(key=lambda c: (-exact(terms[c]), *(key[c] for key in key_lists)))
        settled[a:b] = block
    return settled


def _settled_runs(
    encoded: Encoded,
    weights: Sequence[float],
    sorted_scores: FloatArray,
    order: IntArray,
    starts: IntArray,
    stops: IntArray,
) -> npt.NDArray[np.bool_]:
    """For each run ``order[start:stop]``: are all its items' score terms the same
    (equal :func:`signatures`) and their floats equal and finite? Then their exact
    scores are equal, and the float sort (score, then the tie keys) already put
    them in the order the exact sort would.

    An item's terms are encoded as one row of integers, one per list: the pair
    (index of the list's weight among the distinct non-zero weights, rank), or a
    filler where the item is not in the list or the list weighs 0; the row sorted,
    two items have the same signature exactly when their rows are equal."""
    weight_arr = np.asarray(weights, dtype=np.float64)
    distinct, weight_index = np.unique(weight_arr, return_inverse=True)
    stride = int(encoded.ranks.max()) + 1 if encoded.ranks.size else 1
    filler = np.iinfo(np.int64).max
    row_keys = np.where(
        weight_arr[encoded.lists] != 0.0,
        weight_index[encoded.lists].astype(np.int64) * stride + encoded.ranks,
        filler,
    )
    table = np.full((encoded.size, max(len(weights), 1)), filler, dtype=np.int64)
    table[encoded.codes, encoded.lists] = row_keys
    del distinct
    # Neighbours (i, i + 1) inside the runs: same terms and the same finite float.
    # Runs do not overlap, so run r's pairs are at starts[r] + 0 .. pairs[r] - 1.
    pairs = stops - starts - 1
    positions = np.repeat(starts - np.cumsum(np.concatenate(([0], pairs[:-1]))), pairs) + (
        np.arange(int(pairs.sum()), dtype=np.int64)
    )
    rows = np.sort(table[order], axis=1)
    same = (
        (rows[positions] == rows[positions + 1]).all(axis=1)
        & (sorted_scores[positions] == sorted_scores[positions + 1])
        & np.isfinite(sorted_scores[positions])
    )
    # A run is settled when every one of its neighbour pairs is the same.
    unequal = np.concatenate(([0], np.cumsum(~same)))
    bounds = np.concatenate(([0], np.cumsum(pairs)))
    return np.asarray((unequal[bounds[1:]] - unequal[bounds[:-1]]) == 0, dtype=np.bool_)
