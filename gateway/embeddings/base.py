"""The one small interface every embedding provider meets, and the checks they share.

The store keeps exactly one model's vectors and compares them by cosine, so a
provider's answer is only usable when it has the right shape, holds finite
numbers and has unit rows. Every provider, local or remote, runs its output
through :func:`validate_vectors` so that nothing else ever has to doubt a vector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from gateway.errors import EmbeddingError, EmbeddingMalformed

T = TypeVar("T")

Vectors: TypeAlias = npt.NDArray[np.float32]
"""Rows of one embedding each, float32, shape ``(n, dimensions)``."""

# Below this a row has no direction worth trusting (a float32 zero vector, or
# one so small that normalising it would only amplify rounding noise).
_MIN_NORM = 1e-12


@runtime_checkable
class EmbeddingProvider(Protocol):
    """What the write and recall services need from an embedding model.

    A Protocol rather than a base class so that a test double or a future
    provider needs no import from here to fit.
    """

    @property
    def model(self) -> str:
        """Stable identifier stored next to every vector; a change means a new vector space.

        Read-only in the Protocol: a wrapper may answer with the model it
        delegates to now (it may change when the store moves to another model).
        """
        ...

    @property
    def dimensions(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """One unit-length float32 row per text, in input order; ``(0, dimensions)`` for none."""
        ...

    async def aclose(self) -> None:
        """Release threads, sessions and connections; the provider is unusable after."""
        ...


async def embed_queries(provider: EmbeddingProvider, texts: Sequence[str]) -> Vectors:
    """Vectors of search questions, for recall.

    Asymmetric models (E5) embed a question differently from a document; such
    a provider has an ``embed_queries`` method. Every other provider embeds
    both sides alike, so the Protocol stays as small as it was.
    """
    queries = getattr(provider, "embed_queries", None)
    if callable(queries):
        vectors: Vectors = await queries(texts)
        return vectors
    return await provider.embed(texts)


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list, refusing a bare ``str``.

    A ``str`` is itself a ``Sequence[str]``: without this check ``embed("hello")``
    would quietly embed five one-letter texts.
    """
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not a single str")
    items = list(texts)
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"text {i} is {type(text).__name__}, not str")
    return items


def chunked(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Consecutive slices of at most ``size`` items (``itertools.batched`` is 3.12+)."""
    if size < 1:
        raise ValueError("batch size must be at least 1")
    for start in range(0, len(items), size):
        yield items[start : start + size]


async def in_length_batches(
    items: Sequence[str],
    dimensions: int,
    batch_size: int,
    run: Callable[[list[str]], Awaitable[Vectors]],
) -> Vectors:
    """``run`` over batches of texts of similar length, rows back in input order.

    A batch is padded to its longest text, so sorting by length first saves
    the local models most of their padding work.
    """
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    out = np.empty((len(items), dimensions), dtype=np.float32)
    for indices in chunked(order, batch_size):
        out[list(indices)] = await run([items[i] for i in indices])
    return out


def token_batches(lengths: Sequence[int], max_texts: int, max_tokens: int) -> list[list[int]]:
    """Indices of texts grouped shortest first, each group's padded size within a budget.

    A batch costs its size times its longest text in tokens (everything is
    padded to the longest), and on a CPU a large padded batch costs more per
    text than a small one: the attention matrices grow with the square of the
    length and fall out of the caches. So a group holds at most ``max_texts``
    texts and, unless it is a single text, at most ``max_tokens`` padded
    tokens: long texts go alone, short ones in groups.
    """
    if max_texts < 1 or max_tokens < 1:
        raise ValueError("max_texts and max_tokens must be at least 1")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # sorted: the newcomer is the longest of the group
        if current and (len(current) >= max_texts or (len(current) + 1) * lengths[i] > max_tokens):
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups


class InferenceThread:
    """The worker thread(s) a local model runs in.

    One thread by default, because each run already uses the cores it is
    given: concurrent requests queue rather than oversubscribe them, and a
    large input goes in one batch at a time so that a query can slip in
    between the batches of a bulk load. A provider whose runtime takes
    concurrent runs may give its bulk work a pool of ``workers`` of its own.
    """

    def __init__(self, name: str, what: str, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.what = what
        self.closed = False
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except RuntimeError as exc:  # the executor refuses work after close()
            if self.closed:
                raise EmbeddingError(f"{self.what} is closed") from exc
            raise

    def check_open(self) -> None:
        if self.closed:
            raise EmbeddingError(f"{self.what} is closed")

    def close(self) -> None:
        # Queued batches are not cancelled (their callers would see a bare
        # CancelledError): they find the provider closed and say so.
        self.closed = True
        self._executor.shutdown(wait=False)


def empty(dimensions: int) -> Vectors:
    """The answer for no texts, with the right width so callers can still slice and stack."""
    return np.empty((0, dimensions), dtype=np.float32)


def validate_vectors(vectors: object, expected_count: int, dimensions: int) -> Vectors:
    """Check a provider's raw answer and return it as unit-length float32 rows.

    Accepts an array or nested lists (parsed JSON). Anything that is not a
    ``(expected_count, dimensions)`` block of finite real numbers with a non-zero
    norm per row raises :class:`EmbeddingError`: a bad vector written to the
    store would silently corrupt every later recall, so it is refused here.
    Rows are re-normalised in float64 because remote providers round their
    output and cosine scores assume exactly unit rows.
    """
    try:
        raw = np.asarray(vectors)
    except (TypeError, ValueError) as exc:  # ragged lists and the like
        raise EmbeddingMalformed(f"embedding response is not a numeric matrix ({exc})") from exc
    # Numbers only: np.asarray(..., dtype=float) would accept "0.1" or True.
    if raw.size and raw.dtype.kind not in "iuf":
        raise EmbeddingMalformed(f"embedding response holds non-numeric values ({raw.dtype})")
    if expected_count == 0 and raw.size == 0:
        return empty(dimensions)
    if raw.ndim != 2 or raw.shape[0] != expected_count:
        raise EmbeddingMalformed(
            f"expected {expected_count} vectors, got an array of shape {raw.shape}"
        )
    if raw.shape[1] != dimensions:
        raise EmbeddingMalformed(f"expected {dimensions} dimensions, got {raw.shape[1]}")
    block = raw.astype(np.float64, copy=False)
    finite = np.isfinite(block).all(axis=1)
    if not finite.all():
        rows = np.flatnonzero(~finite).tolist()
        raise EmbeddingMalformed(f"embedding rows {rows[:5]} contain NaN or infinite values")
    norms = np.linalg.norm(block, axis=1, keepdims=True)
    unusable = ~np.isfinite(norms[:, 0]) | (norms[:, 0] < _MIN_NORM)
    if unusable.any():
        rows = np.flatnonzero(unusable).tolist()
        raise EmbeddingMalformed(f"embedding rows {rows[:5]} are zero vectors (or overflow)")
    return np.ascontiguousarray(block / norms, dtype=np.float32)
