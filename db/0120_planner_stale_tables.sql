-- The tables whose planner statistics the loader's refresh should renew
-- (gateway/store/bulk_writes.py, Staleness; docs/data-model.md, "Planner
-- statistics on a new store"), picked by one call.
--
-- Why a function: the page rule reads each table's size from its file
-- (pg_relation_size), which takes ACCESS SHARE on the table and so waits
-- behind a session holding ACCESS EXCLUSIVE on it (a migration, an ALTER, the
-- detach of 'load --index-after'). As one SQL statement under a lock timeout,
-- a single such table failed the whole selection, and no table was analysed
-- after that batch. Here each size read has its own exception block: a table
-- whose lock does not come within the function's lock_timeout is left out (as
-- ANALYZE (SKIP_LOCKED) leaves out a table it cannot lock), and the others are
-- still returned. The rows rule, which needs no lock, is tried first, so a
-- table it picks is never sized.
--
-- Arguments as in Staleness: a table is stale when its pages on disk are at
-- least pages_factor * relpages + extra_pages, or the rows changed since its
-- last analysis at least rows_factor * reltuples + extra_rows, or it holds rows
-- and has no statistics at all (only a table some foreign key references,
-- unless every_unplanned). Names come as regclass prints them (quoted where
-- needed), in oid order.

CREATE FUNCTION planner_stale_tables(
    pages_factor float8,
    extra_pages bigint,
    rows_factor float8,
    extra_rows bigint,
    every_unplanned boolean
) RETURNS SETOF text
    LANGUAGE plpgsql VOLATILE
    SET search_path = public, pg_temp
    SET lock_timeout = '100ms' AS $$
DECLARE
    t record;
    pages float8;
    block_size float8 := current_setting('block_size')::float8;
BEGIN
    FOR t IN
        SELECT c.oid,
               c.reltuples,
               c.relpages,
               coalesce(s.n_mod_since_analyze, 0) AS changed,
               (every_unplanned
                OR c.oid IN (SELECT confrelid FROM pg_constraint WHERE contype = 'f'))
                   AS counts_unplanned
        FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
        WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
        ORDER BY c.oid
    LOOP
        IF t.changed >= rows_factor * greatest(t.reltuples, 0) + extra_rows THEN
            RETURN NEXT t.oid::regclass::text;
            CONTINUE;
        END IF;
        BEGIN
            pages := pg_relation_size(t.oid) / block_size;
        EXCEPTION WHEN lock_not_available THEN
            CONTINUE;  -- locked: the next refresh looks again
        END;
        IF (t.reltuples <= 0 AND t.counts_unplanned AND pages > 0)
           OR pages >= pages_factor * t.relpages + extra_pages THEN
            RETURN NEXT t.oid::regclass::text;
        END IF;
    END LOOP;
END $$;
