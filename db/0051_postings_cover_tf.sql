-- The full-text lists read each query lexeme's postings with their term
-- frequency (gateway/store/bm25.py). tf lived only in the table's rows, so
-- every posting cost a visit to its own heap page (the postings of a lexeme
-- are written one document at a time, far apart): 7,426 postings of a
-- 10-word question read 6,900 pages of a 10,000-evidence space, 107 of the
-- 146 ms of the evidence candidate statement under EXPLAIN ANALYZE with a cold
-- cache. With tf in the primary key's leaf tuples (as recorded_at since
-- db/0040) that read is an index-only scan of the lexeme's key range, a few
-- dozen pages. Four bytes more per posting; no second index to maintain.
--
-- The keys are rebuilt once (on a large store this locks each table for the
-- build; db/0040 named both keys <table>_pkey). Writers are unaffected: the
-- postings triggers (db/0055) fill the same columns.
ALTER TABLE evidence_terms DROP CONSTRAINT evidence_terms_pkey,
    ADD PRIMARY KEY (team_id, space_id, lexeme, evidence_id) INCLUDE (recorded_at, tf);
ALTER TABLE relationship_terms DROP CONSTRAINT relationship_terms_pkey,
    ADD PRIMARY KEY (team_id, space_id, lexeme, relationship_id) INCLUDE (recorded_at, tf);
