-- Per-space lexeme statistics kept by the write path: each lexeme's document
-- frequency (df) and largest term frequency (max_tf) in a space, for the
-- current view's BM25 (gateway/store/search.py, gateway/store/related.py).
--
-- Until now every full-text list counted them per query: an index-only scan
-- of every posting of every query lexeme (count(*), max(tf)), before the list
-- itself read the essential lexemes' postings again. At 100,000 evidence per
-- space that is 73,304 postings for a 10-word question of the recall
-- benchmark, 28 ms of the statement (EXPLAIN ANALYZE; docs/benchmarks.md); it
-- grows with the space. Now it is at most 8 rows per query lexeme.
--
-- What df is computed over is unchanged (docs/recall.md, "Statistics of a
-- view"): the current view's df counts every posting of the space, all
-- generations, present state, which is what these rows sum to. Postings are
-- only ever inserted (0001 and 0003 grant no UPDATE or DELETE on them, and
-- nothing in the gateway updates or deletes them), so a posting counted once
-- when it is inserted is counted for good, as the running totals of
-- evidence_search_stats (db/0002) are. A knownAt view still counts the
-- postings recorded by its instant (db/0040): these rows have no time.
--
-- Writes. A statement trigger on the postings tables, over the transition
-- table: one upsert per (space, lexeme) of the statement, adding its count
-- and raising max_tf. Concurrent writers do not queue on one hot row per
-- lexeme: the rows are sharded by the writing backend (pg_backend_pid() % 8,
-- the shard of db/0002's statistics) and readers sum the shards. Two writers
-- of the same shard and space already queue on that space's row of
-- evidence_search_stats (relationship_search_stats), which their evidence
-- (relationship) trigger updates first, the postings trigger firing after it:
-- so no writer waits here that did not wait there, and the lexeme rows are
-- locked in one order (sorted) so that no two statements wait on each other
-- in a cycle. SECURITY DEFINER: whoever inserts postings (the owner today;
-- recall_app may), the statistics are written by the owner, and recall_app
-- only reads them.
--
-- Exactness is checked by tests/test_lexeme_statistics.py (the rows against a
-- count of the postings after writes of every kind, and a broken trigger
-- caught) and by the full-text lists' tests, which compare with BM25 computed
-- over every document.

CREATE TABLE evidence_lexeme_stats (
    team_id  client_id NOT NULL,
    space_id uuid NOT NULL,
    lexeme   text NOT NULL,
    shard    smallint NOT NULL CHECK (shard BETWEEN 0 AND 7),
    df       bigint NOT NULL CHECK (df >= 0),
    max_tf   integer NOT NULL CHECK (max_tf >= 1),
    PRIMARY KEY (team_id, space_id, lexeme, shard)
);

CREATE TABLE relationship_lexeme_stats (
    team_id  client_id NOT NULL,
    space_id uuid NOT NULL,
    lexeme   text NOT NULL,
    shard    smallint NOT NULL CHECK (shard BETWEEN 0 AND 7),
    df       bigint NOT NULL CHECK (df >= 0),
    max_tf   integer NOT NULL CHECK (max_tf >= 1),
    PRIMARY KEY (team_id, space_id, lexeme, shard)
);

CREATE FUNCTION evidence_lexeme_stats_add() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO evidence_lexeme_stats AS s (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT n.team_id, n.space_id, n.lexeme, (pg_backend_pid() % 8)::smallint, count(*), max(n.tf)
    FROM new_evidence_terms n
    GROUP BY n.team_id, n.space_id, n.lexeme
    -- A fixed order of row locks: two statements never wait on each other in a cycle.
    ORDER BY n.team_id, n.space_id, n.lexeme
    ON CONFLICT (team_id, space_id, lexeme, shard) DO UPDATE
        SET df = s.df + excluded.df, max_tf = greatest(s.max_tf, excluded.max_tf);
    RETURN NULL;
END $$;

CREATE FUNCTION relationship_lexeme_stats_add() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO relationship_lexeme_stats AS s (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT n.team_id, n.space_id, n.lexeme, (pg_backend_pid() % 8)::smallint, count(*), max(n.tf)
    FROM new_relationship_terms n
    GROUP BY n.team_id, n.space_id, n.lexeme
    ORDER BY n.team_id, n.space_id, n.lexeme
    ON CONFLICT (team_id, space_id, lexeme, shard) DO UPDATE
        SET df = s.df + excluded.df, max_tf = greatest(s.max_tf, excluded.max_tf);
    RETURN NULL;
END $$;

-- The postings written so far, counted once. The lock keeps writers out between
-- the count and the trigger (a posting committed in between would be missed);
-- it is held to the end of this migration's transaction.
LOCK TABLE evidence_terms, relationship_terms IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO evidence_lexeme_stats (team_id, space_id, lexeme, shard, df, max_tf)
SELECT t.team_id, t.space_id, t.lexeme, 0, count(*), max(t.tf)
FROM evidence_terms t
GROUP BY t.team_id, t.space_id, t.lexeme;

INSERT INTO relationship_lexeme_stats (team_id, space_id, lexeme, shard, df, max_tf)
SELECT t.team_id, t.space_id, t.lexeme, 0, count(*), max(t.tf)
FROM relationship_terms t
GROUP BY t.team_id, t.space_id, t.lexeme;

CREATE TRIGGER evidence_lexeme_stats_add AFTER INSERT ON evidence_terms
    REFERENCING NEW TABLE AS new_evidence_terms
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_lexeme_stats_add();
CREATE TRIGGER relationship_lexeme_stats_add AFTER INSERT ON relationship_terms
    REFERENCING NEW TABLE AS new_relationship_terms
    FOR EACH STATEMENT EXECUTE FUNCTION relationship_lexeme_stats_add();

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['evidence_lexeme_stats', 'relationship_lexeme_stats'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY space_wall ON %I TO recall_app '
            'USING (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces())) '
            'WITH CHECK (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces()))',
            t);
    END LOOP;
END $$;
-- Read only: the triggers above write as the owner.
GRANT SELECT ON evidence_lexeme_stats, relationship_lexeme_stats TO recall_app;
