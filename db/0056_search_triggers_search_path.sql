-- The trigger functions of db/0055 with a fixed search_path.
--
-- db/0055 made search_document and doc_length by a BEFORE trigger and the
-- postings by statement triggers. Their names (tsvector_token_count, the
-- postings tables) were looked up in the search_path of the session that
-- inserts, so a session without public in its path failed, or could find
-- another schema's function of the same name. The generated columns they
-- replaced had bound those names when the column was created. Same convention
-- as the other functions of the store (db/0001): public, then pg_temp last.
-- Only the functions' settings change: their bodies and the rows they make are
-- the same (tests/test_postings.py).

ALTER FUNCTION evidence_search_document() SET search_path = public, pg_temp;
ALTER FUNCTION relationship_search_document() SET search_path = public, pg_temp;
ALTER FUNCTION evidence_terms_fill() SET search_path = public, pg_temp;
ALTER FUNCTION relationship_terms_fill() SET search_path = public, pg_temp;
