-- The relationship full-text function (discovery by full text), cheaper for the
-- same list, and written once: each scored document's term frequencies from its
-- own search_document (as db/0195 for evidence), every lookup of a document in
-- one inlined SQL function, and one query for both paths.
--
-- Profile (docs/benchmarks.md, "Discovery's full-text list at 100k"): on the
-- recall benchmark's 100,000-evidence dataset (spaces of 10,000 relationships,
-- about 1,000 postings per question, every question below PRUNE_FROM_POSTINGS)
-- the function costs about 2.6 ms of server CPU per call. EXPLAIN (ANALYZE,
-- BUFFERS) of its query as the tenant: the grouping of the postings (a sort of
-- about 1,000 text keys, then a group per document) and the top 2 k of it about
-- half; the exact scores of best (80 documents) read every query lexeme's
-- postings again for their IDs (an index scan per lexeme, 23 searches), sorted
-- and grouped them, then looked each document up for its length and
-- visibility; the other survivors the same way; best_scores was read by a
-- nested-loop semi-join with whole, and whole EXCEPT best hashed.
--
-- 1. Term frequencies from the document. An exact score needs each query
--    lexeme's tf in the document and the document's length. The row is looked
--    up anyway (length, visibility); its search_document restricted to the
--    query's lexemes (setweight gives every position of theirs weight A,
--    ts_filter keeps the lexemes with A positions, and the join with the
--    query's lexemes drops any other: so, unlike db/0195, no first setweight
--    to D is needed, whatever weights a document holds) gives tf as the number
--    of positions: the postings' own definition (db/0055:
--    tf = coalesce(array_length(positions, 1), 1) of unnest(search_document),
--    the parse doc_length counts) for a parse whose lexemes all carry
--    positions, as every to_tsvector's do (ts_filter drops a lexeme without
--    positions, to which the postings give tf 1; the coalesce below is only
--    the postings' expression restated). The postings are written from that
--    search_document by their trigger only (db/0130), and since db/0196 a
--    relationship's statement, search_document and doc_length cannot change
--    after insert (the parse trigger fires on INSERT only, an UPDATE of them is
--    refused): the postings and the document cannot disagree, so a document
--    picked by a posting holds that lexeme with that tf (a document that held
--    none would score NULL: the orders put NULL last, so it could not take a
--    place in theta or the list). The score is the same
--    expression over the same (IDF, tf) pairs summed in the same order (lexeme
--    order, COLLATE "C", as the arrays were built): the same float, bit for bit.
--    The postings are read by the grouping only (and, from PRUNE_FROM_POSTINGS
--    on, by the first floor's walk and the survivors' minor lexemes).
--
-- 2. One lookup, written once: relationship_fulltext_document(view, doc_id,
--    lexemes, idfs, avgdl) returns the document's row when the view shows it,
--    with its score. It is a set-returning LANGUAGE sql function without SET
--    clauses, so the planner inlines it into each lateral call (the plan is the
--    one a lateral subquery gives: the primary key, OFFSET 0 keeping it a
--    lookup); where only visibility is asked (the first floor's walk), the
--    unused score is dropped from the plan. The view's filter, written five
--    times before, is written once (tests/test_fulltext_visibility.py reads it
--    there), and best_visible scores its documents as it finds them (the
--    separate best_visible_scores step is gone).
--
-- 3. One query for both paths. Below PRUNE_FROM_POSTINGS, db/0170 ran a second
--    copy of the query without the first floor, the lexeme bounds and the minor
--    lexemes (a smaller plan to start at every call). Now those steps are a
--    statement of their own that runs only from PRUNE_FROM_POSTINGS on and
--    leaves three values: theta0 (the first floor), rest (what the minor
--    lexemes can add to a document, at most) and the minor lexemes. Below the
--    threshold they keep their neutral values (minus infinity, 0, none), which
--    is what db/0170's second copy spelled out: every lexeme essential, every
--    group kept (part + 0 >= minus infinity), theta = greatest(minus infinity,
--    x) = x (or minus infinity when x is NULL: greatest ignores NULLs, as
--    db/0170's coalesce), the survivors' minor parts empty (the lateral lookup
--    runs per minor lexeme: never), whole the survivors whose part reaches
--    theta, taken as they are (the grouping with the minor parts runs only when
--    there are minor lexemes). One query serves both paths.
--
-- 4. Each document scored once (db/0175's argument, now for relationships):
--    best's scores are candidates of the answer as computed for theta; the
--    answer scores only the documents of whole that are not in best, told
--    without a join (best is a prefix of grp in the order part descending, ID:
--    a document is in it when it comes no later than best's last, best_edge).
--    A document of best outside whole has a bound, so a score, below theta,
--    hence below k visible documents of whole: the limit cuts it, as before.
--
-- 5. enable_sort = off for the function's query (db/0151 for evidence): the
--    grouping of the postings is hashed instead of sorted. db/0151 found nothing
--    measurable for this function; with the rest cheaper it saved about 6 % of
--    it (one interleaved run). The sorts the query needs for its ORDER BYs stay.
--
-- Interleaved against db/0170 (40 questions, every lexeme essential and with
-- PRUNE_FROM_POSTINGS 0): the same rows for every call; figures in
-- docs/benchmarks.md. Exact by the argument of gateway/store/bm25.py;
-- tests/test_bm25_top_k.py compares both paths with BM25 over every document.
-- Signature unchanged.

CREATE FUNCTION relationship_fulltext_document(
    p_team text,
    p_space uuid,
    p_generation integer,
    p_t_sys timestamptz,
    p_doc_id text,
    p_lexemes text[],
    p_idfs double precision[],
    p_avgdl double precision
) RETURNS TABLE (doc_id text, score double precision)
    LANGUAGE sql STABLE
-- No SET clause, not STRICT, not SECURITY DEFINER: what inlining asks. The table
-- is named with its schema (the caller's search path is the one in force).
AS $$
    SELECT d.id::text,
           (SELECT sum(l.idf * u.tf * (CAST(0.9 AS double precision) + 1)
                       / (u.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)
                          + CAST(0.4 AS double precision) * d.doc_length / p_avgdl))
                       ORDER BY u.lexeme COLLATE "C")
            FROM (SELECT t.lexeme, coalesce(array_length(t.positions, 1), 1)::double precision AS tf
                  FROM unnest(ts_filter(setweight(d.search_document, 'A', p_lexemes),
                                        '{a}')) AS t) u
            JOIN unnest(p_lexemes, p_idfs) AS l (lexeme, idf) ON l.lexeme = u.lexeme)
    FROM public.relationships d
    WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = p_doc_id
      AND d.generation = p_generation
      AND d.recorded_at <= p_t_sys
    OFFSET 0
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
    SET enable_sort = off
AS $$
#variable_conflict use_column
DECLARE
    -- The first floor, what the minor lexemes can add at most, and the minor
    -- lexemes: neutral unless the postings reach PRUNE_FROM_POSTINGS.
    v_theta0 double precision := '-infinity';
    v_rest double precision := 0;
    v_minor text[] := '{}';
BEGIN
    IF (SELECT sum(d) FROM unnest(p_dfs) AS d) >= p_prune_from THEN
        WITH lex AS MATERIALIZED (
            -- Per lexeme its bound ub (the term part at dl = 0 with its largest
            -- tf: never below its contribution to a document) and upto, the sum
            -- of the bounds of the lexemes up to it in bound order.
            SELECT l.lexeme, l.df,
                   sum(l.ub) OVER (ORDER BY l.ub, l.lexeme COLLATE "C" ROWS UNBOUNDED PRECEDING) AS upto
            FROM (
                SELECT u.lexeme, u.df,
                       greatest(u.idf, 0) * u.max_tf::double precision * (CAST(0.9 AS double precision) + 1)
                       / (u.max_tf::double precision + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision))) AS ub
                FROM unnest(p_lexemes, p_idfs, p_dfs, p_max_tfs) AS u (lexeme, idf, df, max_tf)
            ) l
        ),
        -- The first floor: the exact scores of the first 2 k visible hits of the
        -- rarest lexemes; their k-th best, lowered by a relative 1e-9 against
        -- rounding (minus infinity with fewer than k hits).
        seed AS MATERIALIZED (
            SELECT DISTINCT s.doc_id
            FROM (
                SELECT v.doc_id
                FROM (SELECT l.lexeme FROM lex l ORDER BY l.df, l.lexeme COLLATE "C" OFFSET 0) r
                CROSS JOIN LATERAL (
                    SELECT p.relationship_id::text AS doc_id
                    FROM relationship_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
                    OFFSET 0
                ) g
                CROSS JOIN LATERAL relationship_fulltext_document(
                    p_team, p_space, p_generation, p_t_sys, g.doc_id, p_lexemes, p_idfs, p_avgdl) v
                LIMIT 2 * p_limit
            ) s
        ),
        theta0 AS MATERIALIZED (
            SELECT coalesce((SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM seed o
               CROSS JOIN LATERAL relationship_fulltext_document(
                   p_team, p_space, p_generation, p_t_sys, o.doc_id, p_lexemes, p_idfs, p_avgdl) v
               ORDER BY 1 DESC NULLS LAST LIMIT p_limit) k),
                            '-infinity'::double precision) AS v
        ),
        -- The lexemes in bound order: the prefix whose bounds sum below the floor
        -- is minor (non-essential); the rest is what those can add, at most.
        ranked AS MATERIALIZED (
            SELECT l.lexeme, l.upto, l.upto < (SELECT t.v FROM theta0 t) AS minor FROM lex l
        )
        SELECT (SELECT t.v FROM theta0 t),
               coalesce(max(l.upto) FILTER (WHERE l.minor), 0),
               coalesce(array_agg(l.lexeme) FILTER (WHERE l.minor), '{}')
        INTO v_theta0, v_rest, v_minor
        FROM ranked l;
    END IF;
    RETURN QUERY
    WITH lex AS MATERIALIZED (
        SELECT u.lexeme, u.idf, u.lexeme = ANY (v_minor) AS minor
        FROM unnest(p_lexemes, p_idfs) AS u (lexeme, idf)
    ),
    -- The essential lexemes' postings summed per document into the bound of
    -- their term parts at dl = 0; kept when that plus the rest reaches the floor.
    grp AS MATERIALIZED (
        SELECT h.doc_id,
               sum(greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)))) AS part
        FROM lex r
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
               + v_rest >= v_theta0
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
        SELECT s.doc_id, s.score
        FROM best o
        CROSS JOIN LATERAL relationship_fulltext_document(
            p_team, p_space, p_generation, p_t_sys, o.doc_id, p_lexemes, p_idfs, p_avgdl) s
    ),
    -- Read only when fewer than k of best are visible.
    best_visible AS MATERIALIZED (
        SELECT s.doc_id, s.score
        FROM (
            SELECT g.doc_id, g.part FROM grp g
            ORDER BY g.part DESC, g.doc_id COLLATE "C" OFFSET 0
        ) g
        CROSS JOIN LATERAL relationship_fulltext_document(
            p_team, p_space, p_generation, p_t_sys, g.doc_id, p_lexemes, p_idfs, p_avgdl) s
        LIMIT 2 * p_limit
    ),
    theta AS MATERIALIZED (
        SELECT greatest(v_theta0,
                        coalesce((SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM best_scores v ORDER BY 1 DESC NULLS LAST LIMIT p_limit) k),
                                 (SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM best_visible v ORDER BY 1 DESC NULLS LAST LIMIT p_limit) k))) AS v
    ),
    -- The documents whose bound can still reach theta, and whether each is in
    -- best; without minor lexemes (the rest is 0) they are whole.
    surv AS MATERIALIZED (
        SELECT g.doc_id, g.part,
               coalesce(g.part > (SELECT e.part FROM best_edge e)
                        OR (g.part = (SELECT e.part FROM best_edge e)
                            AND g.doc_id COLLATE "C" <= (SELECT e.doc_id FROM best_edge e) COLLATE "C"),
                        false) AS in_best
        FROM grp g
        WHERE g.part + v_rest >= (SELECT t.v FROM theta t)
    ),
    whole AS MATERIALIZED (
        SELECT s.doc_id, s.in_best FROM surv s
        WHERE cardinality(v_minor) = 0
        UNION ALL
        -- With minor lexemes: their term parts read for the survivors only, and
        -- one grouping of those with the survivors' bounds (no join: see
        -- db/0150); kept when the whole bound reaches theta.
        SELECT x.doc_id, bool_or(x.in_best) AS in_best
        FROM (
            SELECT s.doc_id, s.part, s.in_best FROM surv s
            UNION ALL
            SELECT h.doc_id,
                   greatest(r.idf, 0) * h.tf * (CAST(0.9 AS double precision) + 1)
                   / (h.tf + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision))),
                   false
            FROM lex r
            CROSS JOIN LATERAL (
                SELECT p.relationship_id::text AS doc_id, p.tf::double precision AS tf
                FROM relationship_terms p
                WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
                  AND p.relationship_id = ANY (ARRAY(SELECT o.doc_id FROM surv o))
                OFFSET 0
            ) h
            WHERE r.minor
        ) x
        WHERE cardinality(v_minor) > 0
        GROUP BY x.doc_id
        HAVING sum(x.part) >= (SELECT th.v FROM theta th)
    ),
    -- The answer's candidates: best's scores as computed for theta, and the other
    -- documents of whole scored the same way (see the head of this file).
    scored AS (
        SELECT b.doc_id, b.score FROM best_scores b
        UNION ALL
        SELECT s.doc_id, s.score
        FROM (SELECT o.doc_id FROM whole o WHERE NOT o.in_best) g
        CROSS JOIN LATERAL relationship_fulltext_document(
            p_team, p_space, p_generation, p_t_sys, g.doc_id, p_lexemes, p_idfs, p_avgdl) s
    )
    SELECT h.doc_id, row_number() OVER (ORDER BY h.score DESC NULLS LAST, h.doc_id COLLATE "C") AS rank
    FROM scored h
    ORDER BY h.score DESC NULLS LAST, h.doc_id COLLATE "C"
    LIMIT p_limit;
END
 $$;
