"""The pool's reset statement on release (gateway/store/database.py, ``PooledConnection``).

A recall's connections (the token lookup's and the recall's unit) and a
committed tenant transaction's (a ``remember``) go back to the pool without
asyncpg's reset statement, because they leave no session state: their tenant
settings and counter shard are transaction-local. These tests hold the pool to
one connection, so every request of two teams runs on the same session, and
check what that session holds between requests; other uses keep the reset."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette

from gateway.embeddings import EmbeddingProvider
from gateway.embeddings.base import Vectors
from gateway.services.auth import authenticate
from gateway.services.mutations import MutationService, remember_items
from gateway.services.writes import WriteService
from gateway.store.connection import Conn

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_mutations import incident_memory, mutate, remember
from .test_recall import ids, recall, token

RESET_MARK = "RESET ALL"


@pytest_asyncio.fixture(loop_scope="session")
async def one_connection_app(dsn: str) -> AsyncIterator[Starlette]:
    app = app_for(dsn, pool_min_size=1, pool_max_size=1)
    async with app.router.lifespan_context(app):
        yield app


def _pool(app: Starlette) -> asyncpg.Pool:
    pool: asyncpg.Pool = app.state.services.db.pool
    return pool


async def _two_teams(writes: WriteService) -> tuple[str, str, str, str]:
    a, b = unique("reset-a"), unique("reset-b")
    await load_jsonl(writes, jsonl([*team_records(a), *team_records(b)]))
    return a, await token(writes, a, "alice"), b, await token(writes, b, "alice")


async def _session_state(app: Starlette) -> dict[str, Any]:
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
                   (SELECT count(*) FROM pg_class
                     WHERE relnamespace = pg_my_temp_schema()) AS temp_tables,
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
    one_connection_app: Starlette, writes: WriteService
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
    one_connection_app: Starlette, writes: WriteService
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
    one_connection_app: Starlette,
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


def _receipts(body: dict[str, Any]) -> list[tuple[str, str, bool]]:
    assert "errors" not in body, body
    return [(r["kind"], r["id"], r["created"]) for r in body["data"]["remember"]["receipts"]]


async def test_writes_of_two_teams_release_their_connection_without_a_reset_statement(
    one_connection_app: Starlette, writes: WriteService
) -> None:
    """``remember`` of two teams, one after the other on the pool's only session:
    no reset statement between them, each write whole, each team's rows its own
    (its recall finds them, the other's does not), a re-run writes nothing and
    says so, and the session is afterwards what it was before the requests."""
    a, tok_a, b, tok_b = await _two_teams(writes)
    fresh = await _session_state(one_connection_app)
    sent: list[str] = []
    async with _pool(one_connection_app).acquire() as conn:
        conn.add_query_logger(lambda record: sent.append(str(record.query)))
    transport = httpx.ASGITransport(app=one_connection_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        sent.clear()  # the acquire above ends with a reset of its own
        first: dict[str, list[tuple[str, str, bool]]] = {}
        for tok, team in ((tok_a, a), (tok_b, b), (tok_a, a)):
            space = "PRIVATE" if team in first else "SHARED"
            data = incident_memory(space, suffix=f"-{team}-{space.lower()}")
            receipts = _receipts(await remember(client, tok, data))
            assert receipts and all(created for _, _, created in receipts), receipts
            first.setdefault(team, []).extend(receipts)
        for tok, team in ((tok_b, b), (tok_a, a)):
            found = ids(await recall(client, tok, q="nightly export job warehouse", limit=20))
            assert f"ev-export-{team}-shared" in found, found
            other = b if team == a else a
            assert not [i for i in found if other in i], found
        # the same call again: nothing written, and said so
        again = _receipts(
            await remember(client, tok_b, incident_memory("SHARED", suffix=f"-{b}-shared"))
        )
        assert again == [(k, i, False) for k, i, _ in first[b]], again
    assert any(q.strip().upper().startswith("COMMIT") for q in sent), "written on that session"
    assert not [q for q in sent if RESET_MARK in q], sent
    assert await _session_state(one_connection_app) == fresh


async def test_a_refused_write_keeps_the_reset_and_another_teams_ids_look_missing(
    one_connection_app: Starlette, writes: WriteService, admin_conn: Conn
) -> None:
    """Team b names team a's evidence right after team a wrote it on the same
    session: refused as an evidence that does not exist (same code and message as
    one nobody wrote), nothing of the call written, the refused use's release
    keeps the reset statement, and the session is left as it was."""
    _, tok_a, b, tok_b = await _two_teams(writes)
    fresh = await _session_state(one_connection_app)
    transport = httpx.ASGITransport(app=one_connection_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        _receipts(await remember(client, tok_a, incident_memory("SHARED", suffix="-x")))
        sent: list[str] = []
        async with _pool(one_connection_app).acquire() as conn:
            conn.add_query_logger(lambda record: sent.append(str(record.query)))
        answers = {}
        for name, evidence in (("foreign", "ev-export-x"), ("unknown", "ev-nobody")):
            data = incident_memory("SHARED", suffix=f"-{name}")
            data["relationships"][0]["supports"][0] = {"id": f"sup-{name}", "evidence": evidence}
            sent.clear()
            body = await mutate(client, tok_b, "remember", "RememberInput", data, "receipts { id }")
            assert body.get("data") is None and body["errors"], body
            answers[name] = body["errors"][0]
            assert [q for q in sent if RESET_MARK in q], sent
            assert await _session_state(one_connection_app) == fresh
    foreign, unknown = answers["foreign"], answers["unknown"]
    assert foreign["extensions"]["code"] == unknown["extensions"]["code"] == "NOT_FOUND"
    assert foreign["message"].replace("ev-export-x", "ev-nobody") == unknown["message"]
    # nothing of either refused call, in any table it writes (read as the owner,
    # past row-level security)
    written = {
        table: await admin_conn.fetchval(
            f"SELECT count(*) FROM {table} WHERE team_id = $1 "
            f"AND ({column} LIKE '%-foreign' OR {column} LIKE '%-unknown')",
            b,
        )
        for table, column in (
            ("write_log", "client_id"),
            ("sources", "id"),
            ("entities", "id"),
            ("evidence", "id"),
            ("evidence_occurrences", "id"),
            ("evidence_embeddings", "evidence_id"),
            ("relationships", "id"),
            ("relationship_embeddings", "relationship_id"),
            ("supports", "id"),
        )
    }
    assert written == dict.fromkeys(written, 0), written


class _HeldEmbedder:
    """The app's provider, holding every call until the test cancels the write."""

    def __init__(self, inner: EmbeddingProvider) -> None:
        self.inner = inner
        self.model = inner.model
        self.dimensions = inner.dimensions
        self.started = asyncio.Event()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.started.set()
        await asyncio.Event().wait()  # until cancelled
        return await self.inner.embed(texts)  # pragma: no cover

    async def aclose(self) -> None:
        return None  # the app's provider is the app's to close


async def test_a_cancelled_write_keeps_the_reset(
    one_connection_app: Starlette, writes: WriteService, admin_conn: Conn
) -> None:
    """A ``remember`` cancelled in the middle of its transaction (a client gone
    while its texts embed: asyncio cancels the request's task): the transaction
    is rolled back, nothing of it is written, and the connection's release sends
    the reset statement; only a committed tenant transaction skips it
    (``Database.tenant``)."""
    team, tok, _, _ = await _two_teams(writes)
    db = one_connection_app.state.services.db
    held = _HeldEmbedder(one_connection_app.state.services.embedder)
    mutations = MutationService(WriteService(db, held))
    principal = await authenticate(db, tok)
    fresh = await _session_state(one_connection_app)
    sent: list[str] = []
    async with _pool(one_connection_app).acquire() as conn:
        conn.add_query_logger(lambda record: sent.append(str(record.query)))
    sent.clear()
    data = incident_memory("shared", suffix="-cancelled")
    data["source"].update(type="document", authority="high")  # the enums' values
    items = remember_items(principal, data)
    task = asyncio.create_task(mutations.apply(principal, items))
    await asyncio.wait_for(held.started.wait(), timeout=30)
    for _ in range(500):  # the transaction has written its first records
        if any("INSERT INTO" in q for q in sent):
            break
        await asyncio.sleep(0.01)
    assert any("INSERT INTO" in q for q in sent), sent
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with _pool(one_connection_app).acquire():  # once the cancelled use released it
        released = list(sent)
    assert [q for q in released if RESET_MARK in q], released
    assert not [q for q in released if q.strip().upper().startswith("COMMIT")], released
    assert await _session_state(one_connection_app) == fresh
    assert not await admin_conn.fetchval(
        "SELECT count(*) FROM write_log WHERE team_id = $1 AND client_id LIKE '%-cancelled'", team
    )


async def test_the_suite_catches_session_state_left_behind_a_skipped_reset(
    one_connection_app: Starlette, writes: WriteService
) -> None:
    """What a tenant block must never do (``Database.tenant``): a session-level
    setting and a session advisory lock, left by a committed tenant transaction,
    whose release skips the reset. The suite's guard (tests/session_guard.py)
    finds them on the connection as it goes back to the pool."""
    from . import session_guard

    team, _, _, _ = await _two_teams(writes)
    db = one_connection_app.state.services.db
    async with db.tenant(team, [], readonly=False) as conn:
        await conn.execute("SELECT set_config('lock_timeout', '1234ms', false)")
        await conn.execute("SELECT pg_advisory_lock(4243)")
    leaks, session_guard.LEAKS[:] = list(session_guard.LEAKS), []
    assert len(leaks) == 1, leaks
    assert leaks[0]["session_settings"] == ["lock_timeout"]
    assert leaks[0]["advisory_locks"] == 1
    async with _pool(one_connection_app).acquire():
        pass  # this release resets the session in full: clean again
    after = await _session_state(one_connection_app)
    assert after["advisory"] == 0 and after["lock_timeout"] != "1234ms", after

    # the session's user, which even the full reset keeps, and the write path's
    # own shard setting (a placeholder, not in pg_settings)
    async with db.tenant(team, [], readonly=False) as conn:
        await conn.execute("SET SESSION AUTHORIZATION recall_app")
    async with db.tenant(team, [], readonly=False) as conn:
        await conn.execute("SELECT set_config('recall.stats_shard', '3', false)")
    leaks, session_guard.LEAKS[:] = list(session_guard.LEAKS), []
    assert len(leaks) == 2, leaks
    assert leaks[0]["session_authorization"] and leaks[1]["stats_shard"] == "3", leaks
    async with _pool(one_connection_app).acquire() as conn:
        await conn.execute("RESET SESSION AUTHORIZATION")
    assert await _session_state(one_connection_app) == after
