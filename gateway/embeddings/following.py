"""A provider that keeps up with the store's model while the process runs.

``recall-gateway reembed`` switches a store to another model in one
transaction, while gateways keep serving. A gateway that went on embedding
questions with the old model would compare them with vectors of the new one:
wrong answers, with nothing to show for it. So the serving process watches the
store's model (:func:`gateway.services.reembed.watch_store_model` calls
:meth:`observe`) and this wrapper acts on a change:

* ``RECALL_EMBEDDING_MODEL=auto``: it loads the store's new model and embeds
  with it from then on;
* a model named explicitly: it refuses to embed (an :class:`EmbeddingError`:
  recall degrades to its full-text and entity lists, writes are refused), and
  says which setting to change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from gateway.embeddings.base import EmbeddingProvider, Vectors, embed_queries
from gateway.embeddings.catalog import LocalModel, by_model_id
from gateway.errors import EmbeddingError

log = logging.getLogger(__name__)


class FollowingProvider:
    """Delegates to one local provider; swaps it when the store's model changes."""

    def __init__(
        self, model: LocalModel, provider: EmbeddingProvider, *, follow: bool, batch_size: int
    ) -> None:
        self._current = provider
        self._follow = follow
        self._batch_size = batch_size
        self._store_model: str | None = None
        self._switch = asyncio.Lock()
        self._retired: list[EmbeddingProvider] = []

    @property
    def current(self) -> EmbeddingProvider:
        return self._current

    @property
    def model(self) -> str:
        return self._current.model

    @property
    def dimensions(self) -> int:
        return self._current.dimensions

    @property
    def next_model(self) -> str:
        """The model the next call embeds with: the store's, if this provider follows it
        and it is a local model; else the present one (which then refuses to embed)."""
        wanted = self._store_model
        if wanted is None or wanted == self._current.model:
            return self._current.model
        if self._follow and by_model_id(wanted) is not None:
            return wanted
        return self._current.model

    def observe(self, store_model: str | None) -> None:
        """Record the model the store holds now (None: no vectors yet).

        Recall's LRU of query vectors needs no signal from here: it is keyed by
        :attr:`next_model`, which this changes only when the store's model is
        not the one this provider embeds with."""
        self._store_model = store_model

    def load(self) -> None:
        load = getattr(self._current, "load", None)
        if callable(load):
            load()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        provider = await self._provider()
        return await provider.embed(texts)

    async def embed_queries(self, texts: Sequence[str]) -> Vectors:
        provider = await self._provider()
        return await embed_queries(provider, texts)

    async def aclose(self) -> None:
        for provider in [self._current, *self._retired]:
            await provider.aclose()
        self._retired.clear()

    async def _provider(self) -> EmbeddingProvider:
        wanted = self._store_model
        if wanted is None or wanted == self._current.model:
            return self._current
        target = by_model_id(wanted) if self._follow else None
        if target is None:
            raise EmbeddingError(
                f"the store now holds vectors of model '{wanted}' and this process embeds "
                f"with '{self._current.model}': set RECALL_EMBEDDING_MODEL to auto (or to "
                "that model) and restart the gateway"
            )
        async with self._switch:
            if self._current.model != wanted:
                fresh = target.make(self._batch_size)
                load = getattr(fresh, "load", None)
                if callable(load):
                    await asyncio.to_thread(load)
                log.info("the store moved to model %s; embedding with it from now on", wanted)
                # The old provider may still be running a batch for a request
                # that started before the switch: closed with the process.
                self._retired.append(self._current)
                self._current = fresh
        return self._current
