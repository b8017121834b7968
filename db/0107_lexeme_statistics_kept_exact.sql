-- The kept lexeme statistics (db/0106) stay exact whatever changes the postings.
--
-- db/0106 counts a posting when it is inserted, and nothing in the gateway
-- deletes, updates or truncates postings. The tables' owner can, though
-- (maintenance, tests, the TRUNCATE that docs/data-model.md describes since
-- db/0115), and before this migration that left the statistics stale with no
-- error: a df too large changes BM25's ranked lists. Now:
--
-- 1. TRUNCATE of a postings table empties its statistics (AFTER TRUNCATE
--    statement trigger), so the instruction cannot be forgotten. DELETE, not
--    TRUNCATE, of the statistics: a TRUNCATE ... CASCADE may already hold the
--    statistics table open, and TRUNCATE refuses a table in use.
-- 2. DELETE or UPDATE of postings recounts, from the postings, the rows of every
--    (team, space, lexeme) the statement touched (statement triggers over the
--    OLD/NEW transition tables): df and max_tf both exact again, not an upper
--    bound. First the statistics table is locked EXCLUSIVE: readers go on, but
--    writers of postings (whose insert trigger upserts these rows) wait until
--    this transaction ends, and those already in flight are waited for, so the
--    count sees every posting whose statistics are already kept and none whose
--    statistics will be added after it. Owner maintenance only; the gateway
--    never takes this path.
-- 3. A foreign key from the statistics to memory_spaces, as db/0002's
--    evidence_search_stats has: TRUNCATE memory_spaces CASCADE now reaches them
--    and no orphan row is left. It is checked only when a new (space, lexeme,
--    shard) row is inserted, never on the upsert's update; deferred to the
--    commit, so that a posting naming no document of its space is still refused
--    by db/0115's check, with that check's error (the statistics trigger fires
--    first).
-- 4. recall_rebuild_lexeme_stats(): the owner's recount of both tables from
--    the postings, for a migration that ever rewrites postings with the
--    triggers disabled.

CREATE FUNCTION evidence_lexeme_stats_recount() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    LOCK TABLE evidence_lexeme_stats IN EXCLUSIVE MODE;
    CREATE TEMP TABLE IF NOT EXISTS lexeme_stats_touched
        (team_id text, space_id uuid, lexeme text) ON COMMIT DROP;
    TRUNCATE lexeme_stats_touched;
    IF TG_OP = 'DELETE' OR TG_OP = 'UPDATE' THEN
        INSERT INTO lexeme_stats_touched SELECT DISTINCT team_id, space_id, lexeme FROM old_postings;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        INSERT INTO lexeme_stats_touched SELECT DISTINCT team_id, space_id, lexeme FROM new_postings;
    END IF;
    DELETE FROM evidence_lexeme_stats s USING lexeme_stats_touched k
    WHERE s.team_id = k.team_id AND s.space_id = k.space_id AND s.lexeme = k.lexeme;
    INSERT INTO evidence_lexeme_stats (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT k.team_id, k.space_id, k.lexeme, 0, c.df, c.max_tf
    FROM (SELECT DISTINCT team_id, space_id, lexeme FROM lexeme_stats_touched) k
    CROSS JOIN LATERAL (
        SELECT count(*) AS df, max(t.tf) AS max_tf FROM evidence_terms t
        WHERE t.team_id = k.team_id AND t.space_id = k.space_id AND t.lexeme = k.lexeme) c
    WHERE c.df > 0
    ORDER BY 1, 2, 3;
    RETURN NULL;
END $$;

CREATE FUNCTION relationship_lexeme_stats_recount() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    LOCK TABLE relationship_lexeme_stats IN EXCLUSIVE MODE;
    CREATE TEMP TABLE IF NOT EXISTS lexeme_stats_touched
        (team_id text, space_id uuid, lexeme text) ON COMMIT DROP;
    TRUNCATE lexeme_stats_touched;
    IF TG_OP = 'DELETE' OR TG_OP = 'UPDATE' THEN
        INSERT INTO lexeme_stats_touched SELECT DISTINCT team_id, space_id, lexeme FROM old_postings;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        INSERT INTO lexeme_stats_touched SELECT DISTINCT team_id, space_id, lexeme FROM new_postings;
    END IF;
    DELETE FROM relationship_lexeme_stats s USING lexeme_stats_touched k
    WHERE s.team_id = k.team_id AND s.space_id = k.space_id AND s.lexeme = k.lexeme;
    INSERT INTO relationship_lexeme_stats (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT k.team_id, k.space_id, k.lexeme, 0, c.df, c.max_tf
    FROM (SELECT DISTINCT team_id, space_id, lexeme FROM lexeme_stats_touched) k
    CROSS JOIN LATERAL (
        SELECT count(*) AS df, max(t.tf) AS max_tf FROM relationship_terms t
        WHERE t.team_id = k.team_id AND t.space_id = k.space_id AND t.lexeme = k.lexeme) c
    WHERE c.df > 0
    ORDER BY 1, 2, 3;
    RETURN NULL;
END $$;

CREATE TRIGGER evidence_lexeme_stats_on_delete AFTER DELETE ON evidence_terms
    REFERENCING OLD TABLE AS old_postings
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_lexeme_stats_recount();
CREATE TRIGGER evidence_lexeme_stats_on_update AFTER UPDATE ON evidence_terms
    REFERENCING OLD TABLE AS old_postings NEW TABLE AS new_postings
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_lexeme_stats_recount();
CREATE TRIGGER relationship_lexeme_stats_on_delete AFTER DELETE ON relationship_terms
    REFERENCING OLD TABLE AS old_postings
    FOR EACH STATEMENT EXECUTE FUNCTION relationship_lexeme_stats_recount();
CREATE TRIGGER relationship_lexeme_stats_on_update AFTER UPDATE ON relationship_terms
    REFERENCING OLD TABLE AS old_postings NEW TABLE AS new_postings
    FOR EACH STATEMENT EXECUTE FUNCTION relationship_lexeme_stats_recount();

CREATE FUNCTION evidence_lexeme_stats_clear() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    DELETE FROM evidence_lexeme_stats;
    RETURN NULL;
END $$;

CREATE FUNCTION relationship_lexeme_stats_clear() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    DELETE FROM relationship_lexeme_stats;
    RETURN NULL;
END $$;

CREATE TRIGGER evidence_lexeme_stats_on_truncate AFTER TRUNCATE ON evidence_terms
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_lexeme_stats_clear();
CREATE TRIGGER relationship_lexeme_stats_on_truncate AFTER TRUNCATE ON relationship_terms
    FOR EACH STATEMENT EXECUTE FUNCTION relationship_lexeme_stats_clear();

-- Owner only (not granted to recall_app): both tables recounted from the postings.
CREATE FUNCTION recall_rebuild_lexeme_stats() RETURNS void
    LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    LOCK TABLE evidence_terms, relationship_terms IN SHARE ROW EXCLUSIVE MODE;
    DELETE FROM evidence_lexeme_stats;
    DELETE FROM relationship_lexeme_stats;
    INSERT INTO evidence_lexeme_stats (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT t.team_id, t.space_id, t.lexeme, 0, count(*), max(t.tf)
    FROM evidence_terms t GROUP BY t.team_id, t.space_id, t.lexeme;
    INSERT INTO relationship_lexeme_stats (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT t.team_id, t.space_id, t.lexeme, 0, count(*), max(t.tf)
    FROM relationship_terms t GROUP BY t.team_id, t.space_id, t.lexeme;
END $$;
REVOKE ALL ON FUNCTION recall_rebuild_lexeme_stats() FROM PUBLIC;

-- Rows of spaces already gone (a TRUNCATE memory_spaces CASCADE before this
-- migration) would fail the foreign key; they count postings that no longer exist.
DELETE FROM evidence_lexeme_stats s
WHERE NOT EXISTS (SELECT 1 FROM memory_spaces m WHERE m.team_id = s.team_id AND m.id = s.space_id);
DELETE FROM relationship_lexeme_stats s
WHERE NOT EXISTS (SELECT 1 FROM memory_spaces m WHERE m.team_id = s.team_id AND m.id = s.space_id);
ALTER TABLE evidence_lexeme_stats
    ADD FOREIGN KEY (team_id, space_id) REFERENCES memory_spaces (team_id, id)
    DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE relationship_lexeme_stats
    ADD FOREIGN KEY (team_id, space_id) REFERENCES memory_spaces (team_id, id)
    DEFERRABLE INITIALLY DEFERRED;
