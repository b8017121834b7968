-- The evidence list's walk is sorted whole, not in batches trusting the
-- index's order.
--
-- evidence_vector_candidates (db/0006, restated by db/0060) collects its HNSW
-- walk's ef rows with array_agg(... ORDER BY distance, id) so that a row that
-- hnsw.iterative_scan = relaxed_order hands over a little late is not cut off.
-- On PostgreSQL 16 and later that sort is not what runs: the planner feeds the
-- aggregate presorted input and, the index already delivering rows by
-- distance, gets it from an incremental sort with the distance as presorted
-- key (EXPLAIN: Aggregate <- Incremental Sort, "Presorted Key: distance",
-- "Full-sort Groups: 7" for 200 rows). An incremental sort sorts each batch of
-- about 32 rows and trusts the input's order between batches, which is exactly
-- what relaxed_order does not promise: a nearer row handed over a batch late
-- stays behind the batch before it, and may fall past the limit.
--
-- The function now sets enable_incremental_sort = off, so that the plan is a
-- full Sort of the walk's rows below the aggregate (EXPLAIN: Aggregate <- Sort,
-- quicksort of the 200 rows). The same setting as the relationship list's
-- (db/0075). The cost is one in-memory sort of ef rows (at most 1000).
-- Restated whole from db/0060 with only that SET clause added.

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
    SET enable_incremental_sort = off
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
