"""The pool's reset statement on release (gateway/store/database.py, ``PooledConnection``).

A recall's connections (the token lookup's and the recall's unit) go back to the
pool without asyncpg's reset statement, because the read path leaves no session
state: its tenant settings are transaction-local. These tests hold the pool to
one connection, so every request of two teams runs on the same session, and
check what that session holds between requests; other uses keep the reset."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest_asyncio

from gateway.services.writes import WriteService

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import recall, token

RESET_MARK = "RESET ALL"


@pytest_asyncio.fixture(loop_scope="session")
async def one_connection_app(dsn: str) -> AsyncIterator[Any]:
    app = app_for(dsn, pool_min_size=1, pool_max_size=1)
    async with app.router.lifespan_context(app):
        yield app


def _pool(app: Any) -> Any:
    return app.state.services.db.pool


async def _two_teams(writes: WriteService) -> tuple[str, str, str, str]:
    a, b = unique("reset-a"), unique("reset-b")
    await load_jsonl(writes, jsonl([*team_records(a), *team_records(b)]))
    return a, await token(writes, a, "alice"), b, await token(writes, b, "alice")


async def _session_state(app: Any) -> dict[str, Any]:
    """What the next request would find on the pool's only connection. Read with
    the pool's own connection (acquired, so this use ends with a full reset)."""
    async with _pool(app).acquire() as conn:
        row = await conn.fetchrow(
            """
            SELECT current_user = session_user AS own_role,
                   coalesce(current_setting('recall.team_id', true), '') AS team,
                   coalesce(current_setting('recall.space_ids', true), '') AS spaces,
                   current_setting('statement_timeout') AS statement_timeout,
                   current_setting('lock_timeout') AS lock_timeout,
                   current_setting('plan_cache_mode') AS plan_cache_mode,
                   -- what RESET ALL would change (asyncpg's type introspection
                   -- sets jit and restores its value: a session source, same value)
                   (SELECT array_agg(name ORDER BY name) FROM pg_settings
                     WHERE setting IS DISTINCT FROM reset_val) AS session_settings,
                   (SELECT count(*) FROM pg_locks
                     WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS advisory,
                   (SELECT count(*) FROM pg_listening_channels()) AS listening,
                   (SELECT count(*) FROM pg_cursors) AS cursors,
                   pg_backend_pid() AS pid
            """
        )
    assert row is not None
    return dict(row)


# recall shapes: the current view, a knownAt view, entity expansion with known IDs
SHAPES: list[dict[str, Any]] = [
    {},
    {"knownAt": "now"},  # the instant of the request
    {"entities": ["billing"], "known": ["ev-owner"]},
]


async def _ask(client: httpx.AsyncClient, tok: str, **shape: Any) -> list[str]:
    if shape.get("knownAt") == "now":
        shape = {**shape, "knownAt": datetime.now(UTC).isoformat()}
    result = await recall(client, tok, q="billing service owned", limit=10, **shape)
    return [r["context"] for r in result["results"]]


async def test_recalls_release_their_connection_without_a_reset_statement(
    one_connection_app: Any, writes: WriteService
) -> None:
    _, tok_a, _, tok_b = await _two_teams(writes)
    sent: list[str] = []
    async with _pool(one_connection_app).acquire() as conn:
        conn.add_query_logger(lambda record: sent.append(str(record.query)))
    transport = httpx.ASGITransport(app=one_connection_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        sent.clear()  # the acquire above ends with a reset of its own
        await _ask(client, tok_a)
        await _ask(client, tok_b)
    assert sent, "the recalls ran on the logged connection"
    assert not [q for q in sent if RESET_MARK in q], sent


async def test_one_teams_settings_never_reach_the_next_request(
    one_connection_app: Any, writes: WriteService
) -> None:
    a, tok_a, b, tok_b = await _two_teams(writes)
    fresh = await _session_state(one_connection_app)
    assert fresh["team"] == "" and fresh["own_role"]
    transport = httpx.ASGITransport(app=one_connection_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        for shape in SHAPES:
            for tok, mine, other in ((tok_a, a, b), (tok_b, b, a)):
                contexts = await _ask(client, tok, **shape)
                assert not any(other in c for c in contexts), (shape, contexts)
                if "known" not in shape:  # known evidence is left out of the results
                    assert any(mine in c for c in contexts), (shape, contexts)
                after = await _session_state(one_connection_app)
                # the same session as before the requests, with nothing of theirs
                assert after == fresh, (shape, after, fresh)


async def test_other_uses_of_a_connection_keep_the_reset(
    one_connection_app: Any,
) -> None:
    """Session state set outside the read path (admin work may set a timeout or
    take a session lock) is still reset when the connection goes back."""
    fresh = await _session_state(one_connection_app)
    async with _pool(one_connection_app).acquire() as conn:
        await conn.execute("SET lock_timeout = '1234ms'")
        await conn.execute("SELECT pg_advisory_lock(4242)")
    assert await _session_state(one_connection_app) == fresh
    db = one_connection_app.state.services.db
    async with db.acquire() as conn:  # not said to be stateless
        await conn.execute("SET lock_timeout = '1234ms'")
    assert await _session_state(one_connection_app) == fresh
