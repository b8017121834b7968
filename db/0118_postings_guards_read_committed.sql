-- The postings' guards of db/0115, made safe at every isolation level.
--
-- db/0115's delete-side guard (evidence_keep_postings, relationships_keep_postings)
-- looks for postings that still name a removed document key. A query inside
-- a trigger sees the transaction's snapshot. Under READ COMMITTED each query
-- of a VOLATILE function takes a new snapshot, after any wait for the
-- inserters' FOR KEY SHARE locks, so it sees every committed posting: the
-- foreign key's NO ACTION, exactly. Under REPEATABLE READ or SERIALIZABLE
-- the snapshot is the transaction's first one: a posting that another
-- transaction committed after it (having locked the document FOR KEY SHARE,
-- which makes the delete wait but is no serialization conflict) is invisible,
-- and the delete commits, leaving an orphan posting. The foreign key did not
-- have that hole: its check reads the newest committed rows (a cross-check
-- snapshot), which no trigger can do.
--
-- So a statement that removes a document key (a DELETE, an UPDATE of
-- team_id, space_id or id, a TRUNCATE) is refused unless the transaction is
-- READ COMMITTED: SQLSTATE 0A000 (feature_not_supported), with a hint. The
-- gateway never deletes, re-keys or truncates documents (its role has no such
-- privilege); an owner's maintenance session runs it in READ COMMITTED, the
-- default. Inserting postings needs no change: its check locks the documents
-- (FOR KEY SHARE) and so waits for, and then sees, a concurrent delete
-- whatever the isolation level, as the foreign key's did.
--
-- Also here:
-- - The document-update guard becomes a row trigger with a WHEN clause that
--   compares the key: an UPDATE that keeps every key queues no trigger event
--   and captures no transition table (db/0115 put every updated row, text
--   and tsvector included, into one, then anti-joined it). Re-keying a
--   document is checked per re-keyed row, at the end of the statement, as
--   the foreign key's NO ACTION was.
-- - EXECUTE on the SECURITY DEFINER guard functions is revoked from PUBLIC:
--   a trigger function cannot be called directly anyway, and firing a
--   trigger checks no EXECUTE privilege, so every writer keeps its checks.
--
-- Function bodies must stay VOLATILE (the default): a STABLE function keeps
-- its statement's snapshot and would miss a posting committed while the
-- DELETE waited for its lock (tests/test_postings_guards.py shows both races).

-- ---------------------------------------------------------------------------
-- DELETE and TRUNCATE: refused outside READ COMMITTED; otherwise as db/0115
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION evidence_keep_postings() RETURNS trigger
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    orphan record;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- a removed key: refused (the check below could not see postings
        -- committed after this transaction's snapshot)
        IF TG_OP = 'TRUNCATE' THEN
            PERFORM 1;
        ELSE
            PERFORM 1 FROM old_documents o
            WHERE NOT EXISTS (SELECT 1 FROM evidence e
                              WHERE e.team_id = o.team_id AND e.space_id = o.space_id
                                AND e.id = o.id)
            LIMIT 1;
        END IF;
        IF FOUND THEN
            RAISE EXCEPTION 'evidence can be deleted, re-keyed or truncated only in a READ COMMITTED transaction (this one is %)',
                    upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'feature_not_supported',
                      SCHEMA = 'public', TABLE = 'evidence',
                      CONSTRAINT = 'evidence_terms_team_id_space_id_evidence_id_fkey',
                      HINT = 'Run the statement in its own READ COMMITTED transaction: only there does the check see postings that other transactions committed meanwhile.';
        END IF;
    END IF;
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

CREATE OR REPLACE FUNCTION relationships_keep_postings() RETURNS trigger
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    orphan record;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        IF TG_OP = 'TRUNCATE' THEN
            PERFORM 1;
        ELSE
            PERFORM 1 FROM old_documents o
            WHERE NOT EXISTS (SELECT 1 FROM relationships r
                              WHERE r.team_id = o.team_id AND r.space_id = o.space_id
                                AND r.id = o.id)
            LIMIT 1;
        END IF;
        IF FOUND THEN
            RAISE EXCEPTION 'relationships can be deleted, re-keyed or truncated only in a READ COMMITTED transaction (this one is %)',
                    upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'feature_not_supported',
                      SCHEMA = 'public', TABLE = 'relationships',
                      CONSTRAINT = 'relationship_terms_team_id_space_id_relationship_id_fkey',
                      HINT = 'Run the statement in its own READ COMMITTED transaction: only there does the check see postings that other transactions committed meanwhile.';
        END IF;
    END IF;
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

-- ---------------------------------------------------------------------------
-- UPDATE of a document's key: a row trigger, fired only when the key changes
-- ---------------------------------------------------------------------------

CREATE FUNCTION evidence_keep_postings_rekeyed() RETURNS trigger
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       AND NOT EXISTS (SELECT 1 FROM evidence e
                       WHERE e.team_id = OLD.team_id AND e.space_id = OLD.space_id
                         AND e.id = OLD.id) THEN
        RAISE EXCEPTION 'evidence can be deleted, re-keyed or truncated only in a READ COMMITTED transaction (this one is %)',
                upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'feature_not_supported',
                  SCHEMA = 'public', TABLE = 'evidence',
                  CONSTRAINT = 'evidence_terms_team_id_space_id_evidence_id_fkey',
                  HINT = 'Run the statement in its own READ COMMITTED transaction: only there does the check see postings that other transactions committed meanwhile.';
    END IF;
    -- at the end of the statement (an AFTER row event): another row of the
    -- statement may have taken the old key over
    IF NOT EXISTS (SELECT 1 FROM evidence e
                   WHERE e.team_id = OLD.team_id AND e.space_id = OLD.space_id AND e.id = OLD.id)
       AND EXISTS (SELECT 1 FROM evidence_terms t
                   WHERE t.team_id = OLD.team_id AND t.space_id = OLD.space_id
                     AND t.evidence_id = OLD.id) THEN
        RAISE EXCEPTION 'update or delete on table "evidence" violates foreign key constraint "%" on table "evidence_terms"',
                'evidence_terms_team_id_space_id_evidence_id_fkey'
            USING ERRCODE = 'foreign_key_violation',
                  SCHEMA = 'public', TABLE = 'evidence',
                  CONSTRAINT = 'evidence_terms_team_id_space_id_evidence_id_fkey',
                  DETAIL = format('Key (team_id, space_id, id)=(%s, %s, %s) is still referenced from table "evidence_terms".',
                                  OLD.team_id, OLD.space_id, OLD.id);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION relationships_keep_postings_rekeyed() RETURNS trigger
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       AND NOT EXISTS (SELECT 1 FROM relationships r
                       WHERE r.team_id = OLD.team_id AND r.space_id = OLD.space_id
                         AND r.id = OLD.id) THEN
        RAISE EXCEPTION 'relationships can be deleted, re-keyed or truncated only in a READ COMMITTED transaction (this one is %)',
                upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'feature_not_supported',
                  SCHEMA = 'public', TABLE = 'relationships',
                  CONSTRAINT = 'relationship_terms_team_id_space_id_relationship_id_fkey',
                  HINT = 'Run the statement in its own READ COMMITTED transaction: only there does the check see postings that other transactions committed meanwhile.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM relationships r
                   WHERE r.team_id = OLD.team_id AND r.space_id = OLD.space_id AND r.id = OLD.id)
       AND EXISTS (SELECT 1 FROM relationship_terms t
                   WHERE t.team_id = OLD.team_id AND t.space_id = OLD.space_id
                     AND t.relationship_id = OLD.id) THEN
        RAISE EXCEPTION 'update or delete on table "relationships" violates foreign key constraint "%" on table "relationship_terms"',
                'relationship_terms_team_id_space_id_relationship_id_fkey'
            USING ERRCODE = 'foreign_key_violation',
                  SCHEMA = 'public', TABLE = 'relationships',
                  CONSTRAINT = 'relationship_terms_team_id_space_id_relationship_id_fkey',
                  DETAIL = format('Key (team_id, space_id, id)=(%s, %s, %s) is still referenced from table "relationship_terms".',
                                  OLD.team_id, OLD.space_id, OLD.id);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER evidence_keep_postings_update ON evidence;
CREATE TRIGGER evidence_keep_postings_update AFTER UPDATE ON evidence
    FOR EACH ROW
    WHEN ((OLD.team_id, OLD.space_id, OLD.id) IS DISTINCT FROM (NEW.team_id, NEW.space_id, NEW.id))
    EXECUTE FUNCTION evidence_keep_postings_rekeyed();

DROP TRIGGER relationships_keep_postings_update ON relationships;
CREATE TRIGGER relationships_keep_postings_update AFTER UPDATE ON relationships
    FOR EACH ROW
    WHEN ((OLD.team_id, OLD.space_id, OLD.id) IS DISTINCT FROM (NEW.team_id, NEW.space_id, NEW.id))
    EXECUTE FUNCTION relationships_keep_postings_rekeyed();

-- ---------------------------------------------------------------------------
-- No direct calls of the SECURITY DEFINER guards
-- ---------------------------------------------------------------------------

REVOKE EXECUTE ON FUNCTION evidence_terms_check_documents() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION relationship_terms_check_documents() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION evidence_keep_postings() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION relationships_keep_postings() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION evidence_keep_postings_rekeyed() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION relationships_keep_postings_rekeyed() FROM PUBLIC;
