-- The evidence full-text function (db/0198) restated with a cut on its
-- grouping: the same lists, about a sixth cheaper on the recall benchmark's
-- spaces.
--
-- Profile (docs/benchmarks.md, "The evidence full-text grouping cut at 100k"):
-- on the recall benchmark's 100,000-evidence dataset (10,000 evidence per
-- space, every question below PRUNE_FROM_POSTINGS) evidence_fulltext_top_k
-- costs about 5.0 ms of server CPU per call. A 9-lexeme question: 8,944
-- postings grouped into 6,336 documents, all of them stored in grp, copied one
-- by one into the top-N sort of best (120 kept) and read again by surv, which
-- keeps 226 (the documents whose bound reaches theta). The query cut after
-- each step (one question, 40 runs): reading the postings about 1.2 ms,
-- grouping them about 1.4 ms, best's top-N over the groups about 1.1 ms; then
-- the 226 lookups and scores. `perf`: forming and copying tuples (the groups,
-- grp's store, the sort's copies) about an eighth of the function.
--
-- The cut. grp keeps a document only when its bound (part, the term parts of
-- its essential lexemes at dl = 0, plus rest) reaches greatest(theta0, cut),
-- where cut is the largest term part at dl = 0 and tf = 1 of an essential
-- lexeme held by at least 2 k documents (the grouping's own expression, so
-- each of them has at least that part): grp usually keeps more than the 2 k
-- that best takes (a fifth of the documents at the median of the benchmark's
-- questions), and best is then the same prefix of the same order. theta is
-- computed as before, from best (or best_visible) and theta0. The answer is
-- exact when theta >= cut: every document whose bound reaches theta reaches
-- the cut too, so it is in grp, and surv, whole and the scores are what they
-- were (a document of grp is in best exactly when it comes no later than
-- best's last, as before). When theta < cut (a view hiding most of the
-- documents, a question whose k-th best score is below the cut, fewer than k
-- visible hits), the query returns no row (the guard on the final step), and
-- the function runs it a second time with the cut at minus infinity: a query
-- equivalent to db/0198's (the cut fixed at minus infinity, the guard always
-- true). The cut is a heuristic of cost only; no list depends on its value.
-- No question of the benchmark needs the second try; a second try costs
-- about x1.4 of db/0198 (both tries), and a caller's exclusions that hide
-- the best documents make it come (23 questions in 100 with the top 60
-- excluded, 2 with the top 10). A legitimately empty list (no visible hit)
-- runs it too: one more query of a question that found nothing.
--
-- Below PRUNE_FROM_POSTINGS only. From it on the survivors' bound adds the
-- minor lexemes' rest (4 and more on the benchmark's questions), so the cut
-- kept most groups while 7 questions in 100 needed the second try (with
-- PRUNE_FROM_POSTINGS 0): x1.03 of db/0198 there in two interleaved runs.
-- The cut is minus infinity on that path, whose query is db/0198's.
--
-- Not for the relationship function (db/0197 stays): its lexemes have fewer
-- postings, a lexeme held by 2 k relationships is rare, and its part is often
-- above theta: 12 questions in 100 needed the second try, and the whole
-- recall of one such question cost x1.012 (statement_cpu.py); interleaved
-- over 40 questions x0.987, within the noise.
--
-- Exact by the argument of gateway/store/bm25.py; tests/test_bm25_top_k.py
-- compares both paths (and both tries) with BM25 over every document, and a
-- copy without the guard, or grouping above the cut, fails that comparison.
-- Signature, settings and the lookup function (db/0198) unchanged.

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
    -- First the grouping keeps only the documents whose bound reaches the cut
    -- (see the head of this file); false when that try cannot decide the list.
    v_cut boolean := true;
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
    LOOP
    RETURN QUERY
    WITH lex AS MATERIALIZED (
        SELECT u.lexeme, u.idf, u.df, u.lexeme = ANY (v_minor) AS minor
        FROM unnest(p_lexemes, p_idfs, p_dfs) AS u (lexeme, idf, df)
    ),
    -- The cut: the largest term part at dl = 0 and tf = 1 of an essential lexeme
    -- held by at least 2 k documents (each of them has at least that bound), so
    -- that grp usually keeps more than best needs; minus infinity on the second
    -- try and from PRUNE_FROM_POSTINGS on (see the head of this file). Only a
    -- filter: the answer is exact whatever its value (see the guard).
    cut AS MATERIALIZED (
        SELECT CASE WHEN v_cut AND (SELECT sum(x.df) FROM lex x) < p_prune_from
                    THEN coalesce(max(greatest(l.idf, 0) * 1 * (CAST(0.9 AS double precision) + 1)
                                      / (1 + CAST(0.9 AS double precision) * (1 - CAST(0.4 AS double precision)))),
                                  '-infinity'::double precision)
                    ELSE '-infinity'::double precision END AS v
        FROM lex l
        WHERE NOT l.minor AND l.df >= 2 * p_limit
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
               + v_rest >= greatest(v_theta0, (SELECT c.v FROM cut c))
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
    -- The guard: grp holds every document whose bound reaches theta only when
    -- theta is not below the cut. Else no row, and the second try groups all.
    WHERE (SELECT t.v FROM theta t) >= (SELECT c.v FROM cut c)
    ORDER BY h.score DESC NULLS LAST, h.doc_id COLLATE "C"
    LIMIT p_limit;
    EXIT WHEN FOUND OR NOT v_cut;
    v_cut := false;
    END LOOP;
END
 $$;

