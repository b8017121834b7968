"""Combined statements' parameter placement (gateway/store/round_trips.py ``_Placer``):
rewritten once per statement shape, and the same text and arguments as the
rewriting done anew every time."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.services.writes import WriteService
from gateway.store import round_trips

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import recall, token

_PARAM = re.compile(r"\$(\d+)")


class ReferencePlacer:
    """The placement as it was before the cache: the regular expression every time."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def part(
        self, args: Sequence[Any], exprs: Mapping[int, str] | None = None
    ) -> Callable[[str], str]:
        numbers: dict[int, str] = {}
        given_exprs = exprs or {}

        def place(sql: str) -> str:
            def sub(m: re.Match[str]) -> str:
                n = int(m.group(1))
                if n in given_exprs:
                    return given_exprs[n]
                if n not in numbers:
                    self.args.append(args[n - 1])
                    numbers[n] = f"${len(self.args)}"
                return numbers[n]

            return _PARAM.sub(sub, sql)

        return place


# a part: its SQL texts (placed one after the other) over parameters 1..5, and the
# numbers replaced by an expression
_SQL = st.lists(st.integers(1, 5), min_size=0, max_size=6).map(
    lambda ns: " AND ".join(f"c{i} = ${n}" for i, n in enumerate(ns)) or "SELECT 1"
)
_PART = st.tuples(
    st.lists(_SQL, min_size=1, max_size=3),
    st.dictionaries(st.integers(1, 5), st.sampled_from(["now()", "ARRAY(SELECT 1)"]), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PART, min_size=1, max_size=4))
def test_same_text_and_arguments_as_placing_anew(parts: list[Any]) -> None:
    for _ in range(2):  # the second time from the cache
        mine, reference = round_trips._Placer(), ReferencePlacer()
        texts, expected = [], []
        for k, (sqls, exprs) in enumerate(parts):
            args = [f"p{k}.{i}" for i in range(1, 6)]
            place, ref = mine.part(args, exprs), reference.part(args, exprs)
            texts += [place(sql) for sql in sqls]
            expected += [ref(sql) for sql in sqls]
        assert texts == expected
        assert mine.args == reference.args


class CountingPattern:
    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.subs = 0

    def sub(self, repl: Any, text: str) -> str:
        self.subs += 1
        return self.pattern.sub(repl, text)


async def test_a_repeated_recall_rewrites_no_statement(
    client: httpx.AsyncClient, writes: WriteService, monkeypatch: Any
) -> None:
    team = unique("placed")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    counting = CountingPattern(round_trips._PARAM)
    monkeypatch.setattr(round_trips, "_PARAM", counting)
    first = await recall(client, tok, q="billing service owned", limit=10)
    assert counting.subs > 0 or round_trips._PLACED  # placed now, or by an earlier test
    counting.subs = 0
    again = await recall(client, tok, q="billing service owned", limit=10)
    assert counting.subs == 0
    assert [r["evidenceId"] for r in again["results"]] == [
        r["evidenceId"] for r in first["results"]
    ]
