"""Persisted queries: APQ over POST and GET, the shared bounded store, allow-list mode."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from gateway.app import create_app
from gateway.settings import Settings
from gateway.store import persisted as store
from gateway.store.database import Database


def sha(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()


def apq(h: str) -> dict[str, Any]:
    return {"persistedQuery": {"version": 1, "sha256Hash": h}}


def code(r: httpx.Response) -> str:
    return str(r.json()["errors"][0]["extensions"]["code"])


@pytest_asyncio.fixture(loop_scope="session")
async def make_client(dsn: str) -> AsyncIterator[Any]:
    stack: list[Any] = []

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


def fresh_document() -> str:
    # a unique alias makes a document no other test has registered
    return "{ q" + secrets.token_hex(6) + ": __typename }"


async def test_apq_register_then_run_by_hash_over_post_and_get(make_client) -> None:
    worker_a = await make_client()
    worker_b = await make_client()  # another process: shares only the database
    document = fresh_document()
    h = sha(document)
    alias = document.split()[1][:-1]

    r = await worker_a.post("/graphql", json={"extensions": apq(h)})
    assert r.status_code == 200 and code(r) == "PERSISTED_QUERY_NOT_FOUND"
    assert r.json()["errors"][0]["message"] == "PersistedQueryNotFound"
    r = await worker_a.post(
        "/graphql",
        json={"extensions": apq(h)},
        headers={"accept": "application/graphql-response+json"},
    )
    assert r.status_code == 400 and code(r) == "PERSISTED_QUERY_NOT_FOUND"

    r = await worker_a.post("/graphql", json={"query": document, "extensions": apq(h)})
    assert r.json() == {"data": {alias: "Query"}}

    r = await worker_b.post("/graphql", json={"extensions": apq(h)})
    assert r.json() == {"data": {alias: "Query"}}
    r = await worker_b.get("/graphql", params={"extensions": json.dumps(apq(h))})
    assert r.status_code == 200 and r.json() == {"data": {alias: "Query"}}


async def test_apq_refuses_bad_hashes_and_junk(make_client, db: Database) -> None:
    client = await make_client()
    document = fresh_document()
    r = await client.post("/graphql", json={"query": document, "extensions": apq(sha("other"))})
    assert code(r) == "PERSISTED_QUERY_HASH_MISMATCH"
    r = await client.post("/graphql", json={"extensions": {"persistedQuery": {"version": 2}}})
    assert code(r) == "PERSISTED_QUERY_INVALID"
    r = await client.post(
        "/graphql", json={"extensions": {"persistedQuery": {"version": 1, "sha256Hash": "ZZ"}}}
    )
    assert code(r) == "PERSISTED_QUERY_INVALID"
    junk = "{ not graphql " + secrets.token_hex(4)
    r = await client.post("/graphql", json={"query": junk, "extensions": apq(sha(junk))})
    assert code(r) == "GRAPHQL_PARSE_FAILED"
    async with db.admin() as conn:
        assert await store.get(conn, sha(junk)) is None  # junk never takes a slot


async def test_store_is_bounded_least_recently_used_out(db: Database) -> None:
    documents = [fresh_document() for _ in range(15)]
    async with db.admin() as conn:
        for document in documents:
            await store.put(conn, sha(document), document, max_entries=10)
        assert await store.count(conn) <= 10
        # the most recent ones stayed
        assert await store.get(conn, sha(documents[-1])) == documents[-1]
        assert await store.get(conn, sha(documents[0])) is None


async def test_off_mode_refuses_persisted_queries(make_client) -> None:
    client = await make_client(persisted_queries="off")
    r = await client.post("/graphql", json={"extensions": apq(sha("{ __typename }"))})
    assert code(r) == "PERSISTED_QUERY_NOT_SUPPORTED"
    assert (await client.post("/graphql", json={"query": "{ __typename }"})).json() == {
        "data": {"__typename": "Query"}
    }


async def test_allowlist_runs_only_registered_operations(make_client, tmp_path: Path) -> None:
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
