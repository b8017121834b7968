"""Row-level security is really in force for the gateway's role.

These statements deliberately omit every team and space predicate: only the
policies stand between the caller and other teams' rows.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg
import pytest

from gateway.services.writes import WriteService
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records


async def _spaces(conn: Conn, team: str) -> dict[str | None, UUID]:
    rows = await conn.fetch(
        "SELECT id, owner_principal_id FROM memory_spaces WHERE team_id = $1", team
    )
    return {r["owner_principal_id"]: r["id"] for r in rows}


async def test_app_role_cannot_bypass(db: Database) -> None:
    async with db.tenant("nobody", []) as conn:
        row = await conn.fetchrow(
            "SELECT current_user AS who, rolbypassrls, rolsuper FROM pg_roles "
            "WHERE rolname = current_user"
        )
        assert row is not None
    assert row["who"] == "recall_app"
    assert row["rolbypassrls"] is False and row["rolsuper"] is False


async def test_no_predicate_still_confined_to_team_and_spaces(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    team_a, team_b = unique("rls-a"), unique("rls-b")
    await load_jsonl(writes, jsonl(team_records(team_a) + team_records(team_b)))
    spaces_a = await _spaces(admin_conn, team_a)

    # Shared space only (a shared-only token): no private rows, no other team.
    async with db.tenant(team_a, [spaces_a[None]]) as conn:
        teams = {r["team_id"] for r in await conn.fetch("SELECT team_id FROM evidence")}
        ids = {r["id"] for r in await conn.fetch("SELECT id FROM evidence")}
        rels = {r["id"] for r in await conn.fetch("SELECT id FROM relationships")}
        principals = {r["team_id"] for r in await conn.fetch("SELECT team_id FROM principals")}
        vectors = await conn.fetchval("SELECT count(*) FROM evidence_embeddings")
    assert teams == {team_a}
    assert ids == {"ev-owner"}
    assert rels == {"rel-owner"}
    assert principals == {team_a}
    assert vectors == 1

    # Alice's private-bound view: shared + her private space, still one team.
    async with db.tenant(team_a, [spaces_a[None], spaces_a["alice"]]) as conn:
        ids = {r["id"] for r in await conn.fetch("SELECT id FROM evidence")}
        teams = {r["team_id"] for r in await conn.fetch("SELECT team_id FROM supports")}
    assert ids == {"ev-owner", "ev-private"}
    assert teams == {team_a}

    # Bob may read the shared space but not Alice's private one.
    async with db.tenant(team_a, [spaces_a[None]]) as conn:
        assert await conn.fetchval("SELECT count(*) FROM evidence WHERE id = 'ev-private'") == 0

    # Team A's space IDs used with team B's tenancy show nothing of either.
    async with db.tenant(team_b, [spaces_a[None]]) as conn:
        assert await conn.fetchval("SELECT count(*) FROM evidence") == 0


async def test_unset_tenancy_sees_nothing(db: Database, writes: WriteService) -> None:
    await load_jsonl(writes, jsonl(team_records(unique("rls-c"))))
    async with db.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL ROLE recall_app")
        assert await conn.fetchval("SELECT count(*) FROM evidence") == 0
        assert await conn.fetchval("SELECT count(*) FROM teams") == 0
        assert await conn.fetchval("SELECT count(*) FROM api_tokens") == 0


async def test_writes_into_another_team_are_refused(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    team_a, team_b = unique("rls-d"), unique("rls-e")
    await load_jsonl(writes, jsonl(team_records(team_a) + team_records(team_b)))
    spaces_a = await _spaces(admin_conn, team_a)
    spaces_b = await _spaces(admin_conn, team_b)
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        async with db.tenant(team_a, [spaces_a[None]], readonly=False) as conn:
            await conn.execute(
                "INSERT INTO evidence_lifecycle_events (team_id, space_id, evidence_id, status) "
                "VALUES ($1, $2, 'ev-owner', 'withdrawn')",
                team_b,
                spaces_b[None],
            )
    count = await admin_conn.fetchval(
        "SELECT count(*) FROM evidence_lifecycle_events WHERE team_id = $1", team_b
    )
    assert count == 2  # only the two initial 'active' events


async def test_a_tenancy_makes_no_team_principal_token_or_space(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """Only operator batches (the owner role) make teams, principals, tokens and
    spaces: with the team wall only, a tenancy could mint a private-bound token of
    another principal of its team (here bob's tenancy, one of alice's) and read her
    private space with it. Each INSERT is refused, and none happened."""
    team = unique("rls-make")
    # carol has no private space yet: making hers breaks no constraint, only the grant
    carol = {"kind": "principal", "team": team, "id": "carol", "private_space": False}
    await load_jsonl(writes, jsonl([*team_records(team), {**carol, "display_name": "Carol"}]))
    spaces = await _spaces(admin_conn, team)
    attempts = (
        "INSERT INTO teams (id, name) VALUES ($1 || '-probe', 'Probe')",
        "INSERT INTO principals (team_id, id, kind, display_name) "
        "VALUES ($1, 'probe', 'agent', 'Probe')",
        "INSERT INTO api_tokens (id, team_id, principal_id, secret_sha256, binding) "
        "VALUES ($1 || '-probe-tok', $1, 'alice', sha256('s'::bytea), 'private')",
        "INSERT INTO memory_spaces (team_id, kind, owner_principal_id) "
        "VALUES ($1, 'private', 'carol')",
    )
    for sql in attempts:
        # refused by the grant, not by a policy (both are SQLSTATE 42501)
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied for table"):
            async with db.tenant(team, [spaces[None], spaces["bob"]], readonly=False) as conn:
                await conn.execute(sql, team)
    made = await admin_conn.fetchrow(
        "SELECT (SELECT count(*) FROM teams WHERE id = $1 || '-probe') AS teams, "
        "(SELECT count(*) FROM principals WHERE team_id = $1 AND id = 'probe') AS principals, "
        "(SELECT count(*) FROM api_tokens WHERE id = $1 || '-probe-tok') AS tokens, "
        "(SELECT count(*) FROM memory_spaces WHERE team_id = $1) AS spaces",
        team,
    )
    assert made is not None
    assert dict(made) == {"teams": 0, "principals": 0, "tokens": 0, "spaces": len(spaces)}
    # nor may it change, remove or empty them (TRUNCATE ignores row-level security)
    privileges = await admin_conn.fetch(
        "SELECT t, p FROM unnest(ARRAY['teams', 'principals', 'api_tokens', 'memory_spaces']) t, "
        "unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) p "
        "WHERE CASE WHEN p IN ('DELETE', 'TRUNCATE') THEN has_table_privilege('recall_app', t, p) "
        "ELSE has_any_column_privilege('recall_app', t, p) END"
    )
    assert [tuple(r) for r in privileges] == []


async def test_other_principals_spaces_and_generations_are_walled(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """A tenancy sees, and may write, only the spaces it reads (db/0205): not
    another principal's private space nor its generations, and it cannot reset
    one (insert its next generation); a shared-only tenancy not even its own
    principal's private space; another team's tenancy none of them."""
    team, other = unique("rls-sp"), unique("rls-sq")
    await load_jsonl(writes, jsonl(team_records(team) + team_records(other)))
    spaces = await _spaces(admin_conn, team)
    tenancies = {
        "bob, private-bound": (team, [spaces[None], spaces["bob"]], {None, "bob"}),
        "alice, shared only": (team, [spaces[None]], {None}),
        "another team with these IDs": (other, list(spaces.values()), set()),
    }
    for name, (tenant, allowed, owners) in tenancies.items():
        async with db.tenant(tenant, allowed) as conn:
            seen = await conn.fetch("SELECT team_id, owner_principal_id FROM memory_spaces")
            generations = await conn.fetch("SELECT space_id FROM space_generations")
        assert {r["owner_principal_id"] for r in seen} == owners, name
        assert {r["team_id"] for r in seen} <= {team}, name
        assert {r["space_id"] for r in generations} == {spaces[o] for o in owners}, name
        # nor make a space (a principal of its own making gets none either)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            async with db.tenant(tenant, allowed, readonly=False) as conn:
                await conn.execute(
                    "INSERT INTO principals (team_id, id, kind, display_name) "
                    "VALUES ($1, 'probe', 'agent', 'Probe')",
                    tenant,
                )
                await conn.execute(
                    "INSERT INTO memory_spaces (team_id, kind, owner_principal_id) "
                    "VALUES ($1, 'private', 'probe')",
                    tenant,
                )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            async with db.tenant(tenant, allowed, readonly=False) as conn:
                await conn.execute(
                    "INSERT INTO space_generations "
                    "(team_id, space_id, generation, reset_id, reason, recorded_by) "
                    "VALUES ($1, $2, 2, $3, 'not mine', 'principal:bob')",
                    team,
                    spaces["alice"],
                    unique("sneak"),
                )
    assert (
        await admin_conn.fetchval(
            "SELECT max(generation) FROM space_generations WHERE team_id = $1 AND space_id = $2",
            team,
            spaces["alice"],
        )
        == 1
    )
    # its own spaces it reads, and resets
    async with db.tenant(team, [spaces[None], spaces["bob"]], readonly=False) as conn:
        await conn.execute(
            "INSERT INTO space_generations (team_id, space_id, generation, reset_id, recorded_by) "
            "VALUES ($1, $2, 2, $3, 'principal:bob')",
            team,
            spaces["bob"],
            unique("reset"),
        )


async def test_every_tenant_table_has_a_policy(admin_conn: Conn) -> None:
    """A table added later without row-level security fails here, not in production."""
    rows = await admin_conn.fetch(
        """
        SELECT c.relname, c.relrowsecurity, c.relispartition,
               (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) AS policies,
               has_table_privilege('recall_app', c.oid, 'SELECT') AS readable
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
          AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                      AND a.attname = 'team_id' AND NOT a.attisdropped)
        """
    )
    assert rows
    for row in rows:
        if row["relispartition"]:
            # partitions are reached only through their parent, whose policy applies
            assert not row["readable"], row["relname"]
        else:
            assert row["relrowsecurity"] and row["policies"] >= 1, row["relname"]
    teams = await admin_conn.fetchrow(
        "SELECT relrowsecurity FROM pg_class WHERE relname = 'teams' AND relkind = 'r'"
    )
    assert teams is not None
    assert teams["relrowsecurity"]


async def test_space_wall_reads_the_spaces_once_per_statement(
    db: Database, writes: WriteService, admin_conn: Conn
) -> None:
    """The space wall's readable spaces are a parameter of the statement (an
    InitPlan evaluated once), not an expression every scanned row evaluates
    again: written inline, each row and each index rescan looked the setting up
    and parsed its text into a uuid[] (db/0121). Every space wall has that form,
    and a plan over a space table shows it; the rows are still the caller's."""
    walls = await admin_conn.fetch(
        "SELECT pol.polrelid::regclass::text AS t, pg_get_expr(pol.polqual, pol.polrelid) AS q, "
        "pg_get_expr(pol.polwithcheck, pol.polrelid) AS c FROM pg_policy pol "
        "WHERE pol.polname = 'space_wall'"
    )
    assert len(walls) >= 20
    for wall in walls:
        for expr in (wall["q"], wall["c"]):
            assert "SELECT recall_allowed_spaces()" in expr, (wall["t"], expr)
    team = unique("rls-once")
    await load_jsonl(writes, jsonl(team_records(team)))
    spaces = await _spaces(admin_conn, team)
    async with db.tenant(team, [spaces[None]]) as conn:
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN (VERBOSE) SELECT s.id FROM supports s "
                "JOIN evidence_lifecycle_events le ON le.evidence_id = s.evidence_id "
                f"WHERE s.team_id = '{team}'"  # a name of this test's own making
            )
        )
        ids = {r["id"] for r in await conn.fetch("SELECT id FROM evidence")}
    assert ids == {"ev-owner"}
    quals = [line for line in plan.splitlines() if "Filter:" in line or "Index Cond:" in line]
    walls_in_quals = [line for line in quals if "space_id = ANY" in line]
    # both tables' walls, each reading its InitPlan's value
    assert len(walls_in_quals) == 2, plan
    assert all("(InitPlan" in line for line in walls_in_quals), plan
    assert not any("recall.space_ids" in line for line in quals), plan
