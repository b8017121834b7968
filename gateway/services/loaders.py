"""Per-request batch loaders: every GraphQL field that needs a source, a
relationship or an entity asks a loader, and each loader sends one statement per
batch, whatever the number of results. They read through the request's view
(team, spaces, instants), so a nested field never sees more than the recall did.

A recall reads the rows its answer's nested fields will ask for and primes the
loaders with them; :meth:`_ViewLoader.primed` hands such a row over at once, so
that a resolver can answer without an awaitable. Each awaitable a resolver
returns costs graphql-core an asyncio task and a gather (about 30 tasks for a
full recall of 10 results), for a value that was already there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Generic, TypeVar
from uuid import UUID

from aiodataloader import DataLoader

from gateway.services.recall_types import ReadView
from gateway.store import recall as store
from gateway.store.connection import Conn
from gateway.store.database import Database

T = TypeVar("T")

Fetch = Callable[[Conn, str, Sequence[str], Sequence[UUID], datetime], Awaitable[dict[str, T]]]


class _ViewLoader(DataLoader[str, T | None], Generic[T]):
    def __init__(self, db: Database, view: ReadView, fetch: Fetch[T]) -> None:
        super().__init__()
        self._db = db
        self._view = view
        self._fetch = fetch
        self._primed: dict[str, T] = {}

    def prime_rows(self, rows: dict[str, T]) -> None:
        """Prime the loader with rows read beforehand (before any load)."""
        for key, row in rows.items():
            self.prime(key, row)
            self._primed.setdefault(key, row)

    def primed(self, key: str) -> T | None:
        """The row primed for ``key``, which ``load(key)`` would resolve to; None
        when it was not primed (then ``load`` reads it, or finds it missing)."""
        return self._primed.get(key)

    def primed_many(self, keys: Sequence[str]) -> list[T] | None:
        """The rows primed for every one of ``keys``, in order; None unless all
        were primed."""
        primed = self._primed
        try:
            return [primed[k] for k in keys]
        except KeyError:
            return None

    async def batch_load_fn(self, keys: Sequence[str]) -> list[T | None]:
        view = self._view
        async with self._db.tenant(view.team_id, view.space_ids) as conn:
            found = await self._fetch(conn, view.team_id, list(keys), view.space_ids, view.t_sys)
        return [found.get(k) for k in keys]


class ReadLoaders:
    """The loaders of one request and one view, primed with the rows the recall
    already read (``nested``), so that only what it did not foresee costs a
    statement of its own."""

    def __init__(
        self, db: Database, view: ReadView, nested: store.NestedRows | None = None
    ) -> None:
        self.view = view
        self.sources: _ViewLoader[store.SourceRow] = _ViewLoader(db, view, store.sources)
        self.relationships: _ViewLoader[store.RelationshipRow] = _ViewLoader(
            db, view, store.relationships
        )
        self.entities: _ViewLoader[store.EntityRow] = _ViewLoader(db, view, store.entities)
        if nested is not None:
            self.sources.prime_rows(nested.sources)
            self.relationships.prime_rows(nested.relationships)
            self.entities.prime_rows(nested.entities)
