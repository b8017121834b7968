"""Tracing, metrics and request logs, against the real database.

Spans go to OpenTelemetry's in-memory exporter; ``/metrics`` is read with
prometheus-client's own parser; the request log line is taken from the
logger and formatted as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import AnyValue
from prometheus_client.parser import text_string_to_metric_families

import gateway.app as gateway_app
from gateway.app import create_app
from gateway.observability import Observability, metrics
from gateway.observability.logs import JsonFormatter, TextFormatter
from gateway.observability.metrics import OperationLabels
from gateway.observability.tracing import exporters, uninstrument_asyncpg
from gateway.services.writes import WriteService
from gateway.settings import Settings
from gateway.stages import STAGE_PREFIX

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token

RECALL = """query WhoOwnsBilling($q: String!) {
  recallMemory(query: $q, limit: 5) {
    results { rank evidenceId context supportingRelationships { id statement } }
    degradations { frontier code }
  }
}"""


@pytest.fixture(autouse=True)
def fresh_operation_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own label bound: the process-wide one fills as the suite grows."""
    monkeypatch.setattr(metrics, "OPERATION_LABELS", OperationLabels())


def attributes(span: ReadableSpan) -> Mapping[str, AnyValue]:
    """A finished span's attributes (the SDK's spans always have them; the API's
    type allows None)."""
    assert span.attributes is not None, span.name
    return span.attributes


@pytest_asyncio.fixture(loop_scope="session")
async def traced(dsn: str) -> AsyncIterator[tuple[httpx.AsyncClient, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observability = Observability(metrics_enabled=True, provider=provider)
    app = create_app(Settings(database_url=dsn, pool_max_size=4), observability)
    # The store-model watcher reads every second on a connection of its own, in
    # no request's trace: a read of it that fell inside a test's recall (a
    # recall that loads the model takes a good part of a second on a busy host)
    # was counted among the recall's statements. Not a second time in a test.
    poll = gateway_app.STORE_MODEL_POLL_S
    gateway_app.STORE_MODEL_POLL_S = 3600.0
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
                yield c, exporter
    finally:
        gateway_app.STORE_MODEL_POLL_S = poll
        uninstrument_asyncpg()


async def _recall(
    client: httpx.AsyncClient, secret: str, q: str = "who owns billing?", **headers: str
) -> httpx.Response:
    return await client.post(
        "/graphql",
        json={"query": RECALL, "variables": {"q": q}},
        headers={"authorization": f"Bearer {secret}", **headers},
    )


async def test_one_span_per_operation_with_recall_embedding_and_statements(
    traced: tuple[httpx.AsyncClient, InMemorySpanExporter],
    writes: WriteService,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, exporter = traced
    team = unique("otel")
    await load_jsonl(writes, jsonl(team_records(team)))
    secret = await token(writes, team, "alice")
    exporter.clear()
    with caplog.at_level(logging.INFO, logger="gateway.request"):
        response = await _recall(client, secret, **{"x-request-id": "trace-test-0001"})
    assert response.json()["data"]["recallMemory"]["results"]

    spans = exporter.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    operation = by_name["query WhoOwnsBilling"]
    assert len(operation) == 1
    op = operation[0]
    assert op.attributes["graphql.operation.name"] == "WhoOwnsBilling"
    assert op.attributes["graphql.operation.type"] == "query"
    assert op.attributes["graphql.errors"] == 0
    (recall,) = by_name["recall"]
    assert recall.parent.span_id == op.context.span_id
    assert recall.attributes["recall.results"] >= 1
    (embedding,) = by_name["recall.query_embedding"]
    assert embedding.parent.span_id == recall.context.span_id
    (embed,) = by_name["embed"]
    assert embed.parent.span_id == embedding.context.span_id
    statements = [s for s in spans if attributes(s).get("db.system") == "postgresql"]
    assert len(statements) >= 5
    assert all(s.context.trace_id == op.context.trace_id for s in statements)
    # The HTTP request's span (asgi instrumentation) is the root of the trace.
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 1 and roots[0].context.trace_id == op.context.trace_id
    # No per-field spans: besides SQL, only the request's, the operation's, recall's,
    # its stages' and embed's (asgi adds one per receive/send message of the request).
    rest = {s.name for s in spans if s not in statements}
    assert {n for n in rest if not n.startswith(("POST /graphql", STAGE_PREFIX))} == {
        "query WhoOwnsBilling",
        "recall",
        "embed",
    }, rest

    # The request's one log line carries the trace ID, as JSON when asked for.
    lines = [r for r in caplog.records if r.name == "gateway.request"]
    assert len(lines) == 1
    line = json.loads(JsonFormatter().format(lines[0]))
    assert line["request_id"] == "trace-test-0001"
    assert line["operation"] == "WhoOwnsBilling" and line["outcome"] == "ok"
    assert line["status"] == 200 and line["duration_ms"] > 0
    assert line["trace_id"] == format(op.context.trace_id, "032x")
    assert "community_snapshot_unavailable" in line["degradations"]
    assert line["statements"] >= 5


async def test_recall_stages_are_child_spans_without_text(
    traced: tuple[httpx.AsyncClient, InMemorySpanExporter], writes: WriteService
) -> None:
    """Each stage of the pipeline is a span under the recall, the statements nest
    under the stage that sent them (the combined statements of
    gateway/store/round_trips.py under theirs), and no span carries the query's
    text or any memory text (both private)."""
    client, exporter = traced
    team = unique("stages")
    records = team_records(team)
    await load_jsonl(writes, jsonl(records))
    secret = await token(writes, team, "alice")
    question = "which team owns the billing service of " + team
    exporter.clear()
    response = await _recall(client, secret, question)
    results = response.json()["data"]["recallMemory"]["results"]
    assert results

    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    (recall,) = by_name["recall"]

    def parent(span: ReadableSpan) -> str:
        assert span.parent is not None, span.name  # a stage or a statement: never a root
        return str(by_id[span.parent.span_id].name)

    for name in ("query_embedding", "scope", "search", "evidence", "related", "answer", "nested"):
        (one,) = by_name[STAGE_PREFIX + name]
        assert parent(one) == "recall", name
        assert one.context.trace_id == recall.context.trace_id
        assert one.start_time >= recall.start_time and one.end_time <= recall.end_time
    # The stages of the separate statements run only when a combined one fails.
    for name in ("candidates", "hydration", "hypotheses", "conflicts"):
        assert STAGE_PREFIX + name not in by_name, name
    # Statements belong to their stage: the candidate lists, hydration and discovery
    # in recall.search, hypotheses and conflicts in recall.answer, the nested rows
    # and the recall event in recall.nested.
    statements = [s for s in spans if attributes(s).get("db.system") == "postgresql"]
    parents = {parent(s) for s in statements}
    assert {"recall.scope", "recall.search", "recall.answer", "recall.nested"} <= parents, parents

    # Untrusted, private text stays out of every span: the question, the stored
    # texts (evidence content, names, titles) and the returned contexts.
    private = [question, *(r["context"] for r in results if r["context"])]
    for record in records:
        for key in ("content", "name", "title", "statement"):
            value = record.get(key)
            if isinstance(value, str) and len(value) > 8:
                private.append(value)
    assert len(private) > 3
    for span in spans:
        for key, value in (span.attributes or {}).items():
            text = str(value)
            leaked = [p for p in private if p in text or (len(text) > 8 and text in p)]
            assert not leaked, (span.name, key, leaked)
        assert question not in span.name


async def test_a_get_recall_leaves_its_question_out_of_the_request_span(
    traced: tuple[httpx.AsyncClient, InMemorySpanExporter], writes: WriteService
) -> None:
    """Over GET the document and variables are in the URL: the request span keeps
    the path only."""
    client, exporter = traced
    team = unique("otelget")
    await load_jsonl(writes, jsonl(team_records(team)))
    secret = await token(writes, team, "alice")
    question = "who really owns billing for " + team
    exporter.clear()
    response = await client.get(
        "/graphql",
        params={"query": RECALL, "variables": json.dumps({"q": question})},
        headers={"authorization": f"Bearer {secret}"},
    )
    assert response.json()["data"]["recallMemory"]["results"]
    spans = exporter.get_finished_spans()
    (request,) = [s for s in spans if s.parent is None]
    assert any(str(v).endswith("/graphql") for v in attributes(request).values())
    words = [question, "really owns", "WhoOwnsBilling($q"]
    for span in spans:
        for key, value in (span.attributes or {}).items():
            assert not any(w in str(value) for w in words), (span.name, key, value)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_metrics_after_a_few_requests(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("prom")
    await load_jsonl(writes, jsonl(team_records(team)))
    secret = await token(writes, team, "alice")
    before = _samples((await client.get("/metrics")).text)
    # Distinct questions: the recall service caches query embeddings.
    for q in ("who owns billing?", "billing latency at noon", "the payments team"):
        assert (await _recall(client, secret, q)).status_code == 200
    bad = await client.post(
        "/graphql",
        json={"query": "{ recallMemory(limit: 500) { recallId } }"},
        headers={"authorization": f"Bearer {secret}"},
    )
    assert bad.status_code == 200
    response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    after = _samples(response.text)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    ok = {"operation": "WhoOwnsBilling", "outcome": "ok"}
    assert delta("recall_gateway_requests_total", **ok) == 3
    assert delta("recall_gateway_request_duration_seconds_count", **ok) == 3
    assert (
        delta("recall_gateway_requests_total", operation="(anonymous)", outcome="BAD_USER_INPUT")
        == 1
    )
    assert (
        delta(
            "recall_gateway_degradations_total",
            frontier="communities",
            code="community_snapshot_unavailable",
        )
        >= 3
    )
    assert delta("recall_gateway_embedding_duration_seconds_count") >= 3
    assert delta("recall_gateway_statements_per_request_count") == 4
    assert delta("recall_gateway_statements_per_request_sum") >= 3 * 5
    assert after[("recall_gateway_pool_connections", (("state", "max"),))] == 4
    assert ("recall_gateway_pool_connections", (("state", "waiting"),)) in after


async def test_a_request_without_a_caller_names_no_operation_in_the_metrics(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    """/metrics is read by whoever reaches it: the operation names of requests
    without an authenticated caller (no token, a wrong one) must not become
    labels there, nor grow the label set; a caller's do."""
    team = unique("promanon")
    await load_jsonl(writes, jsonl(team_records(team)))
    secret = await token(writes, team, "alice")
    before = _samples((await client.get("/metrics")).text)
    named = "query AcmeMergerDueDiligence { viewer { principalId } }"
    for headers in ({}, {"authorization": "Bearer rgt_nosuchtoken.secret"}):
        refused = await client.post("/graphql", json={"query": named}, headers=headers)
        assert refused.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    ok = await client.post(
        "/graphql", json={"query": named}, headers={"authorization": f"Bearer {secret}"}
    )
    assert "errors" not in ok.json()
    text = (await client.get("/metrics")).text
    after = _samples(text)

    def delta(**labels: str) -> float:
        key = ("recall_gateway_requests_total", tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta(operation="(unauthenticated)", outcome="UNAUTHENTICATED") == 2
    assert delta(operation="AcmeMergerDueDiligence", outcome="UNAUTHENTICATED") == 0
    assert delta(operation="AcmeMergerDueDiligence", outcome="ok") == 1


def test_operation_labels_are_bounded_and_well_formed() -> None:
    labels = OperationLabels(limit=2)
    # a document that did not parse, or names no definition: no slot taken
    assert labels("Ghost", "unknown", True) == "(invalid)"
    assert labels("First", "query", True) == "First"
    assert labels("Second", "mutation", True) == "Second"
    assert labels("Third", "query", True) == "(other)"  # past the bound
    assert labels("First", "query", True) == "First"  # the first names keep theirs
    assert labels("Second", "query", False) == "(unauthenticated)"
    assert labels(None, "query", True) == "(anonymous)"
    assert labels("First", None, True) == "(none)"  # never reached an operation
    assert labels("no such\noperation", "query", True) == "(invalid)"
    assert labels("x" * 101, "query", True) == "(invalid)"


async def test_request_lines_carry_no_client_line_breaks(
    client: httpx.AsyncClient, writes: WriteService, caplog: pytest.LogCaptureFixture
) -> None:
    """A text log is read line by line: a line break the client chose (in an
    operation name, or a path's %0A) must not forge a line of its own."""
    team = unique("logforge")
    await load_jsonl(writes, jsonl(team_records(team)))
    secret = await token(writes, team, "alice")
    forged = "x\n2026-12-05 00:00:00,000 INFO gateway.request: FORGED"
    with caplog.at_level(logging.INFO, logger="gateway.request"):
        for headers in ({}, {"authorization": f"Bearer {secret}"}):
            await client.post(
                "/graphql",
                json={"query": "query {", "operationName": forged},
                headers=headers,
            )
        await client.get("/nothing%0A2026-12-05 00:00:00,000 INFO gateway.request: FORGED")
    lines = [TextFormatter().format(r) for r in caplog.records if r.name == "gateway.request"]
    assert len(lines) == 3
    for line in lines:
        assert "\n" not in line and "FORGED" not in line.split("/nothing", 1)[0], line
    assert "/nothing\\x0a2026" in lines[2]


async def test_a_refusal_before_any_operation_is_not_counted_ok(client: httpx.AsyncClient) -> None:
    before = _samples((await client.get("/metrics")).text)
    refused = await client.post(
        "/graphql", content=b"query=1", headers={"content-type": "text/plain"}
    )
    assert refused.status_code >= 400
    after = _samples((await client.get("/metrics")).text)
    key = (
        "recall_gateway_requests_total",
        (("operation", "(none)"), ("outcome", f"http_{refused.status_code}")),
    )
    assert after.get(key, 0.0) - before.get(key, 0.0) == 1


def test_metrics_add_up_across_worker_processes(tmp_path: Path) -> None:
    """prometheus-client's multiprocess mode, as ``serve --workers N`` sets it up."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    work = (
        "from gateway.observability import metrics\n"
        "metrics.REQUESTS.labels('Op', 'ok').inc()\n"
        "metrics.POOL.labels('max').set(4)\n"
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", work], env=env, check=True)
    read = (
        "from prometheus_client import CollectorRegistry, generate_latest, multiprocess\n"
        "r = CollectorRegistry(); multiprocess.MultiProcessCollector(r)\n"
        "print(generate_latest(r).decode())\n"
    )
    text = subprocess.run(
        [sys.executable, "-c", read], env=env, check=True, capture_output=True, text=True
    ).stdout
    samples = _samples(text)
    assert samples[("recall_gateway_requests_total", (("operation", "Op"), ("outcome", "ok")))] == 2


def test_tracing_is_off_without_an_exporter(dsn: str) -> None:
    assert exporters({}) == []
    assert exporters({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) == ["otlp"]
    assert exporters({"OTEL_TRACES_EXPORTER": "console,otlp"}) == ["console", "otlp"]
    assert exporters({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) == []
    app = create_app(Settings(database_url=dsn))
    names = [getattr(m.cls, "__name__", None) for m in app.user_middleware]  # classes
    assert "OpenTelemetryMiddleware" not in names
    assert "RequestObserver" in names
