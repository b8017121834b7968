-- The HNSW walk of a vector list is at least 150 wide (db/0060: 100).
--
-- evidence_vector_ef (db/0060), which both vector lists use
-- (evidence_vector_candidates, db/0076; relationship_vector_candidates,
-- db/0075), gave ef_search = max(2 * limit, 100, space size / 100), at most
-- 1000: for a space of 10,000 to 15,000 vectors (the smallest that takes the
-- HNSW path) 100 for a list of 10 or 40 and 120 for the list of 60 that a
-- recall of limit 10 asks for. pgvector draws each element's graph level at
-- random, so each build of an index is another graph, and at that width the
-- recall@10 against an exact scan of the space depended on the build: 0.993
-- on one generation of the recall benchmark's dataset, 0.973 on the next.
--
-- Measured by benchmarks/vector_ef_bench.py on that dataset (10 spaces of
-- 10,000 evidence and 10,000 relationship vectors, m 16, ef_construction 64),
-- the index as loaded and rebuilt several times (REINDEX: a new graph each
-- time), 200 questions per build, each list against the exact top N of its
-- space; the worst build of each rule (docs/benchmarks.md, "The ef_search
-- floor"):
--
--   floor   evidence         evidence         relationships    relationships
--           list of 10 @10   list of 60 @60   list of 10 @10   list of 40 @40
--   100     0.981            0.979            0.985            0.978
--   120     0.987            0.979            0.989            0.984
--   150     0.992            0.989            0.991            0.989
--   200     0.993            0.992            0.998            0.997
--
-- So ef_search = max(2 * limit, 150, space size / 100), at most 1000. Every
-- list that changed was at least as near to the exact answer (its k-th
-- distance at most the old list's at every rank k). Spaces from 15,000
-- vectors on (size / 100 >= 150) and lists of more than 75 keep their walk;
-- spaces under the exact-search bound are scanned exactly, as before.
--
-- Only the rule changes: the two functions call evidence_vector_ef, so both
-- lists follow it, and nothing else of them (signatures, settings, the exact
-- path, the fallback, the walk cap max(4 * ef, space size / 10)) is restated.

CREATE OR REPLACE FUNCTION evidence_vector_ef(p_space_size bigint, p_limit integer)
    RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN least(greatest(p_limit * 2, 150, p_space_size / 100), 1000)::integer;
