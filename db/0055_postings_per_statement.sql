-- The BM25 postings and the full-text columns of evidence and relationships,
-- written once per statement and parsed once per row.
--
-- 1. Postings per statement. evidence_terms_fill and relationship_terms_fill
--    (db/0001, db/0003, db/0040) ran once per inserted row: a PL/pgSQL call
--    and a planned INSERT for every evidence row of a loader batch's COPY. They
--    now run once per statement over its transition table: a COPY of a batch's
--    evidence writes all their postings with one INSERT ... SELECT, and a
--    single-row INSERT (a mutation, `remember`) writes the same rows as before.
--    The rows are the same as the row triggers made (lexeme, tf from the
--    positions, the document's team, space, id and recorded_at); they are
--    still ordinary inserts into the postings tables, under the writer's role
--    and row-level security, so the foreign-key checks and any trigger on the
--    postings tables fire as before.
--
-- 2. One parse per row. search_document and doc_length were two generated
--    columns, each calling to_tsvector on the text: every row was parsed
--    twice (about 0.4 ms per SciFact abstract each). A BEFORE INSERT trigger
--    now parses once and derives the length from that document. Same values:
--    doc_length was tsvector_token_count(to_tsvector('english', text)), the
--    document is to_tsvector('english', text). Nothing can store other values:
--    the trigger overwrites both columns on every insert and on any update of
--    the text (the application role may not update these tables at all).

-- ---------------------------------------------------------------------------
-- 1. Postings per statement
-- ---------------------------------------------------------------------------

DROP TRIGGER evidence_terms_fill ON evidence;
DROP TRIGGER relationship_terms_fill ON relationships;

CREATE OR REPLACE FUNCTION evidence_terms_fill() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evidence_terms (team_id, space_id, lexeme, evidence_id, tf, recorded_at)
    SELECT n.team_id, n.space_id, u.lexeme, n.id, coalesce(array_length(u.positions, 1), 1),
           n.recorded_at
    FROM new_evidence_rows n CROSS JOIN LATERAL unnest(n.search_document) AS u;
    RETURN NULL;
END $$;
CREATE TRIGGER evidence_terms_fill AFTER INSERT ON evidence
    REFERENCING NEW TABLE AS new_evidence_rows
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_terms_fill();

CREATE OR REPLACE FUNCTION relationship_terms_fill() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO relationship_terms (team_id, space_id, lexeme, relationship_id, tf, recorded_at)
    SELECT n.team_id, n.space_id, u.lexeme, n.id, coalesce(array_length(u.positions, 1), 1),
           n.recorded_at
    FROM new_relationship_rows n CROSS JOIN LATERAL unnest(n.search_document) AS u;
    RETURN NULL;
END $$;
CREATE TRIGGER relationship_terms_fill AFTER INSERT ON relationships
    REFERENCING NEW TABLE AS new_relationship_rows
    FOR EACH STATEMENT EXECUTE FUNCTION relationship_terms_fill();

-- ---------------------------------------------------------------------------
-- 2. One parse per row
-- ---------------------------------------------------------------------------

ALTER TABLE evidence ALTER COLUMN search_document DROP EXPRESSION;
ALTER TABLE evidence ALTER COLUMN doc_length DROP EXPRESSION;
ALTER TABLE relationships ALTER COLUMN search_document DROP EXPRESSION;
ALTER TABLE relationships ALTER COLUMN doc_length DROP EXPRESSION;

CREATE FUNCTION evidence_search_document() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.search_document := to_tsvector('english'::regconfig, NEW.content);
    NEW.doc_length := tsvector_token_count(NEW.search_document);
    RETURN NEW;
END $$;
CREATE TRIGGER evidence_search_document BEFORE INSERT OR UPDATE ON evidence
    FOR EACH ROW EXECUTE FUNCTION evidence_search_document();

CREATE FUNCTION relationship_search_document() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.search_document := to_tsvector('english'::regconfig, NEW.statement);
    NEW.doc_length := tsvector_token_count(NEW.search_document);
    RETURN NEW;
END $$;
CREATE TRIGGER relationship_search_document BEFORE INSERT OR UPDATE ON relationships
    FOR EACH ROW EXECUTE FUNCTION relationship_search_document();
