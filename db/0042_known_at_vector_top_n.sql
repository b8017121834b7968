-- The vector list of a knownAt view without a full sort of the space.
--
-- A knownAt view's vector list is always exact (gateway/store/search.py and
-- gateway/store/related.py): an approximate index's answer moves with later
-- inserts. Until now it went through the exact branch of
-- evidence_vector_candidates (db/0006) and relationship_vector_candidates
-- (db/0003): the distance of every vector of the space, a FULL sort of them
-- all (OFFSET 0 kept the filter above the sort, so no top-N sort), then a
-- lookup of generation and recorded_at row by row until the limit was reached.
-- The sort grew with every write made after the view's instant.
--
-- These functions first count the space's rows and those visible in the view
-- (generation, recorded_at <= the instant), by an index-only scan of
-- evidence_search_filter / relationships_search_filter; no index led by
-- (team_id, space_id, recorded_at) is added (db/0041 says why). Then:
--
-- * at least half of the space visible (the usual case: an instant in the
--   recent past): every distance, but only the nearest
--   limit + (rows not visible) + (excluded IDs) kept by a top-N heap sort. At
--   most that many rows can fail the filter (each vector has exactly one
--   evidence row), so the first `limit` that pass are among them;
-- * less than half visible (an old instant, many later writes): the visible
--   rows joined to their vectors (a hash join), distances of those only, then
--   ORDER BY distance, id LIMIT k as a top-N heap sort.
--
-- Either way the answer is the exact branch's: the same filter (generation,
-- recorded_at, excluded IDs, active projection) and the same total order
-- (distance, then the ID in "C" collation; unique per space). The choice
-- between the two depends on later writes, the answer does not. Each ORDER BY
-- sits above a subquery behind OFFSET 0, so that the planner cannot answer it
-- with the space's HNSW index, which it otherwise does on a large space (an
-- approximate answer of ef_search rows at most: seen on 10,000 vectors, 40
-- rows instead of 60). Both still read every vector of the space: a vector is
-- cheaper to read in sequence than to fetch by key, so the cost of a
-- historical view still grows with later writes, but by the read, not a sort.
-- Measured in docs/benchmarks.md. The current view still calls the functions
-- of db/0006 and db/0003, unchanged.
--
-- SECURITY INVOKER (the default), as the others: read as the caller, under
-- row-level security, with the team and space named in every predicate.

CREATE OR REPLACE FUNCTION evidence_vector_candidates_as_of(
    p_team text,
    p_space uuid,
    p_generation integer,
    p_query vector,
    p_limit integer,
    p_known_at timestamptz,
    p_exclude text[]
) RETURNS TABLE (evidence_id text, distance double precision)
    LANGUAGE plpgsql VOLATILE
    SET search_path = public, pg_temp
    SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    n_total bigint;
    n_visible bigint;
BEGIN
    SELECT count(*),
           count(*) FILTER (WHERE e.generation = p_generation
                              AND e.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz))
    INTO n_total, n_visible
    FROM evidence e
    WHERE e.team_id = p_team AND e.space_id = p_space;

    IF n_visible * 2 < n_total THEN
        -- Mostly later (or older-generation) rows: distances of the visible ones only.
        RETURN QUERY
        SELECT v.id, v.d
        FROM (
            SELECT ee.evidence_id::text AS id, ee.embedding <=> p_query AS d
            FROM evidence e
            JOIN evidence_embeddings ee
              ON ee.team_id = p_team AND ee.space_id = p_space AND ee.evidence_id = e.id
            WHERE e.team_id = p_team AND e.space_id = p_space
              AND e.generation = p_generation
              AND e.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
              AND NOT (e.id = ANY (p_exclude))
            OFFSET 0  -- keeps the HNSW index out: it would answer this ORDER BY approximately
        ) v
        ORDER BY v.d, v.id COLLATE "C"
        LIMIT p_limit;
        RETURN;
    END IF;

    -- Mostly visible rows: every distance, but only the nearest
    -- p_limit + (rows not visible) + (excluded IDs) are kept (a top-N heap, not
    -- a full sort); at most that many can fail the filter, so the first p_limit
    -- that pass are among them.
    RETURN QUERY
    SELECT o.id, o.d
    FROM (
        SELECT s.id, s.d
        FROM (
            SELECT ee.evidence_id::text AS id, ee.embedding <=> p_query AS d
            FROM evidence_embeddings ee
            WHERE ee.team_id = p_team AND ee.space_id = p_space
            OFFSET 0  -- keeps the HNSW index out (see above)
        ) s
        ORDER BY s.d, s.id COLLATE "C"
        LIMIT p_limit + (n_total - n_visible) + coalesce(cardinality(p_exclude), 0)
    ) o
    WHERE NOT (o.id = ANY (p_exclude))
      AND (SELECT e.generation = p_generation
                  AND e.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
           FROM evidence e
           WHERE e.team_id = p_team AND e.space_id = p_space AND e.id = o.id) IS TRUE
    ORDER BY o.d, o.id COLLATE "C"
    LIMIT p_limit;
END $$;

CREATE OR REPLACE FUNCTION relationship_vector_candidates_as_of(
    p_team text,
    p_space uuid,
    p_generation integer,
    p_projection integer,
    p_query vector,
    p_limit integer,
    p_known_at timestamptz
) RETURNS TABLE (relationship_id text, distance double precision)
    LANGUAGE plpgsql VOLATILE
    SET search_path = public, pg_temp
    SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    n_total bigint;
    n_visible bigint;
BEGIN
    SELECT count(*),
           count(*) FILTER (WHERE r.generation = p_generation
                              AND r.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz))
    INTO n_total, n_visible
    FROM relationships r
    WHERE r.team_id = p_team AND r.space_id = p_space;

    IF n_visible * 2 < n_total THEN
        RETURN QUERY
        SELECT v.id, v.d
        FROM (
            SELECT re.relationship_id::text AS id, re.embedding <=> p_query AS d
            FROM relationships r
            JOIN relationship_embeddings re
              ON re.team_id = p_team AND re.space_id = p_space AND re.relationship_id = r.id
                 AND re.projection_generation = p_projection
            WHERE r.team_id = p_team AND r.space_id = p_space
              AND r.generation = p_generation
              AND r.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
            OFFSET 0  -- keeps the HNSW index out
        ) v
        ORDER BY v.d, v.id COLLATE "C"
        LIMIT p_limit;
        RETURN;
    END IF;

    RETURN QUERY
    SELECT o.id, o.d
    FROM (
        SELECT s.id, s.d
        FROM (
            SELECT re.relationship_id::text AS id, re.embedding <=> p_query AS d
            FROM relationship_embeddings re
            WHERE re.team_id = p_team AND re.space_id = p_space
              AND re.projection_generation = p_projection
            OFFSET 0  -- keeps the HNSW index out
        ) s
        ORDER BY s.d, s.id COLLATE "C"
        LIMIT p_limit + (n_total - n_visible)
    ) o
    WHERE (SELECT r.generation = p_generation
                  AND r.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
           FROM relationships r
           WHERE r.team_id = p_team AND r.space_id = p_space AND r.id = o.id) IS TRUE
    ORDER BY o.d, o.id COLLATE "C"
    LIMIT p_limit;
END $$;
