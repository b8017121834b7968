-- The two vector lists' HNSW walks check the view of their walked rows in one
-- statement, with the walk's plan pinned to the index.
--
-- evidence_vector_candidates (db/0076) and relationship_vector_candidates
-- (db/0075) walked the space's HNSW graph with a filter per walked row: a
-- subquery looking the row up in evidence / relationships (generation, system
-- time), about ef_search index lookups per call (150 on a space of 10,000), a
-- fifth to a quarter of each list's server CPU (docs/benchmarks.md).
--
-- Now, in a space that was never reset (the view's generation is 1), the walk
-- takes its ef rows without that lookup, and one statement checks them all
-- (id = ANY of the walked IDs). When every walked row is in the view (the
-- usual case), the filtered walk would have handed over exactly those rows:
-- the index hands rows over in the same order whatever the executor's filter
-- does with them (the filter is applied above the scan), so when it removes
-- none the first ef rows are the same, with the same distances. When any
-- walked row is outside the view (recorded after the view's instant: a write
-- committed between the recall's first statement and this one), the filtered
-- walk of before runs and answers (its query unchanged, its plan pinned as
-- below). Measured, that second walk costs about
-- half a list more (docs/benchmarks.md). After a reset the older generation's
-- rows stay in the space and may be the nearest, so that every walk would
-- need the second one: a space of a later generation takes the filtered walk
-- directly, as before. The evidence walk keeps its exclusion filter (the
-- caller's known IDs: a test of the row's own column, no lookup).
--
-- The walk's plan is pinned. With the per-row lookup, a sequential scan of the
-- partition had to run the lookup for every row, so on a large space the
-- planner walked the index; without it, on a small partition or a wide walk,
-- it may prefer a sequential scan and a top-N sort of every vector: an exact
-- list where the walk's was approximate, a changed answer. Both walks (the
-- unfiltered one and the filtered one) run with enable_sort off: every plan
-- for `ORDER BY embedding <=> query LIMIT ef` other than the HNSW index's
-- ordered scan needs a Sort node, so PostgreSQL (which since version 18
-- prefers the plan with fewer disabled nodes, whatever its cost) has one plan
-- left. Before, even the filtered walk could be sorted instead where a space's
-- partition holds few of its vectors (1,500 of a space of 10,000 evidence, as
-- in tests/test_search.py): a list exact by accident of the costs, where the
-- design promises the walk above the exact-search bound. There it is the walk
-- now; wherever the index was walked before, the rows are the same. The walked
-- rows are collected unsorted, then sorted by (distance, ID) in a statement of
-- their own, with sorts enabled: the sort db/0075 and db/0076 made the
-- aggregate do (enable_incremental_sort stays off, so that no sort trusts the
-- index's order).
--
-- Planning: only the walks and the exact scan, which read the partitioned
-- tables, are planned per call (force_custom_plan: pruned to the space's
-- partition at planning, db/0002); the space's size, the check and the sort
-- of the walked rows keep generic plans, set by set_config inside the
-- function and undone at its exit by its own SET clause.
--
-- Unchanged: signatures, ef_search (evidence_vector_ef, db/0110), the walk
-- cap, the exact path under p_exact_below and the fallback to it when the
-- walk comes back short, the filters, the total order (distance, then the ID
-- in "C" collation).

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
    SET enable_sort = on
AS $$
DECLARE
    space_size bigint;
    ef integer;
    walked_ids text[];
    walked_distances double precision[];
    in_view bigint;
BEGIN
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    SELECT coalesce(sum(s.doc_count), 0) INTO space_size
    FROM evidence_search_stats s
    WHERE s.team_id = p_team AND s.space_id = p_space;

    IF space_size >= p_exact_below THEN
        ef := evidence_vector_ef(space_size, p_limit);
        PERFORM set_config('hnsw.ef_search', ef::text, true);
        PERFORM set_config('hnsw.max_scan_tuples', greatest(ef * 4, space_size / 10)::text, true);
        -- A space never reset holds no row of another generation: walk it
        -- unfiltered, then check the walked rows. (After a reset the older
        -- generation's rows stay, and may be the nearest: the filtered walk.)
        IF p_generation = 1 THEN
            -- The walk: planned for this space's partition, sorts disabled (the
            -- index's ordered scan is then the only plan without a disabled node).
            PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
            PERFORM set_config('enable_sort', 'off', true);
            SELECT array_agg(w.evidence_id), array_agg(w.distance)
            INTO walked_ids, walked_distances
            FROM (
                SELECT ee.evidence_id::text AS evidence_id, ee.embedding <=> p_query AS distance
                FROM evidence_embeddings ee
                WHERE ee.team_id = p_team AND ee.space_id = p_space
                  AND NOT (ee.evidence_id = ANY (p_exclude))
                ORDER BY ee.embedding <=> p_query
                -- relaxed_order returns rows only roughly by distance: take ef of
                -- them (not just the limit), so that a near row returned a little
                -- late is not cut off, then sort them all and keep the nearest.
                LIMIT ef
            ) w;
            PERFORM set_config('enable_sort', 'on', true);
            PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
            -- Every walked row in the view? One statement over their IDs.
            SELECT count(*) INTO in_view
            FROM evidence e
            WHERE e.team_id = p_team AND e.space_id = p_space
              AND e.id = ANY (walked_ids)
              AND e.generation = p_generation
              AND e.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz);
        END IF;
        IF p_generation <> 1 OR in_view < coalesce(cardinality(walked_ids), 0) THEN
            -- Some are not (or a reset space): the filtered walk of db/0076, pinned likewise.
            PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
            PERFORM set_config('enable_sort', 'off', true);
            SELECT array_agg(r.evidence_id), array_agg(r.distance)
            INTO walked_ids, walked_distances
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
                LIMIT ef
            ) r;
            PERFORM set_config('enable_sort', 'on', true);
            PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
        END IF;
        IF coalesce(cardinality(walked_ids), 0) >= p_limit THEN
            RETURN QUERY
            SELECT a.evidence_id, a.distance
            FROM unnest(walked_ids, walked_distances) AS a (evidence_id, distance)
            ORDER BY a.distance, a.evidence_id COLLATE "C"
            LIMIT p_limit;
            RETURN;
        END IF;
        -- Short: fall through to the exact scan.
    END IF;

    -- The exact scan reads the partitioned table: planned for this call's space.
    PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
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

CREATE OR REPLACE FUNCTION relationship_vector_candidates(
    p_team text,
    p_space uuid,
    p_generation integer,
    p_projection integer,
    p_query vector,
    p_limit integer,
    p_known_at timestamptz,
    p_exact_below bigint
) RETURNS TABLE (relationship_id text, distance double precision)
    LANGUAGE plpgsql VOLATILE
    SET search_path = public, pg_temp
    SET plan_cache_mode = force_custom_plan
    SET hnsw.iterative_scan = relaxed_order
    SET hnsw.ef_search = 100
    SET hnsw.max_scan_tuples = 20000
    SET enable_incremental_sort = off
    SET enable_sort = on
AS $$
DECLARE
    space_size bigint;
    ef integer;
    walked_ids text[];
    walked_distances double precision[];
    in_view bigint;
BEGIN
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    SELECT coalesce(sum(s.doc_count), 0) INTO space_size
    FROM relationship_search_stats s
    WHERE s.team_id = p_team AND s.space_id = p_space;

    IF space_size >= p_exact_below THEN
        ef := evidence_vector_ef(space_size, p_limit);
        PERFORM set_config('hnsw.ef_search', ef::text, true);
        PERFORM set_config('hnsw.max_scan_tuples', greatest(ef * 4, space_size / 10)::text, true);
        -- A space never reset holds no row of another generation: walk it
        -- unfiltered, then check the walked rows. (After a reset the older
        -- generation's rows stay, and may be the nearest: the filtered walk.)
        IF p_generation = 1 THEN
            -- The walk: planned for this space's partition, sorts disabled (the
            -- index's ordered scan is then the only plan without a disabled node).
            PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
            PERFORM set_config('enable_sort', 'off', true);
            SELECT array_agg(w.relationship_id), array_agg(w.distance)
            INTO walked_ids, walked_distances
            FROM (
                SELECT re.relationship_id::text AS relationship_id,
                       re.embedding <=> p_query AS distance
                FROM relationship_embeddings re
                WHERE re.team_id = p_team AND re.space_id = p_space
                  AND re.projection_generation = p_projection
                ORDER BY re.embedding <=> p_query
                -- relaxed_order returns rows only roughly by distance: take ef of
                -- them (not just the limit), so that a near row returned a little
                -- late is not cut off, then sort them all and keep the nearest.
                LIMIT ef
            ) w;
            PERFORM set_config('enable_sort', 'on', true);
            PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
            -- Every walked row in the view? One statement over their IDs.
            SELECT count(*) INTO in_view
            FROM relationships r
            WHERE r.team_id = p_team AND r.space_id = p_space
              AND r.id = ANY (walked_ids)
              AND r.generation = p_generation
              AND r.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz);
        END IF;
        IF p_generation <> 1 OR in_view < coalesce(cardinality(walked_ids), 0) THEN
            -- Some are not (or a reset space): the filtered walk of db/0075, pinned likewise.
            PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
            PERFORM set_config('enable_sort', 'off', true);
            SELECT array_agg(w.relationship_id), array_agg(w.distance)
            INTO walked_ids, walked_distances
            FROM (
                SELECT re.relationship_id::text AS relationship_id,
                       re.embedding <=> p_query AS distance
                FROM relationship_embeddings re
                WHERE re.team_id = p_team AND re.space_id = p_space
                  AND re.projection_generation = p_projection
                  AND (SELECT r.generation = p_generation
                              AND r.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
                       FROM relationships r
                       WHERE r.team_id = p_team AND r.space_id = p_space
                         AND r.id = re.relationship_id) IS TRUE
                ORDER BY re.embedding <=> p_query
                LIMIT ef
            ) w;
            PERFORM set_config('enable_sort', 'on', true);
            PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
        END IF;
        IF coalesce(cardinality(walked_ids), 0) >= p_limit THEN
            RETURN QUERY
            SELECT a.relationship_id, a.distance
            FROM unnest(walked_ids, walked_distances) AS a (relationship_id, distance)
            ORDER BY a.distance, a.relationship_id COLLATE "C"
            LIMIT p_limit;
            RETURN;
        END IF;
        -- Short: fall through to the exact scan.
    END IF;

    -- The exact scan reads the partitioned table: planned for this call's space.
    PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    RETURN QUERY
    WITH scored AS MATERIALIZED (
        -- Materialised: no index can stand in for this full, exact ordering.
        SELECT re.relationship_id::text AS relationship_id,
               re.embedding <=> p_query AS distance
        FROM relationship_embeddings re
        WHERE re.team_id = p_team AND re.space_id = p_space
          AND re.projection_generation = p_projection
    )
    SELECT o.relationship_id, o.distance
    FROM (
        SELECT sc.relationship_id, sc.distance
        FROM scored sc
        ORDER BY sc.distance, sc.relationship_id COLLATE "C"
        OFFSET 0  -- keeps the filter above the sort: checked in order, until the limit
    ) o
    WHERE (SELECT r.generation = p_generation
                  AND r.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
           FROM relationships r
           WHERE r.team_id = p_team AND r.space_id = p_space
             AND r.id = o.relationship_id) IS TRUE
    LIMIT p_limit;
END $$;
