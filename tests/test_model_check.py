"""Reads never compare a question of one model with vectors of another.

The provider of another model is a real OpenAI-compatible HTTP endpoint on
loopback (a small server in this module that makes deterministic 384-dimension
vectors); the store is the real PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
from starlette.applications import Starlette

from gateway.embeddings import FollowingProvider, LocalModel, StoreModel, by_key, create_provider
from gateway.services.writes import WriteService
from gateway.settings import Settings
from gateway.store.database import Database

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .loopback import serving
from .test_recall import token

MODEL = "fake-embedding-model"

RECALL = """
query Recall($q: String, $knownAt: DateTime) {
  recallMemory(query: $q, knownAt: $knownAt, communityLimit: 0) {
    results { evidenceId }
    relatedRelationships { representativeId }
    degradations { frontier code message optional }
    searchStates {
      evidence { status complete lists { spaceKind list status } }
      relationships { status complete lists { spaceKind list status } }
    }
  }
}
"""


class Endpoint:
    """A loopback ``POST /v1/embeddings`` that counts the texts it was asked to embed."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.lock = threading.Lock()
        self.url = ""

    def calls(self) -> int:
        with self.lock:
            return len(self.texts)


def _vector(text: str) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    row = np.random.default_rng(seed).standard_normal(384)
    return [float(x) for x in row / np.linalg.norm(row)]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    ep = Endpoint()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            with ep.lock:
                ep.texts += body["input"]
            data = [
                {"object": "embedding", "index": i, "embedding": _vector(t)}
                for i, t in enumerate(body["input"])
            ]
            raw = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        ep.url = f"{url}/v1"
        yield ep


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)


def _remote(endpoint: Endpoint, **more: Any) -> dict[str, Any]:
    return {
        "embedding_provider": "openai",
        "openai_base_url": endpoint.url,
        "openai_model": MODEL,
        "openai_dimensions": 384,
        **more,
    }


async def _recall(
    app: Starlette, tok: str, **variables: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recall's answer and the /readyz body, from the app running its lifespan."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            ready = await c.get("/readyz")
            assert ready.status_code == 200
            r = await c.post(
                "/graphql",
                json={"query": RECALL, "variables": variables},
                headers={"Authorization": f"Bearer {tok}"},
            )
    body = r.json()
    assert "errors" not in body, body
    result: dict[str, Any] = body["data"]["recallMemory"]
    return result, ready.json()


def _codes(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(d["frontier"], d["code"]) for d in result["degradations"]]


def _vector_lists(result: dict[str, Any], frontier: str) -> list[str]:
    return [x["status"] for x in result["searchStates"][frontier]["lists"] if x["list"] == "VECTOR"]


async def test_a_provider_of_another_model_never_meets_the_stores_vectors(
    dsn: str, writes: WriteService, endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """The session store holds the local model's vectors; the gateway is set to a
    working remote provider of another model with the same dimension."""
    team = unique("mm")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "bob")
    before = endpoint.calls()
    with caplog.at_level(logging.WARNING):
        result, ready = await _recall(
            app_for(dsn, **_remote(endpoint)), tok, q="who owns the billing service"
        )
    # Nothing was embedded: the question never met the store's vectors.
    assert endpoint.calls() == before
    assert ("EVIDENCE", "query_embedding_model_mismatch") in _codes(result)
    assert ("RELATIONSHIPS", "query_embedding_model_mismatch") in _codes(result)
    assert not any(c == "query_embedding_unavailable" for _, c in _codes(result))
    mismatch = [d for d in result["degradations"] if d["code"] == "query_embedding_model_mismatch"]
    assert all(d["optional"] for d in mismatch)
    assert f"openai:{MODEL}" in mismatch[0]["message"]
    states = result["searchStates"]
    assert states["evidence"]["status"] == "PARTIAL" and not states["evidence"]["complete"]
    assert set(_vector_lists(result, "evidence")) == {"SKIPPED"}
    assert states["relationships"]["status"] == "PARTIAL"
    assert _vector_lists(result, "relationships") == ["SKIPPED"]
    # The full-text list still answers.
    assert [r["evidenceId"] for r in result["results"]][:1] == ["ev-owner"]
    # /readyz and the start-up log name both models.
    assert ready["status"] == "degraded"
    assert f"openai:{MODEL}" in ready["reason"] and "all-MiniLM" in ready["reason"]
    started = [r.getMessage() for r in caplog.records if "store holds vectors" in r.getMessage()]
    assert started and f"openai:{MODEL}" in started[0]


@pytest_asyncio.fixture
async def remote_store(fresh_dsn: str, endpoint: Endpoint) -> AsyncIterator[tuple[str, str]]:
    """A store of its own whose vectors were made by the remote model; a team in it."""
    db = await Database.open(fresh_dsn, min_size=1, max_size=2)
    provider = create_provider(Settings(**_remote(endpoint)))
    try:
        writes = WriteService(db, provider)
        team = unique("remote")
        await load_jsonl(writes, jsonl(team_records(team)))
        yield fresh_dsn, await token(writes, team, "alice")
    finally:
        await provider.aclose()
        await db.close()


async def test_the_stores_own_model_compares_and_others_do_not(
    remote_store: tuple[str, str], endpoint: Endpoint
) -> None:
    dsn, tok = remote_store
    # The provider of the store's model: vector lists run, the search is complete.
    before = endpoint.calls()
    result, ready = await _recall(app_for(dsn, **_remote(endpoint)), tok, q="billing owner")
    assert endpoint.calls() == before + 1
    assert ready == {"status": "ready"}
    assert not any(c.startswith("query_embedding") for _, c in _codes(result))
    assert set(_vector_lists(result, "evidence")) == {"COMPLETE"}
    assert result["searchStates"]["evidence"]["complete"]

    # The same endpoint serving another model of the same dimension: skipped.
    other = _remote(endpoint, openai_model="another-model")
    result, ready = await _recall(app_for(dsn, **other), tok, q="billing owner")
    assert endpoint.calls() == before + 1
    assert ("EVIDENCE", "query_embedding_model_mismatch") in _codes(result)
    assert ready["status"] == "degraded"

    # A local model named explicitly, on this store of a remote model: skipped too
    # (with auto, such a gateway refuses to start, tested in test_embeddings.py).
    local = {"embedding_provider": "local", "embedding_model": "minilm"}
    result, ready = await _recall(app_for(dsn, **local), tok, q="billing owner")
    assert ("EVIDENCE", "query_embedding_model_mismatch") in _codes(result)
    assert set(_vector_lists(result, "evidence")) == {"SKIPPED"}
    assert ready["status"] == "degraded"

    # The store's model whose endpoint is down is another loss: unavailable.
    down = _remote(endpoint, openai_base_url="http://127.0.0.1:9/v1", openai_timeout_s=1.0)
    result, _ = await _recall(app_for(dsn, **down), tok, q="billing owner")
    assert ("EVIDENCE", "query_embedding_unavailable") in _codes(result)
    assert not result["searchStates"]["evidence"]["complete"]


def test_a_provider_that_follows_the_store_is_no_mismatch() -> None:
    """Under auto the provider switches at its next call: the store moving to another
    local model is not a mismatch; a model it cannot follow is."""
    minilm, e5 = by_key("minilm"), by_key("e5-small")

    def following(model: LocalModel, follow: bool) -> FollowingProvider:
        return FollowingProvider(model, model.make(8), follow=follow, batch_size=8)

    auto = StoreModel(following(minilm, True), minilm.model_id)
    assert auto.mismatch() is None
    auto.observe(e5.model_id)
    assert auto.mismatch() is None  # it embeds with e5 from its next call
    auto.observe("openai:text-embedding-3-small")
    assert auto.mismatch() is not None
    auto.observe(None)  # a store without vectors matches any model
    assert auto.mismatch() is None

    pinned = StoreModel(following(minilm, False), minilm.model_id)
    assert pinned.mismatch() is None
    pinned.observe(e5.model_id)
    assert e5.model_id in (pinned.mismatch() or "")
