-- The spaces whose vector tables `recall-gateway load --index-after` detached
-- (gateway/store/vector_partitions.py), one row per space from its detach until
-- both its tables are attached again, each change in the same transaction as
-- the DDL it records.
--
-- Before this table the catalogue alone said which tables were deferred: any
-- non-partition table named like a space's partition was taken as one and
-- attached by build-vector-indexes, so a table someone else made under such a
-- name (a backup copy made with CREATE TABLE ... AS) would have been attached
-- into the live parent. Now only the tables the store detached itself are
-- built and attached. The row also lets a re-embed and the migration runner
-- refuse while vectors are detached, and names the spaces in their messages.
--
-- Row-level security as on every tenant table: the application role may read
-- the rows of its own team's allowed spaces (recall can then say that a
-- space's vector list waits for its index), and never writes here; only the
-- loader, the tables' owner, does.

CREATE TABLE vector_deferrals (
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    PRIMARY KEY (team_id, space_id),
    deferred_at timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, space_id) REFERENCES memory_spaces (team_id, id)
);

ALTER TABLE vector_deferrals ENABLE ROW LEVEL SECURITY;
CREATE POLICY space_wall ON vector_deferrals TO recall_app
    USING (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces()));
GRANT SELECT ON vector_deferrals TO recall_app;
