"""Embedding providers: the real local model, and the HTTP provider against a real server.

The HTTP provider talks to a small ``http.server`` on 127.0.0.1 started here,
so the bytes on the wire, the retries and the connection errors are real.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from pydantic import SecretStr

from gateway.embeddings import (
    EmbeddingProvider,
    FollowingProvider,
    LocalEmbeddingProvider,
    OpenAIEmbeddingProvider,
    create_provider,
    validate_vectors,
)
from gateway.embeddings.local import (
    MODEL_ID,
    default_model_file,
    default_tokenizer_file,
)
from gateway.errors import ConfigurationError, EmbeddingError
from gateway.settings import Settings

from .loopback import serving

API_KEY = "sk-test-" + secrets.token_hex(8)


# --- the local model ----------------------------------------------------------------


async def test_local_vectors_are_unit_float32_rows(embedder: EmbeddingProvider) -> None:
    texts = ["The deploy was rolled back on Friday.", "Alice owns the billing service.", ""]
    vectors = await embedder.embed(texts)
    assert embedder.model == MODEL_ID
    assert embedder.dimensions == 384
    assert vectors.dtype == np.float32
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


async def test_local_is_deterministic(embedder: EmbeddingProvider) -> None:
    texts = ["Quarterly revenue grew by twelve percent.", "The cat sat on the mat."]
    assert np.array_equal(await embedder.embed(texts), await embedder.embed(texts))


async def test_local_paraphrase_is_closer_than_an_unrelated_sentence(
    embedder: EmbeddingProvider,
) -> None:
    anchor, paraphrase, unrelated = await embedder.embed(
        [
            "The database migration is scheduled for next Tuesday.",
            "We plan to migrate the database next Tuesday.",
            "Penguins live mostly in the southern hemisphere.",
        ]
    )
    assert float(anchor @ paraphrase) > float(anchor @ unrelated) + 0.3


async def test_local_batch_and_single_agree(embedder: EmbeddingProvider) -> None:
    texts = [
        "short",
        "A medium length sentence about the team offsite.",
        "word " * 600,  # beyond 256 tokens: truncated, not an error
        "Who decided to move the on-call rotation to weekly shifts, and why?",
    ]
    batch = await embedder.embed(texts)
    singles = np.vstack([await embedder.embed([t]) for t in texts])
    cosines = (batch * singles).sum(axis=1)
    assert (cosines > 0.999).all(), cosines


async def test_local_empty_input(embedder: EmbeddingProvider) -> None:
    vectors = await embedder.embed([])
    assert vectors.shape == (0, 384)
    assert vectors.dtype == np.float32


async def test_a_bare_string_is_refused(embedder: EmbeddingProvider) -> None:
    with pytest.raises(TypeError):
        await embedder.embed("one text, not a list")


async def test_local_inference_leaves_the_event_loop_free(embedder: EmbeddingProvider) -> None:
    texts = [f"Note {i}: the planning meeting moved to room {i % 7}." for i in range(128)]
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(0.002)
            ticks += 1

    task = asyncio.create_task(ticker())
    await embedder.embed(texts)
    done.set()
    await task
    assert ticks >= 10


async def test_local_loads_once_under_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = LocalEmbeddingProvider(batch_size=2)
    loads = 0
    real_load = provider._load

    def counting_load() -> Any:
        nonlocal loads
        loads += 1
        return real_load()

    monkeypatch.setattr(provider, "_load", counting_load)
    try:
        texts = ["alpha beta", "gamma", "delta epsilon zeta"]
        results, _ = await asyncio.gather(
            asyncio.gather(*(provider.embed(texts) for _ in range(4))),
            asyncio.gather(*(asyncio.to_thread(provider.load) for _ in range(4))),
        )
        assert loads == 1
        for other in results[1:]:
            assert np.array_equal(results[0], other)
    finally:
        await provider.aclose()
    with pytest.raises(EmbeddingError, match="closed"):
        await provider.embed(["after close"])


def _corrupt_copy(source: Path, target: Path) -> Path:
    shutil.copyfile(source, target)
    with target.open("r+b") as f:
        f.seek(target.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    return target


async def test_corrupted_model_file_is_refused(tmp_path: Path) -> None:
    corrupt = _corrupt_copy(default_model_file(), tmp_path / "model.onnx")
    provider = LocalEmbeddingProvider(model_path=corrupt)
    try:
        with pytest.raises(ConfigurationError) as caught:
            await provider.embed(["anything"])
    finally:
        await provider.aclose()
    assert str(corrupt) in caught.value.message
    assert "checksum" in caught.value.message
    assert caught.value.code == "CONFIGURATION_ERROR"


async def test_corrupted_tokenizer_file_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "original.json"
    source.write_bytes(default_tokenizer_file().read_bytes())
    corrupt = _corrupt_copy(source, tmp_path / "tokenizer.json")
    provider = LocalEmbeddingProvider(tokenizer_path=corrupt)
    try:
        with pytest.raises(ConfigurationError, match="checksum") as caught:
            provider.load()
    finally:
        await provider.aclose()
    assert str(corrupt) in caught.value.message


async def test_create_provider_picks_by_settings() -> None:
    local = create_provider(Settings(embedding_provider="local", embedding_batch_size=8))
    remote = create_provider(
        Settings(embedding_provider="openai", openai_model="m1", openai_dimensions=384)
    )
    try:
        # The local provider follows the store's model (gateway.embeddings.following).
        assert isinstance(local, FollowingProvider)
        assert isinstance(local.current, LocalEmbeddingProvider)
        assert isinstance(local, EmbeddingProvider)
        assert isinstance(remote, OpenAIEmbeddingProvider)
        assert remote.model == "openai:m1"
        assert remote.dimensions == 384
        assert isinstance(remote, EmbeddingProvider)
    finally:
        await local.aclose()
        await remote.aclose()


# --- validate_vectors ------------------------------------------------------------------


def test_validate_renormalises_rows() -> None:
    out = validate_vectors([[3.0, 4.0], [0.0, 2.0]], 2, 2)
    assert out.dtype == np.float32
    assert np.allclose(out, [[0.6, 0.8], [0.0, 1.0]])


@pytest.mark.parametrize(
    ("vectors", "count", "dims", "fragment"),
    [
        ([[1.0, 0.0]], 2, 2, "expected 2 vectors"),
        ([[1.0, 0.0, 0.0]], 1, 2, "expected 2 dimensions"),
        ([[0.0, 0.0]], 1, 2, "zero"),
        ([[float("nan"), 1.0]], 1, 2, "NaN"),
        ([[float("inf"), 1.0]], 1, 2, "NaN or infinite"),
        ([["0.1", "0.2"]], 1, 2, "non-numeric"),
        ([[None, 1.0]], 1, 2, "non-numeric"),
        ([[1.0, 2.0], [1.0]], 2, 2, "numeric matrix"),
        ([1.0, 2.0], 1, 2, "expected 1 vectors"),
    ],
)
def test_validate_refuses(vectors: object, count: int, dims: int, fragment: str) -> None:
    with pytest.raises(EmbeddingError, match=fragment):
        validate_vectors(vectors, count, dims)


# --- the HTTP provider against a real server ----------------------------------------


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeEndpoint:
    """A real HTTP server whose behaviour is chosen by the first path segment."""

    url: str
    requests: list[Recorded] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def base(self, scenario: str) -> str:
        """A base URL of its own, so hit counts never mix between tests."""
        return f"{self.url}/{scenario}-{secrets.token_hex(4)}"

    def calls(self, base_url: str) -> list[Recorded]:
        prefix = base_url.removeprefix(self.url)
        return [r for r in self.requests if r.path.startswith(prefix + "/")]


def _vector(i: int, dims: int) -> list[float]:
    """Deterministic, not unit length: the provider has to normalise it."""
    return [float(i + 1)] + [0.5 * (j % 3) for j in range(1, dims)]


def _answer(endpoint: FakeEndpoint, segment: str, body: Any) -> tuple[int, dict[str, str], bytes]:
    scenario = segment.rsplit("-", 1)[0]
    with endpoint.lock:
        hit = endpoint.hits.get(segment, 0) + 1
        endpoint.hits[segment] = hit
    texts = body["input"]
    dims = body["dimensions"]
    data: list[dict[str, Any]] = [
        {"object": "embedding", "index": i, "embedding": _vector(i, dims)}
        for i in range(len(texts))
    ]
    data.reverse()  # the protocol orders by index, not by position
    json_headers = {"Content-Type": "application/json"}
    if scenario == "flaky" and hit == 1:
        return 500, json_headers, b'{"error": {"message": "boom"}}'
    if scenario == "ratelimited" and hit == 1:
        return 429, {**json_headers, "Retry-After": "0"}, b'{"error": {"message": "slow down"}}'
    if scenario == "down":
        return 503, json_headers, b'{"error": {"message": "down"}}'
    if scenario == "unauthorized":
        return 401, json_headers, b'{"error": {"message": "bad key"}}'
    if scenario == "wrongdim":
        for item in data:
            item["embedding"] = item["embedding"][:-1]
    if scenario == "wrongcount":
        data = data[1:]
    if scenario == "nan":
        data[0]["embedding"][0] = float("nan")
    if scenario == "strings":
        data[0]["embedding"] = [str(x) for x in data[0]["embedding"]]
    if scenario == "notjson":
        return 200, {"Content-Type": "text/plain"}, b"not json at all"
    payload = {"object": "list", "data": data, "model": body["model"]}
    return 200, json_headers, json.dumps(payload).encode()


@pytest.fixture(scope="session")
def endpoint() -> Iterator[FakeEndpoint]:
    holder: list[FakeEndpoint] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            ep = holder[0]
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            with ep.lock:
                ep.requests.append(Recorded(self.path, dict(self.headers.items()), body))
            segments = self.path.strip("/").split("/")
            headers: dict[str, str] = {}
            status, raw = 404, b""
            if len(segments) == 2 and segments[1] == "embeddings":
                status, headers, raw = _answer(ep, segments[0], body)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        holder.append(FakeEndpoint(url))
        yield holder[0]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx honours proxy variables; the test server is local."""
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)


def _remote(
    base_url: str, *, dims: int = 8, batch_size: int = 64, key: str | None = API_KEY
) -> OpenAIEmbeddingProvider:
    return OpenAIEmbeddingProvider(
        model_name="text-embedding-3-small",
        dimensions=dims,
        base_url=base_url,
        api_key=SecretStr(key) if key is not None else None,
        timeout_s=2.0,
        batch_size=batch_size,
        backoff_s=0.01,
    )


def _expected(count: int, dims: int) -> npt.NDArray[np.float64]:
    rows = np.array([_vector(i, dims) for i in range(count)], dtype=np.float64)
    unit: npt.NDArray[np.float64] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return unit


async def test_http_good_response(endpoint: FakeEndpoint) -> None:
    base = endpoint.base("good")
    provider = _remote(base)
    try:
        vectors = await provider.embed(["first text", "second text", "third"])
    finally:
        await provider.aclose()
    with pytest.raises(EmbeddingError, match="closed"):
        await provider.embed(["after close"])
    assert provider.model == "openai:text-embedding-3-small"
    assert vectors.dtype == np.float32
    assert vectors.shape == (3, 8)
    assert np.allclose(vectors, _expected(3, 8), atol=1e-6)  # reordered by index
    (call,) = endpoint.calls(base)
    assert call.path.endswith("/embeddings")
    assert call.body == {
        "model": "text-embedding-3-small",
        "input": ["first text", "second text", "third"],
        "dimensions": 8,
        "encoding_format": "float",
    }
    headers = {k.lower(): v for k, v in call.headers.items()}
    assert headers["authorization"] == f"Bearer {API_KEY}"
    assert headers["content-type"] == "application/json"


async def test_http_batches_and_keeps_order(endpoint: FakeEndpoint) -> None:
    base = endpoint.base("good")
    provider = _remote(base, batch_size=2, key=None)
    texts = ["a", "b", "c", "d", "e"]
    try:
        vectors = await provider.embed(texts)
    finally:
        await provider.aclose()
    calls = endpoint.calls(base)
    assert [c.body["input"] for c in calls] == [["a", "b"], ["c", "d"], ["e"]]
    assert all("authorization" not in {k.lower() for k in c.headers} for c in calls)
    expected = np.vstack([_expected(2, 8), _expected(2, 8), _expected(1, 8)])
    assert np.allclose(vectors, expected, atol=1e-6)


async def test_http_through_create_provider(endpoint: FakeEndpoint) -> None:
    base = endpoint.base("good")
    settings = Settings(
        embedding_provider="openai",
        openai_base_url=base + "/",
        openai_api_key=SecretStr(API_KEY),
        openai_model="custom-model",
        openai_dimensions=384,
        embedding_batch_size=3,
    )
    provider = create_provider(settings)
    try:
        vectors = await provider.embed(["x"] * 4)
    finally:
        await provider.aclose()
    assert vectors.shape == (4, 384)
    assert provider.model == "openai:custom-model"
    assert [c.body["model"] for c in endpoint.calls(base)] == ["custom-model", "custom-model"]


async def test_http_empty_input_makes_no_request(endpoint: FakeEndpoint) -> None:
    base = endpoint.base("good")
    provider = _remote(base)
    try:
        assert (await provider.embed([])).shape == (0, 8)
    finally:
        await provider.aclose()
    assert endpoint.calls(base) == []


@pytest.mark.parametrize(
    ("scenario", "fragment"),
    [
        ("wrongdim", "expected 8 dimensions"),
        ("wrongcount", "expected 3 embeddings"),
        ("nan", "NaN"),
        ("strings", "non-numeric"),
        ("notjson", "not JSON"),
    ],
)
async def test_http_malformed_responses(
    endpoint: FakeEndpoint, scenario: str, fragment: str
) -> None:
    base = endpoint.base(scenario)
    provider = _remote(base)
    try:
        with pytest.raises(EmbeddingError, match=fragment) as caught:
            await provider.embed(["one", "two", "three"])
    finally:
        await provider.aclose()
    assert caught.value.code == "EMBEDDING_UNAVAILABLE"
    assert len(endpoint.calls(base)) == 1  # a bad answer is not retried


@pytest.mark.parametrize("scenario", ["flaky", "ratelimited"])
async def test_http_retries_then_succeeds(
    endpoint: FakeEndpoint, scenario: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    base = endpoint.base(scenario)
    provider = _remote(base)
    try:
        vectors = await provider.embed(["retry me"])
    finally:
        await provider.aclose()
    assert vectors.shape == (1, 8)
    assert len(endpoint.calls(base)) == 2
    assert "retrying" in caplog.text
    assert API_KEY not in caplog.text


async def test_http_gives_up_after_two_retries(endpoint: FakeEndpoint) -> None:
    base = endpoint.base("down")
    provider = _remote(base)
    try:
        with pytest.raises(EmbeddingError, match="HTTP 503 after 3 attempts"):
            await provider.embed(["anyone there?"])
    finally:
        await provider.aclose()
    assert len(endpoint.calls(base)) == 3


async def test_http_401_is_not_retried(endpoint: FakeEndpoint) -> None:
    base = endpoint.base("unauthorized")
    provider = _remote(base)
    try:
        with pytest.raises(EmbeddingError, match="HTTP 401") as caught:
            await provider.embed(["let me in"])
    finally:
        await provider.aclose()
    assert len(endpoint.calls(base)) == 1
    assert API_KEY not in caught.value.message


async def test_http_closed_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    provider = _remote(f"http://127.0.0.1:{port}/v1")
    try:
        with pytest.raises(EmbeddingError, match="cannot reach") as caught:
            await provider.embed(["hello?"])
    finally:
        await provider.aclose()
    assert caught.value.code == "EMBEDDING_UNAVAILABLE"


def test_http_base_url_must_be_http() -> None:
    with pytest.raises(ConfigurationError):
        OpenAIEmbeddingProvider(model_name="m", dimensions=8, base_url="api.example.com/v1")
