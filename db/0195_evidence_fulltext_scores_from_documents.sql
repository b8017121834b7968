-- The evidence full-text function, cheaper for the same list: each scored
-- document's term frequencies from its own search_document (looked up anyway),
-- and below PRUNE_FROM_POSTINGS a query without the first floor, the lexeme
-- bounds and the minor lexemes.
--
-- Profile (docs/benchmarks.md, "The scope round's evidence parts at 100k"): on
-- the recall benchmark's 100,000-evidence dataset (spaces of 10,000 evidence)
-- the scope round costs about 12.7 ms of server CPU, the evidence full-text
-- list about 5.2 ms of it. The function cut after each step: the grouping of
-- the postings about 2 ms, the exact scores of best (for theta) about 1.7 ms,
-- the other survivors' scores about 0.75 ms; executor start-up of the
-- function's plan (about 15 CTEs, started at every call) about 8 % of the
-- list's samples under perf.
--
-- 1. An exact score needs each query lexeme's tf in the document and the
--    document's length. The tf came from the postings: per query lexeme an
--    index scan of its postings for the documents' IDs (about 10 index
--    searches per lexeme, reading long runs of a common lexeme's postings),
--    then a sort and grouping per document; the length from the document's
--    row, looked up for visibility anyway. Now the tf comes from that row
--    too: the document's search_document restricted to the query's lexemes
--    (setweight marks their positions, ts_filter keeps them), tf the number
--    of positions. That is the postings' own definition (db/0055: tf =
--    coalesce(array_length(positions, 1), 1) of unnest(search_document), the
--    same parse as doc_length), and the postings are written from that
--    search_document by their triggers only (db/0130). The score is the same
--    expression over the same (IDF, tf) pairs summed in the same order
--    (lexeme order, COLLATE "C", as the arrays were built): the same float,
--    bit for bit.
-- 2. Below PRUNE_FROM_POSTINGS postings of the query's lexemes (every question
--    of a space of 10,000 evidence: about 7,000 postings) theta0 is minus
--    infinity: no lexeme is minor, the rest is 0, grp keeps every document,
--    and whole is the survivors. The function then runs the same steps
--    without the first floor (seed, seed_scores, theta0), the lexeme bounds
--    (lex's window) and the minor lexemes (ranked, rest, the minor parts of
--    whole): a plan about half the size. db/0170 did the same for the
--    relationship function. Step for step on that path, as db/0175:
--    - grp: every lexeme's postings grouped per document, the same part;
--      db/0175's HAVING (part + 0 >= minus infinity) keeps every group;
--    - best, best_edge and the scores of best and best_visible: unchanged;
--    - theta: greatest(minus infinity, x) is x, or minus infinity when x is
--      NULL (greatest ignores NULLs): coalesce(x, minus infinity);
--    - whole: db/0175 groups the survivors (part + 0 >= theta) with their
--      minor lexemes' parts (none) and keeps sum(part) >= theta: one row per
--      survivor, the same part, the same in_best;
--    - scored and the final order: unchanged.
--    From PRUNE_FROM_POSTINGS on, db/0175's query runs, with change 1.
--
-- Exact either way, by the argument of gateway/store/bm25.py;
-- tests/test_bm25_top_k.py compares both paths with BM25 over every document.
-- Signature and settings are restated unchanged.

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
    -- With many postings (a first floor, minor lexemes): db/0175's query.
    IF (SELECT sum(d) FROM unnest(p_dfs) AS d) >= p_prune_from THEN
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
               (SELECT sum(l.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / p_avgdl))
                           ORDER BY u.lexeme COLLATE "C")
                FROM (SELECT t.lexeme, coalesce(array_length(t.positions, 1), 1)::double precision AS tf
                      FROM unnest(ts_filter(setweight(setweight(d.search_document, 'D'), 'A', p_lexemes),
                                            '{a}')) AS t) u
                JOIN lex l ON l.lexeme = u.lexeme) AS score
        FROM (SELECT o.doc_id FROM seed o) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length, d.search_document FROM evidence d
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
               (SELECT sum(l.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / p_avgdl))
                           ORDER BY u.lexeme COLLATE "C")
                FROM (SELECT t.lexeme, coalesce(array_length(t.positions, 1), 1)::double precision AS tf
                      FROM unnest(ts_filter(setweight(setweight(d.search_document, 'D'), 'A', p_lexemes),
                                            '{a}')) AS t) u
                JOIN lex l ON l.lexeme = u.lexeme) AS score
        FROM (SELECT o.doc_id FROM best o) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length, d.search_document FROM evidence d
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
               (SELECT sum(l.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / p_avgdl))
                           ORDER BY u.lexeme COLLATE "C")
                FROM (SELECT t.lexeme, coalesce(array_length(t.positions, 1), 1)::double precision AS tf
                      FROM unnest(ts_filter(setweight(setweight(d.search_document, 'D'), 'A', p_lexemes),
                                            '{a}')) AS t) u
                JOIN lex l ON l.lexeme = u.lexeme) AS score
        FROM (SELECT o.doc_id FROM best_visible o) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length, d.search_document FROM evidence d
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
    -- documents of whole scored the same way (db/0175 says why).
    scored AS (
        SELECT b.doc_id, b.score FROM best_scores b
        UNION ALL
        SELECT g.doc_id,
               (SELECT sum(l.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / p_avgdl))
                           ORDER BY u.lexeme COLLATE "C")
                FROM (SELECT t.lexeme, coalesce(array_length(t.positions, 1), 1)::double precision AS tf
                      FROM unnest(ts_filter(setweight(setweight(d.search_document, 'D'), 'A', p_lexemes),
                                            '{a}')) AS t) u
                JOIN lex l ON l.lexeme = u.lexeme) AS score
        FROM (SELECT o.doc_id FROM whole o WHERE NOT o.in_best) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length, d.search_document FROM evidence d
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
        RETURN;
    END IF;
    -- Without: theta0 is minus infinity, every lexeme is essential and the rest
    -- is 0, so the first floor, the lexeme bounds and the minor lexemes' parts
    -- decide nothing; the same steps without them (a smaller plan to start).
    RETURN QUERY
    WITH lex AS MATERIALIZED (
        SELECT u.lexeme, u.idf FROM unnest(p_lexemes, p_idfs) AS u (lexeme, idf)
    ),
    -- Every lexeme's postings summed per document into the bound of their term
    -- parts at dl = 0 (no minor lexeme, no rest: every document is kept).
    grp AS MATERIALIZED (
        SELECT h.doc_id,
               sum(greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)))) AS part
        FROM lex r
        CROSS JOIN LATERAL (
            SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
            FROM evidence_terms p
            WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
            OFFSET 0
        ) h
        GROUP BY h.doc_id
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
               (SELECT sum(l.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / p_avgdl))
                           ORDER BY u.lexeme COLLATE "C")
                FROM (SELECT t.lexeme, coalesce(array_length(t.positions, 1), 1)::double precision AS tf
                      FROM unnest(ts_filter(setweight(setweight(d.search_document, 'D'), 'A', p_lexemes),
                                            '{a}')) AS t) u
                JOIN lex l ON l.lexeme = u.lexeme) AS score
        FROM (SELECT o.doc_id FROM best o) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length, d.search_document FROM evidence d
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
               (SELECT sum(l.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / p_avgdl))
                           ORDER BY u.lexeme COLLATE "C")
                FROM (SELECT t.lexeme, coalesce(array_length(t.positions, 1), 1)::double precision AS tf
                      FROM unnest(ts_filter(setweight(setweight(d.search_document, 'D'), 'A', p_lexemes),
                                            '{a}')) AS t) u
                JOIN lex l ON l.lexeme = u.lexeme) AS score
        FROM (SELECT o.doc_id FROM best_visible o) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length, d.search_document FROM evidence d
            WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = g.doc_id
              AND d.generation = p_generation
              AND d.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
              AND NOT (d.id = ANY (p_exclude))
            OFFSET 0
        ) d
    ),
    theta AS MATERIALIZED (
        SELECT coalesce((SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM best_scores v ORDER BY 1 DESC LIMIT p_limit) k),
                        (SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM best_visible_scores v ORDER BY 1 DESC LIMIT p_limit) k),
                        '-infinity'::double precision) AS v
    ),
    -- The documents whose bound reaches theta (the survivors and whole of the
    -- other path: with no minor lexeme and no rest they are one), and whether
    -- the document is in best.
    whole AS MATERIALIZED (
        SELECT g.doc_id,
               coalesce(g.part > (SELECT e.part FROM best_edge e)
                        OR (g.part = (SELECT e.part FROM best_edge e)
                            AND g.doc_id COLLATE "C" <= (SELECT e.doc_id FROM best_edge e) COLLATE "C"),
                        false) AS in_best
        FROM grp g
        WHERE g.part >= (SELECT th.v FROM theta th)
    ),
    -- The answer's candidates: best's scores as computed for theta, and the other
    -- documents of whole scored the same way (db/0175 says why).
    scored AS (
        SELECT b.doc_id, b.score FROM best_scores b
        UNION ALL
        SELECT g.doc_id,
               (SELECT sum(l.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                           / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                              + CAST(0.4 AS double precision) * d.doc_length / p_avgdl))
                           ORDER BY u.lexeme COLLATE "C")
                FROM (SELECT t.lexeme, coalesce(array_length(t.positions, 1), 1)::double precision AS tf
                      FROM unnest(ts_filter(setweight(setweight(d.search_document, 'D'), 'A', p_lexemes),
                                            '{a}')) AS t) u
                JOIN lex l ON l.lexeme = u.lexeme) AS score
        FROM (SELECT o.doc_id FROM whole o WHERE NOT o.in_best) g
        CROSS JOIN LATERAL (
            SELECT d.doc_length, d.search_document FROM evidence d
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
