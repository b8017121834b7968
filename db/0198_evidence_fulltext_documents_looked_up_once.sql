-- The evidence full-text function in db/0197's shape: every lookup of a
-- document in one inlined SQL function, one query for both paths, and no first
-- setweight. The same list; no slower on long documents than the postings.
--
-- Review of db/0195 (docs/benchmarks.md, "Discovery's full-text list at 100k"
-- measures it): db/0195 takes a scored document's term frequencies from its
-- search_document instead of the postings. A long document's search_document
-- is stored out of line (TOAST): on SciFact (5,183 abstracts, 154 lexemes on
-- average, 4,339 of the parses out of line) each scored document then costs a
-- TOAST fetch, which the postings' index scans did not (EXPLAIN (ANALYZE,
-- BUFFERS) of a question: 1,938 buffers against db/0175's 1,345, about 250
-- documents scored). Interleaved, 100 SciFact questions: below
-- PRUNE_FROM_POSTINGS (where a space of 5,000 abstracts is) db/0195 cost as
-- much as db/0175; from it on (spaces of about 30,000 such documents and more:
-- the first floor scores its 2 k documents too) x1.04 to x1.09. This
-- migration: x0.95 to x0.99 of db/0175 on both paths there, and the same as
-- db/0195 on the recall benchmark's short documents (x0.95 to x1.01).
--
-- 1. One lookup, written once: evidence_fulltext_document(view, doc_id,
--    lexemes, idfs, avgdl) returns the document's row when the view shows it
--    (team, space, generation, system time, exclusions), with its score, as
--    relationship_fulltext_document (db/0197). Inlined by the planner into each
--    lateral call: the plan of a lateral subquery on the primary key; where
--    only visibility is asked (the first floor's walk) the score is dropped
--    from the plan. The view's filter, written six times in db/0195, is written
--    once (tests/test_fulltext_visibility.py reads it there); best_visible
--    scores its documents as it finds them.
--
-- 2. The score as db/0195's, without its first setweight: setweight gives
--    every position of the query's lexemes weight A, ts_filter keeps the
--    lexemes with A positions, and the join with the query's lexemes drops any
--    other, so the weights a document held before do not matter (db/0195 set
--    them all to D first: a copy of the whole parse, which a long document
--    pays for). tf is the number of positions, the postings' own definition
--    (db/0055) for a parse whose lexemes all carry positions, as every
--    to_tsvector's do (db/0197 says more); the postings are written from that
--    search_document by their trigger only (db/0130), and the document's text
--    and parse cannot change after insert (db/0196), so a document picked by a
--    posting holds that lexeme with that tf (one that held none would score
--    NULL, which every order here puts last). The same expression over the
--    same (IDF, tf) pairs summed in the same order: the same float.
--
-- 3. One query for both paths (db/0197, point 3): the first floor, the lexeme
--    bounds and the choice of minor lexemes are a statement of their own, run
--    from PRUNE_FROM_POSTINGS on, leaving theta0, rest and the minor lexemes;
--    below it they keep their neutral values (minus infinity, 0, none), which
--    is what db/0195's second copy of the query spelled out: every lexeme
--    essential, every group kept, theta = greatest(minus infinity, x) = x (or
--    minus infinity when x is NULL), whole the survivors as they are (the
--    grouping with the minor parts runs only when there are minor lexemes).
--    Everything else is db/0195's (db/0175's best scored once, db/0151's
--    grouping hashed).
--
-- Exact by the argument of gateway/store/bm25.py; tests/test_bm25_top_k.py
-- compares both paths with BM25 over every document. Signature and settings
-- unchanged.

CREATE FUNCTION evidence_fulltext_document(
    p_team text,
    p_space uuid,
    p_generation integer,
    p_known_at timestamptz,
    p_exclude text[],
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
    FROM public.evidence d
    WHERE d.team_id = p_team AND d.space_id = p_space AND d.id = p_doc_id
      AND d.generation = p_generation
      AND d.recorded_at <= coalesce(p_known_at, 'infinity'::timestamptz)
      AND NOT (d.id = ANY (p_exclude))
    OFFSET 0
$$;

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
                    SELECT p.evidence_id::text AS doc_id
                    FROM evidence_terms p
                    WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
                    OFFSET 0
                ) g
                CROSS JOIN LATERAL evidence_fulltext_document(
                    p_team, p_space, p_generation, p_known_at, p_exclude, g.doc_id, p_lexemes, p_idfs, p_avgdl) v
                LIMIT 2 * p_limit
            ) s
        ),
        theta0 AS MATERIALIZED (
            SELECT coalesce((SELECT CASE WHEN count(*) >= p_limit
                     THEN min(k.score) - 1e-9 * abs(min(k.score)) END
         FROM (SELECT v.score FROM seed o
               CROSS JOIN LATERAL evidence_fulltext_document(
                   p_team, p_space, p_generation, p_known_at, p_exclude, o.doc_id, p_lexemes, p_idfs, p_avgdl) v
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
            SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
            FROM evidence_terms p
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
        CROSS JOIN LATERAL evidence_fulltext_document(
            p_team, p_space, p_generation, p_known_at, p_exclude, o.doc_id, p_lexemes, p_idfs, p_avgdl) s
    ),
    -- Read only when fewer than k of best are visible.
    best_visible AS MATERIALIZED (
        SELECT s.doc_id, s.score
        FROM (
            SELECT g.doc_id, g.part FROM grp g
            ORDER BY g.part DESC, g.doc_id COLLATE "C" OFFSET 0
        ) g
        CROSS JOIN LATERAL evidence_fulltext_document(
            p_team, p_space, p_generation, p_known_at, p_exclude, g.doc_id, p_lexemes, p_idfs, p_avgdl) s
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
                SELECT p.evidence_id::text AS doc_id, p.tf::double precision AS tf
                FROM evidence_terms p
                WHERE p.team_id = p_team AND p.space_id = p_space AND p.lexeme = r.lexeme
                  AND p.evidence_id = ANY (ARRAY(SELECT o.doc_id FROM surv o))
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
        CROSS JOIN LATERAL evidence_fulltext_document(
            p_team, p_space, p_generation, p_known_at, p_exclude, g.doc_id, p_lexemes, p_idfs, p_avgdl) s
    )
    SELECT h.doc_id, row_number() OVER (ORDER BY h.score DESC NULLS LAST, h.doc_id COLLATE "C") AS rank
    FROM scored h
    ORDER BY h.score DESC NULLS LAST, h.doc_id COLLATE "C"
    LIMIT p_limit;
END
 $$;
