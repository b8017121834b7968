"""Every setting of the gateway, read from the environment (prefix ``RECALL_``).

One pydantic-settings model so that a setting is declared, typed, defaulted and
documented in one place; ``docs/configuration.md`` is checked against it by a test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import AliasChoices, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """Per-user data folder for the embedded database (XDG data dir on Linux)."""
    return Path(platformdirs.user_data_dir("recall-gateway", appauthor=False))


class Settings(BaseSettings):
    """Gateway configuration. Environment variables are ``RECALL_<NAME>``."""

    model_config = SettingsConfigDict(
        env_prefix="RECALL_", env_file=None, extra="ignore", frozen=True
    )

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "RECALL_DATABASE_URL"),
        description="PostgreSQL DSN. Unset: the embedded PostgreSQL under data_dir is used.",
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Folder of the embedded database (and nothing else).",
    )
    host: str = Field(default="127.0.0.1", description="Address `serve` binds to.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port `serve` binds to.")
    workers: int = Field(default=1, ge=1, le=64, description="uvicorn worker processes.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info")
    log_format: Literal["text", "json"] = Field(
        default="text", description="`json`: one JSON object per log line."
    )
    metrics: bool = Field(default=True, description="Serve Prometheus metrics on GET /metrics.")
    # --- serving and shutdown (gateway/serving.py, docs/security.md)
    header_timeout_ms: int = Field(
        default=10_000,
        ge=100,
        le=600_000,
        description="A request's headers must be complete within this (408, then close).",
    )
    body_timeout_ms: int = Field(
        default=15_000,
        ge=100,
        le=600_000,
        description="A request's body must be complete within this after its headers.",
    )
    shutdown_drain_ms: int = Field(
        default=5_000,
        ge=0,
        le=600_000,
        description="On SIGTERM, /readyz answers 503 and requests are still served this long.",
    )
    shutdown_grace_ms: int = Field(
        default=10_000,
        ge=0,
        le=600_000,
        description="After the drain, in-flight requests get this long before they are "
        "cancelled; closing the pool gets as long again.",
    )

    pool_min_size: int = Field(default=1, ge=0, le=100, description="asyncpg pool minimum.")
    pool_max_size: int = Field(default=10, ge=1, le=200, description="asyncpg pool maximum.")
    side_connections: int = Field(
        default=4,
        ge=0,
        le=64,
        description="Connections per pool reserved for relationship discovery beside a full "
        "recall's own connection (outside RECALL_POOL_MAX_SIZE; a recall takes one only if "
        "one is free, else discovers on its own connection); 0: none. See docs/recall.md.",
    )
    statement_timeout_ms: int = Field(
        default=5000, ge=100, le=600_000, description="Upper bound of one SQL statement."
    )

    # --- the embedded server's memory (gateway/embedded.py, docs/deploy.md "Memory")
    pg_shared_buffers_mb: int | None = Field(
        default=None,
        ge=16,
        le=1_048_576,
        description="shared_buffers (MB) of the embedded PostgreSQL when the gateway starts "
        "it; unset: a quarter of the machine's memory (or of its cgroup limit), at least "
        "128 and at most 8192. Not used with DATABASE_URL.",
    )
    pg_effective_cache_size_mb: int | None = Field(
        default=None,
        ge=16,
        le=1_048_576,
        description="effective_cache_size (MB, a planner estimate; allocates nothing) of the "
        "embedded PostgreSQL; unset: half the machine's memory, at least shared_buffers.",
    )

    warm_up_mb: int | None = Field(
        default=None,
        ge=0,
        le=16_777_216,
        description="At start, read up to this many MB of the store's files into the page "
        "cache, vector indexes first (/readyz says 503 meanwhile); unset: the embedded "
        "server's effective_cache_size, and no warm-up with DATABASE_URL; 0: no warm-up; "
        "with the embedded server, a value not below the machine's memory is refused at "
        "start. Needs a login that may read the server's files.",
    )

    # --- read replicas (gateway/store/replicas.py, docs/deploy.md)
    read_database_urls: str = Field(
        default="",
        description="Comma-separated DSNs of PostgreSQL streaming replicas of DATABASE_URL: "
        "recall and trace read there when a replica has replayed what the read needs.",
    )
    replica_max_lag_ms: int = Field(
        default=5000,
        ge=10,
        le=3_600_000,
        description="A replica behind a position the primary had longer ago than this "
        "leaves the rotation until it catches up.",
    )
    replica_wait_ms: int = Field(
        default=20,
        ge=0,
        le=10_000,
        description="How long a read waits for a replica to replay its position before "
        "it runs on the primary instead.",
    )
    replica_check_interval_ms: int = Field(
        default=250,
        ge=10,
        le=60_000,
        description="How often the primary's position and each replica's replay are sampled.",
    )

    plan_cache_mode: Literal["force_generic_plan", "auto", "force_custom_plan", "server"] = Field(
        default="force_generic_plan",
        description="PostgreSQL's plan_cache_mode for a recall's transaction; `server`: "
        "none set (the setting the connection got at login: server, database or login role; "
        "not recall_app's). See docs/deploy.md.",
    )

    @property
    def read_urls(self) -> list[str]:
        return [u.strip() for u in self.read_database_urls.split(",") if u.strip()]

    embedding_provider: Literal["local", "openai"] = Field(
        default="local",
        description="`local`: a bundled offline model (RECALL_EMBEDDING_MODEL). `openai`: an "
        "OpenAI-compatible "
        "`/embeddings` endpoint.",
    )
    embedding_model: Literal["auto", "minilm", "minilm-int8", "e5-small"] = Field(
        default="auto",
        description="Local model (`local` provider): `auto` follows the model the store holds "
        "(a new store gets the default, MiniLM); `minilm`, `minilm-int8` or `e5-small` names "
        "one.",
    )
    embedding_batch_size: int = Field(
        default=64,
        ge=1,
        le=2048,
        description="Most texts per embedding call (a request to the `openai` endpoint, a run "
        "of a local model); the local MiniLM also caps a run at 256 padded tokens, so long "
        "texts run one at a time.",
    )
    openai_base_url: str = Field(
        default="https://api.openai.com/v1", description="Base URL of the embeddings endpoint."
    )
    openai_api_key: SecretStr | None = Field(default=None, description="Bearer key, if needed.")
    openai_model: str = Field(default="text-embedding-3-small")
    openai_dimensions: int = Field(
        default=384, ge=1, le=16000, description="Requested vector size; the store holds 384."
    )
    openai_timeout_s: float = Field(default=10.0, gt=0, le=300)

    migrate_on_start: bool = Field(
        default=True, description="Apply pending migrations when the server starts."
    )

    feedback_enabled: bool = Field(
        default=True,
        description="Persist each recall as a recall event and suggest "
        "submitRecallSessionFeedback (docs/feedback.md).",
    )

    load_batch_size: int = Field(
        default=500, ge=1, le=100_000, description="Loader records per transaction."
    )
    load_concurrency: int = Field(
        default=2,
        ge=1,
        le=16,
        description="Loader batches in flight at once, each a transaction on a connection "
        "of its own (1: one batch at a time); see docs/loading.md.",
    )
    index_build_memory_mb: int = Field(
        default=1024,
        ge=64,
        le=65_536,
        description="maintenance_work_mem (MB) of the vector index builds that end a "
        "'load --index-after'; an HNSW graph built in memory needs about 2 KB per "
        "384-dimension vector.",
    )
    index_build_workers: int = Field(
        default=1,
        ge=0,
        le=64,
        description="Parallel workers (besides the server process leading it) of each "
        "vector index build that ends a 'load --index-after'.",
    )
    load_progress_interval_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="Seconds between the loader's progress lines when standard error "
        "is not a terminal.",
    )

    community_max_nodes: int = Field(
        default=50_000,
        ge=1,
        le=10_000_000,
        description="Above this many semantic groups a community run is stored as too_large.",
    )
    community_max_edges: int = Field(
        default=500_000,
        ge=1,
        le=100_000_000,
        description="Above this many graph edges a community run is stored as too_large.",
    )
    # --- hardening (docs/security.md). `None` means "the profile's default":
    # gateway/http/limits.py holds the development and production values.
    env: Literal["development", "production"] = Field(
        default="development",
        description="Profile: `production` turns introspection, GraphiQL and field "
        "suggestions off and uses the strict limits.",
    )
    introspection: bool | None = Field(default=None, description="Allow introspection.")
    graphiql: bool | None = Field(default=None, description="Serve GraphiQL on GET /graphql.")
    cors_origins: str = Field(
        default="", description="Comma-separated origins allowed by CORS; empty: no CORS."
    )
    max_depth: int | None = Field(default=None, ge=1, le=100)
    max_aliases: int | None = Field(default=None, ge=0, le=1000)
    max_tokens: int | None = Field(default=None, ge=10, le=1_000_000)
    max_directives: int | None = Field(default=None, ge=0, le=1000)
    max_selections: int | None = Field(default=None, ge=1, le=100_000)
    max_repeats: int | None = Field(default=None, ge=1, le=1000)
    max_cost: int | None = Field(default=None, ge=1, le=10_000_000)
    max_body_bytes: int | None = Field(default=None, ge=1024, le=100_000_000)
    batching: bool = Field(default=False, description="Accept a JSON array of operations.")
    max_batch_size: int = Field(default=5, ge=1, le=100)
    request_timeout_ms: int | None = Field(default=None, ge=100, le=600_000)
    persisted_queries: Literal["off", "apq", "allowlist"] = Field(
        default="apq",
        description="`apq`: Automatic Persisted Queries; `allowlist`: only operations of "
        "the manifest run; `off`: neither.",
    )
    persisted_query_manifest: Path | None = Field(
        default=None, description="JSON object {sha256: document} for `allowlist` mode."
    )
    persisted_query_max_entries: int = Field(default=1000, ge=10, le=10_000_000)
    persisted_query_max_bytes: int = Field(default=32_768, ge=256, le=10_000_000)

    mcp_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the agent that `recall-gateway mcp` serves over stdio.",
    )


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit overrides (used by the CLI's flags)."""
    return Settings(**overrides)  # type: ignore[arg-type]


_SECRET_WORDS = ("url", "token", "secret", "password", "key")
"""Settings whose values an error message must not repeat (a URL holds a password)."""


def settings_problems(exc: ValidationError) -> list[str]:
    """Each refused setting of ``exc`` named by the environment variable a user
    sets (``RECALL_PLAN_CACHE_MODE``, not the field ``plan_cache_mode``), with
    pydantic's reason (the allowed values, the bounds) and, unless the setting
    may hold a secret, the value given."""
    problems = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        name = f"RECALL_{field.upper()}" if field in Settings.model_fields else field.upper()
        problem = f"{name}: {error['msg']}"
        given = error.get("input")
        if isinstance(given, str | int | float) and not any(w in field for w in _SECRET_WORDS):
            problem += f" (got {given!r})"
        problems.append(problem)
    return problems
