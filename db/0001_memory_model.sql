-- The memory model (SPEC section 2). Read docs/data-model.md first.
--
-- Three rules shape every table here:
-- 1. Tenancy is in the key. Every row carries team_id and every reference is a
--    composite foreign key that includes it, so a row can never point into another
--    team. Space-scoped rows also carry space_id and reference within one space.
-- 2. History is append-only. Lifecycle state (source/evidence status, support
--    decisions, relationship status, conflict case state, hypothesis status, space
--    generations) lives only in *_events / *_decisions tables stamped with system
--    time (recorded_at = transaction time, seq breaks ties inside a transaction).
--    The state "as known at t" is the latest event with recorded_at <= t; nothing a
--    past view needs is ever updated in place.
-- 3. Row-level security is a second wall: the gateway's tenant queries run as the
--    non-owner role recall_app with recall.team_id / recall.space_ids set per
--    transaction, and the policies below filter on them even if a statement
--    forgets its own predicates.

CREATE EXTENSION IF NOT EXISTS vector;

CREATE DOMAIN client_id AS text
    CHECK (VALUE ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$');

-- ---------------------------------------------------------------------------
-- Tenants, principals, tokens, spaces
-- ---------------------------------------------------------------------------

CREATE TABLE teams (
    id          client_id PRIMARY KEY,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    recorded_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE principals (
    team_id      client_id NOT NULL REFERENCES teams (id),
    id           client_id NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('person', 'agent')),
    display_name text NOT NULL CHECK (length(display_name) BETWEEN 1 AND 200),
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id)
);

-- Bearer tokens. Only the SHA-256 of the random secret is stored; the token
-- string is rgt_<id>_<secret> and is shown once, when issued.
CREATE TABLE api_tokens (
    id            text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9-]{2,63}$'),
    team_id       client_id NOT NULL,
    principal_id  client_id NOT NULL,
    secret_sha256 bytea NOT NULL CHECK (length(secret_sha256) = 32),
    binding       text NOT NULL CHECK (binding IN ('private', 'shared_only')),
    label         text CHECK (length(label) <= 200),
    expires_at    timestamptz,
    revoked_at    timestamptz,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, principal_id) REFERENCES principals (team_id, id)
);

CREATE TABLE memory_spaces (
    team_id            client_id NOT NULL REFERENCES teams (id),
    id                 uuid NOT NULL DEFAULT gen_random_uuid(),
    kind               text NOT NULL CHECK (kind IN ('shared', 'private')),
    owner_principal_id client_id,
    recorded_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, id, kind),
    CHECK ((kind = 'shared') = (owner_principal_id IS NULL)),
    FOREIGN KEY (team_id, owner_principal_id) REFERENCES principals (team_id, id)
);
CREATE UNIQUE INDEX memory_spaces_one_shared_per_team
    ON memory_spaces (team_id) WHERE kind = 'shared';
CREATE UNIQUE INDEX memory_spaces_one_private_per_principal
    ON memory_spaces (team_id, owner_principal_id) WHERE kind = 'private';

-- A space's generations. Generation 1 is made with the space; a reset appends the
-- next one. Rows written under an older generation are invisible from then on;
-- the generation current at t is max(generation) with recorded_at <= t.
CREATE TABLE space_generations (
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    generation  integer NOT NULL CHECK (generation >= 1),
    reset_id    client_id,
    reason      text CHECK (length(reason) <= 2000),
    recorded_by text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, space_id, generation),
    UNIQUE (team_id, reset_id),
    CHECK ((generation = 1) = (reset_id IS NULL)),
    FOREIGN KEY (team_id, space_id) REFERENCES memory_spaces (team_id, id)
);

-- ---------------------------------------------------------------------------
-- Embedding models: the store holds vectors of exactly one model and dimension.
-- ---------------------------------------------------------------------------

CREATE TABLE embedding_models (
    name        text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    dimensions  integer NOT NULL CHECK (dimensions = 384),
    recorded_at timestamptz NOT NULL DEFAULT now()
);
-- At most one row: mixing models in one store is refused, not tolerated.
CREATE UNIQUE INDEX embedding_models_single ON embedding_models ((true));

-- ---------------------------------------------------------------------------
-- Sources and evidence
-- ---------------------------------------------------------------------------

CREATE TABLE sources (
    team_id     client_id NOT NULL,
    id          client_id NOT NULL,
    space_id    uuid NOT NULL,
    generation  integer NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('document', 'conversation', 'tool', 'person')),
    title       text NOT NULL CHECK (length(title) BETWEEN 1 AND 500),
    uri         text CHECK (length(uri) <= 2000),
    authority   text NOT NULL CHECK (authority IN ('unverified', 'low', 'medium', 'high', 'authoritative')),
    created_at  timestamptz,
    recorded_by text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, generation) REFERENCES space_generations (team_id, space_id, generation)
);

CREATE TABLE source_lifecycle_events (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    source_id   client_id NOT NULL,
    event_id    client_id,
    status      text NOT NULL CHECK (status IN ('active', 'withdrawn')),
    reason      text CHECK (length(reason) <= 2000),
    recorded_by text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, event_id),
    FOREIGN KEY (team_id, space_id, source_id) REFERENCES sources (team_id, space_id, id)
);
CREATE INDEX source_lifecycle_events_at
    ON source_lifecycle_events (team_id, source_id, recorded_at DESC, seq DESC);

-- Total number of lexeme occurrences: the document length BM25 normalises by.
CREATE FUNCTION tsvector_token_count(doc tsvector) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)::integer
            FROM unnest(doc) AS u);

CREATE TABLE evidence (
    team_id         client_id NOT NULL,
    id              client_id NOT NULL,
    space_id        uuid NOT NULL,
    generation      integer NOT NULL,
    source_id       client_id NOT NULL,
    content         text NOT NULL CHECK (length(content) BETWEEN 1 AND 20000),
    content_sha256  bytea NOT NULL CHECK (length(content_sha256) = 32),
    -- The full-text document. The 'english' configuration stems and drops stop
    -- words; docs/data-model.md says why BM25 over evidence_terms ranks with it.
    search_document tsvector NOT NULL
        GENERATED ALWAYS AS (to_tsvector('english'::regconfig, content)) STORED,
    doc_length      integer NOT NULL
        GENERATED ALWAYS AS (tsvector_token_count(to_tsvector('english'::regconfig, content))) STORED,
    observed_at     timestamptz,
    recorded_by     text,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, source_id) REFERENCES sources (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, generation) REFERENCES space_generations (team_id, space_id, generation)
);
CREATE INDEX evidence_space ON evidence (team_id, space_id, generation);
CREATE INDEX evidence_search_document ON evidence USING gin (search_document);

-- Postings of the full-text document (lexeme, term frequency) for BM25 scoring
-- inside one space: IDF and length normalisation need per-space statistics that
-- ts_rank_cd does not have.
CREATE TABLE evidence_terms (
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    lexeme      text NOT NULL,
    evidence_id client_id NOT NULL,
    tf          integer NOT NULL CHECK (tf >= 1),
    PRIMARY KEY (team_id, space_id, lexeme, evidence_id),
    FOREIGN KEY (team_id, space_id, evidence_id) REFERENCES evidence (team_id, space_id, id)
);

CREATE FUNCTION evidence_terms_fill() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evidence_terms (team_id, space_id, lexeme, evidence_id, tf)
    SELECT NEW.team_id, NEW.space_id, u.lexeme, NEW.id, coalesce(array_length(u.positions, 1), 1)
    FROM unnest(NEW.search_document) AS u;
    RETURN NULL;
END $$;
CREATE TRIGGER evidence_terms_fill AFTER INSERT ON evidence
    FOR EACH ROW EXECUTE FUNCTION evidence_terms_fill();

CREATE TABLE evidence_lifecycle_events (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    evidence_id client_id NOT NULL,
    event_id    client_id,
    status      text NOT NULL CHECK (status IN ('active', 'quarantined', 'withdrawn')),
    reason      text CHECK (length(reason) <= 2000),
    recorded_by text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, event_id),
    FOREIGN KEY (team_id, space_id, evidence_id) REFERENCES evidence (team_id, space_id, id)
);
CREATE INDEX evidence_lifecycle_events_at
    ON evidence_lifecycle_events (team_id, evidence_id, recorded_at DESC, seq DESC);

-- Quoted spans of an evidence text, by character offsets [span_start, span_end).
CREATE TABLE evidence_occurrences (
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    evidence_id client_id NOT NULL,
    id          client_id NOT NULL,
    quote       text NOT NULL,
    span_start  integer NOT NULL CHECK (span_start >= 0),
    span_end    integer NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, evidence_id, id),
    CHECK (span_end > span_start),
    FOREIGN KEY (team_id, space_id, evidence_id) REFERENCES evidence (team_id, space_id, id)
);

-- A quote must be exactly the evidence text at its span: checked by the database
-- so that no writer can store a citation that the text does not contain.
CREATE FUNCTION check_quote_matches_evidence() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    body text;
BEGIN
    IF NEW.quote IS NULL THEN
        RETURN NEW;
    END IF;
    SELECT e.content INTO body FROM evidence e
     WHERE e.team_id = NEW.team_id AND e.id = NEW.evidence_id;
    IF body IS NULL THEN
        RETURN NEW;  -- the foreign key reports the missing evidence
    END IF;
    IF NEW.span_end > length(body)
       OR substr(body, NEW.span_start + 1, NEW.span_end - NEW.span_start) <> NEW.quote THEN
        RAISE EXCEPTION 'quote does not match the evidence text at [%, %)', NEW.span_start, NEW.span_end
            USING ERRCODE = 'check_violation', CONSTRAINT = 'quote_matches_evidence';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER evidence_occurrences_quote BEFORE INSERT ON evidence_occurrences
    FOR EACH ROW EXECUTE FUNCTION check_quote_matches_evidence();

-- Per-space partitions make each space's HNSW graph contain only that space's
-- vectors, so a search inside one team's space is not crowded out by other
-- teams' neighbours (HNSW filters after the index scan). A partition is made
-- with its space by the trigger below.
CREATE TABLE evidence_embeddings (
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    evidence_id client_id NOT NULL,
    model       text NOT NULL REFERENCES embedding_models (name),
    dimensions  integer NOT NULL CHECK (dimensions = 384),
    embedding   vector(384) NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, space_id, evidence_id),
    FOREIGN KEY (team_id, space_id, evidence_id) REFERENCES evidence (team_id, space_id, id)
) PARTITION BY LIST (space_id);
ALTER TABLE evidence_embeddings ALTER COLUMN embedding SET STORAGE PLAIN;
CREATE INDEX evidence_embeddings_hnsw ON evidence_embeddings
    USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);

-- ---------------------------------------------------------------------------
-- Entities and relationships
-- ---------------------------------------------------------------------------

CREATE TABLE entities (
    team_id         client_id NOT NULL,
    id              client_id NOT NULL,
    space_id        uuid NOT NULL,
    generation      integer NOT NULL,
    name            text NOT NULL CHECK (length(name) BETWEEN 1 AND 300),
    kind            text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_]{0,39}$'),
    aliases         text[] NOT NULL DEFAULT '{}' CHECK (cardinality(aliases) <= 50),
    recorded_by     text,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, generation) REFERENCES space_generations (team_id, space_id, generation)
);
CREATE INDEX entities_space ON entities (team_id, space_id, generation);

CREATE TABLE evidence_entity_mentions (
    team_id       client_id NOT NULL,
    space_id      uuid NOT NULL,
    evidence_id   client_id NOT NULL,
    entity_id     client_id NOT NULL,
    occurrence_id client_id,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, evidence_id, entity_id),
    FOREIGN KEY (team_id, space_id, evidence_id) REFERENCES evidence (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, entity_id) REFERENCES entities (team_id, space_id, id),
    FOREIGN KEY (team_id, evidence_id, occurrence_id) REFERENCES evidence_occurrences (team_id, evidence_id, id)
);
CREATE INDEX evidence_entity_mentions_entity ON evidence_entity_mentions (team_id, space_id, entity_id);

-- Relationship vectors are rebuilt per projection generation; only the active
-- generation's vectors may be searched (a new one is 'building' until complete).
CREATE TABLE relationship_projections (
    team_id      client_id NOT NULL REFERENCES teams (id),
    generation   integer NOT NULL CHECK (generation >= 1),
    model        text NOT NULL REFERENCES embedding_models (name),
    status       text NOT NULL CHECK (status IN ('building', 'active', 'retired', 'failed')),
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    activated_at timestamptz,
    PRIMARY KEY (team_id, generation)
);
CREATE UNIQUE INDEX relationship_projections_one_active
    ON relationship_projections (team_id) WHERE status = 'active';

CREATE TABLE relationships (
    team_id            client_id NOT NULL,
    id                 client_id NOT NULL,
    space_id           uuid NOT NULL,
    generation         integer NOT NULL,
    subject_entity_id  client_id NOT NULL,
    predicate          text NOT NULL CHECK (predicate ~ '^[a-z][a-z0-9_]{0,63}$'),
    object_entity_id   client_id,
    object_value       text CHECK (length(object_value) BETWEEN 1 AND 1000),
    object_unit        text CHECK (length(object_unit) BETWEEN 1 AND 50),
    polarity           text NOT NULL DEFAULT 'positive' CHECK (polarity IN ('positive', 'negative')),
    valid_from         timestamptz,
    valid_to           timestamptz,
    owner_principal_id client_id NOT NULL,
    semantic_group_key text NOT NULL CHECK (length(semantic_group_key) BETWEEN 1 AND 300),
    -- A readable rendering ("Ada works at Acme"), made by the writer from the
    -- entity names; the relationship's search document and vector are made from it.
    statement          text NOT NULL CHECK (length(statement) BETWEEN 1 AND 2000),
    search_document    tsvector NOT NULL
        GENERATED ALWAYS AS (to_tsvector('english'::regconfig, statement)) STORED,
    recorded_by        text,
    recorded_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, space_id, id),
    CHECK ((object_entity_id IS NULL) <> (object_value IS NULL)),
    CHECK (object_unit IS NULL OR object_value IS NOT NULL),
    CHECK (valid_from IS NULL OR valid_to IS NULL OR valid_from < valid_to),
    FOREIGN KEY (team_id, space_id, generation) REFERENCES space_generations (team_id, space_id, generation),
    FOREIGN KEY (team_id, space_id, subject_entity_id) REFERENCES entities (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, object_entity_id) REFERENCES entities (team_id, space_id, id),
    FOREIGN KEY (team_id, owner_principal_id) REFERENCES principals (team_id, id)
);
CREATE INDEX relationships_group ON relationships (team_id, space_id, semantic_group_key);
CREATE INDEX relationships_subject ON relationships (team_id, space_id, subject_entity_id);
CREATE INDEX relationships_object ON relationships (team_id, space_id, object_entity_id);
CREATE INDEX relationships_search_document ON relationships USING gin (search_document);

CREATE TABLE relationship_status_events (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id         client_id NOT NULL,
    space_id        uuid NOT NULL,
    relationship_id client_id NOT NULL,
    event_id        client_id,
    status          text NOT NULL CHECK (status IN ('active', 'superseded', 'retracted')),
    superseded_by   client_id,
    reason          text CHECK (length(reason) <= 2000),
    recorded_by     text,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, event_id),
    CHECK (superseded_by IS NULL OR status = 'superseded'),
    FOREIGN KEY (team_id, space_id, relationship_id) REFERENCES relationships (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, superseded_by) REFERENCES relationships (team_id, space_id, id)
);
CREATE INDEX relationship_status_events_at
    ON relationship_status_events (team_id, relationship_id, recorded_at DESC, seq DESC);

CREATE TABLE relationship_embeddings (
    team_id               client_id NOT NULL,
    space_id              uuid NOT NULL,
    relationship_id       client_id NOT NULL,
    projection_generation integer NOT NULL,
    model                 text NOT NULL REFERENCES embedding_models (name),
    dimensions            integer NOT NULL CHECK (dimensions = 384),
    embedding             vector(384) NOT NULL,
    recorded_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, space_id, relationship_id, projection_generation),
    FOREIGN KEY (team_id, space_id, relationship_id) REFERENCES relationships (team_id, space_id, id),
    FOREIGN KEY (team_id, projection_generation) REFERENCES relationship_projections (team_id, generation)
) PARTITION BY LIST (space_id);
ALTER TABLE relationship_embeddings ALTER COLUMN embedding SET STORAGE PLAIN;
CREATE INDEX relationship_embeddings_hnsw ON relationship_embeddings
    USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);

-- ---------------------------------------------------------------------------
-- Supports: "evidence E supports relationship R", with append-only decisions.
-- ---------------------------------------------------------------------------

CREATE TABLE supports (
    team_id         client_id NOT NULL,
    id              client_id NOT NULL,
    space_id        uuid NOT NULL,
    evidence_id     client_id NOT NULL,
    relationship_id client_id NOT NULL,
    occurrence_id   client_id,
    quote           text,
    span_start      integer CHECK (span_start >= 0),
    span_end        integer,
    recorded_by     text,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, space_id, id),
    CHECK ((quote IS NULL) = (span_start IS NULL) AND (quote IS NULL) = (span_end IS NULL)),
    CHECK (span_end IS NULL OR span_end > span_start),
    FOREIGN KEY (team_id, space_id, evidence_id) REFERENCES evidence (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, relationship_id) REFERENCES relationships (team_id, space_id, id),
    FOREIGN KEY (team_id, evidence_id, occurrence_id) REFERENCES evidence_occurrences (team_id, evidence_id, id)
);
CREATE INDEX supports_evidence ON supports (team_id, evidence_id);
CREATE INDEX supports_relationship ON supports (team_id, relationship_id);
CREATE TRIGGER supports_quote BEFORE INSERT ON supports
    FOR EACH ROW EXECUTE FUNCTION check_quote_matches_evidence();

CREATE TABLE support_decisions (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    support_id  client_id NOT NULL,
    decision_id client_id,
    decision    text NOT NULL CHECK (decision IN ('grant', 'revoke', 'reinstate')),
    reason      text CHECK (length(reason) <= 2000),
    recorded_by text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, decision_id),
    FOREIGN KEY (team_id, space_id, support_id) REFERENCES supports (team_id, space_id, id)
);
CREATE INDEX support_decisions_at
    ON support_decisions (team_id, support_id, recorded_at DESC, seq DESC);

-- ---------------------------------------------------------------------------
-- Relationship conflict cases
-- ---------------------------------------------------------------------------

CREATE TABLE conflict_cases (
    team_id     client_id NOT NULL,
    id          client_id NOT NULL,
    space_id    uuid NOT NULL,
    generation  integer NOT NULL,
    question    text NOT NULL CHECK (length(question) BETWEEN 1 AND 2000),
    recorded_by text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, generation) REFERENCES space_generations (team_id, space_id, generation)
);

CREATE TABLE conflict_positions (
    team_id     client_id NOT NULL,
    space_id    uuid NOT NULL,
    case_id     client_id NOT NULL,
    id          client_id NOT NULL,
    label       text NOT NULL CHECK (length(label) BETWEEN 1 AND 500),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, case_id, id),
    FOREIGN KEY (team_id, space_id, case_id) REFERENCES conflict_cases (team_id, space_id, id)
);

CREATE TABLE conflict_position_relationships (
    team_id         client_id NOT NULL,
    space_id        uuid NOT NULL,
    case_id         client_id NOT NULL,
    position_id     client_id NOT NULL,
    relationship_id client_id NOT NULL,
    PRIMARY KEY (team_id, position_id, relationship_id),
    -- One relationship stands in at most one position of a case.
    UNIQUE (team_id, case_id, relationship_id),
    FOREIGN KEY (team_id, case_id, position_id) REFERENCES conflict_positions (team_id, case_id, id),
    FOREIGN KEY (team_id, space_id, relationship_id) REFERENCES relationships (team_id, space_id, id)
);
CREATE INDEX conflict_position_relationships_rel
    ON conflict_position_relationships (team_id, relationship_id);

CREATE TABLE conflict_case_events (
    seq                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id               client_id NOT NULL,
    space_id              uuid NOT NULL,
    case_id               client_id NOT NULL,
    event_id              client_id,
    event                 text NOT NULL CHECK (event IN ('open', 'resolve', 'reopen')),
    preferred_position_id client_id,
    reason                text CHECK (length(reason) <= 2000),
    recorded_by           text,
    recorded_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, event_id),
    CHECK ((event = 'resolve') = (preferred_position_id IS NOT NULL)),
    FOREIGN KEY (team_id, space_id, case_id) REFERENCES conflict_cases (team_id, space_id, id),
    FOREIGN KEY (team_id, case_id, preferred_position_id) REFERENCES conflict_positions (team_id, case_id, id)
);
CREATE INDEX conflict_case_events_at
    ON conflict_case_events (team_id, case_id, recorded_at DESC, seq DESC);

-- ---------------------------------------------------------------------------
-- Evidence conflicts: positions cite exact occurrences.
-- ---------------------------------------------------------------------------

CREATE TABLE evidence_conflicts (
    team_id     client_id NOT NULL,
    id          client_id NOT NULL,
    space_id    uuid NOT NULL,
    generation  integer NOT NULL,
    question    text NOT NULL CHECK (length(question) BETWEEN 1 AND 2000),
    recorded_by text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, generation) REFERENCES space_generations (team_id, space_id, generation)
);

CREATE TABLE evidence_conflict_positions (
    team_id       client_id NOT NULL,
    space_id      uuid NOT NULL,
    conflict_id   client_id NOT NULL,
    id            client_id NOT NULL,
    label         text NOT NULL CHECK (length(label) BETWEEN 1 AND 500),
    evidence_id   client_id NOT NULL,
    occurrence_id client_id NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, conflict_id, occurrence_id),
    FOREIGN KEY (team_id, space_id, conflict_id) REFERENCES evidence_conflicts (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, evidence_id) REFERENCES evidence (team_id, space_id, id),
    FOREIGN KEY (team_id, evidence_id, occurrence_id) REFERENCES evidence_occurrences (team_id, evidence_id, id)
);
CREATE INDEX evidence_conflict_positions_evidence
    ON evidence_conflict_positions (team_id, evidence_id);

-- ---------------------------------------------------------------------------
-- Community snapshots (derived data: a run is written once, then its status)
-- ---------------------------------------------------------------------------

CREATE TABLE community_runs (
    team_id           client_id NOT NULL,
    id                uuid NOT NULL DEFAULT gen_random_uuid(),
    space_id          uuid NOT NULL,
    space_kind        text NOT NULL DEFAULT 'shared' CHECK (space_kind = 'shared'),
    status            text NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'too_large')),
    algorithm         text NOT NULL,
    seed              integer NOT NULL,
    node_count        integer CHECK (node_count >= 0),
    edge_count        integer CHECK (edge_count >= 0),
    -- The graph state the run was built from, to detect staleness later.
    graph_fingerprint text,
    graph_watermark   timestamptz,
    error             text,
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    PRIMARY KEY (team_id, id),
    FOREIGN KEY (team_id, space_id, space_kind) REFERENCES memory_spaces (team_id, id, kind)
);
CREATE INDEX community_runs_latest ON community_runs (team_id, started_at DESC);

CREATE TABLE communities (
    team_id            client_id NOT NULL,
    run_id             uuid NOT NULL,
    ordinal            integer NOT NULL CHECK (ordinal >= 0),
    summary            text NOT NULL,
    top_entities       text[] NOT NULL DEFAULT '{}',
    top_predicates     text[] NOT NULL DEFAULT '{}',
    group_count        integer NOT NULL CHECK (group_count >= 0),
    relationship_count integer NOT NULL CHECK (relationship_count >= 0),
    PRIMARY KEY (team_id, run_id, ordinal),
    FOREIGN KEY (team_id, run_id) REFERENCES community_runs (team_id, id)
);

CREATE TABLE community_members (
    team_id            client_id NOT NULL,
    run_id             uuid NOT NULL,
    ordinal            integer NOT NULL,
    semantic_group_key text NOT NULL,
    relationship_id    client_id NOT NULL,
    PRIMARY KEY (team_id, run_id, semantic_group_key, relationship_id),
    FOREIGN KEY (team_id, run_id, ordinal) REFERENCES communities (team_id, run_id, ordinal),
    FOREIGN KEY (team_id, relationship_id) REFERENCES relationships (team_id, id)
);

-- ---------------------------------------------------------------------------
-- Hypotheses (shared space only) and their feedback history
-- ---------------------------------------------------------------------------

CREATE TABLE hypotheses (
    team_id      client_id NOT NULL,
    id           client_id NOT NULL,
    space_id     uuid NOT NULL,
    space_kind   text NOT NULL DEFAULT 'shared' CHECK (space_kind = 'shared'),
    generation   integer NOT NULL,
    statement    text NOT NULL CHECK (length(statement) BETWEEN 1 AND 2000),
    origin       text NOT NULL DEFAULT 'dreaming' CHECK (length(origin) BETWEEN 1 AND 100),
    proposed_by  client_id,
    search_document tsvector NOT NULL
        GENERATED ALWAYS AS (to_tsvector('english'::regconfig, statement)) STORED,
    recorded_by  text,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    UNIQUE (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, space_kind) REFERENCES memory_spaces (team_id, id, kind),
    FOREIGN KEY (team_id, space_id, generation) REFERENCES space_generations (team_id, space_id, generation),
    FOREIGN KEY (team_id, proposed_by) REFERENCES principals (team_id, id)
);

CREATE TABLE hypothesis_relationships (
    team_id         client_id NOT NULL,
    space_id        uuid NOT NULL,
    hypothesis_id   client_id NOT NULL,
    relationship_id client_id NOT NULL,
    PRIMARY KEY (team_id, hypothesis_id, relationship_id),
    FOREIGN KEY (team_id, space_id, hypothesis_id) REFERENCES hypotheses (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, relationship_id) REFERENCES relationships (team_id, space_id, id)
);
CREATE INDEX hypothesis_relationships_rel ON hypothesis_relationships (team_id, relationship_id);

CREATE TABLE hypothesis_evidence (
    team_id       client_id NOT NULL,
    space_id      uuid NOT NULL,
    hypothesis_id client_id NOT NULL,
    evidence_id   client_id NOT NULL,
    PRIMARY KEY (team_id, hypothesis_id, evidence_id),
    FOREIGN KEY (team_id, space_id, hypothesis_id) REFERENCES hypotheses (team_id, space_id, id),
    FOREIGN KEY (team_id, space_id, evidence_id) REFERENCES evidence (team_id, space_id, id)
);
CREATE INDEX hypothesis_evidence_ev ON hypothesis_evidence (team_id, evidence_id);

CREATE TABLE hypothesis_feedback (
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id       client_id NOT NULL,
    space_id      uuid NOT NULL,
    hypothesis_id client_id NOT NULL,
    feedback_id   client_id,
    decision      text NOT NULL CHECK (decision IN ('propose', 'confirm', 'reject', 'mark_stale', 'reopen')),
    status        text NOT NULL CHECK (status IN ('proposed', 'confirmed', 'rejected', 'stale')),
    note          text CHECK (length(note) <= 2000),
    recorded_by   text,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, feedback_id),
    CHECK (
        (decision = 'propose' AND status = 'proposed') OR
        (decision = 'reopen' AND status = 'proposed') OR
        (decision = 'confirm' AND status = 'confirmed') OR
        (decision = 'reject' AND status = 'rejected') OR
        (decision = 'mark_stale' AND status = 'stale')
    ),
    FOREIGN KEY (team_id, space_id, hypothesis_id) REFERENCES hypotheses (team_id, space_id, id)
);
CREATE INDEX hypothesis_feedback_at
    ON hypothesis_feedback (team_id, hypothesis_id, recorded_at DESC, seq DESC);

-- ---------------------------------------------------------------------------
-- Recall events (what one recall returned) and recall feedback
-- ---------------------------------------------------------------------------

CREATE TABLE recall_events (
    team_id      client_id NOT NULL,
    id           uuid NOT NULL DEFAULT gen_random_uuid(),
    principal_id client_id NOT NULL,
    token_id     text,
    query_sha256 bytea CHECK (length(query_sha256) = 32),
    space_kinds  text[] NOT NULL,
    valid_at     timestamptz,
    known_at     timestamptz,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    FOREIGN KEY (team_id, principal_id) REFERENCES principals (team_id, id)
);

CREATE TABLE recall_event_items (
    team_id         client_id NOT NULL,
    recall_event_id uuid NOT NULL,
    frontier        text NOT NULL CHECK (frontier IN
                        ('evidence', 'relationship', 'community', 'hypothesis', 'conflict')),
    item_id         text NOT NULL,
    rank            integer NOT NULL CHECK (rank >= 1),
    PRIMARY KEY (team_id, recall_event_id, frontier, item_id),
    FOREIGN KEY (team_id, recall_event_id) REFERENCES recall_events (team_id, id)
);

CREATE TABLE recall_feedback (
    team_id          client_id NOT NULL,
    id               client_id NOT NULL,
    recall_event_id  uuid NOT NULL,
    principal_id     client_id NOT NULL,
    used             boolean NOT NULL,
    supported_answer boolean,
    rating           smallint CHECK (rating BETWEEN 1 AND 5),
    missing_context  text CHECK (length(missing_context) <= 4000),
    payload_sha256   bytea NOT NULL CHECK (length(payload_sha256) = 32),
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, id),
    FOREIGN KEY (team_id, recall_event_id) REFERENCES recall_events (team_id, id),
    FOREIGN KEY (team_id, principal_id) REFERENCES principals (team_id, id)
);

CREATE TABLE recall_feedback_items (
    team_id     client_id NOT NULL,
    feedback_id client_id NOT NULL,
    frontier    text NOT NULL,
    item_id     text NOT NULL,
    judgement   text NOT NULL CHECK (judgement IN ('irrelevant', 'useful', 'wrong', 'not_useful')),
    note        text CHECK (length(note) <= 2000),
    PRIMARY KEY (team_id, feedback_id, frontier, item_id),
    FOREIGN KEY (team_id, feedback_id) REFERENCES recall_feedback (team_id, id)
);

-- ---------------------------------------------------------------------------
-- Idempotency: one row per client-supplied write, with the hash of its content.
-- The same record again is a no-op; the same ID with other content is refused.
-- ---------------------------------------------------------------------------

CREATE TABLE write_log (
    team_id        client_id NOT NULL,
    kind           text NOT NULL,
    client_id      text NOT NULL,
    payload_sha256 bytea NOT NULL CHECK (length(payload_sha256) = 32),
    recorded_by    text,
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, kind, client_id)
);

-- ---------------------------------------------------------------------------
-- Per-space vector partitions, made with the space.
-- ---------------------------------------------------------------------------

CREATE FUNCTION memory_spaces_make_partitions() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    suffix text := replace(NEW.id::text, '-', '');
BEGIN
    EXECUTE format('CREATE TABLE %I PARTITION OF evidence_embeddings FOR VALUES IN (%L)',
                   'evidence_embeddings_' || suffix, NEW.id);
    EXECUTE format('ALTER TABLE %I ALTER COLUMN embedding SET STORAGE PLAIN',
                   'evidence_embeddings_' || suffix);
    EXECUTE format('CREATE TABLE %I PARTITION OF relationship_embeddings FOR VALUES IN (%L)',
                   'relationship_embeddings_' || suffix, NEW.id);
    EXECUTE format('ALTER TABLE %I ALTER COLUMN embedding SET STORAGE PLAIN',
                   'relationship_embeddings_' || suffix);
    INSERT INTO space_generations (team_id, space_id, generation, recorded_by)
    VALUES (NEW.team_id, NEW.id, 1, NEW.owner_principal_id);
    RETURN NULL;
END $$;
CREATE TRIGGER memory_spaces_make_partitions AFTER INSERT ON memory_spaces
    FOR EACH ROW EXECUTE FUNCTION memory_spaces_make_partitions();

-- ---------------------------------------------------------------------------
-- Row-level security: the application role and its policies.
-- ---------------------------------------------------------------------------

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recall_app') THEN
        CREATE ROLE recall_app NOLOGIN NOINHERIT NOBYPASSRLS;
    END IF;
END $$;
GRANT recall_app TO CURRENT_USER;
GRANT USAGE ON SCHEMA public TO recall_app;

-- The caller's team and readable spaces, as set by the gateway with
-- set_config(..., is_local => true). Unset (or reverted to '') means none.
CREATE FUNCTION recall_current_team() RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN nullif(current_setting('recall.team_id', true), '');

CREATE FUNCTION recall_allowed_spaces() RETURNS uuid[]
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN coalesce(nullif(current_setting('recall.space_ids', true), '')::uuid[], '{}'::uuid[]);

DO $$
DECLARE
    t text;
    team_tables text[] := ARRAY[
        'teams', 'principals', 'api_tokens', 'memory_spaces', 'space_generations',
        'relationship_projections', 'community_runs', 'communities', 'community_members',
        'recall_events', 'recall_event_items', 'recall_feedback', 'recall_feedback_items',
        'write_log'];
    space_tables text[] := ARRAY[
        'sources', 'source_lifecycle_events', 'evidence', 'evidence_terms',
        'evidence_lifecycle_events', 'evidence_occurrences', 'evidence_embeddings',
        'entities', 'evidence_entity_mentions', 'relationships', 'relationship_status_events',
        'relationship_embeddings', 'supports', 'support_decisions', 'conflict_cases',
        'conflict_positions', 'conflict_position_relationships', 'conflict_case_events',
        'evidence_conflicts', 'evidence_conflict_positions', 'hypotheses',
        'hypothesis_relationships', 'hypothesis_evidence', 'hypothesis_feedback'];
BEGIN
    FOREACH t IN ARRAY team_tables LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY team_wall ON %I TO recall_app USING (%s = recall_current_team()) '
            'WITH CHECK (%s = recall_current_team())',
            t, CASE WHEN t = 'teams' THEN 'id' ELSE 'team_id' END,
            CASE WHEN t = 'teams' THEN 'id' ELSE 'team_id' END);
        EXECUTE format('GRANT SELECT, INSERT ON %I TO recall_app', t);
    END LOOP;
    FOREACH t IN ARRAY space_tables LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY space_wall ON %I TO recall_app '
            'USING (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces())) '
            'WITH CHECK (team_id = recall_current_team() AND space_id = ANY (recall_allowed_spaces()))',
            t);
        EXECUTE format('GRANT SELECT, INSERT ON %I TO recall_app', t);
    END LOOP;
END $$;
-- Community runs move from 'running' to a final status; tokens can be revoked.
GRANT UPDATE (status, node_count, edge_count, graph_fingerprint, graph_watermark, error, finished_at)
    ON community_runs TO recall_app;
GRANT SELECT ON embedding_models TO recall_app;
