-- The postings' references to their documents, checked once per statement
-- instead of once per posting.
--
-- evidence_terms and relationship_terms had a foreign key each to their
-- document (db/0001, db/0003): every posting ran its own check, an SPI query
-- looking up and locking its evidence (or relationship) row. An abstract has
-- about 70 postings, so a loader batch of 500 evidence ran 35,000 such checks
-- against 500 rows; measured (docs/benchmarks.md, "Postings checked per
-- statement"), the checks were about half of the postings' cost and a third of
-- an evidence row's. The guard stays, as triggers that do the same work per
-- statement:
--
-- 1. After an INSERT or UPDATE of postings (statement-level, over the
--    statement's new rows): every distinct (team_id, space_id, document id)
--    must name an existing document row, which is locked FOR KEY SHARE as the
--    foreign key's check locked it (so that no other transaction deletes it or
--    changes its key before this one ends). Otherwise the statement fails with
--    the foreign key's error: SQLSTATE 23503 and the constraint's former name.
-- 2. After a DELETE or an UPDATE of documents, or a TRUNCATE of the document
--    table: no posting may be left naming a key that no document row holds any
--    more (the foreign key's NO ACTION, checked at the end of the statement);
--    otherwise the statement fails with the same error.
--
-- What a posting-by-posting foreign key gave that these do not: nothing the
-- gateway uses. The checks run as the tables' owner (SECURITY DEFINER, as the
-- foreign key's checks did), so row-level security does not hide a document
-- from them. Under REPEATABLE READ or SERIALIZABLE a foreign key re-checks
-- against the newest committed rows, these against the transaction's
-- snapshot; the gateway writes in READ COMMITTED and never deletes or updates
-- documents (the application role has neither privilege on them).
-- TRUNCATE ... CASCADE no longer reaches the postings: name them too.
--
-- Only the constraints change: the postings, their columns and keys, and the
-- triggers that write them (evidence_terms_fill, relationship_terms_fill) are
-- as before (tests/test_postings_guards.py).

ALTER TABLE evidence_terms
    DROP CONSTRAINT evidence_terms_team_id_space_id_evidence_id_fkey;
ALTER TABLE relationship_terms
    DROP CONSTRAINT relationship_terms_team_id_space_id_relationship_id_fkey;

-- ---------------------------------------------------------------------------
-- 1. New postings name an existing document
-- ---------------------------------------------------------------------------

CREATE FUNCTION evidence_terms_check_documents() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    wanted bigint;
    locked bigint;
    missing record;
BEGIN
    -- one lookup by key per distinct document (LATERAL: never a scan of the
    -- whole table, however the planner sizes the statement's rows)
    SELECT count(*), count(l.found) INTO wanted, locked
    FROM (SELECT DISTINCT team_id, space_id, evidence_id FROM new_postings) n
    LEFT JOIN LATERAL (
        SELECT true AS found FROM evidence e
        WHERE e.team_id = n.team_id AND e.space_id = n.space_id AND e.id = n.evidence_id
        FOR KEY SHARE OF e) l ON true;
    IF locked < wanted THEN
        SELECT n.team_id, n.space_id, n.evidence_id AS id INTO missing
        FROM new_postings n
        WHERE NOT EXISTS (SELECT 1 FROM evidence e
                          WHERE e.team_id = n.team_id AND e.space_id = n.space_id
                            AND e.id = n.evidence_id)
        ORDER BY 1, 2, 3 LIMIT 1;
        RAISE EXCEPTION 'insert or update on table "evidence_terms" violates foreign key constraint "%"',
                'evidence_terms_team_id_space_id_evidence_id_fkey'
            USING ERRCODE = 'foreign_key_violation',
                  SCHEMA = 'public', TABLE = 'evidence_terms',
                  CONSTRAINT = 'evidence_terms_team_id_space_id_evidence_id_fkey',
                  DETAIL = format('Key (team_id, space_id, evidence_id)=(%s, %s, %s) is not present in table "evidence".',
                                  missing.team_id, missing.space_id, missing.id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER evidence_terms_check_documents AFTER INSERT ON evidence_terms
    REFERENCING NEW TABLE AS new_postings
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_terms_check_documents();
-- (a trigger with a transition table has one event: the same check for updates)
CREATE TRIGGER evidence_terms_check_documents_update AFTER UPDATE ON evidence_terms
    REFERENCING NEW TABLE AS new_postings
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_terms_check_documents();

CREATE FUNCTION relationship_terms_check_documents() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    wanted bigint;
    locked bigint;
    missing record;
BEGIN
    -- one lookup by key per distinct document (LATERAL: never a scan of the
    -- whole table, however the planner sizes the statement's rows)
    SELECT count(*), count(l.found) INTO wanted, locked
    FROM (SELECT DISTINCT team_id, space_id, relationship_id FROM new_postings) n
    LEFT JOIN LATERAL (
        SELECT true AS found FROM relationships r
        WHERE r.team_id = n.team_id AND r.space_id = n.space_id AND r.id = n.relationship_id
        FOR KEY SHARE OF r) l ON true;
    IF locked < wanted THEN
        SELECT n.team_id, n.space_id, n.relationship_id AS id INTO missing
        FROM new_postings n
        WHERE NOT EXISTS (SELECT 1 FROM relationships r
                          WHERE r.team_id = n.team_id AND r.space_id = n.space_id
                            AND r.id = n.relationship_id)
        ORDER BY 1, 2, 3 LIMIT 1;
        RAISE EXCEPTION 'insert or update on table "relationship_terms" violates foreign key constraint "%"',
                'relationship_terms_team_id_space_id_relationship_id_fkey'
            USING ERRCODE = 'foreign_key_violation',
                  SCHEMA = 'public', TABLE = 'relationship_terms',
                  CONSTRAINT = 'relationship_terms_team_id_space_id_relationship_id_fkey',
                  DETAIL = format('Key (team_id, space_id, relationship_id)=(%s, %s, %s) is not present in table "relationships".',
                                  missing.team_id, missing.space_id, missing.id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER relationship_terms_check_documents AFTER INSERT ON relationship_terms
    REFERENCING NEW TABLE AS new_postings
    FOR EACH STATEMENT EXECUTE FUNCTION relationship_terms_check_documents();
CREATE TRIGGER relationship_terms_check_documents_update AFTER UPDATE ON relationship_terms
    REFERENCING NEW TABLE AS new_postings
    FOR EACH STATEMENT EXECUTE FUNCTION relationship_terms_check_documents();

-- ---------------------------------------------------------------------------
-- 2. No document goes while postings name it (the foreign key's NO ACTION)
-- ---------------------------------------------------------------------------

-- The keys of ``old_documents`` that no row of the document table holds now and
-- that a posting still names: at most one, for the message. Runs over the
-- transition table of a DELETE or an UPDATE (``old_documents``).
CREATE FUNCTION evidence_keep_postings() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    orphan record;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        SELECT t.team_id, t.space_id, t.evidence_id AS id INTO orphan
        FROM evidence_terms t LIMIT 1;
    ELSE
        SELECT o.team_id, o.space_id, o.id INTO orphan
        FROM old_documents o
        WHERE NOT EXISTS (SELECT 1 FROM evidence e
                          WHERE e.team_id = o.team_id AND e.space_id = o.space_id AND e.id = o.id)
          AND EXISTS (SELECT 1 FROM evidence_terms t
                      WHERE t.team_id = o.team_id AND t.space_id = o.space_id
                        AND t.evidence_id = o.id)
        LIMIT 1;
    END IF;
    IF FOUND THEN
        RAISE EXCEPTION 'update or delete on table "evidence" violates foreign key constraint "%" on table "evidence_terms"',
                'evidence_terms_team_id_space_id_evidence_id_fkey'
            USING ERRCODE = 'foreign_key_violation',
                  SCHEMA = 'public', TABLE = 'evidence',
                  CONSTRAINT = 'evidence_terms_team_id_space_id_evidence_id_fkey',
                  DETAIL = format('Key (team_id, space_id, id)=(%s, %s, %s) is still referenced from table "evidence_terms".',
                                  orphan.team_id, orphan.space_id, orphan.id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER evidence_keep_postings AFTER DELETE ON evidence
    REFERENCING OLD TABLE AS old_documents
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_keep_postings();
CREATE TRIGGER evidence_keep_postings_update AFTER UPDATE ON evidence
    REFERENCING OLD TABLE AS old_documents
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_keep_postings();
CREATE TRIGGER evidence_keep_postings_truncate AFTER TRUNCATE ON evidence
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_keep_postings();

CREATE FUNCTION relationships_keep_postings() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    orphan record;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        SELECT t.team_id, t.space_id, t.relationship_id AS id INTO orphan
        FROM relationship_terms t LIMIT 1;
    ELSE
        SELECT o.team_id, o.space_id, o.id INTO orphan
        FROM old_documents o
        WHERE NOT EXISTS (SELECT 1 FROM relationships r
                          WHERE r.team_id = o.team_id AND r.space_id = o.space_id AND r.id = o.id)
          AND EXISTS (SELECT 1 FROM relationship_terms t
                      WHERE t.team_id = o.team_id AND t.space_id = o.space_id
                        AND t.relationship_id = o.id)
        LIMIT 1;
    END IF;
    IF FOUND THEN
        RAISE EXCEPTION 'update or delete on table "relationships" violates foreign key constraint "%" on table "relationship_terms"',
                'relationship_terms_team_id_space_id_relationship_id_fkey'
            USING ERRCODE = 'foreign_key_violation',
                  SCHEMA = 'public', TABLE = 'relationships',
                  CONSTRAINT = 'relationship_terms_team_id_space_id_relationship_id_fkey',
                  DETAIL = format('Key (team_id, space_id, id)=(%s, %s, %s) is still referenced from table "relationship_terms".',
                                  orphan.team_id, orphan.space_id, orphan.id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER relationships_keep_postings AFTER DELETE ON relationships
    REFERENCING OLD TABLE AS old_documents
    FOR EACH STATEMENT EXECUTE FUNCTION relationships_keep_postings();
CREATE TRIGGER relationships_keep_postings_update AFTER UPDATE ON relationships
    REFERENCING OLD TABLE AS old_documents
    FOR EACH STATEMENT EXECUTE FUNCTION relationships_keep_postings();
CREATE TRIGGER relationships_keep_postings_truncate AFTER TRUNCATE ON relationships
    FOR EACH STATEMENT EXECUTE FUNCTION relationships_keep_postings();
