"""A serving process freezes its start-up heap and collects young objects less often
(gateway/heap.py); an app embedded elsewhere (tests, the MCP server) leaves the
collector as it found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from gateway import app as app_module
from gateway import heap
from gateway.settings import Settings


@pytest.fixture
def collector() -> Iterator[None]:
    """Put the collector back as it was (other tests share this process)."""
    threshold = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


async def test_a_served_app_settles_its_heap_when_ready(dsn: str, collector: None) -> None:
    app = app_module.create_app(Settings(database_url=dsn, pool_max_size=2), settle_heap=True)
    assert gc.get_freeze_count() == 0
    async with app.router.lifespan_context(app):
        # everything start-up made (schema, pool, model) is out of the collector's walks
        assert gc.get_freeze_count() > 10_000
        assert gc.get_threshold()[0] == heap.YOUNG_THRESHOLD
        # and the collector still runs, and still reclaims cycles
        cycle: list[Any] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1


async def test_an_embedded_app_leaves_the_collector_alone(dsn: str, collector: None) -> None:
    before = gc.get_threshold()
    app = app_module.create_app(Settings(database_url=dsn, pool_max_size=2))
    async with app.router.lifespan_context(app):
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == before


def test_serve_workers_settle_their_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve --workers N`` builds each worker's app with ``create_served_app``."""
    seen: dict[str, Any] = {}

    def fake(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(app_module, "create_app", fake)
    monkeypatch.delenv(app_module.SERVES_EMBEDDED_ENV, raising=False)
    app_module.create_served_app()
    assert seen == {"handle_sigterm": True, "settle_heap": True, "embedded_server": False}
    # serve on the embedded server tells its workers so (the warm-up's default)
    monkeypatch.setenv(app_module.SERVES_EMBEDDED_ENV, "1")
    app_module.create_served_app()
    assert seen["embedded_server"] is True
