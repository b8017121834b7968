"""Every setting of the gateway, read from the environment (prefix ``RECALL_``).

One pydantic-settings model so that a setting is declared, typed, defaulted and
documented in one place; ``docs/configuration.md`` is checked against it by a test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import AliasChoices, Field, SecretStr
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

    pool_min_size: int = Field(default=1, ge=0, le=100, description="asyncpg pool minimum.")
    pool_max_size: int = Field(default=10, ge=1, le=200, description="asyncpg pool maximum.")
    statement_timeout_ms: int = Field(
        default=5000, ge=100, le=600_000, description="Upper bound of one SQL statement."
    )

    embedding_provider: Literal["local", "openai"] = Field(
        default="local",
        description="`local`: bundled offline MiniLM (ONNX). `openai`: an OpenAI-compatible "
        "`/embeddings` endpoint.",
    )
    embedding_batch_size: int = Field(
        default=64, ge=1, le=2048, description="Texts per embedding call."
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

    load_batch_size: int = Field(
        default=500, ge=1, le=100_000, description="Loader records per transaction."
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


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit overrides (used by the CLI's flags)."""
    return Settings(**overrides)  # type: ignore[arg-type]
