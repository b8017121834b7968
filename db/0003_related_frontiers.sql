-- Related relationships and communities (recallMemory, part 2):
--   1. BM25 postings and statistics for relationship statements, the same
--      approach as evidence (db/0002), so that the lexical list of relationship
--      discovery ranks like BM25 and fuses well with the vector list;
--   2. relationship_vector_candidates: nearest relationship vectors of one
--      space, for one projection generation only;
--   3. a change counter of each space's relationship graph, so that a
--      community snapshot can tell whether the graph changed since it was built.

-- ---------------------------------------------------------------------------
-- 1. BM25 over relationship statements
-- ---------------------------------------------------------------------------

-- The statement's length in lexeme occurrences (BM25's document length).
ALTER TABLE relationships
    ADD COLUMN doc_length integer NOT NULL
        GENERATED ALWAYS AS (tsvector_token_count(to_tsvector('english'::regconfig, statement))) STORED;

CREATE TABLE relationship_terms (
    team_id         client_id NOT NULL,
    space_id        uuid NOT NULL,
    lexeme          text NOT NULL,
    relationship_id client_id NOT NULL,
    tf              integer NOT NULL CHECK (tf >= 1),
    PRIMARY KEY (team_id, space_id, lexeme, relationship_id),
    FOREIGN KEY (team_id, space_id, relationship_id) REFERENCES relationships (team_id, space_id, id)
);

CREATE FUNCTION relationship_terms_fill() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO relationship_terms (team_id, space_id, lexeme, relationship_id, tf)
    SELECT NEW.team_id, NEW.space_id, u.lexeme, NEW.id, coalesce(array_length(u.positions, 1), 1)
    FROM unnest(NEW.search_document) AS u;
    RETURN NULL;
END $$;
CREATE TRIGGER relationship_terms_fill AFTER INSERT ON relationships
    FOR EACH ROW EXECUTE FUNCTION relationship_terms_fill();

INSERT INTO relationship_terms (team_id, space_id, lexeme, relationship_id, tf)
SELECT r.team_id, r.space_id, u.lexeme, r.id, coalesce(array_length(u.positions, 1), 1)
FROM relationships r CROSS JOIN LATERAL unnest(r.search_document) AS u;

-- N and total length per space, in up to 8 shard rows (see evidence_search_stats).
CREATE TABLE relationship_search_stats (
    team_id      client_id NOT NULL,
    space_id     uuid NOT NULL,
    shard        smallint NOT NULL CHECK (shard BETWEEN 0 AND 7),
    doc_count    bigint NOT NULL CHECK (doc_count >= 0),
    total_length bigint NOT NULL CHECK (total_length >= 0),
    PRIMARY KEY (team_id, space_id, shard),
    FOREIGN KEY (team_id, space_id) REFERENCES memory_spaces (team_id, id)
);

CREATE FUNCTION relationship_search_stats_add() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO relationship_search_stats AS s (team_id, space_id, shard, doc_count, total_length)
    SELECT n.team_id, n.space_id, (pg_backend_pid() % 8)::smallint, count(*), sum(n.doc_length)
    FROM new_relationships n
    GROUP BY n.team_id, n.space_id
    ORDER BY n.team_id, n.space_id
    ON CONFLICT (team_id, space_id, shard) DO UPDATE
        SET doc_count = s.doc_count + excluded.doc_count,
            total_length = s.total_length + excluded.total_length;
    RETURN NULL;
END $$;
CREATE TRIGGER relationship_search_stats_add AFTER INSERT ON relationships
    REFERENCING NEW TABLE AS new_relationships
    FOR EACH STATEMENT EXECUTE FUNCTION relationship_search_stats_add();

INSERT INTO relationship_search_stats (team_id, space_id, shard, doc_count, total_length)
SELECT r.team_id, r.space_id, 0, count(*), sum(r.doc_length)
FROM relationships r
GROUP BY r.team_id, r.space_id;

-- Relationship filters of the candidate lists (space, generation, system time)
-- and the document length, index-only.
CREATE INDEX relationships_search_filter ON relationships (team_id, space_id, id)
    INCLUDE (generation, recorded_at, doc_length, semantic_group_key);

-- ---------------------------------------------------------------------------
-- 2. Relationship vector candidates of one space and one projection generation
-- ---------------------------------------------------------------------------
--
-- The same shape as evidence_vector_candidates (db/0002) and for the same
-- reasons (settings in force before planning, custom plans pruned to the
-- space's partition, exact scan below p_exact_below relationships, else the
-- partition's HNSW index with an iterative scan). Only vectors of
-- p_projection, the team's active projection generation, are candidates:
-- vectors of a generation that is building or failed are never searched.
CREATE FUNCTION relationship_vector_candidates(
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
        ef := least(greatest(p_limit * 2, 100), 1000);
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

-- ---------------------------------------------------------------------------
-- 3. Change counter of each space's relationship graph
-- ---------------------------------------------------------------------------
--
-- A community snapshot is built from the relationships that are eligible at
-- build time and their supports. Every write that can change that graph
-- (a relationship, a status transition, a support or support decision, an
-- evidence or source lifecycle event, a conflict case event, a space reset)
-- adds to this counter, per space, in the writing transaction. A run records
-- the counter's value it read in its own snapshot; a recall compares it with
-- the current value. A counter, not a timestamp: recorded_at is the writing
-- transaction's start time, so a transaction that began before a build and
-- committed after it would carry an older timestamp than the build and look
-- already included. Up to 8 shard rows per space so that concurrent writers
-- do not queue on one row; readers sum them.
CREATE TABLE graph_change_counters (
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    shard       smallint NOT NULL CHECK (shard BETWEEN 0 AND 7),
    changes     bigint NOT NULL CHECK (changes >= 0),
    changed_at  timestamptz NOT NULL,
    PRIMARY KEY (team_id, space_id, shard),
    FOREIGN KEY (team_id, space_id) REFERENCES memory_spaces (team_id, id)
);

CREATE FUNCTION graph_change_counters_add() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO graph_change_counters AS c (team_id, space_id, shard, changes, changed_at)
    SELECT n.team_id, n.space_id, (pg_backend_pid() % 8)::smallint, count(*), now()
    FROM changed_rows n
    GROUP BY n.team_id, n.space_id
    ORDER BY n.team_id, n.space_id
    ON CONFLICT (team_id, space_id, shard) DO UPDATE
        SET changes = c.changes + excluded.changes,
            changed_at = greatest(c.changed_at, excluded.changed_at);
    RETURN NULL;
END $$;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY[
        'relationships', 'relationship_status_events', 'supports', 'support_decisions',
        'evidence_lifecycle_events', 'source_lifecycle_events', 'conflict_case_events',
        'conflict_position_relationships', 'space_generations'] LOOP
        EXECUTE format(
            'CREATE TRIGGER graph_change_counters_add AFTER INSERT ON %I '
            'REFERENCING NEW TABLE AS changed_rows '
            'FOR EACH STATEMENT EXECUTE FUNCTION graph_change_counters_add()', t);
    END LOOP;
END $$;

-- What a run was built from, beyond the fingerprint and watermark of 0001:
-- graph_changes is the counter above at build time; valid_until is the next
-- instant at which a relationship's validity starts or ends (the graph of the
-- current view changes then without any write).
ALTER TABLE community_runs
    ADD COLUMN graph_changes bigint,
    ADD COLUMN valid_until timestamptz;
CREATE INDEX community_members_group
    ON community_members (team_id, run_id, semantic_group_key);

-- ---------------------------------------------------------------------------
-- Row-level security for the new tables
-- ---------------------------------------------------------------------------

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['relationship_terms', 'relationship_search_stats',
                             'graph_change_counters'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY space_wall ON %I TO recall_app '
            'USING (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces())) '
            'WITH CHECK (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces()))',
            t);
    END LOOP;
END $$;
-- Postings are written by whoever writes the relationship (as for evidence_terms);
-- statistics and counters only by their SECURITY DEFINER triggers.
GRANT SELECT, INSERT ON relationship_terms TO recall_app;
GRANT SELECT ON relationship_search_stats, graph_change_counters TO recall_app;
GRANT UPDATE (graph_changes, valid_until) ON community_runs TO recall_app;
