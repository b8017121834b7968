"""Parsed documents and their validation answers: one cache, bounded in bytes.

Clients send the same few documents with different variables, so a process
keeps each document it parsed and, once validated, the validation's answer
(its errors, or none), keyed by the text, the parse options (the token limit
among them) and the rules it was validated under (the other limits), so that
an answer is never served under other limits, even from a cache shared by two
validators. It is bounded by an estimate of the memory its entries hold, not
by their number: a parsed document's tokens stay reachable from its nodes'
locations, so an entry holds the text and a few hundred bytes per token. By
count, 256 entries of the largest documents the limits admit (a body of 1 MiB,
5,000 tokens of about 600 bytes each parsed) could hold about a gigabyte.

Measured with ``tracemalloc`` on graphql-core 3.3 (a parse of each document
alone): 187 bytes per token for a document that is mostly comments, 314 for
deep nesting, 371 to 487 for the benchmark's recall documents, 607 for a flat
list of 5,000 fields; :data:`TOKEN_BYTES` rounds the largest up. Text is held
more than once: each name or string token keeps its own copy of its characters
(the nodes share it), so the text is counted :data:`TEXT_COPIES` times; and a validation error
quotes names in full (``Cannot query field 'aaa...' on type 'Query'``), so each
kept error counts its message's size besides :data:`ERROR_BYTES`. A review
measured a kept refusal of one 400 KB unknown field name at 3.2 times the
former estimate (the text once, no messages); tests/test_limits.py checks with
``tracemalloc`` that the estimate is at least the memory an entry retains for
such documents.

A document whose estimate is above ``max_entry_bytes`` is parsed and validated
every time and never kept, so that one large document cannot push out many
small ones. A document that does not parse is never kept either (its error is
raised, and strawberry reports it with its code). The cache is only touched on
the event loop's thread; validation may run in a worker thread, but its answer
is stored back on the loop.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from graphql import DocumentNode, GraphQLError, Token, parse

TOKEN_BYTES = 640
"""Estimated bytes a parsed token holds (its token object and its share of the
nodes); see the module doc for the measurements."""

TEXT_COPIES = 3
"""Times the text is counted: the text, its characters again in the name and
string tokens' values, and a margin measured for string values (a kept document
of one 250 KB string retained 2.4 times its text besides its error's message)."""

ERROR_BYTES = 1024
"""Estimated bytes of one validation error kept with its document besides its
message's (its object, locations and extensions; the nodes it points to are the
document's own)."""

MAX_BYTES = 16 * 1024 * 1024
"""Budget of the cache per process (estimated bytes): about 400 documents the
size of the benchmark's full recall (64 tokens, about 41 KB estimated)."""

MAX_ENTRY_BYTES = 1024 * 1024
"""Largest estimate kept (a sixteenth of the budget): about 1,600 tokens. A
maximal recallMemory document (every field, 213 selections) has about 300."""

Key = tuple[str, tuple[tuple[str, Any], ...], Hashable]


@dataclass(slots=True)
class _Entry:
    document: DocumentNode
    weight: int
    errors: list[GraphQLError] | None = None
    """The validation's answer for ``document``; None until validated."""


def _tokens(document: DocumentNode, text: str) -> int:
    """Tokens of a parsed document (its token list, comments included); without
    locations (``no_location``), the length of the text, which no count exceeds."""
    if document.loc is None:
        return len(text)
    count = 0
    token: Token | None = document.loc.start_token
    while token is not None:
        count += 1
        token = token.next
    return count


def error_bytes(errors: list[GraphQLError]) -> int:
    """Estimated bytes of kept validation errors: their messages quote names."""
    return sum(ERROR_BYTES + sys.getsizeof(e.message) for e in errors)


class Documents:
    """An LRU of parsed documents and their validation answers, bounded in bytes."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_entry_bytes: int = MAX_ENTRY_BYTES) -> None:
        self.max_bytes = max_bytes
        self.max_entry_bytes = min(max_entry_bytes, max_bytes)
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self.bytes = 0
        """The estimated bytes held now (never above ``max_bytes``)."""
        self.parsed = 0
        """Documents parsed (misses), for tests and curiosity."""
        self.validated = 0
        """Documents validated (answers not found here)."""

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(text: str, options: dict[str, Any], rules: Hashable) -> Key:
        """The entry of ``text`` parsed with ``options`` and validated under
        ``rules`` (a validator's rules, which an answer depends on)."""
        return text, tuple(sorted(options.items())), rules

    def parse(self, text: str, rules: Hashable, **options: Any) -> DocumentNode:
        """The document of ``text`` (graphql-core's ``parse`` with ``options``),
        from the cache or parsed and kept if it fits, in the entry of ``rules``.
        A parse error is raised and nothing is kept."""
        key = self.key(text, options, rules)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry.document
        document = parse(text, **options)
        self.parsed += 1
        weight = TEXT_COPIES * sys.getsizeof(text) + TOKEN_BYTES * _tokens(document, text)
        if weight <= self.max_entry_bytes:
            self._entries[key] = _Entry(document, weight)
            self.bytes += weight
            self._trim()
        return document

    def errors(self, key: Key, document: DocumentNode) -> list[GraphQLError] | None:
        """The kept validation answer for this very ``document``, or None."""
        entry = self._entries.get(key)
        if entry is None or entry.document is not document or entry.errors is None:
            return None
        self._entries.move_to_end(key)
        return entry.errors

    def keep_errors(self, key: Key, document: DocumentNode, errors: list[GraphQLError]) -> None:
        """Keep the validation answer of ``document`` with it, if it is still kept
        (and the answer fits the entry's bound); otherwise forget it."""
        self.validated += 1
        entry = self._entries.get(key)
        if entry is None or entry.document is not document or entry.errors is not None:
            return
        extra = error_bytes(errors)
        if entry.weight + extra > self.max_entry_bytes:
            return
        entry.errors = errors
        entry.weight += extra
        self.bytes += extra
        self._trim()

    def _trim(self) -> None:
        while self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.weight
