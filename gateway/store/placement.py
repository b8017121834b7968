"""Several statements' parameters numbered for one combined statement.

A combined statement sends the SQL of several parts in one round trip, each
part keeping its own text and its own ``$1``, ``$2``... (the module that owns
the part stays the one place of its rules). :class:`Placer` renumbers each
part's parameters after the parts placed before it, binding each of them
once, or puts a SQL expression in a parameter's place (a value another part
of the statement computes, or a parameter an earlier part already bound).
Its users: a recall's rounds (gateway/store/round_trips.py) and a write's
idempotency claim with the lookups its checks start with
(gateway/store/writes.py, :func:`claim_write`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Placer"]

_PARAM = re.compile(r"\$(\d+)")

_PLACED_MAX = 512
_PLACED: dict[
    tuple[str, tuple[tuple[int, str], ...], int, tuple[tuple[int, str], ...]],
    tuple[str, tuple[int, ...], tuple[tuple[int, str], ...]],
] = {}
"""Placements already made: (part SQL, its expressions, parameters bound before,
the part's numbers so far) -> (rewritten SQL, the part's parameter numbers bound
by it in order, the part's numbers after). The rewriting depends on nothing
else, and a recall's statements take a handful of shapes, so the regular
expression runs once per shape and process, not about 240 times per recall
(0.2-0.3 ms of a worker's CPU per full recall; docs/benchmarks.md, "Worker CPU
per recall at 100k")."""


def _place(
    sql: str, given: Mapping[int, str], bound: int, numbers: Mapping[int, str]
) -> tuple[str, tuple[int, ...], tuple[tuple[int, str], ...]]:
    """One part's SQL with its ``$n`` renumbered (see ``Placer.part``), the part's
    parameter numbers newly bound, and the part's numbers afterwards."""
    mine = dict(numbers)
    added: list[int] = []

    def sub(m: re.Match[str]) -> str:
        n = int(m.group(1))
        if n in given:
            return given[n]
        if n not in mine:
            added.append(n)
            mine[n] = f"${bound + len(added)}"
        return mine[n]

    return _PARAM.sub(sub, sql), tuple(added), tuple(mine.items())


class Placer:
    """Parameters of several statements, numbered for one combined statement."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def part(
        self, args: Sequence[Any], exprs: Mapping[int, str] | None = None
    ) -> Callable[[str], str]:
        """A function that rewrites one part's SQL: its ``$n`` become the combined
        statement's numbers (bound once per part), or the SQL expression
        ``exprs[n]`` (a value that another part computes). A ``$n`` past ``args``
        and not in ``exprs`` is refused (ValueError) where the SQL is placed:
        bound, it would take another part's argument without a word."""
        numbers: dict[int, str] = {}
        given = exprs or {}
        given_key = tuple(given.items())

        def place(sql: str) -> str:
            key = (sql, given_key, len(self.args), tuple(numbers.items()))
            placed = _PLACED.get(key)
            if placed is None:
                placed = _place(sql, given, len(self.args), numbers)
                if len(_PLACED) >= _PLACED_MAX:
                    _PLACED.clear()
                _PLACED[key] = placed
            text, added, after = placed
            wrong = [n for n in added if not 1 <= n <= len(args)]
            if wrong:
                raise ValueError(
                    f"a part's SQL names ${wrong[0]} and was given {len(args)} argument(s)"
                )
            self.args.extend(args[n - 1] for n in added)
            numbers.update(after)
            return text

        return place
