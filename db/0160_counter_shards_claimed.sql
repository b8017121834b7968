-- The per-space counters' shard is claimed by the writing transaction, so that
-- two writers never hold the same counter row and cannot deadlock on them.
--
-- Five statement triggers keep running totals per space in shard rows:
-- evidence_search_stats (db/0002), relationship_search_stats and
-- graph_change_counters (db/0003), evidence_lexeme_stats and
-- relationship_lexeme_stats (db/0106). Each upsert locks its row until the
-- transaction ends. The shard was the writing server process's,
-- pg_backend_pid() % 8: two transactions on connections of one shard that
-- wrote two spaces in opposite orders (evidence into space X then Y, and Y
-- then X; or a relationship of X then evidence of Y, against the reverse) each
-- held the row the other needed next, and PostgreSQL cancelled one (40P01):
-- a `remember` got DATABASE_UNAVAILABLE, a loader batch was refused.
-- Sorting the rows within one statement, which the triggers do, cannot order
-- the statements of two transactions. tests/test_write_deadlock.py makes both
-- cycles happen, deterministically, on the code before this migration.
--
-- Now a transaction claims a shard that no other transaction holds: a
-- transaction-level advisory lock (first key 1936220530, second the shard),
-- the lowest free of 0..31, taken by recall_stats_shard() the first time the
-- transaction writes a counter (the gateway's write transactions call it
-- first thing, before any other lock; gateway/services/writes.py) and held
-- to its end; the shard is remembered in the transaction's setting
-- recall.stats_shard. Two transactions in flight therefore write distinct
-- shard rows: no writer waits for another's counter row, so no cycle can go
-- through them, and writers of one space no longer queue on its row (a
-- `remember` no longer waits for a loader batch of its shard and space that is
-- computing embeddings). Only when all 32 shards are held does a transaction
-- wait: for the first shard freed (tried again every few ms, for about 2 s),
-- then for the shard of its process (pg_backend_pid() % 32) until that
-- transaction ends; the gateway's writers wait holding no other lock, bounded
-- by their statement timeout. An owner's transaction that claims only in a
-- trigger, holding rows already, can then deadlock with the holder of that
-- shard (detected: one is cancelled); docs/data-model.md says so.
--
-- The triggers claim once per call (a variable), not once per row of their
-- upsert.
--
-- Lowest free first: a store written by one writer at a time keeps one row per
-- (space[, lexeme]), in shard 0, and readers, which sum the shards, read as
-- many rows as there were writers at once, not up to 8 per key as before.
--
-- Unchanged: what the rows sum to (the triggers' bodies are those of db/0002,
-- db/0003 and db/0106 but for the shard), how readers sum them, and what the
-- application role may do (read only; the triggers write as the owner).
-- Rows written before this migration stay in shards 0..7 and keep counting.

CREATE FUNCTION recall_stats_shard() RETURNS smallint
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held text := current_setting('recall.stats_shard', true);
    k integer;
    attempt integer;
BEGIN
    -- Already claimed by this transaction (the lock is re-entrant, so this only
    -- confirms it; a setting forged to another's shard fails here and is replaced).
    IF held ~ '^[0-9]{1,2}$' THEN
        k := held::integer;
        IF k < 32 AND pg_try_advisory_xact_lock(1936220530, k) THEN
            RETURN k::smallint;
        END IF;
    END IF;
    -- The lowest free shard; with all 32 held, the first one freed: the loop is
    -- tried again after a pause (1 ms, doubling to 50 ms) for about 2 s.
    FOR attempt IN 0 .. 48 LOOP
        FOR k IN 0 .. 31 LOOP
            IF pg_try_advisory_xact_lock(1936220530, k) THEN
                PERFORM set_config('recall.stats_shard', k::text, true);
                RETURN k::smallint;
            END IF;
        END LOOP;
        PERFORM pg_sleep(least(0.05, 0.001 * 2 ^ least(attempt, 6)));
    END LOOP;
    -- Still none: wait for the shard of this process as a lock wait, which
    -- PostgreSQL's deadlock detection sees (a pause does not: an owner's
    -- transaction claiming inside a trigger may hold a row that the holder of
    -- a shard waits for; the gateway claims first and holds nothing then).
    k := pg_backend_pid() % 32;
    PERFORM pg_advisory_xact_lock(1936220530, k);
    PERFORM set_config('recall.stats_shard', k::text, true);
    RETURN k::smallint;
END $$;
-- Any writer may claim (the application role's transactions do, first thing);
-- functions are executable by PUBLIC by default, said here on purpose.
GRANT EXECUTE ON FUNCTION recall_stats_shard() TO PUBLIC;

CREATE OR REPLACE FUNCTION evidence_search_stats_add() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    my_shard smallint := recall_stats_shard();
BEGIN
    INSERT INTO evidence_search_stats AS s (team_id, space_id, shard, doc_count, total_length)
    SELECT n.team_id, n.space_id, my_shard, count(*), sum(n.doc_length)
    FROM new_evidence n
    GROUP BY n.team_id, n.space_id
    -- A fixed order of row locks: two statements never wait on each other in a cycle.
    ORDER BY n.team_id, n.space_id
    ON CONFLICT (team_id, space_id, shard) DO UPDATE
        SET doc_count = s.doc_count + excluded.doc_count,
            total_length = s.total_length + excluded.total_length;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION relationship_search_stats_add() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    my_shard smallint := recall_stats_shard();
BEGIN
    INSERT INTO relationship_search_stats AS s (team_id, space_id, shard, doc_count, total_length)
    SELECT n.team_id, n.space_id, my_shard, count(*), sum(n.doc_length)
    FROM new_relationships n
    GROUP BY n.team_id, n.space_id
    ORDER BY n.team_id, n.space_id
    ON CONFLICT (team_id, space_id, shard) DO UPDATE
        SET doc_count = s.doc_count + excluded.doc_count,
            total_length = s.total_length + excluded.total_length;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION graph_change_counters_add() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    my_shard smallint := recall_stats_shard();
BEGIN
    INSERT INTO graph_change_counters AS c (team_id, space_id, shard, changes, changed_at)
    SELECT n.team_id, n.space_id, my_shard, count(*), now()
    FROM changed_rows n
    GROUP BY n.team_id, n.space_id
    ORDER BY n.team_id, n.space_id
    ON CONFLICT (team_id, space_id, shard) DO UPDATE
        SET changes = c.changes + excluded.changes,
            changed_at = greatest(c.changed_at, excluded.changed_at);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION evidence_lexeme_stats_add() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    my_shard smallint := recall_stats_shard();
BEGIN
    INSERT INTO evidence_lexeme_stats AS s (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT n.team_id, n.space_id, n.lexeme, my_shard, count(*), max(n.tf)
    FROM new_evidence_terms n
    GROUP BY n.team_id, n.space_id, n.lexeme
    -- A fixed order of row locks: two statements never wait on each other in a cycle.
    ORDER BY n.team_id, n.space_id, n.lexeme
    ON CONFLICT (team_id, space_id, lexeme, shard) DO UPDATE
        SET df = s.df + excluded.df, max_tf = greatest(s.max_tf, excluded.max_tf);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION relationship_lexeme_stats_add() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    my_shard smallint := recall_stats_shard();
BEGIN
    INSERT INTO relationship_lexeme_stats AS s (team_id, space_id, lexeme, shard, df, max_tf)
    SELECT n.team_id, n.space_id, n.lexeme, my_shard, count(*), max(n.tf)
    FROM new_relationship_terms n
    GROUP BY n.team_id, n.space_id, n.lexeme
    ORDER BY n.team_id, n.space_id, n.lexeme
    ON CONFLICT (team_id, space_id, lexeme, shard) DO UPDATE
        SET df = s.df + excluded.df, max_tf = greatest(s.max_tf, excluded.max_tf);
    RETURN NULL;
END $$;

-- Room for 32 shards. Every existing row is in 0..7, so the new check holds for
-- them. Added NOT VALID, then validated: one read of each table, still under
-- the ACCESS EXCLUSIVE lock of the ALTER (a migration file is one transaction).
DO $$
DECLARE
    t text;
    c text;
BEGIN
    FOREACH t IN ARRAY ARRAY['evidence_search_stats', 'relationship_search_stats',
        'graph_change_counters', 'evidence_lexeme_stats', 'relationship_lexeme_stats'] LOOP
        SELECT conname INTO STRICT c FROM pg_constraint
        WHERE conrelid = t::regclass AND contype = 'c'
          AND pg_get_constraintdef(oid) LIKE '%shard%';
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I, '
                       'ADD CONSTRAINT %I CHECK (shard BETWEEN 0 AND 31) NOT VALID', t, c, c);
        EXECUTE format('ALTER TABLE %I VALIDATE CONSTRAINT %I', t, c);
    END LOOP;
END $$;
