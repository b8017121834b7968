"""Which model's vectors the store holds, and whether this process's questions may meet them.

A cosine between a question embedded by one model and vectors of another is a
number without meaning, and nothing in it looks wrong: the vector lists answer
with neighbours, the fusion ranks them, the search says complete. Writes refuse
such a pair (``EMBEDDING_MODEL_MISMATCH``); reads must not compare them either.
So the serving process keeps the store's model as last read (at start, then by
:func:`gateway.services.reembed.watch_store_model`, about once a second) and
recall asks :meth:`StoreModel.mismatch` before it embeds a question: on a
mismatch the vector lists of evidence and relationships are skipped with the
degradation ``query_embedding_model_mismatch`` and the full-text and entity
lists answer alone. ``/readyz`` and the start-up log say the same.

The model a question *will* be embedded with is asked of the provider
(``next_model``), not its present ``model``: a provider following the store
(``RECALL_EMBEDDING_MODEL=auto``) switches at its next call, so the store
moving on is no mismatch for it.
"""

from __future__ import annotations

import logging

from gateway.embeddings.base import EmbeddingProvider

log = logging.getLogger(__name__)

__all__ = ["StoreModel", "query_model"]


def query_model(provider: EmbeddingProvider) -> str:
    """The model the provider's next vector will come from."""
    following = getattr(provider, "next_model", None)
    return following if isinstance(following, str) else provider.model


class StoreModel:
    """The store's model as last read, shared by every request of one process."""

    def __init__(self, provider: EmbeddingProvider, held: str | None) -> None:
        self.provider = provider
        self._held = held

    @property
    def held(self) -> str | None:
        """The model of the store's vectors; None for a store without vectors."""
        return self._held

    def observe(self, held: str | None) -> None:
        """Record what the store holds now, and pass it on to a following provider."""
        before = self.mismatch()
        self._held = held
        observe = getattr(self.provider, "observe", None)
        if callable(observe):
            observe(held)
        after = self.mismatch()
        if after is not None and after != before:
            log.warning("%s: recall skips its vector lists, writes are refused", after)
        elif after is None and before is not None:
            log.info("the store's embedding model matches the configured provider again")

    def mismatch(self) -> str | None:
        """Why questions of this process may not be compared with the store's vectors, or None.

        A store without vectors matches any model: there is nothing to compare with.
        """
        held = self._held
        if held is None:
            return None
        asked = query_model(self.provider)
        if asked == held:
            return None
        return (
            f"the configured embedding provider makes vectors of model '{asked}' and the "
            f"store holds vectors of model '{held}'"
        )
