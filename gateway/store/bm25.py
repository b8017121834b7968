"""SQL of an exact BM25 top-k over postings, scoring only documents that can win.

Both full-text lists (evidence candidates, gateway/store/search.py, and
relationship discovery, gateway/store/related.py) rank with BM25 under OR
semantics: every document holding any query lexeme is a hit. A natural-language
question nearly always holds a common word, so the hits are a large share of
the space (55 % of a 10,000-evidence space for a 10-word question of the recall
benchmark), and scoring each hit needs its document's row (length, generation,
system time): 5,529 lookups of 161 ms of one statement under EXPLAIN ANALYZE.

Only ``per_list`` of them are returned. An upper bound of each hit's score
comes from its postings alone: the term part ``tf (k1 + 1) / (tf + k1 (1 - b +
b dl / avgdl))`` only grows as the document length ``dl`` shrinks, so with
``dl = 0`` it is at least the real one. The statement therefore

1. groups the query lexemes' postings per document with that bound
   (:func:`postings_cte`; no document row is read);
2. scores exactly the ``2 k`` hits of highest bound and takes the ``k``-th best
   score among those visible in the view: a lower bound ``theta`` of the real
   ``k``-th best score (a subset's ``k``-th best is never higher);
3. scores exactly every hit whose bound reaches ``theta`` and returns the best
   ``k`` of them (:func:`top_k`).

A hit left out has a score at most its bound, below ``theta``, so below ``k``
visible documents that are scored: it could never have been among the ``k``.
The answer is the one of scoring every hit, document for document and rank for
rank (``theta`` is lowered by a relative 1e-9 so that rounding in the two sums
cannot exclude a document whose score equals it). With fewer than ``k`` visible
hits among the ``2 k``, ``theta`` is minus infinity and every hit is scored, as
before. The score is computed by the same expression as before, over each
document's (IDF, tf) pairs in lexeme order, so equal documents tie exactly.
"""

from __future__ import annotations

from typing import Final

from gateway.store.params import float_literal

__all__ = ["BM25_B", "BM25_K1", "postings_cte", "top_k"]

# BM25 parameters: the common defaults (Anserini's), which reach nDCG@10
# 0.686 on SciFact here (benchmarks/fulltext_quality.py); the mild length
# normalisation suits short evidence texts.
BM25_K1: Final = 0.9
BM25_B: Final = 0.4


def postings_cte(
    name: str, *, idf: str, space: str, postings: str, doc_id: str, team: str
) -> str:
    """CTE ``name``: per (space, document) the (IDF, tf) pairs of its query lexemes,
    the space's average length, and the score bound.

    ``idf`` is the query's CTE of ``(space_id, lexeme, idf, avgdl)`` (``space``
    names its space column, or a constant for a single-space CTE), ``postings``
    the postings table, ``doc_id`` its document column.
    """
    k1, b = float_literal(BM25_K1), float_literal(BM25_B)
    return f"""{name} AS MATERIALIZED (
    SELECT {space} AS space_id, t.{doc_id}::text AS doc_id,
           array_agg(w.idf ORDER BY w.lexeme COLLATE "C") AS idfs,
           array_agg(t.tf::double precision ORDER BY w.lexeme COLLATE "C") AS tfs,
           -- avgdl is one value per space; min() only carries it through the grouping.
           min(w.avgdl) AS avgdl,
           -- The score with a document length of 0: never below the real score.
           sum(greatest(w.idf, 0) * t.tf * ({k1} + 1) / (t.tf + {k1} * (1 - {b}))) AS bound
    FROM {idf} w
    -- Per query lexeme, its own key range: LATERAL with OFFSET 0 cannot be
    -- flattened into a join. As a join, the planner (estimating one posting
    -- per lexeme) merged the query's lexemes with every posting of the space,
    -- read in key order: 22 of the 45 ms of discovery's full-text list.
    CROSS JOIN LATERAL (
        SELECT p.{doc_id}, p.tf
        FROM {postings} p
        WHERE p.team_id = {team} AND p.space_id = {space} AND p.lexeme = w.lexeme
        OFFSET 0
    ) t
    GROUP BY 1, 2
)"""


def _score(g: str, doc: str) -> str:
    k1, b = float_literal(BM25_K1), float_literal(BM25_B)
    return f"""(SELECT sum(u.idf * u.tf * ({k1} + 1)
                   / (u.tf + {k1} * (1 - {b} + {b} * {doc}.doc_length / {g}.avgdl)))
        FROM unnest({g}.idfs, {g}.tfs) AS u (idf, tf))"""


def top_k(
    cte: str, *, space: str, doc_table: str, doc_join: str, visible: str, limit: str
) -> str:
    """The best ``limit`` visible documents of ``space`` in CTE ``cte``
    (:func:`postings_cte`) by score, then ID in code-point order, as rows
    ``(doc_id, rank)``.

    ``doc_join`` joins the document row ``d`` to the CTE row ``g`` (team, space
    and ID), ``visible`` is the view's filter on ``d``.
    """

    def scored(source: str) -> str:
        return f"""SELECT g.doc_id, {_score("g", "d")} AS score
        FROM {source} g
        JOIN {doc_table} d ON {doc_join}
        WHERE {visible}"""

    best_bounds = f"""(SELECT * FROM {cte} x WHERE x.space_id = {space}
              ORDER BY x.bound DESC, x.doc_id COLLATE "C" LIMIT 2 * {limit})"""
    theta = f"""(SELECT CASE WHEN count(*) < {limit} THEN '-infinity'::double precision
                 ELSE min(k.score) - 1e-9 * abs(min(k.score)) END
          FROM (
              {scored(best_bounds)}
              ORDER BY 2 DESC LIMIT {limit}
          ) k)"""
    return f"""
SELECT h.doc_id, row_number() OVER (ORDER BY h.score DESC, h.doc_id COLLATE "C") AS rank
FROM (
    {scored(cte)}
      AND g.space_id = {space}
      AND g.bound >= {theta}
) h
ORDER BY h.score DESC, h.doc_id COLLATE "C"
LIMIT {limit}"""
