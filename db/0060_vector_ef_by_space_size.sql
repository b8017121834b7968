-- The HNSW path's ef_search grows with the space: one per 100 vectors.
--
-- evidence_vector_candidates (db/0006) walked every space's graph with
-- hnsw.ef_search = max(2 * limit, 100), whatever the space's size. Its own
-- partition holds only the space's vectors, so the recall lost is the graph's
-- approximation alone, and that loss grows with the graph. Measured with the
-- recall benchmark's vectors (every team drawn from the same 8 topic centroids
-- with isotropic noise: about 1/8 of a space's vectors nearly equidistant from
-- a query, a worst case for any graph index), m = 16, ef_construction = 64,
-- 100 queries, recall@10 of a list of 10 against an exact scan of the space:
--
--   vectors in the space   ef_search   recall@10
--   10,000                 100         0.992
--   10,000                 200         0.998
--   100,000                100         0.76
--   100,000                400         0.955
--   100,000                600         0.973
--   100,000                800         0.981
--   100,000                1000        0.984
--
-- So ef_search = max(2 * limit, 100, space size / 100), at most 1000 (the
-- largest value pgvector accepts): unchanged up to 10,000 vectors (the same
-- list and cost as before; smaller spaces are scanned exactly anyway), and
-- about 0.98 from there to 100,000 instead of falling to 0.76. Above 100,000
-- vectors the cap holds it at 1000 and recall falls again on vectors like
-- these; text embeddings are far less uniform, so they lose less. The cost of
-- a walk grows with ef_search: on a loaded machine (load average 7 to 9) a
-- 100,000-vector space took 8 ms (median) at 100 and 42 ms at 1000; an exact
-- scan of it would cost about ten times the 22 ms of a 10,000-vector one.
--
-- A function of its own (evidence_vector_ef) so that tests can check the
-- rule; the settings stay local to evidence_vector_candidates (its SET
-- clauses), as before: a transaction-wide SET LOCAL could not depend on the
-- space's size or the list's length, which only this function knows. The
-- signature, the exact path, the fallback and hnsw.max_scan_tuples are
-- unchanged.

CREATE FUNCTION evidence_vector_ef(p_space_size bigint, p_limit integer)
    RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN least(greatest(p_limit * 2, 100, p_space_size / 100), 1000)::integer;

CREATE OR REPLACE FUNCTION evidence_vector_candidates(
    p_team text,
    p_space uuid,
    p_generation integer,
    p_query vector,
    p_limit integer,
    p_known_at timestamptz,
    p_exclude text[],
    p_exact_below bigint
) RETURNS TABLE (evidence_id text, distance double precision)
    LANGUAGE plpgsql VOLATILE
    SET search_path = public, pg_temp
    SET plan_cache_mode = force_custom_plan
    SET hnsw.iterative_scan = relaxed_order
    SET hnsw.ef_search = 100
    SET hnsw.max_scan_tuples = 20000
AS $$
DECLARE
    space_size bigint;
    ef integer;
    approx_ids text[];
    approx_distances double precision[];
BEGIN
    SELECT coalesce(sum(s.doc_count), 0) INTO space_size
    FROM evidence_search_stats s
    WHERE s.team_id = p_team AND s.space_id = p_space;

    IF space_size >= p_exact_below THEN
        ef := evidence_vector_ef(space_size, p_limit);
        PERFORM set_config('hnsw.ef_search', ef::text, true);
        PERFORM set_config('hnsw.max_scan_tuples', greatest(ef * 4, space_size / 10)::text, true);
        SELECT array_agg(r.evidence_id ORDER BY r.distance, r.evidence_id COLLATE "C"),
               array_agg(r.distance ORDER BY r.distance, r.evidence_id COLLATE "C")
        INTO approx_ids, approx_distances
        FROM (
            SELECT ee.evidence_id::text AS evidence_id, ee.embedding <=> p_query AS distance
            FROM evidence_embeddings ee
            WHERE ee.team_id = p_team AND ee.space_id = p_space
              AND NOT (ee.evidence_id = ANY (p_exclude))
              AND (SELECT e.generation = p_generation
                          AND e.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
                   FROM evidence e
                   WHERE e.team_id = p_team AND e.space_id = p_space
                     AND e.id = ee.evidence_id) IS TRUE
            ORDER BY ee.embedding <=> p_query
            -- relaxed_order returns rows only roughly by distance: take ef of
            -- them (not just the limit), so that a near row returned a little
            -- late is not cut off, then sort and keep the nearest.
            LIMIT ef
        ) r;
        IF coalesce(cardinality(approx_ids), 0) >= p_limit THEN
            RETURN QUERY
            SELECT a.evidence_id, a.distance
            FROM unnest(approx_ids, approx_distances) WITH ORDINALITY AS a (evidence_id, distance, n)
            ORDER BY a.n
            LIMIT p_limit;
            RETURN;
        END IF;
        -- Short: fall through to the exact scan.
    END IF;

    RETURN QUERY
    WITH scored AS MATERIALIZED (
        -- Materialised: no index can stand in for this full, exact ordering.
        SELECT ee.evidence_id::text AS evidence_id, ee.embedding <=> p_query AS distance
        FROM evidence_embeddings ee
        WHERE ee.team_id = p_team AND ee.space_id = p_space
    )
    SELECT o.evidence_id, o.distance
    FROM (
        SELECT sc.evidence_id, sc.distance
        FROM scored sc
        ORDER BY sc.distance, sc.evidence_id COLLATE "C"
        OFFSET 0  -- keeps the filter above the sort: checked in order, until the limit
    ) o
    WHERE NOT (o.evidence_id = ANY (p_exclude))
      AND (SELECT e.generation = p_generation
                  AND e.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
           FROM evidence e
           WHERE e.team_id = p_team AND e.space_id = p_space AND e.id = o.evidence_id) IS TRUE
    LIMIT p_limit;
END $$;
