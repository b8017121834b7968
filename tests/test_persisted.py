"""Persisted queries: APQ over POST and GET, the shared bounded store, allow-list mode."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from gateway.app import create_app
from gateway.services.writes import WriteService
from gateway.settings import Settings
from gateway.store import persisted as store
from gateway.store.database import Database

from .conftest import MakeClient, load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token


def sha(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()


def apq(h: str) -> dict[str, Any]:
    return {"persistedQuery": {"version": 1, "sha256Hash": h}}


def code(r: httpx.Response) -> str:
    return str(r.json()["errors"][0]["extensions"]["code"])


@pytest_asyncio.fixture(loop_scope="session")
async def make_client(dsn: str) -> AsyncIterator[MakeClient]:
    stack: list[tuple[AbstractAsyncContextManager[Any], httpx.AsyncClient]] = []

    async def make(**settings: Any) -> httpx.AsyncClient:
        app = create_app(Settings(database_url=dsn, pool_max_size=2, **settings))
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
        stack.append((lifespan, client))
        return client

    yield make
    for lifespan, client in reversed(stack):
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


async def caller(writes: WriteService, principal: str = "alice") -> tuple[str, dict[str, str]]:
    """A new team and a bearer header of one of its principals."""
    team = unique("apq")
    await load_jsonl(writes, jsonl(team_records(team)))
    return team, {"Authorization": f"Bearer {await token(writes, team, principal)}"}


def fresh_document() -> str:
    # a unique alias makes a document no other test has registered
    return "{ q" + secrets.token_hex(6) + ": __typename }"


async def test_apq_register_then_run_by_hash_over_post_and_get(
    make_client: MakeClient, writes: WriteService
) -> None:
    worker_a = await make_client()
    worker_b = await make_client()  # another process: shares only the database
    _, auth = await caller(writes)
    document = fresh_document()
    h = sha(document)
    alias = document.split()[1][:-1]

    r = await worker_a.post("/graphql", json={"extensions": apq(h)}, headers=auth)
    assert r.status_code == 200 and code(r) == "PERSISTED_QUERY_NOT_FOUND"
    assert r.json()["errors"][0]["message"] == "PersistedQueryNotFound"
    r = await worker_a.post(
        "/graphql",
        json={"extensions": apq(h)},
        headers={**auth, "accept": "application/graphql-response+json"},
    )
    assert r.status_code == 400 and code(r) == "PERSISTED_QUERY_NOT_FOUND"

    r = await worker_a.post(
        "/graphql", json={"query": document, "extensions": apq(h)}, headers=auth
    )
    assert r.json() == {"data": {alias: "Query"}}

    r = await worker_b.post("/graphql", json={"extensions": apq(h)}, headers=auth)
    assert r.json() == {"data": {alias: "Query"}}
    r = await worker_b.get("/graphql", params={"extensions": json.dumps(apq(h))}, headers=auth)
    assert r.status_code == 200 and r.json() == {"data": {alias: "Query"}}


async def test_apq_refuses_bad_hashes_and_junk(
    make_client: MakeClient, db: Database, writes: WriteService
) -> None:
    client = await make_client()
    team, auth = await caller(writes)
    document = fresh_document()
    r = await client.post(
        "/graphql", json={"query": document, "extensions": apq(sha("other"))}, headers=auth
    )
    assert code(r) == "PERSISTED_QUERY_HASH_MISMATCH"
    r = await client.post("/graphql", json={"extensions": {"persistedQuery": {"version": 2}}})
    assert code(r) == "PERSISTED_QUERY_INVALID"
    r = await client.post(
        "/graphql", json={"extensions": {"persistedQuery": {"version": 1, "sha256Hash": "ZZ"}}}
    )
    assert code(r) == "PERSISTED_QUERY_INVALID"
    junk = "{ not graphql " + secrets.token_hex(4)
    invalid = "{ nope" + secrets.token_hex(4) + " }"  # parses, does not validate
    for text, expected in ((junk, "GRAPHQL_PARSE_FAILED"), (invalid, "GRAPHQL_VALIDATION_FAILED")):
        r = await client.post(
            "/graphql", json={"query": text, "extensions": apq(sha(text))}, headers=auth
        )
        assert code(r) == expected
        async with db.admin() as conn:
            assert await store.get(conn, team, sha(text)) is None  # never takes a slot


async def test_anonymous_callers_never_register(
    make_client: MakeClient, db: Database, writes: WriteService
) -> None:
    client = await make_client()
    _, auth = await caller(writes)
    async with db.admin() as conn:
        before = await store.count(conn)
    documents = [fresh_document() for _ in range(100)]
    for document in documents:
        r = await client.post(
            "/graphql", json={"query": document, "extensions": apq(sha(document))}
        )
        assert "data" in r.json() and r.json()["data"] is not None  # it runs
    # a 401 with a bad token stores nothing either
    bad = fresh_document()
    r = await client.post(
        "/graphql",
        json={
            "query": "{ viewer { principalId } " + bad[1:],
            "extensions": apq(sha("{ viewer { principalId } " + bad[1:])),
        },
        headers={"Authorization": "Bearer rgt_nope"},
    )
    assert r.status_code == 401
    async with db.admin() as conn:
        assert await store.count(conn) == before
    r = await client.post("/graphql", json={"extensions": apq(sha(documents[0]))}, headers=auth)
    assert code(r) == "PERSISTED_QUERY_NOT_FOUND"
    # and anonymous hash-only requests find nothing, not even what a team keeps
    document = fresh_document()
    await client.post(
        "/graphql", json={"query": document, "extensions": apq(sha(document))}, headers=auth
    )
    r = await client.post("/graphql", json={"extensions": apq(sha(document))})
    assert code(r) == "PERSISTED_QUERY_NOT_FOUND"


async def test_entries_belong_to_a_team_and_are_bounded_per_team(
    make_client: MakeClient, db: Database, writes: WriteService
) -> None:
    client = await make_client(persisted_query_max_entries=10, persisted_query_max_bytes=512)
    team_a, alice = await caller(writes)
    team_b, bob = await caller(writes, "bob")
    _, other_a = team_a, {"Authorization": f"Bearer {await token(writes, team_a, 'bob')}"}
    kept = fresh_document()
    r = await client.post(
        "/graphql", json={"query": kept, "extensions": apq(sha(kept))}, headers=alice
    )
    assert "errors" not in r.json()
    # the same team (another principal) finds it; another team does not, and
    # cannot tell it apart from a hash nobody registered
    r = await client.post("/graphql", json={"extensions": apq(sha(kept))}, headers=other_a)
    assert "errors" not in r.json(), r.text
    r = await client.post("/graphql", json={"extensions": apq(sha(kept))}, headers=bob)
    missing = await client.post(
        "/graphql", json={"extensions": apq(sha(fresh_document()))}, headers=bob
    )
    assert r.json() == missing.json()
    assert code(r) == "PERSISTED_QUERY_NOT_FOUND"
    # another team registering many pushes out only its own entries
    flood = [fresh_document() for _ in range(15)]
    for document in flood:
        await client.post(
            "/graphql", json={"query": document, "extensions": apq(sha(document))}, headers=bob
        )
    async with db.admin() as conn:
        assert await store.count(conn, team_b) == 10
        assert await store.get(conn, team_b, sha(flood[-1])) == flood[-1]
        assert await store.get(conn, team_b, sha(flood[0])) is None
        assert await store.get(conn, team_a, sha(kept)) == kept
    # a document above the size bound runs and is not kept
    big = "{ " + " ".join(f"a{i}: __typename" for i in range(40)) + " }"
    assert len(big) > 512
    client_big = await make_client(persisted_query_max_bytes=512, max_aliases=100)
    r = await client_big.post(
        "/graphql", json={"query": big, "extensions": apq(sha(big))}, headers=alice
    )
    assert "errors" not in r.json(), r.text
    async with db.admin() as conn:
        assert await store.get(conn, team_a, sha(big)) is None


async def test_store_is_bounded_least_recently_used_out(db: Database, writes: WriteService) -> None:
    team, _ = await caller(writes)
    documents = [fresh_document() for _ in range(15)]
    async with db.admin() as conn:
        for document in documents:
            await store.put(conn, team, "alice", sha(document), document, max_entries=10)
        assert await store.count(conn, team) == 10
        # the most recent ones stayed
        assert await store.get(conn, team, sha(documents[-1])) == documents[-1]
        assert await store.get(conn, team, sha(documents[0])) is None


async def test_off_mode_refuses_persisted_queries(make_client: MakeClient) -> None:
    client = await make_client(persisted_queries="off")
    r = await client.post("/graphql", json={"extensions": apq(sha("{ __typename }"))})
    assert code(r) == "PERSISTED_QUERY_NOT_SUPPORTED"
    assert (await client.post("/graphql", json={"query": "{ __typename }"})).json() == {
        "data": {"__typename": "Query"}
    }


async def test_allowlist_runs_only_registered_operations(
    make_client: MakeClient, tmp_path: Path
) -> None:
    allowed = "{ allowed: __typename }"
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({sha(allowed): allowed}))
    client = await make_client(persisted_queries="allowlist", persisted_query_manifest=manifest)
    r = await client.post("/graphql", json={"extensions": apq(sha(allowed))})
    assert r.json() == {"data": {"allowed": "Query"}}
    r = await client.post("/graphql", json={"query": allowed})
    assert r.json() == {"data": {"allowed": "Query"}}
    r = await client.post("/graphql", json={"query": "{ __typename }"})
    assert r.status_code == 403 and code(r) == "PERSISTED_QUERY_NOT_ALLOWED"
    other = "{ other: __typename }"
    r = await client.post("/graphql", json={"query": other, "extensions": apq(sha(other))})
    assert r.status_code == 403 and code(r) == "PERSISTED_QUERY_NOT_ALLOWED"
