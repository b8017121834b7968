"""Unexpected failures are masked, logged, and findable by the request ID."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from gateway.services.writes import WriteService

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token


async def test_unexpected_error_is_masked_and_logged_with_the_request_id(
    dsn: str, writes: WriteService, caplog: pytest.LogCaptureFixture
) -> None:
    team = unique("mask")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    app = app_for(dsn)
    async with app.router.lifespan_context(app):

        async def broken(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError("SELECT * FROM evidence WHERE team_id = 'internal-7f3a'")

        app.state.services.recall.recall = broken
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            with caplog.at_level(logging.ERROR, logger="gateway"):
                r = await client.post(
                    "/graphql",
                    json={"query": '{ recallMemory(query: "billing") { recallId } }'},
                    headers={"Authorization": f"Bearer {tok}", "X-Request-ID": "req-12345678"},
                )
    assert r.headers["x-request-id"] == "req-12345678"
    error = r.json()["errors"][0]
    assert error["message"] == "Internal server error"
    assert error["extensions"] == {"code": "INTERNAL", "requestId": "req-12345678"}
    assert "SELECT" not in r.text and "internal-7f3a" not in r.text and "Traceback" not in r.text
    logged = [rec for rec in caplog.records if "req-12345678" in rec.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "internal-7f3a" in str(logged[0].exc_info[1])


async def test_a_malformed_id_is_refused_with_the_form_an_id_takes(
    dsn: str, writes: WriteService
) -> None:
    """Reads said only "is not a well-formed ID" (writes quote the pattern): a
    caller who typed ``ev note 1`` or pasted a URL learnt nothing of what an ID
    may hold. Each read argument now says it, with the field as before."""
    team = unique("idform")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    app = app_for(dsn)
    cases = [
        ('{ traceMemory(relationshipId: "rel owner") { truncated } }', "relationshipId"),
        (
            '{ recallMemory(query: "x", knownEvidenceIds: ["ok", "ev/1"]) { recallId } }',
            "knownEvidenceIds",
        ),
        (
            '{ recallMemory(query: "x", knownRelationshipIds: [""]) { recallId } }',
            "knownRelationshipIds",
        ),
        ('{ recallMemory(expandFromEntityIds: ["-x"]) { recallId } }', "expandFromEntityIds"),
        (
            'mutation { submitRecallSessionFeedback(input: {feedbackId: "fb 1", '
            'recallEventId: "00000000-0000-0000-0000-000000000000", used: true}) '
            "{ created } }",
            "feedbackId",
        ),
        (
            'mutation { submitRecallSessionFeedback(input: {feedbackId: "fb-1", '
            'recallEventId: "00000000-0000-0000-0000-000000000000", used: true, '
            'irrelevantResults: [{frontier: EVIDENCE, id: "ev 1"}]}) { created } }',
            "irrelevantResults[0]",
        ),
        # a trailing newline: `$` alone let it through as a well-formed ID
        ('{ traceMemory(relationshipId: "rel-owner\\n") { truncated } }', "relationshipId"),
    ]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for query, field in cases:
                r = await client.post(
                    "/graphql", json={"query": query}, headers={"Authorization": f"Bearer {tok}"}
                )
                error = r.json()["errors"][0]
                assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": field}, error
                assert "not a well-formed ID" in error["message"], error
                assert "1 to 128 letters, digits" in error["message"], error
