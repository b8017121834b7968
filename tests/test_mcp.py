"""The MCP server, driven by the MCP SDK's own client over streamable HTTP and stdio.

The tools run through the gateway's schema on the real database: the same
authorisation (another team's IDs look missing), limits and error codes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent

from gateway.mcp import Gateway, http_app
from gateway.services.writes import WriteService

from .conftest import LiveServer, app_for, load_jsonl, serve_in_thread, unique
from .factories import jsonl, team_records
from .test_recall import token


@pytest.fixture(scope="module")
def mcp_server(dsn: str) -> Iterator[LiveServer]:
    with serve_in_thread(http_app(Gateway(app_for(dsn)))) as server:
        yield server


@asynccontextmanager
async def connect(server: LiveServer, secret: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        transport = streamable_http_client(f"{server.url}/mcp", http_client=http)
        async with Client(transport) as client:
            yield client


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    """(is_error, the JSON the tool answered)."""
    result = await client.call_tool(tool, arguments)
    content = result.content[0]
    assert isinstance(content, TextContent), content
    text = content.text
    if result.is_error:  # the SDK says which tool failed, then our JSON
        assert text.startswith(f"Error executing tool {tool}: {{"), text
        text = text[text.index("{") :]
    return bool(result.is_error), json.loads(text)


async def two_teams(writes: WriteService) -> tuple[str, str]:
    team_a, team_b = unique("mcpa"), unique("mcpb")
    await load_jsonl(writes, jsonl(team_records(team_a)))
    await load_jsonl(writes, jsonl(team_records(team_b)))
    return team_a, team_b


async def test_tools_and_their_inputs(mcp_server: LiveServer, writes: WriteService) -> None:
    team, _ = await two_teams(writes)
    async with connect(mcp_server, await token(writes, team, "alice")) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"recall_memory", "trace_memory", "remember"}
    recall_args = set(tools["recall_memory"].input_schema["properties"])
    assert recall_args == {
        "query",
        "limit",
        "relationshipLimit",
        "communityLimit",
        "communityRelationshipLimit",
        "hypothesisLimit",
        "validAt",
        "knownAt",
        "knownEvidenceIds",
        "knownRelationshipIds",
        "expandFromEntityIds",
    }
    assert tools["trace_memory"].input_schema["required"] == ["relationshipId"]


async def test_recall_keeps_rank_space_and_marks_text_untrusted(
    mcp_server: LiveServer, writes: WriteService
) -> None:
    team, _ = await two_teams(writes)
    async with connect(mcp_server, await token(writes, team, "alice")) as client:
        failed, answer = await call(
            client, "recall_memory", {"query": "who owns the billing service?", "limit": 5}
        )
    assert not failed, answer
    assert [r["rank"] for r in answer["results"]] == list(range(1, len(answer["results"]) + 1))
    by_id = {r["evidenceId"]: r for r in answer["results"]}
    assert by_id["ev-owner"]["spaceKind"] == "SHARED"
    assert by_id["ev-private"]["spaceKind"] == "PRIVATE"
    assert "untrusted" in answer["notice"] and "results[].context" in answer["untrustedFields"]
    assert answer["suggestedActions"][0]["kind"] == "SUBMIT_RECALL_SESSION_FEEDBACK"
    assert {"evidence", "relationships"} <= set(answer["searchStates"])


async def test_the_same_answer_as_graphql(
    mcp_server: LiveServer, writes: WriteService, client: httpx.AsyncClient
) -> None:
    team, _ = await two_teams(writes)
    secret = await token(writes, team, "alice")
    async with connect(mcp_server, secret) as mcp:
        _, answer = await call(mcp, "recall_memory", {"query": "billing latency", "limit": 3})
    response = await client.post(
        "/graphql",
        json={
            "query": '{ recallMemory(query: "billing latency", limit: 3) '
            "{ results { evidenceId spaceKind } } }"
        },
        headers={"authorization": f"Bearer {secret}"},
    )
    graphql = response.json()["data"]["recallMemory"]["results"]
    assert [(r["evidenceId"], r["spaceKind"]) for r in answer["results"]] == [
        (r["evidenceId"], r["spaceKind"]) for r in graphql
    ]


async def test_another_team_s_ids_look_missing(
    mcp_server: LiveServer, writes: WriteService
) -> None:
    team_a, team_b = await two_teams(writes)
    async with connect(mcp_server, await token(writes, team_a, "alice")) as client:
        failed, own = await call(client, "trace_memory", {"relationshipId": "rel-owner"})
        assert not failed and own["relationship"]["id"] == "rel-owner"
    # team B's token: its own rel-owner is another row; team A's private relationship
    # and an ID that exists nowhere answer the same error.
    async with connect(mcp_server, await token(writes, team_b, "bob")) as client:
        failed_private, private = await call(
            client, "trace_memory", {"relationshipId": "rel-private"}
        )
        failed_missing, missing = await call(
            client, "trace_memory", {"relationshipId": "no-such-relationship"}
        )
        _, recall = await call(client, "recall_memory", {"query": f"billing service of {team_a}"})
    assert failed_private and failed_missing
    assert private["code"] == missing["code"] == "NOT_FOUND"
    assert private["message"].replace("rel-private", "X") == missing["message"].replace(
        "no-such-relationship", "X"
    )
    assert team_a not in json.dumps(recall)


async def test_remember_is_authorised_and_idempotent(
    mcp_server: LiveServer, writes: WriteService
) -> None:
    team, _ = await two_teams(writes)
    note = {
        "space": "PRIVATE",
        "source": {"id": "mcp-src", "type": "TOOL", "title": "An agent's note"},
        "entities": [{"id": "mcp-deploys", "name": "Deploys"}],
        "evidence": [{"id": "mcp-ev", "content": "Deploys pause during the Friday freeze."}],
        "relationships": [
            {
                "id": "mcp-rel",
                "subject": "mcp-deploys",
                "predicate": "paused_during",
                "objectValue": "Friday freeze",
                "supports": [{"id": "mcp-sup", "evidence": "mcp-ev"}],
            }
        ],
    }
    async with connect(mcp_server, await token(writes, team, "alice")) as client:
        failed, first = await call(client, "remember", {"input": note})
        assert not failed, first
        _, again = await call(client, "remember", {"input": note})
        _, found = await call(client, "recall_memory", {"query": "Friday freeze deploys"})
    assert [r["created"] for r in first["receipts"]] == [True] * 4
    assert [r["created"] for r in again["receipts"]] == [False] * 4
    assert found["results"][0]["evidenceId"] == "mcp-ev"
    # bob of the same team does not see alice's private note
    async with connect(mcp_server, await token(writes, team, "bob")) as client:
        _, other = await call(client, "recall_memory", {"query": "Friday freeze deploys"})
    assert "mcp-ev" not in json.dumps(other)


async def test_limits_and_authentication_are_graphql_s(
    mcp_server: LiveServer, writes: WriteService
) -> None:
    team, _ = await two_teams(writes)
    async with connect(mcp_server, await token(writes, team, "alice")) as client:
        failed, error = await call(client, "recall_memory", {"query": "billing", "limit": 500})
    assert failed and error["code"] == "BAD_USER_INPUT"
    for secret in (None, "rgt_t-not-a-token"):
        async with connect(mcp_server, secret) as client:
            failed, error = await call(client, "recall_memory", {"query": "billing"})
        assert failed and error["code"] == "UNAUTHENTICATED"


async def test_the_stdio_token_is_never_an_http_caller_s(dsn: str, writes: WriteService) -> None:
    """A server given RECALL_MCP_TOKEN (the stdio caller) and served over HTTP: a
    request without a token is refused, and a request with another principal's
    token reads as that principal, never as the configured one."""
    team, _ = await two_teams(writes)
    alice = await token(writes, team, "alice")
    with serve_in_thread(http_app(Gateway(app_for(dsn), alice))) as server:
        async with connect(server, None) as client:
            failed, anonymous = await call(
                client, "trace_memory", {"relationshipId": "rel-private"}
            )
        async with connect(server, await token(writes, team, "bob")) as client:
            bob_failed, bob = await call(client, "trace_memory", {"relationshipId": "rel-private"})
    assert failed and anonymous["code"] == "UNAUTHENTICATED", anonymous
    assert bob_failed and bob["code"] == "NOT_FOUND", bob  # alice's private relationship


async def test_stdio_with_the_sdk_client(dsn: str, writes: WriteService) -> None:
    team, _ = await two_teams(writes)
    secret = await token(writes, team, "alice")
    command = Path(sys.executable).with_name("recall-gateway")
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "RECALL_MCP_TOKEN": secret,
        "RECALL_POOL_MAX_SIZE": "2",
        "RECALL_POOL_MIN_SIZE": "1",
    }
    params = StdioServerParameters(command=str(command), args=["mcp"], env=env)
    async with Client(params, read_timeout_seconds=120) as client:
        failed, answer = await call(client, "recall_memory", {"query": "billing owner"})
        _, trace = await call(client, "trace_memory", {"relationshipId": "rel-owner"})
    assert not failed, answer
    assert {r["evidenceId"] for r in answer["results"]} == {"ev-owner", "ev-private"}
    assert trace["relationship"]["id"] == "rel-owner"


async def test_tool_calls_are_logged_and_counted_like_requests(
    mcp_server: LiveServer, writes: WriteService, caplog: pytest.LogCaptureFixture
) -> None:
    from prometheus_client import REGISTRY

    team, _ = await two_teams(writes)
    labels = {"operation": "McpRecall", "outcome": "ok"}
    before = REGISTRY.get_sample_value("recall_gateway_requests_total", labels) or 0.0
    with caplog.at_level(logging.INFO, logger="gateway.request"):
        async with connect(mcp_server, await token(writes, team, "alice")) as client:
            failed, _ = await call(client, "recall_memory", {"query": "billing"})
    assert not failed
    assert REGISTRY.get_sample_value("recall_gateway_requests_total", labels) == before + 1
    (line,) = [vars(r) for r in caplog.records if r.name == "gateway.request"]  # its extra fields
    assert line["method"] == "MCP" and line["path"] == "recall_memory"
    assert line["operation"] == "McpRecall" and line["statements"] > 0
