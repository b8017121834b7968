-- Persisted queries belong to the team that registered them (issue: hardening,
-- round 2). Shared by every tenant, a stored document told anyone who guessed
-- its text that some team had run it (its recall query words included), and
-- anonymous callers could fill the store and push everybody's entries out.
-- Now only an authenticated caller registers, for its own team; a hash is
-- looked up in the caller's team only; the bound and its least-recently-used
-- trimming are per team. The rows so far have no owner: they are dropped (the
-- store is a cache: clients send the document again on
-- PERSISTED_QUERY_NOT_FOUND).
DELETE FROM persisted_queries;

ALTER TABLE persisted_queries DROP CONSTRAINT persisted_queries_pkey;
ALTER TABLE persisted_queries
    ADD COLUMN team_id client_id NOT NULL REFERENCES teams (id),
    ADD COLUMN principal_id client_id NOT NULL;
ALTER TABLE persisted_queries ADD PRIMARY KEY (team_id, sha256);

DROP INDEX persisted_queries_last_used;
CREATE INDEX persisted_queries_team_last_used ON persisted_queries (team_id, last_used_at);

-- Still read and written by the connecting role only (recall_app has no
-- privilege on it); the team wall is there for the day it gets one.
ALTER TABLE persisted_queries ENABLE ROW LEVEL SECURITY;
CREATE POLICY team_wall ON persisted_queries TO recall_app
    USING (team_id = recall_current_team()) WITH CHECK (team_id = recall_current_team());
