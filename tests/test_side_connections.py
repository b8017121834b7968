"""Relationship discovery on a side connection beside a recall's unit.

gateway/store/database.py (``SideConnections``) reserves a few connections that
log in as ``recall_app``; a full recall sends its relationship discovery there
as one statement (gateway/store/round_trips.py, ``side_discovery``), beside the
evidence path on its unit's connection (gateway/services/recall.py,
``_DiscoveryBeside``). These tests check what a reviewer of that would ask:
the statement reads as the tenant, and only after its settings; answers are
those of discovery on the unit, for every view and both teams; a full pool
does not deadlock; a cancelled, timed-out or failed side statement leaves
its connection clean and the answer as discovery's own failure leaves it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx

from gateway.services.communities import build_communities
from gateway.services.recall import RecallService
from gateway.services.recall_input import RecallRequest
from gateway.services.writes import WriteService
from gateway.store import database
from gateway.store.database import Database

from .conftest import app_for, unique
from .test_recall import token
from .test_related import RELATED, load_graph

SIDE = "recall-gateway-side"  # the side connections' application_name


@asynccontextmanager
async def gateway(dsn: str, **settings: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    app = app_for(dsn, **settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield app, client


async def ask(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    r = await client.post(
        "/graphql",
        json={"query": RELATED, "variables": variables},
        headers={"Authorization": f"Bearer {tok}"},
    )
    body = r.json()
    assert "errors" not in body, body
    result: dict[str, Any] = body["data"]["recallMemory"]
    return result


def related_ids(result: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for h in result["relatedRelationships"]:
        out |= {h["representativeId"], *h["equivalentIds"]}
    for c in result["relatedCommunities"]:
        for h in c["members"]:
            out |= {h["representativeId"], *h["equivalentIds"]}
    return out


async def two_teams(writes: WriteService, db: Database) -> tuple[str, str, str, str]:
    """Team A (communities built) and team B, whose shared graph has a relationship
    A must never see; in each, alice's private space holds a private relationship
    that bob (private-bound: his own private space, empty) must never see."""
    a, b = unique("side-a"), unique("side-b")
    await load_graph(writes, a)
    await load_graph(writes, b, secret=True)
    await build_communities(db, a, max_nodes=1000, max_edges=10_000)
    return a, await token(writes, a, "bob"), b, await token(writes, b, "alice")


async def side_session(db: Database) -> list[dict[str, Any]]:
    """Each side connection's session as the next recall would find it."""
    assert db.side is not None
    holders = []
    rows = []
    for _ in range(db.side.size):
        holders.append(await db.side.pool.acquire())
    try:
        for conn in holders:
            row = await conn.fetchrow(
                """
                SELECT current_user::text AS role,
                       coalesce(current_setting('recall.team_id', true), '') AS team,
                       coalesce(current_setting('recall.space_ids', true), '') AS spaces,
                       (SELECT array_agg(name ORDER BY name) FROM pg_settings
                         WHERE source = 'session' AND setting IS DISTINCT FROM reset_val)
                           AS changed,
                       (SELECT count(*) FROM pg_locks
                         WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS advisory,
                       (SELECT count(*) FROM pg_listening_channels()) AS listening,
                       (SELECT count(*) FROM pg_cursors WHERE is_holdable) AS cursors,
                       pg_is_in_recovery() AS standby,
                       current_setting('transaction_read_only') AS read_only
                """
            )
            assert row is not None
            rows.append(dict(row))
    finally:
        for conn in holders:
            await db.side.pool.release(conn)
    return rows


CLEAN = {
    "role": database.APP_ROLE,
    "team": "",
    "spaces": "",
    "changed": None,
    "advisory": 0,
    "listening": 0,
    "cursors": 0,
    "standby": False,
    "read_only": "off",
}


async def side_activity(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT pid, state, wait_event_type FROM pg_stat_activity WHERE application_name = $1",
        SIDE,
    )
    return [dict(r) for r in rows]


async def until(check: Any, what: str, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {seconds} s: {what}")


async def test_a_side_statement_reads_as_the_tenant_only_after_its_settings(
    dsn: str, writes: WriteService, db: Database
) -> None:
    """The proof the mechanism rests on: a side connection is ``recall_app`` from its
    login, so its plans carry row-level security; the tenant settings made by a
    statement's first selection hold for the selections after it (and only for
    the statement); selections before them see nothing (never more)."""
    a, _, b, _ = await two_teams(writes, db)
    async with db.pool.acquire() as conn:
        spaces = {
            r["kind"] + ":" + (r["owner_principal_id"] or ""): r["id"]
            for r in await conn.fetch(
                "SELECT id, kind, owner_principal_id FROM memory_spaces WHERE team_id = $1", a
            )
        }
    bobs = [spaces["shared:"]]  # bob reads the shared space (his private one is empty)
    side = await Database.open(dsn, min_size=1, max_size=1, side_connections=1)
    try:
        assert side.side is not None
        args = database.side_tenant_args(a, bobs)
        # No team or space predicate at all: only the policies filter.
        reads = (
            "(SELECT array_agg(DISTINCT r.team_id ORDER BY r.team_id) FROM relationships r)",
            "(SELECT array_agg(DISTINCT r.space_id::text) FROM relationships r)",
            "(SELECT count(*) FROM relationships r)",
        )
        tenant = f"side_tenant AS MATERIALIZED (\n{database.SIDE_TENANT_SQL}\n)"
        after = f"WITH {tenant} SELECT (SELECT t.role FROM side_tenant t), {', '.join(reads)}"
        before = f"WITH {tenant} SELECT {', '.join(reads)}, (SELECT t.role FROM side_tenant t)"
        async with side.side.pool.acquire() as conn:
            role, teams, seen, count = await conn.fetchrow(after, *args)
            assert role == database.APP_ROLE
            assert teams == [a] and seen == [str(spaces["shared:"])] and count > 0
            # alice's private relationship and team B's are in the table all the same
            owner_count = await db.pool.fetchval(
                "SELECT count(*) FROM relationships WHERE team_id = ANY ($1::text[])", [a, b]
            )
            assert owner_count > count
            # read before the settings: nothing (the policies fail closed)
            teams, seen, count, _ = await conn.fetchrow(before, *args)
            assert (teams, seen, count) == (None, None, 0)
            # the settings ended with the statement's implicit transaction
            assert await conn.fetchval("SELECT count(*) FROM relationships") == 0
            assert await conn.fetchval("SELECT current_setting('recall.team_id', true)") in (
                "",
                None,
            )
    finally:
        await side.close()


async def test_discovery_beside_answers_like_discovery_on_the_unit(
    dsn: str, writes: WriteService, db: Database
) -> None:
    """Every shape of view and coverage, both teams: the answer (results, related
    relationships, communities, degradations, search states) with discovery on a
    side connection is the one of discovery on the unit, and team A never sees
    team B's relationships or alice's private ones."""
    _, tok_a, _, tok_b = await two_teams(writes, db)
    now = datetime.now(UTC).isoformat()
    shapes: list[dict[str, Any]] = [
        {"q": "billing payments owner", "limit": 3},
        {"q": "connection pool orders", "limit": 1, "com": 2},
        {"q": "billing vault payments owner", "limit": 1, "rel": 20, "com": 0},
        {"q": "billing charges cards through Stripe", "limit": 1, "knownRel": ["r-own-bob"]},
        {"q": "billing charges cards through Stripe", "limit": 1, "knownEv": ["e-own2"]},
        {"q": "billing ledger invoices payments", "limit": 2, "knownAt": now},
        {"q": "billing ledger invoices payments", "limit": 2, "validAt": now, "com": 0},
        {"q": "zebra hay", "limit": 10},
    ]
    answers: dict[str, list[dict[str, Any]]] = {}
    for name, side in (("unit", 0), ("beside", 2)):
        async with gateway(dsn, side_connections=side) as (app, client):
            services = app.state.services
            got = answers.setdefault(name, [])
            for shape in shapes:
                for tok in (tok_a, tok_b):
                    got.append(await ask(client, tok, **shape))
            if side:
                side_db = services.db.side
                # every full recall here took a side connection (one at a time),
                # and its answer was used
                assert side_db.taken == side_db.used == len(shapes) * 2
                assert side_db.refused == 0
                assert side_db.busy == 0
                assert await side_session(services.db) == [CLEAN, CLEAN]
            else:
                assert services.db.side is None
    assert answers["beside"] == answers["unit"]
    for i, result in enumerate(answers["beside"]):
        found = related_ids(result)
        # discovery reads the shared space only: never a private relationship, and
        # team A (even indexes) never team B's secret one
        assert "r-private" not in found, found
        if i % 2 == 0:
            assert "r-secret" not in found, found
    # the scenario is live: team A's recalls found relationships and communities,
    # and team B's found its secret relationship
    assert any(related_ids(r) for r in answers["beside"][::2])
    assert any(r["relatedCommunities"] for r in answers["beside"][::2])
    assert any("r-secret" in related_ids(r) for r in answers["beside"][1::2])


async def test_recalls_at_the_pool_limit_complete(
    dsn: str, writes: WriteService, db: Database
) -> None:
    """More concurrent full recalls than connections: each holds its unit's
    connection and never waits for a side one, so none deadlocks; those that found
    the side connection busy discovered on their unit; the answers are the ones
    asked one at a time."""
    _, tok_a, _, _ = await two_teams(writes, db)
    questions = [
        "billing payments owner",
        "connection pool orders",
        "invoice job ledger",
        "stripe cards billing",
        "zebra hay",
        "payments reconciles ledger",
        "orders database pool capped",
        "who owns billing",
    ]
    async with gateway(dsn, side_connections=0) as (_, client):
        alone = [await ask(client, tok_a, q=q, limit=3) for q in questions]
    async with gateway(dsn, pool_min_size=1, pool_max_size=2, side_connections=1) as (
        app,
        client,
    ):
        services = app.state.services
        together = await asyncio.wait_for(
            asyncio.gather(*(ask(client, tok_a, q=q, limit=3) for q in questions * 2)), 60
        )
        side = services.db.side
        assert side.taken >= 1 and side.refused >= 1, (side.taken, side.refused)
        assert side.used == side.taken
        assert side.taken + side.refused == 2 * len(questions)
        assert side.busy == 0
        assert services.db.pool.get_max_size() == 2
        assert await side_session(services.db) == [CLEAN]
    assert together == alone * 2


async def test_evidence_only_recalls_take_no_side_connection(
    dsn: str, writes: WriteService, db: Database
) -> None:
    """Statements per recall: a full recall 10 (its discovery beside the unit, one
    statement), an evidence-only one 8 as before, and it takes no side connection."""
    _, tok_a, _, _ = await two_teams(writes, db)
    async with gateway(dsn, side_connections=2) as (app, client):
        services = app.state.services
        counter, side = services.db.counter, services.db.side
        counts = {}
        for name, shape in (
            ("full", {"q": "billing payments owner team", "limit": 3}),
            ("evidence-only", {"q": "connection pool capped orders", "rel": 0, "com": 0}),
        ):
            before, taken = counter.count, side.taken
            await ask(client, tok_a, **shape)
            counts[name] = (counter.count - before, side.taken - taken)
        assert counts == {"full": (10, 1), "evidence-only": (8, 0)}, counts
        assert side.used == 1


async def _held(dsn: str, table: str) -> tuple[asyncpg.Connection, Any]:
    """An ACCESS EXCLUSIVE lock on ``table``, held until the transaction ends."""
    blocker = await asyncpg.connect(dsn)
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
    return blocker, tx


async def test_a_cancelled_recall_cancels_its_side_statement_and_returns_it_clean(
    dsn: str, writes: WriteService, db: Database
) -> None:
    """Discovery's lexical statistics locked: the side statement waits for the lock
    while the unit reads the evidence; the request is cancelled (the client went
    away). The side statement stops on the server, and its connection goes back
    to the pool with nothing of the recall's session state."""
    _, tok_a, _, _ = await two_teams(writes, db)
    question = {"q": "billing payments ledger", "limit": 1}
    async with gateway(dsn, side_connections=1) as (app, client):
        services = app.state.services
        before = await ask(client, tok_a, **question)
        blocker, tx = await _held(dsn, "relationship_lexeme_stats")
        try:
            request = asyncio.create_task(ask(client, tok_a, q="billing payments owner"))

            async def waiting() -> bool:
                return any(r["wait_event_type"] == "Lock" for r in await side_activity(blocker))

            await until(waiting, "the side statement waits for the lock")
            request.cancel()
            try:
                await request
            except asyncio.CancelledError:
                pass

            async def stopped() -> bool:
                return all(r["state"] == "idle" for r in await side_activity(blocker))

            # cancelled on the server while the lock is still held
            await until(stopped, "the side statement was cancelled")

            async def given_back() -> bool:
                return bool(services.db.side.busy == 0)

            await until(given_back, "the side connection was given back")
        finally:
            await tx.rollback()
            await blocker.close()
        assert await side_session(services.db) == [CLEAN]
        # and the connection serves the next recall's discovery
        taken = services.db.side.taken
        assert await ask(client, tok_a, **question) == before
        assert related_ids(before) and services.db.side.taken == taken + 1


async def test_a_deadline_cancels_the_side_statement_and_returns_it_clean(
    dsn: str, writes: WriteService, db: Database
) -> None:
    """The same lock with a request deadline shorter than the lock timeout: the
    request times out, the side statement is cancelled with it, and its connection
    is clean."""
    _, tok_a, _, _ = await two_teams(writes, db)
    async with gateway(dsn, side_connections=1, request_timeout_ms=600) as (app, client):
        services = app.state.services
        await ask(client, tok_a, q="warm up the connections")  # prepared, planned
        blocker, tx = await _held(dsn, "relationship_lexeme_stats")
        try:
            r = await client.post(
                "/graphql",
                json={"query": RELATED, "variables": {"q": "billing payments owner"}},
                headers={"Authorization": f"Bearer {tok_a}"},
            )
            assert r.json()["errors"][0]["extensions"]["code"] == "REQUEST_TIMEOUT", r.text

            async def stopped() -> bool:
                return all(r["state"] == "idle" for r in await side_activity(blocker))

            await until(stopped, "the side statement was cancelled")
            assert services.db.side.busy == 0
        finally:
            await tx.rollback()
            await blocker.close()
        assert await side_session(services.db) == [CLEAN]


async def test_a_failed_side_statement_degrades_like_discovery_on_the_unit(
    dsn: str, writes: WriteService, db: Database, embedder: Any
) -> None:
    """The relationship vectors locked past the lock timeout: the side statement
    fails, discovery runs again on the unit, where its vector list fails too and
    is retried without it. The answer, its degradation and search states are the
    ones of the recall without side connections under the same fault."""
    from gateway.services.auth import authenticate

    a, tok_a, _, _ = await two_teams(writes, db)
    async with db.pool.acquire() as conn:
        shared = await conn.fetchval(
            "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", a
        )
    principal = await authenticate(db, tok_a)
    vectors = "relationship_embeddings_" + str(shared).replace("-", "")
    request = RecallRequest(
        query="connection pool capped",
        limit=1,
        relationship_limit=20,
        community_limit=0,
        community_relationship_limit=5,
        hypothesis_limit=5,
        valid_at=None,
        known_at=None,
        known_evidence_ids=(),
        known_relationship_ids=(),
        expand_from_entity_ids=(),
    )
    outcomes = {}
    for name, side in (("unit", 0), ("beside", 1)):
        own = await Database.open(
            dsn, min_size=1, max_size=2, side_connections=side, lock_timeout="300ms"
        )
        try:
            service = RecallService(own, embedder)
            await service.recall(principal, request)  # warm: the question's embedding
            blocker, tx = await _held(dsn, vectors)
            try:
                got = await service.recall(principal, request)
            finally:
                await tx.rollback()
                await blocker.close()
            outcomes[name] = (
                [r.evidence.id for r in got.results],
                [(h.representative.id, h.equivalent_ids) for h in got.related_relationships],
                [(d.frontier, d.code) for d in got.degradations],
                {k: (v.status, v.lists) for k, v in got.search_states.items()},
            )
            if side:
                assert own.side is not None and own.side.taken == 2 and own.side.busy == 0
                assert own.side.used == 1  # the warm-up's; the failed one's was not
                assert await side_session(own) == [CLEAN]
        finally:
            await own.close()
    assert ("relationships", "relationship_vector_failed") in outcomes["unit"][2]
    assert outcomes["beside"] == outcomes["unit"]
