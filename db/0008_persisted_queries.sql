-- Persisted GraphQL operations (Automatic Persisted Queries), shared by every
-- gateway process through the database and bounded by the gateway, which
-- trims the least recently used rows past RECALL_PERSISTED_QUERY_MAX_ENTRIES.
-- Operations are not tenant data (no team_id, no row-level security): they are
-- GraphQL documents keyed by their SHA-256, and running one still goes through
-- the caller's own authorisation. Only the connecting role reads or writes
-- here; the tenant role recall_app has no privilege on it.
CREATE TABLE persisted_queries (
    sha256       text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    document     text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_used_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX persisted_queries_last_used ON persisted_queries (last_used_at);

REVOKE ALL ON persisted_queries FROM recall_app;
