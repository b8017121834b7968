"""The cyclic garbage collector's policy in a serving process.

Profiled under the throughput step (``recall_bench.py --throughput``, 2 workers,
8 clients; py-spy, docs/benchmarks.md), a worker spent about an eighth of its
CPU in ``gc_collect_main``: a full recall allocates a few thousand container
objects (decoded rows, fusion's exact scores, the result's objects), so with
CPython's default thresholds (700, 10, 10) the youngest generation is
collected about three times per recall and the oldest every few dozen recalls,
each oldest collection walking the whole start-up heap (the schema, the
tokenizer, the imported modules: over 100,000 objects, tens of milliseconds).
Almost everything a recall allocates is freed by reference counting when the
request ends; the collector finds next to nothing.

:func:`settle` runs once, when the process is ready to serve: it collects
what start-up left, then freezes the survivors (``gc.freeze``: they move to a
permanent generation that later collections skip, as they live as long as the
process anyway), and raises the youngest generation's threshold to
:data:`YOUNG_THRESHOLD`, so that the collector still runs, and still reclaims
cycles, but a few times less often. Nothing a request computes depends on it.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Allocations (net of deallocations) of container objects between two
collections of the youngest generation (CPython's default is 700)."""


def settle() -> None:
    """Collect, freeze what start-up left, and raise the young threshold."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
