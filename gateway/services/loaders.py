"""Per-request batch loaders: every GraphQL field that needs a source, a
relationship or an entity asks a loader, and each loader sends one statement per
batch, whatever the number of results. They read through the request's view
(team, spaces, instants), so a nested field never sees more than the recall did.
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

    async def batch_load_fn(self, keys: Sequence[str]) -> list[T | None]:
        view = self._view
        async with self._db.tenant(view.team_id, view.space_ids) as conn:
            found = await self._fetch(conn, view.team_id, list(keys), view.space_ids, view.t_sys)
        return [found.get(k) for k in keys]


class ReadLoaders:
    """The loaders of one request and one view."""

    def __init__(self, db: Database, view: ReadView) -> None:
        self.view = view
        self.sources: _ViewLoader[store.SourceRow] = _ViewLoader(db, view, store.sources)
        self.relationships: _ViewLoader[store.RelationshipRow] = _ViewLoader(
            db, view, store.relationships
        )
        self.entities: _ViewLoader[store.EntityRow] = _ViewLoader(db, view, store.entities)
