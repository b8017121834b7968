"""Rank fusion: hand-computed cases, properties, and an exact brute-force reference.

Scores in comments are written as sums of ``weight / (k + rank)`` with k = 60.
The reference implementations below use plain dicts and ``Fraction`` so that
ties are exact; they share no code with :mod:`gateway.fusion`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping, Sequence
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fusion import (
    EVIDENCE_WEIGHTS,
    RRF_K,
    Branch,
    BranchHit,
    fuse_branches,
    fuse_equal,
    fuse_equal_scores,
    fuse_evidence,
    fuse_weighted,
    fuse_weighted_scores,
    last_reachable_rank,
)

P, S = Branch.PRIVATE, Branch.SHARED


# --- independent reference ---------------------------------------------------------------


def reference_scores(
    lists: Mapping[str, Sequence[str]],
    weights: Mapping[str, float],
    known: Collection[str] = frozenset(),
    k: float = 60,
) -> dict[str, Fraction]:
    """Exact weighted RRF: drop known IDs and repeats, rank from 1, add w / (k + rank)."""
    scores: dict[str, Fraction] = {}
    for name, ids in lists.items():
        rank = 0
        seen: set[str] = set()
        for item in ids:
            if item in known or item in seen:
                continue
            seen.add(item)
            rank += 1
            term = Fraction(weights[name]) / (Fraction(k) + rank)
            scores[item] = scores.get(item, Fraction(0)) + term
    return scores


def reference_order(
    lists: Mapping[str, Sequence[str]],
    weights: Mapping[str, float],
    known: Collection[str] = frozenset(),
    k: float = 60,
) -> list[str]:
    scores = reference_scores(lists, weights, known, k)
    return sorted(scores, key=lambda item: (-scores[item], item))


def reference_branches(
    private: Sequence[str], shared: Sequence[str], k: float = 60
) -> list[tuple[str, Branch]]:
    """Exact branch fusion: sum 1 / (k + rank); report the best-ranked branch
    (private on equal rank); order by score, then private before shared, then ID."""
    score: dict[str, Fraction] = {}
    best: dict[str, tuple[int, int]] = {}
    for position, ids in enumerate((private, shared)):
        rank = 0
        seen: set[str] = set()
        for item in ids:
            if item in seen:
                continue
            seen.add(item)
            rank += 1
            score[item] = score.get(item, Fraction(0)) + 1 / (Fraction(k) + rank)
            best[item] = min(best.get(item, (rank, position)), (rank, position))
    branch = {item: (P, S)[best[item][1]] for item in score}
    return sorted(
        ((item, branch[item]) for item in score),
        key=lambda pair: (-score[pair[0]], 0 if pair[1] is P else 1, pair[0]),
    )


# --- hand-computed cases -----------------------------------------------------------------


def test_ranked_in_two_lists_sums_both_terms() -> None:
    # a: fulltext 1, vector 3 -> 1/61 + 1/63 = 0.03226...
    # c: fulltext 3, vector 1 -> 1/63 + 1/61 (the same: tie, ID decides, a < c)
    # b: fulltext 2 -> 1/62;  x: vector 2 -> 1/62 (tie, b < x)
    # z: entity 1 -> 0.5/61 = 1/122
    ids, scores = fuse_weighted_scores(
        {"fulltext": ["a", "b", "c"], "vector": ["c", "x", "a"], "entity": ["z"]}
    )
    assert ids == ["a", "c", "b", "x", "z"]
    expected = [1 / 61 + 1 / 63, 1 / 61 + 1 / 63, 1 / 62, 1 / 62, 0.5 / 61]
    assert scores.tolist() == pytest.approx(expected, rel=1e-15)


def test_entity_weight_is_half() -> None:
    # e: entity 1 -> 0.5/61 = 0.00820 ranks below f: fulltext 2 -> 1/62 = 0.01613,
    # although it is first in its list.
    assert fuse_evidence(fulltext=["t", "f"], entity=["e"]) == ["t", "f", "e"]
    # 0.5/61 = 1/122 is exactly fulltext rank 62 (1/(60+62)): a tie, broken by ID.
    filler = [f"f{i:03d}" for i in range(61)]
    ids, scores = fuse_weighted_scores({"fulltext": [*filler, "b"], "entity": ["a"]})
    assert ids[-2:] == ["a", "b"]
    assert scores[-1] == scores[-2] == 1 / 122
    # Swap the names: "a" is now rank 62 and "b" entity 1; still a, b.
    assert fuse_evidence(fulltext=[*filler, "a"], entity=["b"])[-2:] == ["a", "b"]


def test_known_ids_are_removed_before_ranking() -> None:
    lists = {"fulltext": ["k", "a", "b"], "vector": ["b", "k", "a"]}
    # Without exclusion: k = 1/61 + 1/62, b = 1/63 + 1/61, a = 1/62 + 1/63.
    assert fuse_weighted(lists) == ["k", "b", "a"]
    # Excluding k first, ranks close up: fulltext [a, b], vector [b, a]:
    # a = 1/61 + 1/62 = b, a tie broken by ID. (Dropping k after fusion would
    # have kept b ahead of a.)
    ids, scores = fuse_weighted_scores(lists, known={"k"})
    assert ids == ["a", "b"]
    assert scores.tolist() == pytest.approx([1 / 61 + 1 / 62] * 2, rel=1e-15)
    # Known IDs that are in no list are harmless.
    assert fuse_weighted(lists, known={"k", "nowhere"}) == ["a", "b"]
    assert fuse_weighted(lists, known={"k", "a", "b"}) == []


def test_repeated_id_keeps_its_first_rank_and_later_items_move_up() -> None:
    # fulltext [a, b, a, c] counts as [a, b, c]: c is rank 3 -> 1/63, not 1/64.
    ids, scores = fuse_weighted_scores({"fulltext": ["a", "b", "a", "c"]})
    assert ids == ["a", "b", "c"]
    assert scores.tolist() == pytest.approx([1 / 61, 1 / 62, 1 / 63], rel=1e-15)


def test_ties_are_broken_by_id_in_plain_string_order() -> None:
    # Every item is rank 1 somewhere: all score 1/61.
    lists = {"fulltext": ["b"], "vector": ["a"], "one": ["B"], "two": ["10"], "three": ["9"]}
    # Code-point order: digits < upper case < lower case, and "10" < "9".
    assert fuse_equal(lists) == ["10", "9", "B", "a", "b"]
    # Exotic IDs compare as Python strings do (numpy would drop the trailing NUL).
    assert fuse_equal({"x": ["a\x00"], "y": ["a"], "z": ["é"]}) == ["a", "a\x00", "é"]


def test_exact_ties_that_floats_get_wrong_are_still_ordered_by_id() -> None:
    # 1/65 = 1/70 + 1/910 exactly, but in floats 1/65 is larger.
    # a: list one rank 10 (1/70) + list two rank 850 (1/910); b: list one rank 5 (1/65).
    assert 1 / 70 + 1 / 910 < 1 / 65
    one = ["p1", "p2", "p3", "p4", "b", "p6", "p7", "p8", "p9", "a"]
    two = [f"q{i:03d}" for i in range(849)] + ["a"]
    ids = fuse_equal({"one": one, "two": two})
    assert ids.index("a") + 1 == ids.index("b")
    # Three lists, summed in name order l1, l2, l3:
    # b: l1 rank 1, l2 rank 2, l3 rank 7 -> (1/61 + 1/62) + 1/67
    # a: l1 rank 7, l2 rank 1, l3 rank 2 -> (1/67 + 1/61) + 1/62
    # Equal on paper, but b's float is one ulp larger; a must still come first.
    assert (1 / 61 + 1 / 62) + 1 / 67 > (1 / 67 + 1 / 61) + 1 / 62
    lists = {
        "l1": ["b", "f1", "f2", "f3", "f4", "f5", "a"],
        "l2": ["a", "b"],
        "l3": ["g0", "a", "g2", "g3", "g4", "g5", "b"],
    }
    exact = reference_scores(lists, dict.fromkeys(lists, 1.0))
    assert exact["a"] == exact["b"]
    assert fuse_equal(lists)[:2] == ["a", "b"]


def test_runs_of_equal_terms_are_settled_without_python_sorting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two disjoint lists make a tie at every rank (the same term, 1/(k + r), in
    each list): a recall's usual case. Those runs are recognised by array
    operations and need no per-item signatures; runs that differ still get them."""
    from gateway.fusion import _core

    full = [f"f{i:03d}" for i in range(60)]
    vec = [f"v{i:03d}" for i in range(60)]
    weights = {"fulltext": 1.0, "vector": 1.0}
    # the same terms, summed in another order: floats one ulp apart (see above)
    uneven = {
        "l1": ["b", "f1", "f2", "f3", "f4", "f5", "a"],
        "l2": ["a", "b"],
        "l3": ["g0", "a", "g2", "g3", "g4", "g5", "b"],
    }

    def refused(*args: object) -> object:
        raise AssertionError("signatures computed")

    with monkeypatch.context() as patched:
        patched.setattr(_core, "signatures", refused)
        assert fuse_weighted({"fulltext": full, "vector": vec}) == reference_order(
            {"fulltext": full, "vector": vec}, weights
        )
        with pytest.raises(AssertionError, match="signatures computed"):
            fuse_equal(uneven)
    assert fuse_equal(uneven)[:2] == ["a", "b"]


def test_zero_weight_lists_still_contribute_candidates_last() -> None:
    # z only in a weight-0 list: score 0, after every positive score, still present.
    ids, scores = fuse_weighted_scores(
        {"fulltext": ["a"], "muted": ["z", "y", "a"]}, {"fulltext": 1.0, "muted": 0.0}
    )
    assert ids == ["a", "y", "z"]
    assert scores.tolist() == [1 / 61, 0.0, 0.0]


def test_limit() -> None:
    lists = {"fulltext": ["a", "b", "c"], "vector": ["c", "d"]}
    full = fuse_weighted(lists)
    # c = 1/63 + 1/61, a = 1/61, b = 1/62, d = 1/62 (b < d).
    assert full == ["c", "a", "b", "d"]
    assert fuse_weighted(lists, limit=0) == []
    assert fuse_weighted(lists, limit=2) == ["c", "a"]
    assert fuse_weighted(lists, limit=3) == ["c", "a", "b"]
    assert fuse_weighted(lists, limit=99) == full
    assert [hit.item_id for hit in fuse_branches(private=["a", "b"], limit=1)] == ["a"]


def test_empty_inputs() -> None:
    assert fuse_weighted({}) == []
    assert fuse_equal({}) == []
    assert fuse_evidence() == []
    assert fuse_weighted({"fulltext": [], "vector": []}) == []
    ids, scores = fuse_equal_scores({"a": []})
    assert ids == [] and scores.shape == (0,)
    assert fuse_branches() == []
    assert fuse_branches(private=[], shared=[]) == []


def test_equal_weights_and_custom_k() -> None:
    # Any list names; with k = 1: a = 1/2 + 1/3, b = 1/3 + 1/2, c = 1/4.
    ids, scores = fuse_equal_scores({"lexical": ["a", "b", "c"], "vector": ["b", "a"]}, k=1)
    assert ids == ["a", "b", "c"]
    assert scores.tolist() == pytest.approx([5 / 6, 5 / 6, 1 / 4], rel=1e-15)
    assert RRF_K == 60
    assert dict(EVIDENCE_WEIGHTS) == {"fulltext": 1.0, "vector": 1.0, "entity": 0.5}


@pytest.mark.parametrize("weight", [-1.0, -1e-300, math.nan, math.inf, -math.inf])
def test_invalid_weights_are_refused(weight: float) -> None:
    with pytest.raises(ValueError, match="finite and >= 0"):
        fuse_weighted({"fulltext": ["a"]}, {"fulltext": weight})
    # Even the weight of a list that is not given is checked.
    with pytest.raises(ValueError, match="finite and >= 0"):
        fuse_weighted({"fulltext": ["a"]}, {"fulltext": 1.0, "other": weight})


def test_missing_weight_and_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="no weight for list"):
        fuse_weighted({"full_text": ["a"]})
    for k in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError, match="k must be"):
            fuse_equal({"a": ["x"]}, k=k)
        with pytest.raises(ValueError, match="k must be"):
            fuse_branches(private=["x"], k=k)
    with pytest.raises(ValueError, match="limit"):
        fuse_equal({"a": ["x"]}, limit=-1)
    with pytest.raises(TypeError):
        fuse_equal({"a": "xyz"})  # a bare string is not a list of IDs
    with pytest.raises(TypeError):
        fuse_equal({"a": ["x"]}, known="x")
    not_an_id: Any = 3  # on purpose: checked at run time too
    with pytest.raises(TypeError):
        fuse_equal({"a": ["x", not_an_id]})
    with pytest.raises(TypeError):
        fuse_weighted({"a": ["x"]}, {"a": True})
    with pytest.raises(TypeError):
        fuse_branches(shared="abc")


def test_branches_interleave_and_private_wins_equal_scores() -> None:
    # Same rank, same score 1/(60 + r): private first at every rank.
    hits = fuse_branches(private=["p1", "p2"], shared=["s1", "s2", "s3"])
    assert hits == [
        BranchHit("p1", P),
        BranchHit("s1", S),
        BranchHit("p2", P),
        BranchHit("s2", S),
        BranchHit("s3", S),
    ]
    # Private wins the tie even when its ID sorts later.
    assert fuse_branches(private=["z"], shared=["a"]) == [("z", P), ("a", S)]
    assert isinstance(hits[0], tuple) and hits[0].branch == "private"


def test_branch_ties_then_order_by_id() -> None:
    # y: private 1 -> 1/61.  x: private 2 + shared 3722 -> 1/62 + 1/3782 = 1/61
    # (3782 = 61 * 62).  s: shared 1 -> 1/61.  All three tie: private before
    # shared, so x and y first and x < y by ID, then s.
    fillers = [f"s{i:04d}" for i in range(3721)]
    hits = fuse_branches(private=["y", "x"], shared=[*fillers, "x"])
    assert hits[:3] == [("x", P), ("y", P), ("s0000", S)]


def test_id_in_both_branches_is_summed_and_reported_once() -> None:
    # d: private 2 + shared 1 -> 1/62 + 1/61, reported from shared (better rank).
    # e: private 1 + shared 2 -> same score, reported from private; private wins the tie.
    assert fuse_branches(private=["e", "d"], shared=["d", "e"]) == [("e", P), ("d", S)]
    # Equal ranks in both: reported as private.
    assert fuse_branches(private=["a"], shared=["a"]) == [("a", P)]
    # Repeats inside a branch keep the first rank: shared [s, s, t] is [s, t].
    assert fuse_branches(shared=["s", "s", "t"], private=["p", "q"]) == [
        ("p", P),
        ("s", S),
        ("q", P),
        ("t", S),
    ]


# --- properties --------------------------------------------------------------------------

NAMES = ["fulltext", "vector", "entity", "extra"]
WEIGHT_VALUES = [0.0, 0.25, 0.5, 1.0, 2.0]

# Tie-heavy: a handful of IDs, short lists, dyadic weights and integer k, so that
# equal scores (same ranks in different lists, and rarer coincidences) are common.
few_ids = st.sampled_from(["a", "b", "c", "d", "e", "f", "A", "aa", "", "\x00"])
tie_heavy_lists = st.dictionaries(
    st.sampled_from(NAMES), st.lists(few_ids, max_size=8), max_size=len(NAMES)
)
# General: arbitrary text IDs and weights; overlap still likely through a small pool.
any_ids = st.one_of(few_ids, st.text(max_size=4))
general_lists = st.dictionaries(
    st.sampled_from(NAMES), st.lists(any_ids, max_size=30), max_size=len(NAMES)
)
weights_for = st.fixed_dictionaries(
    {
        name: st.one_of(
            st.sampled_from(WEIGHT_VALUES),
            st.floats(min_value=0, max_value=10, allow_nan=False, allow_infinity=False),
        )
        for name in NAMES
    }
)
ks = st.one_of(st.sampled_from([60, 1, 0.5, 7]), st.floats(min_value=1e-3, max_value=1e4))
lists_any = st.one_of(tie_heavy_lists, general_lists)


def _union(lists: Mapping[str, Sequence[str]]) -> set[str]:
    return {item for ids in lists.values() for item in ids}


@given(lists=lists_any, weights=weights_for, known=st.sets(any_ids, max_size=4), k=ks)
def test_agrees_with_exact_reference(
    lists: dict[str, list[str]], weights: dict[str, float], known: set[str], k: float
) -> None:
    ids, scores = fuse_weighted_scores(lists, weights, known=known, k=k)
    assert ids == reference_order(lists, weights, known, k)
    exact = reference_scores(lists, weights, known, k)
    assert scores.tolist() == pytest.approx([float(exact[i]) for i in ids], rel=1e-12, abs=1e-300)


@given(lists=tie_heavy_lists, known=st.sets(few_ids, max_size=3))
def test_equal_weights_agree_with_exact_reference(
    lists: dict[str, list[str]], known: set[str]
) -> None:
    assert fuse_equal(lists, known=known) == reference_order(
        lists, dict.fromkeys(lists, 1.0), known
    )


@given(
    fulltext=st.lists(few_ids, max_size=8),
    vector=st.lists(few_ids, max_size=8),
    entity=st.lists(few_ids, max_size=8),
    known=st.sets(few_ids, max_size=3),
    limit=st.none() | st.integers(0, 12),
)
def test_fuse_evidence_is_weighted_with_the_design_weights(
    fulltext: list[str], vector: list[str], entity: list[str], known: set[str], limit: int | None
) -> None:
    lists = {"fulltext": fulltext, "vector": vector, "entity": entity}
    expected = reference_order(lists, {"fulltext": 1, "vector": 1, "entity": 0.5}, known)
    got = fuse_evidence(fulltext=fulltext, vector=vector, entity=entity, known=known, limit=limit)
    assert got == expected[:limit]


@given(lists=lists_any, weights=weights_for, data=st.data())
def test_mapping_order_does_not_matter(
    lists: dict[str, list[str]], weights: dict[str, float], data: st.DataObject
) -> None:
    names = data.draw(st.permutations(list(lists)))
    assert fuse_weighted({n: lists[n] for n in names}, weights) == fuse_weighted(lists, weights)


@given(contents=st.lists(st.lists(any_ids, max_size=20), max_size=4), data=st.data())
def test_with_equal_weights_which_list_is_which_does_not_matter(
    contents: list[list[str]], data: st.DataObject
) -> None:
    shuffled = data.draw(st.permutations(contents))
    as_given = fuse_equal({f"l{i}": ids for i, ids in enumerate(contents)})
    permuted = fuse_equal({f"l{i}": ids for i, ids in enumerate(shuffled)})
    assert as_given == permuted


@given(lists=lists_any, weights=weights_for, known=st.sets(any_ids, max_size=5))
def test_result_is_the_union_minus_known_and_known_never_appears(
    lists: dict[str, list[str]], weights: dict[str, float], known: set[str]
) -> None:
    ids = fuse_weighted(lists, weights, known=known)
    assert len(ids) == len(set(ids))
    assert set(ids) == _union(lists) - known
    assert not set(ids) & known
    # Removing known IDs is the same as never having had them in the lists.
    cleaned = {n: [i for i in ids_ if i not in known] for n, ids_ in lists.items()}
    assert ids == fuse_weighted(cleaned, weights)


@given(lists=lists_any, weights=weights_for, limit=st.integers(0, 40))
def test_limit_is_a_prefix(
    lists: dict[str, list[str]], weights: dict[str, float], limit: int
) -> None:
    assert fuse_weighted(lists, weights, limit=limit) == fuse_weighted(lists, weights)[:limit]


@given(lists=lists_any, weights=weights_for, data=st.data())
def test_moving_an_item_up_never_lets_anyone_overtake_it(
    lists: dict[str, list[str]], weights: dict[str, float], data: st.DataObject
) -> None:
    """Swap an item x with the entry right above it in one list. Only x and that
    neighbour change rank; x's score can only go up and the neighbour's only
    down, so no item that was behind x can be ahead of it afterwards."""
    movable = [(n, p) for n, ids_ in lists.items() for p in range(1, len(ids_))]
    if not movable:
        return
    name, position = data.draw(st.sampled_from(movable))
    before = fuse_weighted(lists, weights)
    moved = list(lists[name])
    moved[position - 1], moved[position] = moved[position], moved[position - 1]
    after = fuse_weighted({**lists, name: moved}, weights)
    x = moved[position - 1]
    assert set(after[: after.index(x)]) <= set(before[: before.index(x)])


@given(
    private=st.lists(few_ids, max_size=10),
    shared=st.lists(few_ids, max_size=10),
    k=st.sampled_from([60, 1, 3]),
    limit=st.none() | st.integers(0, 12),
)
def test_branches_agree_with_exact_reference(
    private: list[str], shared: list[str], k: int, limit: int | None
) -> None:
    hits = fuse_branches(private=private, shared=shared, k=k, limit=limit)
    assert [tuple(hit) for hit in hits] == reference_branches(private, shared, k)[:limit]


@given(private=st.lists(any_ids, max_size=15, unique=True), shared=st.lists(any_ids, max_size=15))
def test_disjoint_branches_keep_each_branch_order(private: list[str], shared: list[str]) -> None:
    shared = [i for i in dict.fromkeys(shared) if i not in private]
    hits = fuse_branches(private=private, shared=shared)
    assert [h.item_id for h in hits if h.branch is P] == private
    assert [h.item_id for h in hits if h.branch is S] == shared


@st.composite
def latin_squares(draw: st.DrawFn) -> dict[str, list[str]]:
    """n lists over the same n items, each item at every rank exactly once (a
    shuffled Latin square): every item has the same exact score, but the float
    sums are taken in different orders and often differ in the last bits."""
    n = draw(st.integers(2, 7))
    items = draw(
        st.lists(
            st.text(alphabet="abcxyz", min_size=1, max_size=3), min_size=n, max_size=n, unique=True
        )
    )
    rows = draw(st.permutations(range(n)))
    cols = draw(st.permutations(range(n)))
    return {f"l{j}": [items[(rows[j] + cols[r]) % n] for r in range(n)] for j in range(n)}


@given(square=latin_squares(), extra=st.lists(few_ids, max_size=6))
def test_latin_square_ties_are_exact(square: dict[str, list[str]], extra: list[str]) -> None:
    assert fuse_equal(square) == sorted(square["l0"])
    # With one more list on top, the reference still decides every tie.
    lists = {**square, "zz": extra}
    assert fuse_equal(lists) == reference_order(lists, dict.fromkeys(lists, 1.0))


@settings(max_examples=25)
@given(size=st.integers(50, 400), seed=st.integers(0, 2**32 - 1))
def test_large_random_lists_agree_with_reference(size: int, seed: int) -> None:
    rng = random.Random(seed)
    pool = [f"e{i:05d}" for i in range(size)]
    lists = {name: rng.sample(pool, rng.randint(0, size)) for name in ("fulltext", "vector")}
    lists["entity"] = rng.sample(pool, rng.randint(0, size // 4))
    known = set(rng.sample(pool, size // 10))
    assert fuse_weighted(lists, known=known) == reference_order(lists, EVIDENCE_WEIGHTS, known)


# --- a third-party reference -------------------------------------------------------------


@pytest.mark.slow
def test_equal_weight_scores_match_ranx() -> None:
    """ranx's RRF (k = 60) on many random queries at once (its numba start-up
    costs seconds, so one call). ranx ranks a run by its scores and breaks
    equal scores in its own way, so each input run gets strictly decreasing
    scores, and the comparison is of fused scores, not only of orders."""
    ranx = pytest.importorskip("ranx")
    rng = random.Random(20240601)
    queries: dict[str, dict[str, list[str]]] = {}
    for number in range(300):
        pool = [f"d{i}" for i in range(rng.randint(1, 40))]
        queries[f"q{number}"] = {
            name: rng.sample(pool, rng.randint(1, len(pool))) for name in ("lexical", "vector")
        }
    runs = []
    for name in ("lexical", "vector"):
        run: dict[str, dict[str, float]] = {}
        for q, named in queries.items():
            ids = named[name]
            run[q] = {doc: float(len(ids) - r) for r, doc in enumerate(ids)}
        runs.append(ranx.Run(run))
    fused = ranx.fuse(runs, norm=None, method="rrf", params={"k": 60})
    for q, named in queries.items():
        ids, scores = fuse_equal_scores(named)
        theirs = dict(fused.run[q])
        assert set(theirs) == set(ids)
        assert scores.tolist() == pytest.approx([theirs[i] for i in ids], rel=1e-12)
        # Our order is ranx's scores descending, ties by ID.
        assert ids == sorted(theirs, key=lambda d: (-theirs[d], d))


# --- the last rank a later list's new item can reach ----------------------------------------


def _reachable(
    lists: dict[str, list[str]], eligible: set[str], limit: int, known: set[str], rank: int
) -> bool:
    """By fusion itself: an eligible new item at ``rank`` of the vector list (the
    ranks above it held by ineligible new items), with the lowest ID (it wins
    ties), is among the first ``limit`` eligible items."""
    later = [f"~filler-{i}" for i in range(rank - 1)] + [""]
    fused = fuse_weighted({**lists, "vector": later}, known=known)
    kept = [i for i in fused if i in eligible or i == ""]
    return "" in kept[:limit]


@pytest.mark.parametrize("seed", range(150))
def test_last_reachable_rank_is_fusions_own(seed: int) -> None:
    rng = random.Random(seed)
    pool = [f"ev-{i:02d}" for i in range(rng.choice([5, 20, 60]))]
    limit = rng.choice([1, 2, 3, 5, 10])
    known = set(rng.sample(pool, rng.choice([0, 1, 3])))
    eligible = {i for i in pool if rng.random() < rng.choice([0.3, 0.8, 1.0])}
    lists: dict[str, list[str]] = {}
    for name in ("fulltext", "entity"):
        if rng.random() < 0.8:
            ids = rng.sample(pool, rng.randint(0, len(pool)))
            if ids and rng.random() < 0.3:
                ids.insert(rng.randrange(len(ids)), ids[0])  # a repeat
            lists[name] = ids
    got = last_reachable_rank(lists, eligible, limit, EVIDENCE_WEIGHTS, known=known)
    reachable = [r for r in range(1, 120) if _reachable(lists, eligible, limit, known, r)]
    if got is None:
        # Fewer than `limit` eligible items: every rank reaches the answer.
        assert reachable == list(range(1, 120))
    else:
        assert reachable == list(range(1, got + 1)), (got, reachable[-3:])
