-- The space wall reads the readable spaces once per statement, not once per row.
--
-- Every space_wall policy (db/0001 and the migrations that added tables since)
-- says
--
--     team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces())
--
-- recall_allowed_spaces() is an inlined SQL function:
-- coalesce(nullif(current_setting('recall.space_ids', true), '')::uuid[], ...).
-- Its value is not a constant, so the executor evaluates it wherever the qual
-- is evaluated: for every row a scan filters, and at every rescan of an index
-- scan that uses it as an index condition; each time it looks the setting up
-- and parses its text into a uuid[] (array_in, uuid_in per element). A profile
-- of a recall's statements on the server (perf, docs/benchmarks.md, "What a
-- recall costs the server") put array_in and uuid_in at about 8 % of the
-- server's CPU: the recall's statements run their lookups in nested loops and
-- correlated subqueries, thousands of rescans and rows per recall.
--
-- As a scalar subquery the value becomes an InitPlan: computed once per
-- execution of the statement, then read as a parameter by every scan and
-- rescan (btree takes it as an array index condition as before). The rows
-- the policy admits are the same: the same function of the same setting, read
-- within one statement. The team predicate is left as it is: every statement
-- of the store names the team itself, so the planner turns the policy's team
-- test into a one-time filter comparing the setting with that parameter.
--
-- The cast to uuid[] makes the subquery an array expression: written without
-- it, "= ANY ((SELECT ...))" is parsed as "= ANY (subquery)", which compares
-- a uuid with each row's uuid[].
--
-- A table given a space wall later should use the same expression
-- (docs/data-model.md, "Row-level security").

DO $$
DECLARE
    t regclass;
BEGIN
    FOR t IN
        SELECT pol.polrelid::regclass
        FROM pg_policy pol
        JOIN pg_class c ON c.oid = pol.polrelid
        WHERE pol.polname = 'space_wall'
          AND c.relnamespace = 'public'::regnamespace
        ORDER BY pol.polrelid
    LOOP
        EXECUTE format(
            'ALTER POLICY space_wall ON %s '
            'USING (team_id = recall_current_team() '
            'AND space_id = ANY ((SELECT recall_allowed_spaces())::uuid[])) '
            'WITH CHECK (team_id = recall_current_team() '
            'AND space_id = ANY ((SELECT recall_allowed_spaces())::uuid[]))',
            t);
    END LOOP;
END $$;
