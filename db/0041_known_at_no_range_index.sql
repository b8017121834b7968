-- Drop the (team_id, space_id, recorded_at) indexes of db/0040.
--
-- They made bulk loads quadratic. The foreign-key check of every new posting
-- (evidence_terms -> evidence, relationship_terms -> relationships) looks its
-- document up by (team_id, space_id, id). On a table without statistics yet (a
-- new store, or before autovacuum has analysed a large first load), the
-- planner costed these indexes like the unique key, took them with the id as a
-- mere filter, and so read every row of the space for every posting: a
-- 10,000-evidence COPY that took about a minute ran for many minutes.
--
-- The statistics of an instant need no index of their own: N and the total
-- length as of t are an index-only scan of the space's entries in
-- evidence_search_filter / relationships_search_filter (both carry
-- recorded_at and doc_length), the same rows a range scan would read when t is
-- recent, the usual case. Measured in docs/benchmarks.md.
DROP INDEX evidence_known_at;
DROP INDEX relationships_known_at;
