"""A write transaction begins with its tenant settings in one round trip: the
settings are literals there (a simple query takes no parameters), quoted so
that the server reads back exactly the value, whatever its string settings."""

from __future__ import annotations

import asyncpg
import pytest

from gateway.store.database import _begin_tenant_writing, _literal

ODD = ["plain", "it's", "back\\slash", "\\'", "''", "tab\there", "émigré ∑", "{a,b}", ""]


@pytest.mark.parametrize("conforming", ["on", "off"])
async def test_a_literal_reads_back_as_its_value(dsn: str, conforming: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"SET standard_conforming_strings = {conforming}")
        for value in ODD:
            assert await conn.fetchval(f"SELECT {_literal(value)}") == value
    finally:
        await conn.close()


def test_a_literal_refuses_nul() -> None:
    with pytest.raises(ValueError, match="NUL"):
        _literal("a\x00b")


async def test_the_begin_sets_what_the_separate_statement_set(dsn: str) -> None:
    """BEGIN, then the same five transaction-local settings and the shard claim;
    gone at ROLLBACK."""
    conn = await asyncpg.connect(dsn)
    try:
        spaces = "{00000000-0000-0000-0000-000000000001}"
        await conn.execute(_begin_tenant_writing(["recall_app", "team-x", spaces, "0", "4321"]))
        assert conn.is_in_transaction()
        row = await conn.fetchrow(
            "SELECT current_user, current_setting('recall.team_id') AS team, "
            "current_setting('recall.space_ids') AS spaces, "
            "current_setting('lock_timeout') AS lock, "
            "current_setting('statement_timeout') AS budget, "
            "current_setting('transaction_read_only') AS ro"
        )
        assert dict(row) == {
            "current_user": "recall_app",
            "team": "team-x",
            "spaces": spaces,
            "lock": "0",
            "budget": "4321ms",
            "ro": "off",
        }
        await conn.execute("ROLLBACK")
        assert await conn.fetchval("SELECT current_setting('recall.team_id', true)") in ("", None)
        assert await conn.fetchval("SELECT current_user") != "recall_app"
    finally:
        await conn.close()
