-- A document's text is written once: evidence.content and
-- relationships.statement (and the search_document / doc_length parsed from
-- them) cannot change after insert.
--
-- The BM25 postings (evidence_terms, relationship_terms) are written from a
-- row's search_document when the row is inserted, and only then (db/0130).
-- db/0055's parse trigger ran BEFORE INSERT OR UPDATE of any column, so an
-- owner's UPDATE of the text (or of any column, once the 'english'
-- dictionaries had changed, e.g. after a major upgrade) rewrote
-- search_document and left the postings naming the old lexemes. Since db/0195
-- the evidence full-text function takes a scored document's term frequencies
-- from its search_document and picks documents from the postings: such a row
-- would be picked by a word it no longer holds and scored NULL, which a
-- descending order puts first (before, it ranked by its stale postings).
-- The gateway never updates a document (its role may only SELECT and INSERT
-- them; a changed memory is a new evidence or relationship and a status
-- event), so the rule is made real instead of repaired after the fact:
-- - the parse triggers fire on INSERT only (an UPDATE keeps the row's parsed
--   text, the one its postings were written from);
-- - an UPDATE that changes the text, search_document or doc_length is
--   refused: SQLSTATE 0A000 (feature_not_supported), with a hint. Updates of
--   other columns (an owner's maintenance) and re-keying (db/0118's guards)
--   are as before.

DROP TRIGGER evidence_search_document ON evidence;
CREATE TRIGGER evidence_search_document BEFORE INSERT ON evidence
    FOR EACH ROW EXECUTE FUNCTION evidence_search_document();

DROP TRIGGER relationship_search_document ON relationships;
CREATE TRIGGER relationship_search_document BEFORE INSERT ON relationships
    FOR EACH ROW EXECUTE FUNCTION relationship_search_document();

CREATE FUNCTION document_text_append_only() RETURNS trigger
    LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'the text of % % cannot change after it is written', TG_TABLE_NAME, OLD.id
        USING ERRCODE = 'feature_not_supported',
              HINT = 'its full-text postings were written from it: write a new document '
                     '(and a status event for the old one) instead';
END $$;
REVOKE EXECUTE ON FUNCTION document_text_append_only() FROM PUBLIC;

CREATE TRIGGER evidence_text_append_only BEFORE UPDATE ON evidence
    FOR EACH ROW
    WHEN (OLD.content IS DISTINCT FROM NEW.content
          OR OLD.search_document IS DISTINCT FROM NEW.search_document
          OR OLD.doc_length IS DISTINCT FROM NEW.doc_length)
    EXECUTE FUNCTION document_text_append_only();

CREATE TRIGGER relationships_text_append_only BEFORE UPDATE ON relationships
    FOR EACH ROW
    WHEN (OLD.statement IS DISTINCT FROM NEW.statement
          OR OLD.search_document IS DISTINCT FROM NEW.search_document
          OR OLD.doc_length IS DISTINCT FROM NEW.doc_length)
    EXECUTE FUNCTION document_text_append_only();
