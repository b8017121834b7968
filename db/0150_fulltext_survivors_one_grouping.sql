-- The full-text functions' survivors' whole bound in one grouping, not a join.
--
-- On the path of large spaces (from PRUNE_FROM_POSTINGS postings of the query's
-- lexemes on: every question of a space of 100,000 evidence), the step `whole`
-- of db/0105 keeps the survivors whose bound plus their minor lexemes' term
-- parts reaches theta. It was written as a LEFT JOIN of the survivors with
-- those parts grouped per document. In the generic plan the functions keep
-- (both sides estimated at a few rows, as every CTE of the function is), that
-- join was a nested loop that ran the grouping again for every survivor and
-- compared each of its rows with the survivor's ID: for one question of the
-- recall benchmark's 100,000-evidence dataset (a space of 10,000 evidence) with
-- the path forced, 1,710 survivors, 718 grouped documents, 1,226,240 rows
-- removed by the join filter, and 274 ms of server CPU for the list instead of
-- about 11 ms (docs/benchmarks.md, "The full-text list's survivors"). On a
-- space of 100,000 evidence, whose statistics gave that plan other estimates,
-- the gain was 3 % of a recall's server CPU.
--
-- Now the survivors' bounds and their minor lexemes' term parts (read for the
-- survivors only, as before) are one relation grouped once per document: no
-- join, whatever the estimates. The bound summed is the same sum of the same
-- terms, only in another order, so it may differ from db/0105's in its last
-- bits; theta is lowered by a relative 1e-9 for exactly that (db/0085), far
-- more than the rounding of a sum of a dozen terms, so the same documents
-- reach the scoring and the lists are those of db/0105, document for document
-- and rank for rank (tests/test_bm25_top_k.py compares both paths with BM25
-- over every document). Signatures, settings and every other step are restated
-- unchanged from db/0105.

CREATE OR REPLACE FUNCTION evidence_fulltext_top_k(
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
            FROM (
                SELECT h.doc_id, l.lexeme, l.idf, h.tf
                FROM lex l
                CROSS JOIN LATERAL (
                    SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
                    FROM evidence_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
                      AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM seed o))
                    OFFSET 0
                ) h
            ) t
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
    -- 3. The essential lexemes' postings summed per document into the bound of
    -- their term parts at dl = 0 (one number per document, no arrays: the
    -- documents are most of the space); kept when that plus the rest reaches
    -- the floor.
    grp AS MATERIALIZED (
        SELECT h.doc_id,
               sum(greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)))) AS part
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
    -- bound; when fewer than k of those are visible (a view hiding most of the
    -- best bounds), of the first 2 k visible ones in bound order.
    best AS MATERIALIZED (
        SELECT g.doc_id FROM grp g ORDER BY g.part DESC, g.doc_id COLLATE "C" LIMIT 2 * p_limit
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
            FROM (
                SELECT h.doc_id, l.lexeme, l.idf, h.tf
                FROM lex l
                CROSS JOIN LATERAL (
                    SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
                    FROM evidence_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
                      AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM best o))
                    OFFSET 0
                ) h
            ) t
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
            FROM (
                SELECT h.doc_id, l.lexeme, l.idf, h.tf
                FROM lex l
                CROSS JOIN LATERAL (
                    SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
                    FROM evidence_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
                      AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM best_visible o))
                    OFFSET 0
                ) h
            ) t
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
    -- 4. The documents whose bound can still reach theta; their minor lexemes'
    -- term parts read for them only; kept when their whole bound reaches theta.
    surv AS MATERIALIZED (
        SELECT g.doc_id, g.part FROM grp g
        WHERE g.part + (SELECT r.v FROM rest r) >= (SELECT t.v FROM theta t)
    ),
    whole AS MATERIALIZED (
        -- One grouping of the survivors' bounds and their minor lexemes' term
        -- parts (no join: see the head of this file).
        SELECT x.doc_id
        FROM (
            SELECT s.doc_id, s.part FROM surv s
            UNION ALL
            SELECT h.doc_id,
                   greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)))
            FROM ranked r
            CROSS JOIN LATERAL (
                SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
                FROM evidence_terms p
                WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
                  AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM surv o))
                OFFSET 0
            ) h
            WHERE r.minor
        ) x
        GROUP BY x.doc_id
        HAVING sum(x.part) >= (SELECT th.v FROM theta th)
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
            FROM (
                SELECT h.doc_id, l.lexeme, l.idf, h.tf
                FROM lex l
                CROSS JOIN LATERAL (
                    SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
                    FROM evidence_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
                      AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM whole o))
                    OFFSET 0
                ) h
            ) t
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
    )
    SELECT h.doc_id, row_number() OVER (ORDER BY h.score DESC, h.doc_id COLLATE "C") AS rank
    FROM scored h
    ORDER BY h.score DESC, h.doc_id COLLATE "C"
    LIMIT p_limit;
END
 $$;

CREATE OR REPLACE FUNCTION relationship_fulltext_top_k(
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
            FROM (
                SELECT h.doc_id, l.lexeme, l.idf, h.tf
                FROM lex l
                CROSS JOIN LATERAL (
                    SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
                    FROM relationship_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
                      AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM seed o))
                    OFFSET 0
                ) h
            ) t
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
    -- 3. The essential lexemes' postings summed per document into the bound of
    -- their term parts at dl = 0 (one number per document, no arrays: the
    -- documents are most of the space); kept when that plus the rest reaches
    -- the floor.
    grp AS MATERIALIZED (
        SELECT h.doc_id,
               sum(greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)))) AS part
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
    -- bound; when fewer than k of those are visible (a view hiding most of the
    -- best bounds), of the first 2 k visible ones in bound order.
    best AS MATERIALIZED (
        SELECT g.doc_id FROM grp g ORDER BY g.part DESC, g.doc_id COLLATE "C" LIMIT 2 * p_limit
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
            FROM (
                SELECT h.doc_id, l.lexeme, l.idf, h.tf
                FROM lex l
                CROSS JOIN LATERAL (
                    SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
                    FROM relationship_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
                      AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM best o))
                    OFFSET 0
                ) h
            ) t
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
            FROM (
                SELECT h.doc_id, l.lexeme, l.idf, h.tf
                FROM lex l
                CROSS JOIN LATERAL (
                    SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
                    FROM relationship_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
                      AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM best_visible o))
                    OFFSET 0
                ) h
            ) t
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
    -- 4. The documents whose bound can still reach theta; their minor lexemes'
    -- term parts read for them only; kept when their whole bound reaches theta.
    surv AS MATERIALIZED (
        SELECT g.doc_id, g.part FROM grp g
        WHERE g.part + (SELECT r.v FROM rest r) >= (SELECT t.v FROM theta t)
    ),
    whole AS MATERIALIZED (
        -- One grouping of the survivors' bounds and their minor lexemes' term
        -- parts (no join: see the head of this file).
        SELECT x.doc_id
        FROM (
            SELECT s.doc_id, s.part FROM surv s
            UNION ALL
            SELECT h.doc_id,
                   greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)))
            FROM ranked r
            CROSS JOIN LATERAL (
                SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
                FROM relationship_terms p
                WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
                  AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM surv o))
                OFFSET 0
            ) h
            WHERE r.minor
        ) x
        GROUP BY x.doc_id
        HAVING sum(x.part) >= (SELECT th.v FROM theta th)
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
            FROM (
                SELECT h.doc_id, l.lexeme, l.idf, h.tf
                FROM lex l
                CROSS JOIN LATERAL (
                    SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
                    FROM relationship_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = l.lexeme
                      AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM whole o))
                    OFFSET 0
                ) h
            ) t
            GROUP BY t.doc_id
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
END
 $$;
