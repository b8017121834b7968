-- The postings are written by their triggers only: the application role may
-- read them, no longer insert them.
--
-- db/0001 and db/0003 granted recall_app SELECT and INSERT on evidence_terms
-- and relationship_terms, because the triggers that fill them from a new
-- document (evidence_terms_fill, relationship_terms_fill; db/0055) ran as the
-- writer: a principal's `remember` (a tenant transaction, recall_app) inserted
-- its postings under its own role. Nothing in the gateway inserts postings by
-- any other way (no statement of gateway/ names the postings tables but the
-- two full-text searches, which read them), and the grant let a direct insert
-- do what no trigger does:
--
-- - db/0106's argument that the lexeme statistics' row locks form no cycle
--   rests on every postings writer first updating its space's row of
--   evidence_search_stats (relationship_search_stats) in its shard, which the
--   document's trigger does before the postings trigger fires. Two
--   transactions inserting postings directly, on one shard, skip that row:
--   each statement locks its lexemes' rows in sorted order, but two
--   transactions of several statements (lexeme a then b, and b then a) wait on
--   each other and one is killed as a deadlock.
-- - a posting inserted directly need not be one the document's text makes
--   (another tf, a lexeme not in it): BM25 would rank by it.
--
-- So:
--
-- 1. The fill triggers run as the tables' owner (SECURITY DEFINER, as the
--    postings' own statement triggers and db/0002's statistics triggers
--    already do): a principal's write of evidence or of a relationship still
--    writes its postings, the owner inserting them. Row-level security does
--    not filter the owner; it needs not here: every posting copies its team
--    and space from the statement's new document rows, which the writer's
--    policies (WITH CHECK) have already let in. EXECUTE on them is revoked
--    from PUBLIC (firing a trigger checks no EXECUTE privilege; db/0118 did
--    the same for the guards).
-- 2. recall_app keeps SELECT on the postings and loses INSERT (and, to be
--    sure whatever a deployment granted by hand, UPDATE, DELETE and TRUNCATE).
--
-- Unchanged: which rows are written (the functions' bodies are those of
-- db/0055), the postings' guards (db/0115, db/0118) and statistics (db/0106,
-- db/0107), which fire on the owner's insert as on the writer's. The owner
-- may still insert postings directly (maintenance, tests); two such
-- transactions of several statements each, on one shard, can still deadlock,
-- as the owner's other maintenance can (docs/data-model.md says so).
-- tests/test_postings_guards.py checks the refusals and that principals'
-- writes still fill the postings and their statistics.

ALTER FUNCTION evidence_terms_fill() SECURITY DEFINER;
ALTER FUNCTION relationship_terms_fill() SECURITY DEFINER;
REVOKE EXECUTE ON FUNCTION evidence_terms_fill() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION relationship_terms_fill() FROM PUBLIC;

REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON evidence_terms, relationship_terms FROM recall_app;
