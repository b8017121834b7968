-- Relationship discovery's vector list gets the two guards of the evidence
-- list: the whole graph walk is sorted before the limit, and a short walk is
-- answered by the exact scan.
--
-- relationship_vector_candidates (db/0003, restated by db/0061) had two
-- defects that evidence_vector_candidates has not had since db/0006:
--
-- 1. Its final `ORDER BY distance, id LIMIT p_limit` over the walk's
--    `ORDER BY embedding <=> query LIMIT ef` was planned as an incremental
--    sort on the index's order: it reads the walk until it holds p_limit rows
--    and the next distance differs, so it stopped the walk after p_limit + 1
--    rows whatever the ef. With hnsw.iterative_scan = relaxed_order the index
--    returns rows only roughly by distance (a later batch of the iterative
--    scan can hold a nearer row than an earlier one), so a nearer row handed
--    over late was cut off, and the ef rule of db/0061 widened a walk that was
--    never read to its end. Now, as in the evidence function, the walk's ef
--    rows are collected into arrays by array_agg(... ORDER BY distance, id),
--    and the nearest p_limit are taken from the sorted arrays; and the
--    function sets enable_incremental_sort = off. Without it PostgreSQL 18
--    still trusts the index's order under the aggregate (a presorted
--    aggregate fed by an incremental sort with the distance as presorted key,
--    seen in EXPLAIN): it reads all ef rows but sorts them only in batches of
--    about 32, so a nearer row handed over a batch late stays behind. With it
--    the plan is a full Sort of the ef rows below the aggregate.
--    tests/test_relationship_vectors.py shows the walk handing over its ef
--    rows with the planner's default settings (11 before) and the setting in
--    force; db/0076 gives the evidence function the same setting.
--
-- 2. When the walk came back with fewer than p_limit eligible rows (the
--    nearest vectors nearly all filtered out: relationships of an older
--    generation after a reset, recorded after the view's system time, or
--    vectors of another projection generation), the list was silently short
--    although the space held more eligible relationships. Now, with the rule
--    of the evidence list (db/0006), the walk's answer is kept only when it is
--    full; otherwise the exact scan that small spaces use answers instead,
--    which is complete by construction. And the walk is capped as the evidence
--    walk is, at hnsw.max_scan_tuples = max(4 * ef_search, space size / 10)
--    visited vectors, past which the exact scan is cheaper than walking on (a
--    walk that reaches the cap still returns what it has seen, and the
--    fallback completes a short one).
--
-- Unchanged: the signature (the callers, gateway/store/related.py, are the
-- same), the ef rule (evidence_vector_ef, db/0060), the exact path under
-- p_exact_below and the filters (the team's active projection generation, the
-- space's generation, system time).

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
AS $$
DECLARE
    space_size bigint;
    ef integer;
    approx_ids text[];
    approx_distances double precision[];
BEGIN
    SELECT coalesce(sum(s.doc_count), 0) INTO space_size
    FROM relationship_search_stats s
    WHERE s.team_id = p_team AND s.space_id = p_space;

    IF space_size >= p_exact_below THEN
        ef := evidence_vector_ef(space_size, p_limit);
        PERFORM set_config('hnsw.ef_search', ef::text, true);
        PERFORM set_config('hnsw.max_scan_tuples', greatest(ef * 4, space_size / 10)::text, true);
        SELECT array_agg(w.relationship_id ORDER BY w.distance, w.relationship_id COLLATE "C"),
               array_agg(w.distance ORDER BY w.distance, w.relationship_id COLLATE "C")
        INTO approx_ids, approx_distances
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
            -- relaxed_order returns rows only roughly by distance: take ef of
            -- them (not just the limit), so that a near row returned a little
            -- late is not cut off, then sort them all and keep the nearest.
            LIMIT ef
        ) w;
        IF coalesce(cardinality(approx_ids), 0) >= p_limit THEN
            RETURN QUERY
            SELECT a.relationship_id, a.distance
            FROM unnest(approx_ids, approx_distances)
                 WITH ORDINALITY AS a (relationship_id, distance, n)
            ORDER BY a.n
            LIMIT p_limit;
            RETURN;
        END IF;
        -- Short: fall through to the exact scan.
    END IF;

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
