"""A provider for any OpenAI-compatible ``POST /embeddings`` endpoint.

Written against the HTTP contract rather than an SDK so that self-hosted
servers speaking the same protocol work too and no dependency is added. The
answer is trusted for nothing: order comes from ``data[*].index``, and every
vector goes through :func:`validate_vectors`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
from pydantic import SecretStr

from gateway.embeddings.base import Vectors, check_texts, chunked, empty, validate_vectors
from gateway.errors import ConfigurationError, EmbeddingError, EmbeddingMalformed

log = logging.getLogger(__name__)

# Worth another try: the request probably never reached the model, or the
# server said "later". Timeouts are not retried: they already spent the budget.
_RETRY_EXCEPTIONS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)
_MAX_RETRY_AFTER_S = 2.0


def _retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


class OpenAIEmbeddingProvider:
    """Embeddings over HTTP, batched, with a couple of quick retries.

    Retries are few and short on purpose: the caller is usually a write
    transaction holding locks, and a provider that is down for longer than a
    second should fail the batch, not stall it.
    """

    def __init__(
        self,
        *,
        model_name: str,
        dimensions: int,
        base_url: str = "https://api.openai.com/v1",
        api_key: SecretStr | None = None,
        timeout_s: float = 10.0,
        batch_size: int = 64,
        max_retries: int = 2,
        backoff_s: float = 0.25,
    ) -> None:
        if batch_size < 1 or dimensions < 1 or max_retries < 0:
            raise ValueError("batch_size and dimensions must be positive, max_retries >= 0")
        url = httpx.URL(base_url.rstrip("/") + "/embeddings")
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigurationError(
                "openai_base_url must be an http(s) URL, like https://api.openai.com/v1"
            )
        self.model = "openai:" + model_name
        self.dimensions = dimensions
        self._model_name = model_name
        self._url = url
        self._batch_size = batch_size
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        headers = {"Accept": "application/json"}
        if api_key is not None and api_key.get_secret_value():
            # httpx masks this header in reprs; it is never logged here.
            headers["Authorization"] = "Bearer " + api_key.get_secret_value()
        self._client = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(timeout_s), follow_redirects=False
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dimensions)
        if self._client.is_closed:
            raise EmbeddingError("the embedding provider is closed")
        parts = [await self._embed_batch(list(batch)) for batch in chunked(items, self._batch_size)]
        return np.concatenate(parts, axis=0)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _embed_batch(self, texts: list[str]) -> Vectors:
        body = {
            "model": self._model_name,
            "input": texts,
            "dimensions": self.dimensions,
            "encoding_format": "float",
        }
        response = await self._post(body)
        try:
            payload = response.json()
        except ValueError as exc:
            raise EmbeddingError(
                "the embeddings endpoint answered something that is not JSON"
            ) from exc
        return validate_vectors(
            _ordered_embeddings(payload, len(texts)), len(texts), self.dimensions
        )

    async def _post(self, body: dict[str, Any]) -> httpx.Response:
        """The first usable response; retries only what may succeed on a second try."""
        for attempt in range(self._max_retries + 1):
            last = attempt == self._max_retries
            try:
                response = await self._client.post(self._url, json=body)
            except _RETRY_EXCEPTIONS as exc:
                if last:
                    raise EmbeddingError(
                        f"cannot reach the embeddings endpoint at {self._url.host} "
                        f"({type(exc).__name__}) after {attempt + 1} attempts"
                    ) from exc
                delay = self._backoff_s * 2**attempt
                log.warning(
                    "embeddings endpoint %s: %s, retrying in %.2fs",
                    self._url.host,
                    type(exc).__name__,
                    delay,
                )
            except httpx.TimeoutException as exc:
                raise EmbeddingError(
                    f"the embeddings endpoint at {self._url.host} timed out ({type(exc).__name__})"
                ) from exc
            except httpx.HTTPError as exc:
                raise EmbeddingError(
                    f"request to the embeddings endpoint failed ({type(exc).__name__})"
                ) from exc
            else:
                if response.is_success:
                    return response
                status = response.status_code
                if not _retryable_status(status) or last:
                    raise EmbeddingError(_status_message(status, attempt + 1))
                delay = max(self._backoff_s * 2**attempt, _retry_after(response))
                log.warning(
                    "embeddings endpoint %s: HTTP %d, retrying in %.2fs",
                    self._url.host,
                    status,
                    delay,
                )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


def _status_message(status: int, attempts: int) -> str:
    # Only the status: an upstream error body may echo what it was sent.
    message = f"the embeddings endpoint answered HTTP {status}"
    if status in (401, 403):
        message += " (check RECALL_OPENAI_API_KEY)"
    if attempts > 1:
        message += f" after {attempts} attempts"
    return message


def _retry_after(response: httpx.Response) -> float:
    """The server's requested delay in seconds, capped: a long wait is a failure."""
    try:
        value = float(response.headers.get("Retry-After", "0"))
    except ValueError:  # the HTTP-date form: not worth parsing for a 2 s cap
        return 0.0
    return min(max(value, 0.0), _MAX_RETRY_AFTER_S)


def _ordered_embeddings(payload: object, count: int) -> list[object]:
    """``data[*].embedding`` in input order, as the protocol defines it by ``index``."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise EmbeddingMalformed("the embeddings response has no 'data' list")
    if len(data) != count:
        raise EmbeddingMalformed(f"expected {count} embeddings, the endpoint returned {len(data)}")
    ordered: list[object] = [None] * count
    for item in data:
        index = item.get("index") if isinstance(item, dict) else None
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise EmbeddingMalformed(f"embedding item with missing or invalid index {index!r}")
        if ordered[index] is not None:
            raise EmbeddingMalformed(f"embedding index {index} appears twice")
        embedding = item.get("embedding")
        if not isinstance(embedding, list):
            raise EmbeddingMalformed(f"embedding {index} is not a list of floats")
        ordered[index] = embedding
    return ordered
