"""Fuzzing GraphQL documents and variables: never a 5xx, never internals.

Documents are random text, or recalls with random arguments, values and
selections (real and made-up fields, wrong types, huge numbers, odd
strings), sent with random variables, with and without a valid token. Every
answer must be a JSON body below 500 whose errors all carry a documented code,
none of them INTERNAL (an INTERNAL here is a bug: bad input is the caller's
error, not the server's), and nothing of the server's inside (stack traces,
SQL, driver names).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.services.writes import WriteService

from .conftest import REPO, app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token

EXAMPLES = int(os.environ.get("RECALL_FUZZ_EXAMPLES", "200"))
DOCUMENTED = set(
    re.findall(r"^\| `([A-Z_]+)` \|", (REPO / "docs/errors.md").read_text(), re.MULTILINE)
)
INTERNALS = ("Traceback", "asyncpg", "postgres", "SELECT ", 'File "', "pg_", "recall_app")

ARGUMENTS = [
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
    "bogus",
]
FIELDS = [
    "recallId",
    "results { evidenceId rank context spaceKind }",
    "degradations { code }",
    "conflicts { id }",
    "relatedRelationships { representativeId }",
    "nope",
    "__typename",
    "results { source { id title } }",
    "searchStates { evidence { status } }",
]

scalars = st.one_of(
    st.integers(-(2**40), 2**40).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=40).map(json.dumps),
    st.sampled_from(
        [
            "null",
            "true",
            "SHARED",
            "$v",
            "[]",
            '["a", "b"]',
            '"2024-01-01T00:00:00Z"',
            '"2024-13-45"',
            '"x" "y"',
            "{a: 1}",
        ]
    ),
)


@st.composite
def recall_documents(draw: st.DrawFn) -> str:
    args = draw(st.lists(st.tuples(st.sampled_from(ARGUMENTS), scalars), max_size=5))
    arg_text = ", ".join(f"{name}: {value}" for name, value in args)
    selection = " ".join(draw(st.lists(st.sampled_from(FIELDS), min_size=0, max_size=4)))
    header = draw(st.sampled_from(["", "query Q($v: Int)", "query Q($v: String!)", "mutation"]))
    return f"{header} {{ recallMemory({arg_text}) {{ {selection} }} }}"


TRACE_ARGUMENTS = [
    "relationshipId",
    "maxDepth",
    "maxEdges",
    "maxEvents",
    "includeEvidenceContent",
    "validAt",
    "knownAt",
    "bogus",
]
TRACE_FIELDS = [
    "relationship { id }",
    "evidence { evidenceId content }",
    "events { kind }",
    "truncated stoppedReason",
    "lineage { depth relationship { id } }",
    "nope",
]


@st.composite
def trace_documents(draw: st.DrawFn) -> str:
    args = draw(st.lists(st.tuples(st.sampled_from(TRACE_ARGUMENTS), scalars), max_size=5))
    arg_text = ", ".join(f"{name}: {value}" for name, value in args)
    selection = " ".join(draw(st.lists(st.sampled_from(TRACE_FIELDS), max_size=3)))
    return f"{{ traceMemory({arg_text}) {{ {selection} }} }}"


@st.composite
def feedback_documents(draw: st.DrawFn) -> str:
    fields = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["feedbackId", "recallEventId", "used", "rating", "bogus"]),
                scalars,
            ),
            max_size=4,
        )
    )
    body = ", ".join(f"{name}: {value}" for name, value in fields)
    return (
        f"mutation {{ submitRecallSessionFeedback(input: {{ {body} }}) {{ feedbackId created }} }}"
    )


documents = st.one_of(
    recall_documents(),
    trace_documents(),
    feedback_documents(),
    st.text(alphabet="{}()[]:$@!.,=\"' \n\tabcdeqrylimt0123456789_", max_size=120),
    st.text(max_size=60),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
variables = st.one_of(
    st.none(), st.dictionaries(st.sampled_from(["v", "q", "x"]), json_values, max_size=3)
)


@pytest_asyncio.fixture(loop_scope="session")
async def fuzz_client(
    dsn: str, writes: WriteService
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    team = unique("fuzz")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    app = app_for(dsn)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            yield c, tok


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=os.environ.get("CI") == "true",
)
@given(
    document=documents,
    values=variables,
    authenticated=st.booleans(),
    accept=st.sampled_from(["application/json", "application/graphql-response+json", "*/*"]),
    method=st.sampled_from(["POST", "POST", "GET"]),
)
async def test_no_document_or_variables_break_the_gateway(
    fuzz_client: tuple[httpx.AsyncClient, str],
    document: str,
    values: dict[str, Any] | None,
    authenticated: bool,
    accept: str,
    method: str,
) -> None:
    client, tok = fuzz_client
    headers = {"accept": accept}
    if authenticated:
        headers["authorization"] = f"Bearer {tok}"
    if method == "POST":
        r = await client.post(
            "/graphql", json={"query": document, "variables": values}, headers=headers
        )
    else:
        params = {"query": document}
        if values is not None:
            params["variables"] = json.dumps(values)
        r = await client.get("/graphql", params=params, headers=headers)
    assert r.status_code < 500, r.text
    for marker in INTERNALS:
        assert marker not in r.text, (marker, r.text)
    body = r.json()
    for error in body.get("errors") or []:
        code = error["extensions"]["code"]
        assert code in DOCUMENTED, (code, r.text)
        assert code != "INTERNAL", r.text


@st.composite
def fragment_documents(draw: st.DrawFn) -> str:
    """Fragments spreading one another at random: unknown, cyclic, doubling, deep."""
    count = draw(st.integers(1, 30))
    names = [f"F{i}" for i in range(count)]
    parts = [f"query {{ ...{draw(st.sampled_from([*names, 'Nope']))} }}"]
    for name in names:
        spreads = draw(st.lists(st.sampled_from([*names, "Nope"]), max_size=3))
        leaves = draw(
            st.lists(st.sampled_from(["__typename", "viewer { principalId }"]), max_size=3)
        )
        body = " ".join([*(f"...{s}" for s in spreads), *leaves])
        parts.append(f"fragment {name} on Query {{ {body} }}")
    return " ".join(parts)


def _nested(n: int) -> bytes:
    return b'{"query": "{ __typename }", "variables": {"x": ' + b"[" * n + b"]" * n + b"}}"


raw_bodies = st.one_of(
    st.binary(max_size=80),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 1500).map(_nested),
    st.text(alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=8).map(
        lambda t: json.dumps({"query": "{ __typename }", "variables": {"q": t}}).encode()
    ),
    fragment_documents().map(lambda d: json.dumps({"query": d}).encode()),
)


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=os.environ.get("CI") == "true",
)
@given(
    body=raw_bodies,
    content_type=st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "application/json; charset=latin-1",
            "application/json; charset=utf-16",
            "text/plain",
        ]
    ),
    method=st.sampled_from(["POST", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"]),
)
async def test_no_body_breaks_the_gateway(
    fuzz_client: tuple[httpx.AsyncClient, str],
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    content_type: str,
    method: str,
) -> None:
    """Raw bodies: bytes, JSON of any shape, deep nesting, lone surrogates, hostile
    fragments, under any content type and method: a coded 4xx (or an answer),
    and nothing logged at ERROR level."""
    client, _ = fuzz_client
    caplog.clear()
    with caplog.at_level("WARNING"):
        r = await client.request(
            method, "/graphql", content=body, headers={"content-type": content_type}
        )
    assert r.status_code < 500, r.text
    for marker in INTERNALS:
        assert marker not in r.text, (marker, r.text)
    for error in r.json().get("errors") or []:
        code = error["extensions"]["code"]
        assert code in DOCUMENTED and code != "INTERNAL", (code, r.text)
    assert not [rec for rec in caplog.records if rec.levelname == "ERROR" or rec.exc_info]
