"""Embedding providers behind one small interface, chosen by the settings.

The rest of the gateway only sees :class:`EmbeddingProvider`; which model made
a vector is recorded through ``provider.model``, never inferred.
"""

from __future__ import annotations

from gateway.embeddings.base import (
    EmbeddingProvider,
    Vectors,
    embed_queries,
    validate_vectors,
)
from gateway.embeddings.catalog import (
    AUTO,
    DEFAULT_LOCAL_MODEL,
    LOCAL_MODELS,
    LocalModel,
    by_key,
    by_model_id,
    choose,
)
from gateway.embeddings.e5 import E5EmbeddingProvider
from gateway.embeddings.following import FollowingProvider
from gateway.embeddings.local import LocalEmbeddingProvider
from gateway.embeddings.openai import OpenAIEmbeddingProvider
from gateway.embeddings.store_model import StoreModel, query_model
from gateway.errors import ConfigurationError
from gateway.settings import Settings

__all__ = [
    "AUTO",
    "DEFAULT_LOCAL_MODEL",
    "LOCAL_MODELS",
    "E5EmbeddingProvider",
    "EmbeddingProvider",
    "FollowingProvider",
    "LocalEmbeddingProvider",
    "LocalModel",
    "OpenAIEmbeddingProvider",
    "StoreModel",
    "Vectors",
    "by_key",
    "by_model_id",
    "choose",
    "create_provider",
    "embed_queries",
    "query_model",
    "validate_vectors",
]


def create_provider(settings: Settings, store_model: str | None = None) -> EmbeddingProvider:
    """The configured provider, not yet loaded or connected: construction is cheap and offline.

    ``store_model`` is the model the store holds vectors of (None for a new
    store): with ``RECALL_EMBEDDING_MODEL=auto`` the local provider is that
    model's, so a store keeps working when the default model changes.
    """
    if settings.embedding_provider == "local":
        model = choose(settings.embedding_model, store_model)
        provider = model.make(settings.embedding_batch_size)
        following = FollowingProvider(
            model,
            provider,
            follow=settings.embedding_model == AUTO,
            batch_size=settings.embedding_batch_size,
        )
        following.observe(store_model)
        return following
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
