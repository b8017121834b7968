"""An exact BM25 top-k that reads only the postings that can matter (db/0085).

Both full-text lists (evidence candidates, gateway/store/search.py, and
relationship discovery, gateway/store/related.py) rank with BM25 under OR
semantics: every document holding any query lexeme is a hit. A natural-language
question nearly always holds a common word, so the hits are a large share of
the space: 54,662 of the 100,000 evidence of one space of the 1,000,000-evidence
benchmark for a 10-word question, from 73,304 postings. Only ``per_list`` of
them are returned.

Until db/0085 the statement grouped every one of those postings per document
with an upper bound of its score (its BM25 at document length 0), scored the
``2 k`` of highest bound for a floor, then the hits whose bound reached it:
few lookups, but the grouping (a sort of 73,304 rows spilled to disk, the
arrays of 54,662 documents materialised and read three times) was most of the
220 ms of that statement (docs/benchmarks.md). A document's bound is a sum
over its lexemes, and most of it comes from the rare ones: the MaxScore
argument (Turtle and Flood, 1995) spares the postings of the common ones.

Per query lexeme ``t`` an upper bound ``ub(t)`` of its contribution to any
document's score: the term part ``tf (k1 + 1) / (tf + k1 (1 - b + b dl /
avgdl))`` grows with ``tf`` and shrinks as ``dl`` grows, so ``idf(t) max_tf
(k1 + 1) / (max_tf + k1 (1 - b))``, with the lexeme's largest term frequency
in the space (kept with its document frequency by the write path, db/0106; a
``knownAt`` view counts both over the postings of its instant),
is never below it. The functions ``evidence_fulltext_top_k`` and
``relationship_fulltext_top_k`` then

1. **a first floor** (only from :data:`PRUNE_FROM_POSTINGS` postings of the
   query's lexemes on; below, minus infinity): the first ``2 k`` visible hits
   of the rarest lexemes' postings, scored exactly; ``theta0`` is the ``k``-th
   best of those, at most the real ``k``-th best score (a subset's ``k``-th
   best is never higher);
2. **essential lexemes**: in bound order, the longest prefix of lexemes whose
   bounds sum below ``theta0`` is *minor*: a document holding only those
   scores below ``theta0``, so below ``k`` visible documents, and is never in
   the list; ``rest`` is that sum;
3. **the grouping**: only the essential lexemes' postings are grouped per
   document into ``part``, the sum of their term parts at dl = 0 (one number
   per document, since db/0105: no arrays of the document's lexemes and term
   frequencies, which made the grouping spill to disk at 100,000 documents
   per space), kept when ``part + rest`` reaches ``theta0``; the ``2 k`` of
   highest ``part`` (or, when the view hides most of those, the first ``2 k``
   visible ones in ``part`` order) are scored exactly, and their ``k``-th
   best is ``theta``. Below :data:`PRUNE_FROM_POSTINGS` the evidence
   function's grouping also keeps only the documents whose ``part`` reaches
   a *cut* (db/0204): the term part at ``tf`` = 1 and dl = 0 of the
   rarest essential lexeme whose ``df`` (the statistics' count of its
   postings in the space, every generation) is at least ``2 k``, so usually
   more than the ``2 k`` are kept, while most groups are neither stored nor
   sorted. The cut only filters (whatever its value); that is exact when
   ``theta`` is not below the cut (every document whose bound reaches
   ``theta`` is kept); when it is, the query returns nothing and runs again
   without the cut;
4. **the survivors**: the documents whose ``part + rest`` reaches ``theta``
   get their minor lexemes' term frequencies from the postings' key (read for
   them only), those whose whole bound reaches ``theta`` are looked up and
   scored, and the best ``k`` returned. Every document scored (here and for
   the floors) gets each query lexeme's term frequency from the document's
   own ``search_document`` (db/0195 for evidence, db/0197 for relationships:
   its row is looked up anyway, and the postings' ``tf`` is defined from it,
   the number of the lexeme's positions). Each document is scored once
   (db/0175, db/0197): the scores of step 3's ``2 k`` are candidates of the
   answer too, and only the survivors outside them are scored here (one of
   the ``2 k`` whose whole bound is below ``theta`` scores below the ``k``
   documents that reach it, so it never makes the list). Steps 1 and 2 are a
   statement of their own, run only from :data:`PRUNE_FROM_POSTINGS` on; below
   it the floor is minus infinity, no lexeme is minor and the rest is 0, and
   the one query of steps 3 and 4 runs with those values (db/0197, db/0198).

A document left out scores below ``theta`` (it holds no essential lexeme, or
its bound is below ``theta``), so below ``k`` visible documents that are
scored: the answer is the one of scoring every hit, document for document and
rank for rank (``tests/test_bm25_top_k.py`` compares both paths with BM25
computed over every document, and shows that a broken bound fails that
comparison). ``theta`` is lowered by a relative 1e-9 so that rounding in the
sums cannot exclude a document whose score equals it. The score is computed by
the same expression as before, over each document's (IDF, tf) pairs in lexeme
order, so equal documents tie exactly.

Each function checks the documents it looks up against the view (team, space,
generation, system time, exclusions) in every stage that scores or walks them,
through one lookup function (``evidence_fulltext_document``,
``relationship_fulltext_document``, db/0197 and db/0198: the filter written
once), which the planner inlines into each stage as a LATERAL lookup on the
primary key. ``tests/test_fulltext_visibility.py`` reads the filter from the
installed functions and checks that it selects the rows of the read path's own
rule (``search._visible``, ``related.visible_relationship``) in current,
``validAt`` and ``knownAt`` views.

Exactness rests on ``tf`` in the postings being the one the score uses: the
postings trigger (db/0055) derives it from the same parse as ``doc_length``
(``search_document``, from which both functions read a scored
document's ``tf``; the postings are written by their triggers only, db/0130,
and a document's text and parse cannot change after insert, db/0196).
The functions exist for their cached plans: the dozen stages planned inside
every candidate statement cost 4 to 6 ms of planning per list (db/0085 says
more).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = ["BM25_B", "BM25_K1", "PRUNE_FROM_POSTINGS", "top_k"]

# BM25 parameters: the common defaults (Anserini's), which reach nDCG@10
# 0.686 on SciFact here (benchmarks/fulltext_quality.py); the mild length
# normalisation suits short evidence texts. db/0085's functions spell the same
# values (tests/test_bm25_top_k.py checks).
BM25_K1: Final = 0.9
BM25_B: Final = 0.4

# From this many postings of the query's lexemes in a space on, the functions
# compute the first floor and skip the minor lexemes' postings (see the module
# doc); below it every lexeme is essential and all postings are grouped, as
# before db/0085, which costs less than the floor's extra passes. A 10,000-
# evidence space of the recall benchmark gives about 7,000 postings per
# question, a 100,000-evidence one about 70,000. Read at call time (the callers
# bind it), so tests can force either path.
PRUNE_FROM_POSTINGS: int = 20_000


def top_k(
    function: str,
    *,
    lexemes: str,
    team: str,
    space: str,
    generation: str,
    view: Sequence[str],
    limit: str,
    prune_from: str,
) -> str:
    """A query of rows ``(doc_id, rank)``: the best ``limit`` visible documents of
    ``space`` by BM25 score, then ID in code-point order, from ``function``
    (``evidence_fulltext_top_k`` or ``relationship_fulltext_top_k``, db/0085).

    ``lexemes`` is a relation of the query's lexemes present in the space with
    columns ``lexeme``, ``idf``, ``avgdl`` (the space's average length), ``df``
    and ``max_tf`` (the lexeme's document count and largest term frequency over
    the postings the statistics count); ``view`` the function's view arguments
    (known_at and exclusions, or the system time); ``prune_from`` a bigint
    expression, :data:`PRUNE_FROM_POSTINGS` bound by the caller.
    """

    def column(name: str) -> str:
        return f'(SELECT array_agg(x.{name} ORDER BY x.lexeme COLLATE "C") FROM {lexemes} x)'

    args = ", ".join(
        [team, space, generation, *view, limit, prune_from]
        + [column(c) for c in ("lexeme", "idf", "df", "max_tf")]
        + [f"(SELECT min(x.avgdl) FROM {lexemes} x)"]
    )
    return f"SELECT f.doc_id, f.rank FROM {function}({args}) f"
