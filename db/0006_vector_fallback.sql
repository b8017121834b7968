-- The vector list stays complete when the HNSW path comes back short.
--
-- evidence_vector_candidates (db/0002_search_stats.sql) walks a large space's
-- HNSW graph with an iterative scan, which gives up after
-- hnsw.max_scan_tuples visited vectors (20,000 by default). When the nearest
-- vectors of a space are nearly all filtered out (an older generation just
-- after a reset, evidence recorded after the view's known_at, many excluded
-- IDs), the scan stopped with fewer rows than asked although the space held
-- more eligible ones: a silently short list.
--
-- Now the approximate answer is kept only when it is full (p_limit rows);
-- otherwise the same exact scan that small spaces use answers instead, which
-- is complete by construction. That costs one exact scan of the space (about
-- 1.6 ms per 1,000 vectors here) only in the short case: when the space really
-- has fewer eligible vectors than asked, or when the graph walk was cut off.
--
-- And the walk is cut off earlier: hnsw.max_scan_tuples = max(4 * ef_search,
-- space size / 10). A visited vector costs about ten times what an exact
-- distance does (the filter is checked for each), so a walk that has visited
-- a tenth of the space without filling the list had better stop: measured on
-- a space of 10,000 vectors whose every vector was filtered out, the walk
-- took 320-670 ms to give up at 20,000 tuples, the exact scan 16 ms. An
-- unfiltered query returns its ef_search rows in the first batch and never
-- comes near the cap. (When pgvector reaches the cap it still returns the
-- candidates it has already seen, so the cap bounds the walk, not the rows.)
--
-- Measured right after a reset (a space of 25,100 vectors, 100 of them in the
-- current generation; 12 queries, limit 60, one run, medians): before, 60
-- rows but only 0.911 of the exact answer, 296 ms; now the exact answer
-- (1.000), 216 ms; the exact scan alone 170 ms. Without a reset nothing
-- changes (the first batch fills the list).
--
-- The signature, the other settings and the threshold are unchanged.

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
        ef := least(greatest(p_limit * 2, 100), 1000);
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
