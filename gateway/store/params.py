"""Building blocks of generated SQL text: numbered bind parameters and constants.

The candidate statements of recall (``search``) and of relationship discovery
(``related``) are assembled from parts; both bind every value as a parameter
so that the text depends only on the shape of the search, never on values,
and asyncpg's statement cache keeps a handful of prepared statements.
"""

from __future__ import annotations

from typing import Any


class Params:
    """Numbered bind parameters: each value is bound once, then referred to by key."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._refs: dict[str, str] = {}

    def bind(self, key: str, value: Any, sql_type: str) -> None:
        self.values.append(value)
        self._refs[key] = f"${len(self.values)}::{sql_type}"

    def __getitem__(self, key: str) -> str:
        return self._refs[key]

    def numbers(self) -> dict[str, int]:
        """Each key's parameter number (``$n``): a combined statement that computes a
        value in SQL puts its expression there (gateway/store/round_trips.py)."""
        return {key: int(ref[1:].split("::", 1)[0]) for key, ref in self._refs.items()}


def float_literal(value: float) -> str:
    """A float8 literal for a module constant (never user input)."""
    return f"CAST({float(value)!r} AS double precision)"
