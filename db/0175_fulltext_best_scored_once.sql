-- The evidence full-text function scores each document of best once, not twice.
--
-- Profile (the recall benchmark's 100,000-evidence dataset, spaces of 10,000
-- evidence; server CPU of the function cut after each of its steps, 40
-- questions interleaved): of about 8.8 ms, the grouping of the postings and
-- everything before it 4.0 ms, the exact scores of best (theta) 1.7 ms, the
-- exact scores of whole and the final order 2.6 ms. An exact score costs a
-- lookup of the document's postings per query lexeme and of its length.
--
-- best (the 2 k documents of highest essential bound) was scored for theta,
-- then most of those documents were scored again in scored, as members of
-- whole. Now best_scores is materialised and is part of the answer's
-- candidates, and scored scores only the documents of whole that are not in
-- best. Whether a document of whole is in best is known without a join:
-- best is a prefix of grp in the order (part descending, ID), so a document
-- is in it when it comes no later than best's last (best_edge).
--
-- The list is the same, document for document and rank for rank:
-- - a document of whole and of best gets the score it got before: the same
--   expression over the same postings, length and average (computed once);
-- - a document of best that is not in whole is now a candidate too. It is
--   not in whole because its bound is below theta, so its score is below
--   the k-th best visible score by more than rounding (theta is that score
--   lowered by a relative 1e-9, and score <= bound); at least k visible
--   documents of whole score at least theta, so it ranks below all of them
--   and is cut by the limit, as before;
-- - documents hidden by the view are dropped by the same lookup as before.
-- tests/test_bm25_top_k.py compares the lists with BM25 over every document,
-- on both paths, and a broken best_edge fails that comparison.
--
-- Restated whole from db/0150 with db/0151's enable_sort = off; only best,
-- best_edge (new), best_scores, whole and scored changed. The relationship
-- function (discovery) is unchanged.

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
    SET enable_sort = off
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
        SELECT g.doc_id, g.part FROM grp g ORDER BY g.part DESC, g.doc_id COLLATE "C" LIMIT 2 * p_limit
    ),
    -- The last of them in that order: a document of grp is in best if and only
    -- if it comes no later (no join needed to tell).
    best_edge AS MATERIALIZED (
        SELECT b.doc_id, b.part FROM best b ORDER BY b.part, b.doc_id COLLATE "C" DESC LIMIT 1
    ),
    -- Materialised: theta reads these scores, and the answer reuses them (scored).
    best_scores AS MATERIALIZED (
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
        -- parts (no join: see db/0150), and whether the document is in best.
        SELECT x.doc_id, bool_or(x.in_best) AS in_best
        FROM (
            SELECT s.doc_id, s.part,
                   coalesce(s.part > (SELECT e.part FROM best_edge e)
                            OR (s.part = (SELECT e.part FROM best_edge e)
                                AND s.doc_id COLLATE "C" <= (SELECT e.doc_id FROM best_edge e) COLLATE "C"),
                            false) AS in_best
            FROM surv s
            UNION ALL
            SELECT h.doc_id,
                   greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision))),
                   false
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
    -- The answer's candidates: best's scores as computed for theta, and the other
    -- documents of whole scored the same way (see the head of this file).
    scored AS (
        SELECT b.doc_id, b.score FROM best_scores b
        UNION ALL
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
                      AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM whole o WHERE NOT o.in_best))
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
