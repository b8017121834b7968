-- recall_rebuild_lexeme_stats() writes only the keys whose counts differ.
--
-- db/0107's rebuild deleted every row of both lexeme statistics tables and
-- wrote them all again from a count of the postings, under SHARE ROW EXCLUSIVE
-- on the postings (every writer of evidence or relationships waits until it
-- commits). Writing a row costs about 15 us and its deferred foreign-key check
-- at commit another 10-16 us: at 1,000,000 rows writers waited about 33 s, of
-- which the count of the postings was about 2 s (docs/benchmarks.md, "The
-- lexeme statistics' foreign key and their recount").
--
-- Now, per table, the count of the postings per (team, space, lexeme) is
-- compared with what the kept rows sum to (df summed over the shards, the
-- largest max_tf), which is what every reader reads; only the keys where they
-- differ are written: a key with no posting loses its rows, a key missing or
-- wrong gets its rows replaced by one row in shard 0 with the count. A key
-- whose rows already sum to the count is not touched, whatever shards hold it.
-- So a store whose statistics are right writes no row and queues no check, and
-- a damaged one pays per damaged key. What readers see afterwards is what they
-- saw after db/0107's rebuild: for every key, exactly the count of its
-- postings (tests/test_lexeme_statistics.py compares the two on a store of two
-- teams with keys to add, change and delete, and checks that the other rows
-- are left as they were).
--
-- Same lock as before, taken first (a posting committed between the count and
-- the writes would be missed otherwise). The differences go through a
-- temporary table dropped at commit (one count, then a delete and an insert).

CREATE OR REPLACE FUNCTION recall_rebuild_lexeme_stats() RETURNS void
    LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    LOCK TABLE evidence_terms, relationship_terms IN SHARE ROW EXCLUSIVE MODE;

    CREATE TEMP TABLE lexeme_stats_differences ON COMMIT DROP AS
    SELECT coalesce(c.team_id, k.team_id) AS team_id,
           coalesce(c.space_id, k.space_id) AS space_id,
           coalesce(c.lexeme, k.lexeme) AS lexeme,
           c.df, c.max_tf
    FROM (SELECT t.team_id, t.space_id, t.lexeme, count(*) AS df, max(t.tf) AS max_tf
          FROM evidence_terms t GROUP BY t.team_id, t.space_id, t.lexeme) c
    FULL JOIN (SELECT s.team_id, s.space_id, s.lexeme, sum(s.df) AS df, max(s.max_tf) AS max_tf
               FROM evidence_lexeme_stats s GROUP BY s.team_id, s.space_id, s.lexeme) k
        ON k.team_id = c.team_id AND k.space_id = c.space_id AND k.lexeme = c.lexeme
    WHERE c.df IS DISTINCT FROM k.df OR c.max_tf IS DISTINCT FROM k.max_tf;
    DELETE FROM evidence_lexeme_stats s USING lexeme_stats_differences d
    WHERE s.team_id = d.team_id AND s.space_id = d.space_id AND s.lexeme = d.lexeme;
    INSERT INTO evidence_lexeme_stats (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT d.team_id, d.space_id, d.lexeme, 0, d.df, d.max_tf
    FROM lexeme_stats_differences d WHERE d.df IS NOT NULL
    ORDER BY 1, 2, 3;
    DROP TABLE lexeme_stats_differences;

    CREATE TEMP TABLE lexeme_stats_differences ON COMMIT DROP AS
    SELECT coalesce(c.team_id, k.team_id) AS team_id,
           coalesce(c.space_id, k.space_id) AS space_id,
           coalesce(c.lexeme, k.lexeme) AS lexeme,
           c.df, c.max_tf
    FROM (SELECT t.team_id, t.space_id, t.lexeme, count(*) AS df, max(t.tf) AS max_tf
          FROM relationship_terms t GROUP BY t.team_id, t.space_id, t.lexeme) c
    FULL JOIN (SELECT s.team_id, s.space_id, s.lexeme, sum(s.df) AS df, max(s.max_tf) AS max_tf
               FROM relationship_lexeme_stats s GROUP BY s.team_id, s.space_id, s.lexeme) k
        ON k.team_id = c.team_id AND k.space_id = c.space_id AND k.lexeme = c.lexeme
    WHERE c.df IS DISTINCT FROM k.df OR c.max_tf IS DISTINCT FROM k.max_tf;
    DELETE FROM relationship_lexeme_stats s USING lexeme_stats_differences d
    WHERE s.team_id = d.team_id AND s.space_id = d.space_id AND s.lexeme = d.lexeme;
    INSERT INTO relationship_lexeme_stats (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT d.team_id, d.space_id, d.lexeme, 0, d.df, d.max_tf
    FROM lexeme_stats_differences d WHERE d.df IS NOT NULL
    ORDER BY 1, 2, 3;
    DROP TABLE lexeme_stats_differences;
END $$;
REVOKE ALL ON FUNCTION recall_rebuild_lexeme_stats() FROM PUBLIC;
