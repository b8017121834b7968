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
-- build). Writers are unaffected: whatever inserts postings (the row triggers,
-- a set-based loader) fills the same columns.
DO $$
DECLARE
    t text;
    pk text;
    id_column text;
BEGIN
    FOREACH t IN ARRAY ARRAY['evidence_terms', 'relationship_terms'] LOOP
        SELECT conname INTO STRICT pk FROM pg_constraint
         WHERE conrelid = t::regclass AND contype = 'p';
        id_column := CASE t WHEN 'evidence_terms' THEN 'evidence_id' ELSE 'relationship_id' END;
        EXECUTE format(
            'ALTER TABLE %I DROP CONSTRAINT %I, '
            'ADD PRIMARY KEY (team_id, space_id, lexeme, %I) INCLUDE (recorded_at, tf)',
            t, pk, id_column);
    END LOOP;
END $$;
