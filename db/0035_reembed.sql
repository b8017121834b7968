-- Moving a store to another embedding model: `recall-gateway reembed`.
--
-- The store keeps vectors of one model only (embedding_models has one row).
-- A re-embed run writes the new model's vectors beside the live ones, into the
-- staging tables below, in bounded batches that each commit, so the run can be
-- interrupted and resumed and the gateway keeps answering with the old vectors
-- meanwhile. When every live vector has its new twin, one transaction swaps
-- them in and renames the model row; the renaming reaches every vector row and
-- every relationship projection through ON UPDATE CASCADE, so no reader ever
-- sees vectors of two models.
--
-- Why not a new relationship projection generation: a projection row must
-- reference a registered model, and the store registers one model only; the
-- staging tables play the "building" generation's part for evidence and
-- relationship vectors alike.

ALTER TABLE evidence_embeddings DROP CONSTRAINT evidence_embeddings_model_fkey;
ALTER TABLE evidence_embeddings ADD CONSTRAINT evidence_embeddings_model_fkey
    FOREIGN KEY (model) REFERENCES embedding_models (name) ON UPDATE CASCADE;
ALTER TABLE relationship_embeddings DROP CONSTRAINT relationship_embeddings_model_fkey;
ALTER TABLE relationship_embeddings ADD CONSTRAINT relationship_embeddings_model_fkey
    FOREIGN KEY (model) REFERENCES embedding_models (name) ON UPDATE CASCADE;
ALTER TABLE relationship_projections DROP CONSTRAINT relationship_projections_model_fkey;
ALTER TABLE relationship_projections ADD CONSTRAINT relationship_projections_model_fkey
    FOREIGN KEY (model) REFERENCES embedding_models (name) ON UPDATE CASCADE;

-- One row per run; at most one is running. A run for another model than the
-- running one abandons it (its staged vectors go with it).
CREATE TABLE reembed_runs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    from_model  text NOT NULL CHECK (length(from_model) BETWEEN 1 AND 200),
    to_model    text NOT NULL CHECK (length(to_model) BETWEEN 1 AND 200),
    status      text NOT NULL CHECK (status IN ('running', 'completed', 'abandoned')),
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CHECK ((status = 'running') = (finished_at IS NULL))
);
CREATE UNIQUE INDEX reembed_runs_one_running ON reembed_runs ((true)) WHERE status = 'running';

-- The new vectors, by the key of the live row they replace. No index beyond
-- the key: they are only ever joined to the live rows, and the HNSW indexes of
-- the live tables take them in at the switch.
CREATE TABLE reembed_evidence (
    run_id      bigint NOT NULL REFERENCES reembed_runs (id) ON DELETE CASCADE,
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    evidence_id client_id NOT NULL,
    embedding   vector(384) NOT NULL,
    PRIMARY KEY (run_id, team_id, space_id, evidence_id)
);
ALTER TABLE reembed_evidence ALTER COLUMN embedding SET STORAGE PLAIN;

CREATE TABLE reembed_relationships (
    run_id                bigint NOT NULL REFERENCES reembed_runs (id) ON DELETE CASCADE,
    team_id               client_id NOT NULL,
    space_id              uuid NOT NULL,
    relationship_id       client_id NOT NULL,
    projection_generation integer NOT NULL,
    embedding             vector(384) NOT NULL,
    PRIMARY KEY (run_id, team_id, space_id, relationship_id, projection_generation)
);
ALTER TABLE reembed_relationships ALTER COLUMN embedding SET STORAGE PLAIN;

-- Operator tables: the gateway's role (recall_app) gets no grant on them. They
-- still get the walls every table with a team_id has, so that a grant added
-- by mistake later would not open them across teams.
ALTER TABLE reembed_evidence ENABLE ROW LEVEL SECURITY;
CREATE POLICY space_wall ON reembed_evidence TO recall_app
    USING (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces()))
    WITH CHECK (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces()));
ALTER TABLE reembed_relationships ENABLE ROW LEVEL SECURITY;
CREATE POLICY space_wall ON reembed_relationships TO recall_app
    USING (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces()))
    WITH CHECK (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces()));
