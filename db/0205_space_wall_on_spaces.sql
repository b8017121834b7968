-- The space wall on memory_spaces and space_generations.
--
-- db/0001 gave both tables only the team wall (team_tables): a principal's
-- tenancy read every space of its team, other principals' private spaces
-- included, with their generations (a reset's reason too), and could insert a
-- generation of any of them: a reset that hides all of another principal's
-- private memory. Only the write service's own check (the space a principal
-- may name) stood in the way; SPEC section 6 asks for row-level security as a
-- second wall behind every predicate.
--
-- Now a tenancy sees, and may write, the rows of its readable spaces only, as
-- on every table of memory (the form of db/0121: the readable spaces read once
-- per statement). Every statement a tenancy sends names only those spaces: a
-- recall's view (the readable spaces by ID), a principal's write (its own
-- shared or private space, after the service's check), the lookups joined to
-- rows it reads (their spaces), the generation of a readable row's space, a
-- reset of a space it may write. The loader, the CLI, the token lookup,
-- warm-up, the community build and the vector-index work run as the owner,
-- which row-level security does not filter; foreign keys are checked without
-- it. memory_spaces names its space `id`, not `space_id`: a later migration that
-- alters every `space_wall` by name (as db/0121 did) must write that table's
-- own expression.

DROP POLICY team_wall ON memory_spaces;
CREATE POLICY space_wall ON memory_spaces TO recall_app
    USING (team_id = recall_current_team()
           AND id = ANY ((SELECT recall_allowed_spaces())::uuid[]))
    WITH CHECK (team_id = recall_current_team()
                AND id = ANY ((SELECT recall_allowed_spaces())::uuid[]));

DROP POLICY team_wall ON space_generations;
CREATE POLICY space_wall ON space_generations TO recall_app
    USING (team_id = recall_current_team()
           AND space_id = ANY ((SELECT recall_allowed_spaces())::uuid[]))
    WITH CHECK (team_id = recall_current_team()
                AND space_id = ANY ((SELECT recall_allowed_spaces())::uuid[]));
