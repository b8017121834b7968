-- Event tables keyed by (team_id, seq) instead of seq alone (issue: past one
-- machine, Citus readiness). A distributed table's primary key and unique
-- constraints must include its distribution column (team_id), so that each
-- one is enforced inside one shard; a key on the global counter alone could
-- not be. Nothing references these keys: reads order by (recorded_at, seq)
-- and find events by (team_id, <row>_id), and seq stays unique on its own (its
-- identity sequence), so the new key changes no answer. The index is rebuilt
-- once here; on a large store this locks each table for the build.
DO $$
DECLARE
    t text;
    pk text;
BEGIN
    FOREACH t IN ARRAY ARRAY[
        'source_lifecycle_events', 'evidence_lifecycle_events', 'relationship_status_events',
        'support_decisions', 'conflict_case_events', 'hypothesis_feedback']
    LOOP
        SELECT conname INTO STRICT pk FROM pg_constraint
         WHERE conrelid = t::regclass AND contype = 'p';
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I, ADD PRIMARY KEY (team_id, seq)', t, pk);
    END LOOP;
END $$;
