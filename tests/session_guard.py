"""A guard on the pool's skipped resets, active in every test (tests/conftest.py).

A committed tenant transaction, a recall's unit and the token lookup release
their connection without asyncpg's reset statement (gateway/store/database.py,
``PooledConnection``): they must leave no session state, or the next request
on that connection inherits it. Every such release in the suite is checked
here first, with one statement on the connection before it goes back to the
pool; a test that leaves session state behind a skipped reset fails, whatever
code path it ran (trace, feedback, dataloaders, writes, recalls). Not checked:
statements prepared with SQL ``PREPARE``, which no reset of asyncpg's removes
either (a test's admin use prepares some on a pooled connection, and a later
skipped release would be blamed for them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import pytest
from asyncpg.connection import LoggedQuery

from gateway.store import database

LEAKS: list[dict[str, Any]] = []
"""What a release that skipped the reset left on its session, one entry a release."""

_CHECK = """
SELECT
       -- a role other than the login's: a side connection's login role (the
       -- startup setting, database.SideConnections) is its reset value
       (SELECT setting IS DISTINCT FROM reset_val FROM pg_settings WHERE name = 'role')
           OR (current_setting('role') = 'none' AND current_user <> session_user)
           AS role_kept,
       session_user <> (SELECT usename FROM pg_stat_activity WHERE pid = pg_backend_pid())
           AS session_authorization,  -- SET SESSION AUTHORIZATION (a full reset keeps it)
       -- the gateway's own settings (placeholders: not in pg_settings)
       coalesce(current_setting('recall.team_id', true), '') AS team,
       coalesce(current_setting('recall.space_ids', true), '') AS spaces,
       coalesce(current_setting('recall.stats_shard', true), '') AS stats_shard,
       -- set for the session, to another value than a reset gives (asyncpg's
       -- type introspection sets jit and restores it: same value)
       (SELECT array_agg(name ORDER BY name) FROM pg_settings
         WHERE source = 'session' AND setting IS DISTINCT FROM reset_val) AS session_settings,
       (SELECT count(*) FROM pg_locks
         WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS advisory_locks,
       (SELECT count(*) FROM pg_listening_channels()) AS listening,
       (SELECT count(*) FROM pg_cursors WHERE is_holdable) AS cursors,  -- not this one's
       (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()) AS temp_tables
"""

_reset = database._reset


def _query_loggers(conn: asyncpg.Connection) -> set[Callable[[LoggedQuery], object]]:
    """asyncpg's own set of the connection's query loggers (private: asyncpg has no
    public way to list them, and asyncpg-stubs names the slot without a type)."""
    loggers: set[Callable[[LoggedQuery], object]] = conn._query_loggers  # type: ignore[attr-defined]
    return loggers


async def _checked_reset(conn: asyncpg.Connection) -> None:
    if getattr(conn, "_skip_reset", False) and not conn.is_closed():
        # unseen by the connection's query loggers (the pool's statement counter,
        # tests' logs): not a statement of the request
        installed = _query_loggers(conn)
        loggers = set(installed)
        installed.clear()
        try:
            found = await conn.fetchrow(_CHECK)
        finally:
            installed.update(loggers)
        assert found is not None  # one row, always
        row = dict(found)
        if any(value for value in row.values()):
            LEAKS.append(row)
    await _reset(conn)


def install() -> None:
    """Check every skipped reset of the pools opened from now on."""
    database._reset = _checked_reset


@pytest.fixture(autouse=True)
def no_session_state_after_skipped_resets() -> Iterator[None]:
    LEAKS.clear()
    yield
    leaks, LEAKS[:] = list(LEAKS), []
    assert not leaks, f"session state left behind a skipped pool reset: {leaks}"
