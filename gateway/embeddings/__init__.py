"""Embedding providers behind one small interface, chosen by the settings.

The rest of the gateway only sees :class:`EmbeddingProvider`; which model made
a vector is recorded through ``provider.model``, never inferred.
"""

from __future__ import annotations

from gateway.embeddings.base import EmbeddingProvider, Vectors, validate_vectors
from gateway.embeddings.local import LocalEmbeddingProvider
from gateway.embeddings.openai import OpenAIEmbeddingProvider
from gateway.errors import ConfigurationError
from gateway.settings import Settings

__all__ = [
    "EmbeddingProvider",
    "LocalEmbeddingProvider",
    "OpenAIEmbeddingProvider",
    "Vectors",
    "create_provider",
    "validate_vectors",
]


def create_provider(settings: Settings) -> EmbeddingProvider:
    """The configured provider, not yet loaded or connected: construction is cheap and offline."""
    if settings.embedding_provider == "local":
        return LocalEmbeddingProvider(batch_size=settings.embedding_batch_size)
    if settings.embedding_provider == "openai":
        return OpenAIEmbeddingProvider(
            model_name=settings.openai_model,
            dimensions=settings.openai_dimensions,
            base_url=settings.openai_base_url,
            api_key=settings.openai_api_key,
            timeout_s=settings.openai_timeout_s,
            batch_size=settings.embedding_batch_size,
        )
    raise ConfigurationError(f"unknown embedding provider {settings.embedding_provider!r}")
