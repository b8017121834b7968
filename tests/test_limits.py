"""Hostile-query limits, profiles and GraphQL-over-HTTP behaviour, over HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio
from graphql import parse, validate

from gateway.app import create_app
from gateway.http import limits as http_limits
from gateway.http.cost import cost_rule
from gateway.schema import build_schema
from gateway.settings import Settings

from .graphql_docs import maximal_recall, selection

GRJ = "application/graphql-response+json"
MAX_ARGS = (
    "limit: 50, relationshipLimit: 20, communityLimit: 10, "
    "communityRelationshipLimit: 20, hypothesisLimit: 20"
)


@pytest_asyncio.fixture(loop_scope="session")
async def make_client(dsn: str) -> AsyncIterator[Any]:
    """Clients of apps with given settings; all closed at the end of the test."""
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


async def post(client: httpx.AsyncClient, query: str, accept: str = "application/json", **kw: Any):
    return await client.post("/graphql", json={"query": query, **kw}, headers={"accept": accept})


def code(r: httpx.Response) -> str:
    return str(r.json()["errors"][0]["extensions"]["code"])


def test_profiles_resolve_documented_defaults() -> None:
    dev = http_limits.resolve(Settings(env="development"))
    prod = http_limits.resolve(Settings(env="production"))
    assert dev.introspection and dev.graphiql and not dev.production
    assert not prod.introspection and not prod.graphiql and prod.production
    assert (prod.max_depth, prod.max_aliases, prod.max_tokens, prod.max_directives) == (
        10,
        10,
        2000,
        10,
    )
    assert (prod.max_cost, prod.max_body_bytes, prod.request_timeout_ms) == (
        12_000,
        262_144,
        10_000,
    )
    assert not prod.batching
    # an explicit setting wins over the profile
    assert http_limits.resolve(Settings(env="production", max_depth=3)).max_depth == 3
    assert http_limits.resolve(Settings(env="production", introspection=True)).introspection


def test_cost_counts_list_limits_and_variables_at_their_maximum() -> None:
    schema = build_schema()._schema

    def cost(document: str) -> int:
        errors = validate(schema, parse(document), [cost_rule(0)])
        return int(errors[0].extensions["cost"]) if errors else 0  # type: ignore[index]

    small = cost('{ recallMemory(query: "x", limit: 1) { results { evidenceId } } }')
    big = cost('{ recallMemory(query: "x", limit: 50) { results { evidenceId } } }')
    default = cost('{ recallMemory(query: "x") { results { evidenceId } } }')
    var = cost('query($n: Int) { recallMemory(query: "x", limit: $n) { results { evidenceId } } }')
    # 1 for the RecallResult, 10 for the search, 1 per result
    assert (small, default, big, var) == (12, 21, 61, 61)
    # nested lists multiply: members per community x communities
    nested = cost(
        '{ recallMemory(query: "x", communityLimit: 2, communityRelationshipLimit: 3) '
        "{ relatedCommunities { members { representativeId } } } }"
    )
    assert nested == 1 + 10 + 2 * (1 + 3)
    # two recalls cost twice one
    two = cost(
        '{ a: recallMemory(query: "x", limit: 50) { results { evidenceId } } '
        'b: recallMemory(query: "x", limit: 50) { results { evidenceId } } }'
    )
    assert two == 2 * big


def test_production_admits_one_maximal_recall_and_not_two() -> None:
    prod = http_limits.resolve(Settings(env="production"))
    schema = build_schema()._schema
    one = maximal_recall(schema, arguments=MAX_ARGS)
    assert validate(schema, parse(one), [cost_rule(prod.max_cost)]) == []
    # and fits the other production limits too
    document = parse(one, max_tokens=prod.max_tokens)
    assert validate(schema, document, [http_limits.depth_rule(prod.max_depth)]) == []
    body = one[1:-1]
    two = "{ a: " + body.strip() + " b: " + body.strip() + " }"
    errors = validate(schema, parse(two), [cost_rule(prod.max_cost)])
    assert errors and errors[0].extensions["code"] == "QUERY_TOO_COSTLY"  # type: ignore[index]
    # a trace with every field at its default bounds passes; at its maxima it does not
    trace_type = schema.get_type("MemoryTrace")
    assert trace_type is not None
    every = selection(schema, trace_type, 6)
    trace = '{ traceMemory(relationshipId: "r") { ' + every + " } }"
    assert validate(schema, parse(trace), [cost_rule(prod.max_cost)]) == []
    big = '{ traceMemory(relationshipId: "r", maxEdges: 200, maxEvents: 1000) { ' + every + " } }"
    assert validate(schema, parse(big), [cost_rule(prod.max_cost)])


async def test_each_limit_is_refused_before_execution_with_its_code(make_client) -> None:
    client = await make_client(
        max_depth=3, max_aliases=2, max_tokens=40, max_directives=2, max_cost=50
    )
    deep = '{ recallMemory(query: "x") { results { supportingRelationships { subject { id } } } } }'
    aliases = "{ a: __typename b: __typename c: __typename }"
    tokens = "{ " + " ".join(["__typename"] * 50) + " }"
    directives = "{ a: __typename @skip(if: false) b: __typename @skip(if: false) __typename @include(if: true) }"
    costly = '{ recallMemory(query: "x", limit: 50) { results { evidenceId } } }'
    for document, expected in [
        (deep, "QUERY_TOO_DEEP"),
        (aliases, "TOO_MANY_ALIASES"),
        (tokens, "TOO_MANY_TOKENS"),
        (directives, "TOO_MANY_DIRECTIVES"),
        (costly, "QUERY_TOO_COSTLY"),
    ]:
        r = await post(client, document)  # no token: refused before auth is even asked
        assert r.status_code == 200 and code(r) == expected, (expected, r.text)
        assert r.json()["data"] is None
        r = await post(client, document, accept=GRJ)
        assert r.status_code == 400 and code(r) == expected
        assert r.headers["content-type"].startswith(GRJ)
        assert "data" not in r.json()
    # under every limit, the same client works
    ok = await post(client, "{ a: __typename }")
    assert ok.json() == {"data": {"a": "Query"}}


async def test_request_body_and_query_string_size(make_client) -> None:
    client = await make_client(max_body_bytes=2048)
    r = await post(client, "{ __typename }", variables={"pad": "x" * 4000})
    assert r.status_code == 413 and code(r) == "REQUEST_TOO_LARGE"
    r = await client.get("/graphql", params={"query": "{ __typename }", "x": "y" * 4000})
    assert r.status_code == 413 and code(r) == "REQUEST_TOO_LARGE"
    # declared too large: refused without reading
    r = await client.post(
        "/graphql", content=b"{}" * 2000, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    assert (await post(client, "{ __typename }")).json() == {"data": {"__typename": "Query"}}


async def test_batching_off_by_default_and_capped_when_on(make_client) -> None:
    off = await make_client()
    r = await off.post("/graphql", json=[{"query": "{ __typename }"}])
    assert r.status_code == 400 and code(r) == "BATCHING_DISABLED"
    on = await make_client(batching=True, max_batch_size=2)
    r = await on.post("/graphql", json=[{"query": "{ __typename }"}] * 2)
    assert r.status_code == 200
    assert r.json() == [{"data": {"__typename": "Query"}}] * 2
    r = await on.post("/graphql", json=[{"query": "{ __typename }"}] * 3)
    assert r.status_code == 400 and code(r) == "BATCH_TOO_LARGE"


async def test_production_hides_schema(make_client) -> None:
    prod = await make_client(env="production")
    r = await post(prod, "{ __schema { types { name } } }")
    assert code(r) == "INTROSPECTION_DISABLED"
    r = await post(prod, "{ viewr { principalId } }")
    message = r.json()["errors"][0]["message"]
    assert code(r) == "GRAPHQL_VALIDATION_FAILED" and "Did you mean" not in message
    r = await post(prod, "{ recallMemory(limt: 3) { recallId } }")
    assert "Did you mean" not in r.text and "limit" not in r.json()["errors"][0]["message"]
    r = await prod.get("/graphql", headers={"accept": "text/html"})
    assert r.status_code == 404 and "<html" not in r.text.lower()

    dev = await make_client(env="development")
    r = await post(dev, "{ viewr { principalId } }")
    assert "Did you mean" in r.json()["errors"][0]["message"]
    r = await post(dev, "{ __schema { queryType { name } } }")
    assert r.json() == {"data": {"__schema": {"queryType": {"name": "Query"}}}}
    r = await dev.get("/graphql", headers={"accept": "text/html"})
    assert r.status_code == 200 and "graphiql" in r.text.lower()


async def test_cors_origins(make_client) -> None:
    client = await make_client(cors_origins="https://app.example, https://ops.example")
    r = await client.options(
        "/graphql",
        headers={"origin": "https://app.example", "access-control-request-method": "POST"},
    )
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    r = await client.post(
        "/graphql", json={"query": "{ __typename }"}, headers={"origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in r.headers
    plain = await make_client()
    r = await plain.post(
        "/graphql", json={"query": "{ __typename }"}, headers={"origin": "https://app.example"}
    )
    assert "access-control-allow-origin" not in r.headers


async def test_media_type_and_http_errors_are_graphql_shaped(make_client) -> None:
    client = await make_client()
    r = await post(client, "{ __typename }", accept=f"{GRJ}, application/json")
    assert r.headers["content-type"].startswith(GRJ)
    r = await post(client, "{ __typename }", accept="application/json")
    assert r.headers["content-type"].startswith("application/json")
    r = await post(client, "{ __typename", accept=GRJ)
    assert r.status_code == 400 and code(r) == "GRAPHQL_PARSE_FAILED"
    r = await client.post(
        "/graphql", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and code(r) == "BAD_REQUEST"
    r = await client.put("/graphql", json={"query": "{ __typename }"})
    assert r.status_code == 405
    # a variable of the wrong type is a request error with BAD_USER_INPUT
    r = await post(
        client,
        'query($n: Int) { recallMemory(query: "x", limit: $n) { recallId } }',
        accept=GRJ,
        variables={"n": "many"},
    )
    assert r.status_code == 400 and code(r) == "BAD_USER_INPUT"
    assert json.loads(r.text).get("data") is None


async def test_empty_selection_set_is_invalid_not_a_crash(make_client) -> None:
    # graphql-core parses it; strawberry's depth rule used to crash on it
    client = await make_client()
    r = await post(client, '{ recallMemory(query: "x") { } }')
    assert code(r) == "GRAPHQL_VALIDATION_FAILED", r.text
    assert "max()" not in r.text


def test_media_type_negotiation() -> None:
    from gateway.http.view import negotiate

    assert negotiate(None) == "application/json"
    assert negotiate("*/*") == "application/json"
    assert negotiate(GRJ) == GRJ
    assert negotiate(f"{GRJ}, application/json") == GRJ
    assert negotiate(f"application/json, {GRJ};q=0.5") == "application/json"
    assert negotiate(f"{GRJ};q=0, application/json") == "application/json"
    assert negotiate(f"{GRJ};q=0.9") == GRJ
