-- A new space's vector partitions are created as plain tables and then attached,
-- instead of with CREATE TABLE ... PARTITION OF (db/0001).
--
-- Why: PARTITION OF takes ACCESS EXCLUSIVE on evidence_embeddings and
-- relationship_embeddings, which every team's recall reads, until the creating
-- transaction commits; a reader then waits for the space's whole batch (and
-- every reader queues behind a request that waits for it). ATTACH PARTITION
-- takes only SHARE UPDATE EXCLUSIVE on the parent, which readers (ACCESS SHARE)
-- and writers (ROW EXCLUSIVE) do not conflict with. Attaching an empty table
-- costs what creating the partition did: ATTACH builds the parent's indexes on
-- it (the primary key and the empty HNSW graph, named as PARTITION OF names
-- them), clones its foreign keys and checks the (empty) table against the
-- partition bound. The table is created by this SECURITY DEFINER function, so
-- its owner, privileges (none for the application role) and row-level security
-- (the parent's, applied to queries through it) are those PARTITION OF gave.
-- One difference: the CHECK constraints copied by LIKE stay marked local on the
-- partition (conislocal), as they already are on every table that
-- 'load --index-after' detached and attached again; nothing reads that mark.
--
-- Cloning the foreign keys still takes SHARE ROW EXCLUSIVE on evidence,
-- relationships, embedding_models and relationship_projections, as PARTITION OF
-- did: writers (of any team) wait for the creating transaction, readers do not.
-- That is why the loader still creates spaces in short batches of their own
-- (docs/loading.md, "Spaces and the vector tables' lock").

CREATE OR REPLACE FUNCTION memory_spaces_make_partitions() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    suffix text := replace(NEW.id::text, '-', '');
    parent text;
BEGIN
    FOREACH parent IN ARRAY ARRAY['evidence_embeddings', 'relationship_embeddings'] LOOP
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                       parent || '_' || suffix, parent);
        EXECUTE format('ALTER TABLE %I ALTER COLUMN embedding SET STORAGE PLAIN',
                       parent || '_' || suffix);
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES IN (%L)',
                       parent, parent || '_' || suffix, NEW.id);
    END LOOP;
    INSERT INTO space_generations (team_id, space_id, generation, recorded_by)
    VALUES (NEW.team_id, NEW.id, 1, NEW.owner_principal_id);
    RETURN NULL;
END $$;
