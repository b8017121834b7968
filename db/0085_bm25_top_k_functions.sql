-- The exact BM25 top-k of both full-text lists as server-side functions,
-- reading only the postings of the query's essential lexemes (MaxScore).
--
-- gateway/store/bm25.py explains the algorithm and why the list is the one of
-- scoring every hit; this file holds its SQL. Two reasons for functions:
--
-- 1. Planning. The statement has a dozen stages (a floor from the rarest
--    lexemes, the essential lexemes, the grouping, a better floor, the
--    survivors); sent as part of the candidate statement it was planned on
--    every recall, 4 to 6 ms more than the single grouping it replaces
--    (EXPLAIN ANALYZE, 100,000-evidence benchmark, 20 questions). A PL/pgSQL
--    function's query is prepared once per connection, and with
--    plan_cache_mode = force_generic_plan its plan is built once: its shape is
--    fixed by the LATERAL ... OFFSET 0 fences whatever the parameters. One
--    plan for the connection's life (until an ANALYZE of a table it reads)
--    must not depend on how big the tables were when it was made: a plan
--    built while the store was nearly empty chose sequential scans of
--    `evidence` for the per-document lookups (seen in the test suite), which
--    on a large store would read the whole table per hit. Every access here is
--    meant to go through a primary key, so enable_seqscan = off (local to the
--    function) keeps the planner on the indexes whatever the statistics.
-- 2. The caller's statement stays one round trip: the function is called in
--    it, once per branch, like the vector list's function (db/0002).
--
-- Inputs: the query's lexemes present in the space with their IDF, document
-- frequency and largest term frequency (the caller computes them from the
-- present statistics or from those of a knownAt instant, as before), the
-- space's average document length, the view (generation, system time,
-- exclusions) and the list's length. p_prune_from: the number of postings of
-- the query's lexemes from which the first floor is computed at all; below it
-- every lexeme is essential and the function groups all postings, as the
-- statement before it did.
--
-- SECURITY INVOKER (the default): it reads as the caller, under row-level
-- security, and names the team and space in every predicate. The score is the
-- expression of gateway/store/bm25.py before this change, over each document's
-- (IDF, tf) pairs in lexeme order, so that equal documents tie exactly and the
-- lists are the same to the last bit.

CREATE FUNCTION evidence_fulltext_top_k(
    p_team text,
    p_space uuid,
    p_generation integer,
    p_known_at timestamptz,
    p_exclude text[],
    p_limit integer,
    p_prune_from bigint,
    p_lexemes text[],
    p_idfs double precision[],
    p_dfs double precision[],
    p_max_tfs integer[],
    p_avgdl double precision
) RETURNS TABLE (doc_id text, rank bigint)
    LANGUAGE plpgsql STABLE
    SET search_path = public, pg_temp
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH lex AS MATERIALIZED (
        -- Per lexeme its bound ub (the term part at dl = 0 with its largest tf:
        -- never below its contribution to a document) and upto, the sum of the
        -- bounds of the lexemes up to it in bound order.
        SELECT l.lexeme, l.idf, l.df,
               sum(l.ub) OVER (ORDER BY l.ub, l.lexeme COLLATE "C" ROWS UNBOUNDED PRECEDING) AS upto
        FROM (
            SELECT u.lexeme, u.idf, u.df,
                   greatest(u.idf, 0) * u.max_tf::double precision * (CAST(0.9 AS double precision) + 1)
                   / (u.max_tf::double precision + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision))) AS ub
            FROM unnest(p_lexemes, p_idfs, p_dfs, p_max_tfs) AS u (lexeme, idf, df, max_tf)
        ) l
    ),
    -- 1. With many postings, a first floor: the exact scores of the first 2 k
    -- visible hits of the rarest lexemes.
    seed AS MATERIALIZED (
        SELECT DISTINCT s.doc_id
        FROM (
            SELECT g.doc_id
            FROM (SELECT l.lexeme FROM lex l ORDER BY l.df, l.lexeme COLLATE "C" OFFSET 0) r
            CROSS JOIN LATERAL (
                SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
                FROM evidence_terms p
                WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
                OFFSET 0
            ) g
            CROSS JOIN LATERAL (
                SELECT 1 FROM evidence d
                WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
                  AND d.generation = p_generation
                  AND d.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
                  AND NOT (d.id = ANY (p_exclude))
                OFFSET 0
            ) v
            LIMIT 2 * p_limit
        ) s
    ),
    seed_scores AS (
        SELECT g.doc_id,
               (SELECT sum(u.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / g.avgdl)))
                FROM unnest(g.idfs, g.tfs) AS u (idf, tf)) AS score
        FROM (
            SELECT t.doc_id, array_agg(t.idf ORDER BY t.lexeme COLLATE "C") AS idfs,
                   array_agg(t.tf ORDER BY t.lexeme COLLATE "C") AS tfs, p_avgdl AS avgdl
            FROM (SELECT h.doc_id, l.lexeme, l.idf, h.tf
        FROM lex l
        CROSS JOIN LATERAL (
            SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
            FROM evidence_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
              AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM seed o))
            OFFSET 0
        ) h) t
            GROUP BY t.doc_id
        ) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length FROM evidence d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
              AND NOT (d.id = ANY (p_exclude))
            OFFSET 0
        ) d
    ),
    -- Their k-th best score, lowered by a relative 1e-9 against rounding; minus
    -- infinity with few postings (every lexeme essential) or fewer than k hits.
    theta0 AS MATERIALIZED (
        SELECT CASE WHEN (SELECT sum(l.df) FROM lex l) >= p_prune_from
                    THEN coalesce((SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM seed_scores v ORDER BY 1 DESC LIMIT p_limit) k),
                                  '-infinity'::double precision)
                    ELSE '-infinity'::double precision END AS v
    ),
    -- 2. The lexemes in bound order: the prefix whose bounds sum below the floor
    -- is minor (non-essential); rest: what those can add to a document, at most.
    ranked AS MATERIALIZED (
        SELECT l.lexeme, l.idf, l.upto < (SELECT t.v FROM theta0 t) AS minor FROM lex l
    ),
    rest AS MATERIALIZED (
        SELECT coalesce(max(l.upto) FILTER (WHERE l.upto < (SELECT t.v FROM theta0 t)), 0) AS v
        FROM lex l
    ),
    -- 3. The essential lexemes' postings grouped per document with the bound of
    -- their term parts at dl = 0; kept when that plus the rest reaches the floor.
    grp AS MATERIALIZED (
        SELECT h.doc_id,
               sum(greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)))) AS part,
               array_agg(r.lexeme) AS lexemes, array_agg(r.idf) AS idfs, array_agg(h.tf) AS tfs
        FROM ranked r
        CROSS JOIN LATERAL (
            SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
            FROM evidence_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
            OFFSET 0
        ) h
        WHERE NOT r.minor
        GROUP BY h.doc_id
        HAVING sum(greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision))))
               + (SELECT r.v FROM rest r) >= (SELECT t.v FROM theta0 t)
    ),
    -- The floor theta: the k-th best score of the 2 k documents of highest
    -- bound (their minor lexemes' tf read back); when fewer than k of those are
    -- visible (a view hiding most of the best bounds), of the first 2 k visible
    -- ones in bound order.
    best AS MATERIALIZED (
        SELECT * FROM grp g ORDER BY g.part DESC, g.doc_id COLLATE "C" LIMIT 2 * p_limit
    ),
    best_scores AS (
        SELECT g.doc_id,
               (SELECT sum(u.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / g.avgdl)))
                FROM unnest(g.idfs, g.tfs) AS u (idf, tf)) AS score
        FROM (
            SELECT t.doc_id, array_agg(t.idf ORDER BY t.lexeme COLLATE "C") AS idfs,
                   array_agg(t.tf ORDER BY t.lexeme COLLATE "C") AS tfs, p_avgdl AS avgdl
            FROM (SELECT c.doc_id, u.lexeme, u.idf, u.tf
        FROM best c
        CROSS JOIN LATERAL unnest(c.lexemes, c.idfs, c.tfs) AS u (lexeme, idf, tf)
        UNION ALL
        SELECT h.doc_id, r.lexeme, r.idf, h.tf
        FROM ranked r
        CROSS JOIN LATERAL (
            SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
            FROM evidence_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
              AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM best o))
            OFFSET 0
        ) h
        WHERE r.minor) t
            GROUP BY t.doc_id
        ) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length FROM evidence d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
              AND NOT (d.id = ANY (p_exclude))
            OFFSET 0
        ) d
    ),
    best_visible AS MATERIALIZED (
        SELECT g.doc_id
        FROM (
            SELECT g.doc_id, g.part FROM grp g
            ORDER BY g.part DESC, g.doc_id COLLATE "C" OFFSET 0
        ) g
        CROSS JOIN LATERAL (
            SELECT 1 FROM evidence d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
              AND NOT (d.id = ANY (p_exclude))
            OFFSET 0
        ) v
        LIMIT 2 * p_limit
    ),
    best_visible_scores AS (
        SELECT g.doc_id,
               (SELECT sum(u.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / g.avgdl)))
                FROM unnest(g.idfs, g.tfs) AS u (idf, tf)) AS score
        FROM (
            SELECT t.doc_id, array_agg(t.idf ORDER BY t.lexeme COLLATE "C") AS idfs,
                   array_agg(t.tf ORDER BY t.lexeme COLLATE "C") AS tfs, p_avgdl AS avgdl
            FROM (SELECT h.doc_id, l.lexeme, l.idf, h.tf
        FROM lex l
        CROSS JOIN LATERAL (
            SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
            FROM evidence_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
              AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM best_visible o))
            OFFSET 0
        ) h) t
            GROUP BY t.doc_id
        ) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length FROM evidence d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
              AND NOT (d.id = ANY (p_exclude))
            OFFSET 0
        ) d
    ),
    theta AS MATERIALIZED (
        SELECT greatest((SELECT t.v FROM theta0 t),
                        coalesce((SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM best_scores v ORDER BY 1 DESC LIMIT p_limit) k),
                                 (SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM best_visible_scores v ORDER BY 1 DESC LIMIT p_limit) k))) AS v
    ),
    -- 4. The documents whose bound can still reach theta, completed with their
    -- minor lexemes, kept when their whole bound does, and scored exactly.
    surv AS MATERIALIZED (
        SELECT g.* FROM grp g WHERE g.part + (SELECT r.v FROM rest r) >= (SELECT t.v FROM theta t)
    ),
    scored AS (
        SELECT g.doc_id,
               (SELECT sum(u.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / g.avgdl)))
                FROM unnest(g.idfs, g.tfs) AS u (idf, tf)) AS score
        FROM (
            SELECT t.doc_id, array_agg(t.idf ORDER BY t.lexeme COLLATE "C") AS idfs,
                   array_agg(t.tf ORDER BY t.lexeme COLLATE "C") AS tfs, p_avgdl AS avgdl
            FROM (SELECT c.doc_id, u.lexeme, u.idf, u.tf
        FROM surv c
        CROSS JOIN LATERAL unnest(c.lexemes, c.idfs, c.tfs) AS u (lexeme, idf, tf)
        UNION ALL
        SELECT h.doc_id, r.lexeme, r.idf, h.tf
        FROM ranked r
        CROSS JOIN LATERAL (
            SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
            FROM evidence_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
              AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM surv o))
            OFFSET 0
        ) h
        WHERE r.minor) t
            GROUP BY t.doc_id
            HAVING sum(greatest(t.idf, 0) * t.tf * (CAST(0.9 AS double precision) + 1)
                   / (t.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision))))
                   >= (SELECT th.v FROM theta th)
        ) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length FROM evidence d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
              AND NOT (d.id = ANY (p_exclude))
            OFFSET 0
        ) d
    )
    SELECT h.doc_id, row_number() OVER (ORDER BY h.score DESC, h.doc_id COLLATE "C") AS rank
    FROM scored h
    ORDER BY h.score DESC, h.doc_id COLLATE "C"
    LIMIT p_limit;
END $$;

CREATE FUNCTION relationship_fulltext_top_k(
    p_team text,
    p_space uuid,
    p_generation integer,
    p_t_sys timestamptz,
    p_limit integer,
    p_prune_from bigint,
    p_lexemes text[],
    p_idfs double precision[],
    p_dfs double precision[],
    p_max_tfs integer[],
    p_avgdl double precision
) RETURNS TABLE (doc_id text, rank bigint)
    LANGUAGE plpgsql STABLE
    SET search_path = public, pg_temp
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH lex AS MATERIALIZED (
        -- Per lexeme its bound ub (the term part at dl = 0 with its largest tf:
        -- never below its contribution to a document) and upto, the sum of the
        -- bounds of the lexemes up to it in bound order.
        SELECT l.lexeme, l.idf, l.df,
               sum(l.ub) OVER (ORDER BY l.ub, l.lexeme COLLATE "C" ROWS UNBOUNDED PRECEDING) AS upto
        FROM (
            SELECT u.lexeme, u.idf, u.df,
                   greatest(u.idf, 0) * u.max_tf::double precision * (CAST(0.9 AS double precision) + 1)
                   / (u.max_tf::double precision + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision))) AS ub
            FROM unnest(p_lexemes, p_idfs, p_dfs, p_max_tfs) AS u (lexeme, idf, df, max_tf)
        ) l
    ),
    -- 1. With many postings, a first floor: the exact scores of the first 2 k
    -- visible hits of the rarest lexemes.
    seed AS MATERIALIZED (
        SELECT DISTINCT s.doc_id
        FROM (
            SELECT g.doc_id
            FROM (SELECT l.lexeme FROM lex l ORDER BY l.df, l.lexeme COLLATE "C" OFFSET 0) r
            CROSS JOIN LATERAL (
                SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
                FROM relationship_terms p
                WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
                OFFSET 0
            ) g
            CROSS JOIN LATERAL (
                SELECT 1 FROM relationships d
                WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
                  AND d.generation = p_generation
                  AND d.recorded_at <= p_t_sys
                OFFSET 0
            ) v
            LIMIT 2 * p_limit
        ) s
    ),
    seed_scores AS (
        SELECT g.doc_id,
               (SELECT sum(u.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / g.avgdl)))
                FROM unnest(g.idfs, g.tfs) AS u (idf, tf)) AS score
        FROM (
            SELECT t.doc_id, array_agg(t.idf ORDER BY t.lexeme COLLATE "C") AS idfs,
                   array_agg(t.tf ORDER BY t.lexeme COLLATE "C") AS tfs, p_avgdl AS avgdl
            FROM (SELECT h.doc_id, l.lexeme, l.idf, h.tf
        FROM lex l
        CROSS JOIN LATERAL (
            SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
            FROM relationship_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
              AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM seed o))
            OFFSET 0
        ) h) t
            GROUP BY t.doc_id
        ) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length FROM relationships d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= p_t_sys
            OFFSET 0
        ) d
    ),
    -- Their k-th best score, lowered by a relative 1e-9 against rounding; minus
    -- infinity with few postings (every lexeme essential) or fewer than k hits.
    theta0 AS MATERIALIZED (
        SELECT CASE WHEN (SELECT sum(l.df) FROM lex l) >= p_prune_from
                    THEN coalesce((SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM seed_scores v ORDER BY 1 DESC LIMIT p_limit) k),
                                  '-infinity'::double precision)
                    ELSE '-infinity'::double precision END AS v
    ),
    -- 2. The lexemes in bound order: the prefix whose bounds sum below the floor
    -- is minor (non-essential); rest: what those can add to a document, at most.
    ranked AS MATERIALIZED (
        SELECT l.lexeme, l.idf, l.upto < (SELECT t.v FROM theta0 t) AS minor FROM lex l
    ),
    rest AS MATERIALIZED (
        SELECT coalesce(max(l.upto) FILTER (WHERE l.upto < (SELECT t.v FROM theta0 t)), 0) AS v
        FROM lex l
    ),
    -- 3. The essential lexemes' postings grouped per document with the bound of
    -- their term parts at dl = 0; kept when that plus the rest reaches the floor.
    grp AS MATERIALIZED (
        SELECT h.doc_id,
               sum(greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)))) AS part,
               array_agg(r.lexeme) AS lexemes, array_agg(r.idf) AS idfs, array_agg(h.tf) AS tfs
        FROM ranked r
        CROSS JOIN LATERAL (
            SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
            FROM relationship_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
            OFFSET 0
        ) h
        WHERE NOT r.minor
        GROUP BY h.doc_id
        HAVING sum(greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision))))
               + (SELECT r.v FROM rest r) >= (SELECT t.v FROM theta0 t)
    ),
    -- The floor theta: the k-th best score of the 2 k documents of highest
    -- bound (their minor lexemes' tf read back); when fewer than k of those are
    -- visible (a view hiding most of the best bounds), of the first 2 k visible
    -- ones in bound order.
    best AS MATERIALIZED (
        SELECT * FROM grp g ORDER BY g.part DESC, g.doc_id COLLATE "C" LIMIT 2 * p_limit
    ),
    best_scores AS (
        SELECT g.doc_id,
               (SELECT sum(u.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / g.avgdl)))
                FROM unnest(g.idfs, g.tfs) AS u (idf, tf)) AS score
        FROM (
            SELECT t.doc_id, array_agg(t.idf ORDER BY t.lexeme COLLATE "C") AS idfs,
                   array_agg(t.tf ORDER BY t.lexeme COLLATE "C") AS tfs, p_avgdl AS avgdl
            FROM (SELECT c.doc_id, u.lexeme, u.idf, u.tf
        FROM best c
        CROSS JOIN LATERAL unnest(c.lexemes, c.idfs, c.tfs) AS u (lexeme, idf, tf)
        UNION ALL
        SELECT h.doc_id, r.lexeme, r.idf, h.tf
        FROM ranked r
        CROSS JOIN LATERAL (
            SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
            FROM relationship_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
              AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM best o))
            OFFSET 0
        ) h
        WHERE r.minor) t
            GROUP BY t.doc_id
        ) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length FROM relationships d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= p_t_sys
            OFFSET 0
        ) d
    ),
    best_visible AS MATERIALIZED (
        SELECT g.doc_id
        FROM (
            SELECT g.doc_id, g.part FROM grp g
            ORDER BY g.part DESC, g.doc_id COLLATE "C" OFFSET 0
        ) g
        CROSS JOIN LATERAL (
            SELECT 1 FROM relationships d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= p_t_sys
            OFFSET 0
        ) v
        LIMIT 2 * p_limit
    ),
    best_visible_scores AS (
        SELECT g.doc_id,
               (SELECT sum(u.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / g.avgdl)))
                FROM unnest(g.idfs, g.tfs) AS u (idf, tf)) AS score
        FROM (
            SELECT t.doc_id, array_agg(t.idf ORDER BY t.lexeme COLLATE "C") AS idfs,
                   array_agg(t.tf ORDER BY t.lexeme COLLATE "C") AS tfs, p_avgdl AS avgdl
            FROM (SELECT h.doc_id, l.lexeme, l.idf, h.tf
        FROM lex l
        CROSS JOIN LATERAL (
            SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
            FROM relationship_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
              AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM best_visible o))
            OFFSET 0
        ) h) t
            GROUP BY t.doc_id
        ) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length FROM relationships d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= p_t_sys
            OFFSET 0
        ) d
    ),
    theta AS MATERIALIZED (
        SELECT greatest((SELECT t.v FROM theta0 t),
                        coalesce((SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM best_scores v ORDER BY 1 DESC LIMIT p_limit) k),
                                 (SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM best_visible_scores v ORDER BY 1 DESC LIMIT p_limit) k))) AS v
    ),
    -- 4. The documents whose bound can still reach theta, completed with their
    -- minor lexemes, kept when their whole bound does, and scored exactly.
    surv AS MATERIALIZED (
        SELECT g.* FROM grp g WHERE g.part + (SELECT r.v FROM rest r) >= (SELECT t.v FROM theta t)
    ),
    scored AS (
        SELECT g.doc_id,
               (SELECT sum(u.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / g.avgdl)))
                FROM unnest(g.idfs, g.tfs) AS u (idf, tf)) AS score
        FROM (
            SELECT t.doc_id, array_agg(t.idf ORDER BY t.lexeme COLLATE "C") AS idfs,
                   array_agg(t.tf ORDER BY t.lexeme COLLATE "C") AS tfs, p_avgdl AS avgdl
            FROM (SELECT c.doc_id, u.lexeme, u.idf, u.tf
        FROM surv c
        CROSS JOIN LATERAL unnest(c.lexemes, c.idfs, c.tfs) AS u (lexeme, idf, tf)
        UNION ALL
        SELECT h.doc_id, r.lexeme, r.idf, h.tf
        FROM ranked r
        CROSS JOIN LATERAL (
            SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
            FROM relationship_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
              AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM surv o))
            OFFSET 0
        ) h
        WHERE r.minor) t
            GROUP BY t.doc_id
            HAVING sum(greatest(t.idf, 0) * t.tf * (CAST(0.9 AS double precision) + 1)
                   / (t.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision))))
                   >= (SELECT th.v FROM theta th)
        ) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length FROM relationships d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= p_t_sys
            OFFSET 0
        ) d
    )
    SELECT h.doc_id, row_number() OVER (ORDER BY h.score DESC, h.doc_id COLLATE "C") AS rank
    FROM scored h
    ORDER BY h.score DESC, h.doc_id COLLATE "C"
    LIMIT p_limit;
END $$;
