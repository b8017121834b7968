-- Writes by principals (the GraphQL mutations) run as recall_app under row-level
-- security, like reads: the team and the principal's writable spaces are set per
-- transaction, so a write that forgot a check still cannot touch another team or
-- another principal's private space (docs/writes.md).
--
-- The one privilege that path lacks: the very first vectors written into an empty
-- store register the embedding model (at most one row, no tenant data; see
-- 0001). Without this grant, a store whose first evidence comes from a mutation
-- could not register it.
GRANT INSERT ON embedding_models TO recall_app;
