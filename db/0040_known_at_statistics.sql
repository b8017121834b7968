-- Corpus statistics as of an earlier instant, for knownAt views
-- (gateway/store/search.py and gateway/store/related.py).
--
-- BM25 ranks with the document count N, the average document length and the
-- document frequency df of each query word. The running totals of db/0002 and
-- db/0003 (and df counted over every posting) describe the present: a knownAt
-- view ranked with them moves whenever anything is written later, matching
-- the query or not. A knownAt view ranks instead with the statistics of its
-- instant, counted over the rows recorded at or before it. That count is
-- reproducible because nothing it reads ever changes: evidence, relationships
-- and their postings are only inserted (0001 grants no UPDATE or DELETE on
-- them; withdrawals, revocations, resets and re-embeds are new rows elsewhere
-- or touch only vectors), and a row's recorded_at is never rewritten.
--
-- 1. Every posting carries its document's recorded_at, as an INCLUDE column of
--    the primary key. df at t is then the same index-only scan of the
--    (team_id, space_id, lexeme) prefix as the present df, with one comparison
--    more per posting, instead of a lookup of every posting's evidence row.
--    Measured on 10,000 evidence in one space (453,057 postings, docs/
--    benchmarks.md), the whole full-text candidate statement, 100 queries
--    twice, interleaved: current view p50 39.8 ms, as of an instant with this
--    column 39.5 ms, joining each posting to its evidence instead 55.7 ms.
--    The triggers that write the postings copy the column from the new row.
-- 2. (team_id, space_id, recorded_at) INCLUDE (doc_length) on evidence and on
--    relationships: N and the total length at t by an index-only range scan of
--    the rows recorded by then.
--
-- The current view's statement is unchanged: it still reads the running totals.

ALTER TABLE evidence_terms ADD COLUMN recorded_at timestamptz;
UPDATE evidence_terms t SET recorded_at = e.recorded_at
FROM evidence e
WHERE e.team_id = t.team_id AND e.space_id = t.space_id AND e.id = t.evidence_id;
ALTER TABLE evidence_terms ALTER COLUMN recorded_at SET NOT NULL;

ALTER TABLE relationship_terms ADD COLUMN recorded_at timestamptz;
UPDATE relationship_terms t SET recorded_at = r.recorded_at
FROM relationships r
WHERE r.team_id = t.team_id AND r.space_id = t.space_id AND r.id = t.relationship_id;
ALTER TABLE relationship_terms ALTER COLUMN recorded_at SET NOT NULL;

-- The same keys, now carrying recorded_at in their leaf tuples (rebuilt once;
-- on a large store this locks each table for the build).
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
            'ADD PRIMARY KEY (team_id, space_id, lexeme, %I) INCLUDE (recorded_at)',
            t, pk, id_column);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION evidence_terms_fill() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evidence_terms (team_id, space_id, lexeme, evidence_id, tf, recorded_at)
    SELECT NEW.team_id, NEW.space_id, u.lexeme, NEW.id, coalesce(array_length(u.positions, 1), 1),
           NEW.recorded_at
    FROM unnest(NEW.search_document) AS u;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION relationship_terms_fill() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO relationship_terms (team_id, space_id, lexeme, relationship_id, tf, recorded_at)
    SELECT NEW.team_id, NEW.space_id, u.lexeme, NEW.id, coalesce(array_length(u.positions, 1), 1),
           NEW.recorded_at
    FROM unnest(NEW.search_document) AS u;
    RETURN NULL;
END $$;

CREATE INDEX evidence_known_at ON evidence (team_id, space_id, recorded_at) INCLUDE (doc_length);
CREATE INDEX relationships_known_at ON relationships (team_id, space_id, recorded_at)
    INCLUDE (doc_length);
