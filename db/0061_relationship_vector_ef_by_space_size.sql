-- Relationship discovery's vector list walks the graph with the ef_search rule
-- of the evidence list (db/0060): max(2 * limit, 100, space size / 100), at
-- most 1000.
--
-- relationship_vector_candidates (db/0003, not redefined since: db/0042 added
-- the separate knownAt function, which scans exactly) still used
-- max(2 * limit, 100) whatever the space's size. A relationship space's HNSW
-- graph loses recall as it grows exactly as an evidence space's does (the same
-- index: m = 16, ef_construction = 64, one partition per space), so the same
-- rule applies; evidence_vector_ef is reused rather than the rule copied, so
-- that the two lists cannot drift apart. The function is restated whole from
-- db/0003 with only the ef line changed: the signature, the exact path under
-- p_exact_below, the projection filter and the settings are unchanged. Spaces
-- under the exact-search bound and spaces up to 10,000 relationships get the
-- same answer as before.

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
AS $$
DECLARE
    space_size bigint;
    ef integer;
BEGIN
    SELECT coalesce(sum(s.doc_count), 0) INTO space_size
    FROM relationship_search_stats s
    WHERE s.team_id = p_team AND s.space_id = p_space;

    IF space_size < p_exact_below THEN
        RETURN QUERY
        WITH scored AS MATERIALIZED (
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
            OFFSET 0
        ) o
        WHERE (SELECT r.generation = p_generation
                      AND r.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
               FROM relationships r
               WHERE r.team_id = p_team AND r.space_id = p_space
                 AND r.id = o.relationship_id) IS TRUE
        LIMIT p_limit;
    ELSE
        ef := evidence_vector_ef(space_size, p_limit);
        PERFORM set_config('hnsw.ef_search', ef::text, true);
        RETURN QUERY
        SELECT x.relationship_id, x.distance
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
        ) x
        ORDER BY x.distance, x.relationship_id COLLATE "C"
        LIMIT p_limit;
    END IF;
END $$;
