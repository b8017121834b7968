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
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import asyncpg
import httpx
import pytest

from gateway.services.communities import build_communities
from gateway.services.recall import RecallService
from gateway.services.recall_input import RecallRequest
from gateway.services.writes import WriteService
from gateway.store import database
from gateway.store.connection import Conn
from gateway.store.database import Database

from .conftest import app_for, fetch_one, unique, until
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
    "read_only": "on",  # the login's default_transaction_read_only
}


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
            role, teams, seen, count = await fetch_one(conn, after, *args)
            assert role == database.APP_ROLE
            assert teams == [a] and seen == [str(spaces["shared:"])] and count > 0
            # alice's private relationship and team B's are in the table all the same
            owner_count = await db.pool.fetchval(
                "SELECT count(*) FROM relationships WHERE team_id = ANY ($1::text[])", [a, b]
            )
            assert owner_count > count
            # read before the settings: nothing (the policies fail closed)
            teams, seen, count, _ = await fetch_one(conn, before, *args)
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
        # and /metrics says so (recall_gateway_side_discoveries_total, per outcome)
        metrics = (await client.get("/metrics")).text
        seen = {
            line.split('outcome="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("recall_gateway_side_discoveries_total{")
        }
        assert seen["refused"] >= side.refused and seen["used"] >= side.used, seen
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


async def test_a_side_connection_is_taken_exactly_for_the_recalls_that_discover(
    dsn: str, writes: WriteService, db: Database
) -> None:
    """_DiscoveryBeside.taken asks ``related.discovers`` (no query built before the
    view is read): a side connection is taken exactly when it was before, for
    every combination of the limits and views: a question, and relationships or
    communities outside a temporal view asked (what discovery_query builds a
    discovery for); never for a recall without a question."""
    from gateway.services.recall_types import ReadView
    from gateway.services.related import SharedBranch, discovers, discovery_query

    _, tok_a, _, _ = await two_teams(writes, db)
    now = datetime.now(UTC).isoformat()
    view = ReadView("t", {}, datetime.now(UTC), datetime.now(UTC))
    async with gateway(dsn, side_connections=1) as (app, client):
        side = app.state.services.db.side
        for rel_limit in (0, 5):
            for com in (0, 3):
                for temporal in ({}, {"knownAt": now}, {"validAt": now}):
                    request = _request(
                        "q",
                        relationship_limit=rel_limit,
                        community_limit=com,
                        known_at=datetime.now(UTC) if "knownAt" in temporal else None,
                        valid_at=datetime.now(UTC) if "validAt" in temporal else None,
                    )
                    built = discovery_query(view, SharedBranch(uuid4(), 1), request, None)
                    # the rule of docs/recall.md ("When."), stated here on its own
                    wanted = rel_limit > 0 or (com > 0 and not temporal)
                    assert discovers(request) == (built is not None) == wanted, request
                    before = side.taken
                    await ask(
                        client, tok_a, q="billing payments", rel=rel_limit, com=com, **temporal
                    )
                    assert side.taken - before == int(built is not None), (rel_limit, com, temporal)
        # no question (entity expansion only): discovery asks for no list, so none is
        # taken, whatever the limits
        before = side.taken
        r = await client.post(
            "/graphql",
            json={"query": NO_QUESTION, "variables": {"entities": ["billing"]}},
            headers={"Authorization": f"Bearer {tok_a}"},
        )
        body = r.json()
        assert "errors" not in body, body
        assert side.taken == before


NO_QUESTION = """query($entities: [ID!]) {
  recallMemory(expandFromEntityIds: $entities, relationshipLimit: 5, communityLimit: 3) {
    results { evidenceId } relatedRelationships { representativeId }
  }
}"""


async def _held(dsn: str, table: str) -> tuple[asyncpg.Connection, Any]:
    """An ACCESS EXCLUSIVE lock on ``table``, held until the transaction ends."""
    blocker = await asyncpg.connect(dsn)
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
    return blocker, tx


def _request(query: str, **kw: Any) -> RecallRequest:
    """A full recall at the default limits."""
    fields: dict[str, Any] = {
        "query": query,
        "limit": 10,
        "relationship_limit": 5,
        "community_limit": 3,
        "community_relationship_limit": 5,
        "hypothesis_limit": 5,
        "valid_at": None,
        "known_at": None,
        "known_evidence_ids": (),
        "known_relationship_ids": (),
        "expand_from_entity_ids": (),
    }
    return RecallRequest(**{**fields, **kw})


@asynccontextmanager
async def patient(dsn: str, embedder: Any) -> AsyncIterator[tuple[Database, RecallService]]:
    """A pool with one side connection whose statements wait a minute for a lock
    and run a minute at most: in the tests below only a cancellation ends a
    blocked statement in time."""
    own = await Database.open(
        dsn,
        min_size=1,
        max_size=2,
        side_connections=1,
        lock_timeout="60s",
        statement_timeout_ms=60_000,
    )
    try:
        yield own, RecallService(own, embedder)
    finally:
        await own.close()


async def busy(monitor: Conn, application: str) -> list[str]:
    """``wait_event_type`` (or 'running') of this database's backends of
    ``application`` running a statement. ``monitor`` is outside any transaction, so
    each call reads the activity anew (inside one, it is read once)."""
    rows = await monitor.fetch(
        "SELECT coalesce(wait_event_type, 'running') AS w FROM pg_stat_activity "
        "WHERE application_name = $1 AND datname = current_database() AND state = 'active'",
        application,
    )
    return [r["w"] for r in rows]


async def _cancelled_while_blocked(
    dsn: str, writes: WriteService, db: Database, embedder: Any, tables: list[str], unit: bool
) -> None:
    """Lock ``tables``; wait until the side statement (and, with ``unit``, the
    unit's statement too) waits for a lock; cancel the recall: both statements
    end on the server within seconds (their lock and statement timeouts are a
    minute), the ticket is given back and the side session is clean."""
    from gateway.services.auth import authenticate

    _, tok_a, _, _ = await two_teams(writes, db)
    principal = await authenticate(db, tok_a)
    monitor = await asyncpg.connect(dsn)
    async with patient(dsn, embedder) as (own, service):
        assert own.side is not None
        await service.recall(principal, _request("billing ledger"))  # warm: plans
        held = [await _held(dsn, t) for t in tables]
        try:
            task = asyncio.create_task(service.recall(principal, _request("billing payments")))

            async def blocked() -> bool:
                side = await busy(monitor, SIDE)
                mine = await busy(monitor, "recall-gateway")
                return side == ["Lock"] and (not unit or mine == ["Lock"])

            await until(blocked, "the side statement (and the unit's) wait for the lock")
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=15)
            assert task in done and task.cancelled()

            async def stopped() -> bool:
                return await busy(monitor, SIDE) == [] == await busy(monitor, "recall-gateway")

            # cancelled on the server while the locks are still held
            await until(stopped, "the statements were cancelled")
            assert own.side.busy == 0
        finally:
            for blocker, tx in held:
                await tx.rollback()
                await blocker.close()
            await monitor.close()
        assert await side_session(own) == [CLEAN]
        # the connection serves the next recall's discovery
        used = own.side.used
        await service.recall(principal, _request("billing payments"))
        assert own.side.used == used + 1


async def test_a_recall_cancelled_in_its_scope_round_cancels_the_side_statement(
    dsn: str, writes: WriteService, db: Database, embedder: Any
) -> None:
    """The unit blocked in its scope round (the evidence lists' statistics locked)
    and the side statement blocked on discovery's: only the recall's exit cancels
    the side task (_DiscoveryBeside.taken)."""
    await _cancelled_while_blocked(
        dsn,
        writes,
        db,
        embedder,
        ["evidence_lexeme_stats", "relationship_lexeme_stats"],
        unit=True,
    )


async def test_a_recall_cancelled_while_it_waits_for_discovery_cancels_the_side_statement(
    dsn: str, writes: WriteService, db: Database, embedder: Any
) -> None:
    """The unit has read the evidence and waits for the side's discovery, blocked on
    its statistics' lock: the cancellation reaches the side task through that wait."""
    await _cancelled_while_blocked(
        dsn, writes, db, embedder, ["relationship_lexeme_stats"], unit=False
    )


async def test_the_request_deadline_bounds_the_side_statement(
    dsn: str, writes: WriteService, db: Database, embedder: Any
) -> None:
    """Discovery's statistics locked (a minute of lock timeout), a request deadline
    of 0.8 s and nobody cancelling: the side statement's own budget (what is left of
    the deadline) cancels it on the server, discovery falls back to the unit, whose
    statement budget is spent too, and the recall fails promptly instead of waiting
    a minute; the side connection is clean."""
    from gateway.deadline import deadline
    from gateway.errors import GatewayError
    from gateway.services.auth import authenticate

    _, tok_a, _, _ = await two_teams(writes, db)
    principal = await authenticate(db, tok_a)
    monitor = await asyncpg.connect(dsn)
    async with patient(dsn, embedder) as (own, service):
        assert own.side is not None
        await service.recall(principal, _request("billing ledger"))  # warm: plans
        blocker, tx = await _held(dsn, "relationship_lexeme_stats")
        try:

            async def recall() -> Any:
                with deadline(0.8):
                    return await service.recall(principal, _request("billing payments"))

            task = asyncio.create_task(recall())
            done, _ = await asyncio.wait([task], timeout=15)
            assert task in done, "the side statement outlived the request's deadline"
            assert isinstance(task.exception(), GatewayError), task.exception()
            assert await busy(monitor, SIDE) == []
            assert own.side.busy == 0 and own.side.used == 1  # the warm-up's only
        finally:
            await tx.rollback()
            await blocker.close()
            await monitor.close()
        assert await side_session(own) == [CLEAN]


async def test_a_side_connection_is_read_only(dsn: str) -> None:
    own = await Database.open(dsn, min_size=1, max_size=1, side_connections=1)
    try:
        assert own.side is not None
        async with own.side.pool.acquire() as conn:
            assert await conn.fetchval("SELECT current_setting('transaction_read_only')") == "on"
            try:
                await conn.execute("INSERT INTO teams (id, name) VALUES ('ro', 'ro')")
            except asyncpg.ReadOnlySQLTransactionError:
                pass
            else:
                raise AssertionError("a side connection wrote")
    finally:
        await own.close()


async def test_a_side_answer_of_another_view_is_not_used(
    dsn: str, writes: WriteService, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard of _DiscoveryBeside.result: a side statement that read another
    generation of the shared space, or read as another role, is not used (here it
    also claims to have found nothing): discovery falls back to the unit, and the
    answer is the unit's."""
    from gateway.store import related as related_store
    from gateway.store import round_trips

    _, tok_a, _, _ = await two_teams(writes, db)
    shape = {"q": "billing payments ledger", "limit": 1}
    async with gateway(dsn, side_connections=0) as (_, client):
        expected = await ask(client, tok_a, **shape)
    assert related_ids(expected)
    real = round_trips.side_discovery
    for name, lie in (
        ("generation", lambda got: {"generation": (got.generation or 0) + 1}),
        ("role", lambda got: {"role": "postgres"}),
    ):

        async def lying(*args: Any, _lie: Any = lie, **kw: Any) -> Any:
            got = await real(*args, **kw)
            empty = related_store.Discovery({n: [] for n in got.discovery.lists}, frozenset(), None)
            return replace(got, discovery=empty, **_lie(got))

        monkeypatch.setattr(round_trips, "side_discovery", lying)
        async with gateway(dsn, side_connections=1) as (app, client):
            got = await ask(client, tok_a, **shape)
            side = app.state.services.db.side
            assert (side.taken, side.used) == (1, 0), name
        assert got == expected, name


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
