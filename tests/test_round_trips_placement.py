"""Combined statements' parameter placement (gateway/store/placement.py ``Placer``,
used by gateway/store/round_trips.py and by a write's idempotency claim):
rewritten once per statement shape, the same text and arguments as the
rewriting done anew every time, and a parameter a part was not given refused."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from gateway.services.writes import WriteService
from gateway.store import placement
from gateway.store import writes as store
from gateway.store.database import Database

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
        mine, reference = placement.Placer(), ReferencePlacer()
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
    client: httpx.AsyncClient,
    gateway_app: Starlette,
    writes: WriteService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    team = unique("placed")
    await load_jsonl(writes, jsonl(team_records(team)))
    tok = await token(writes, team, "alice")
    # A cache of its own: one that earlier tests (the property above) filled to its
    # bound would be emptied in the middle of the recalls below.
    monkeypatch.setattr(placement, "_PLACED", {})
    # A new question's recall sends the scope round with the full-text lists and
    # then the vector round; once its embedding is in the LRU, the scope round
    # with every list, another shape. Every recall here is of a new question (the
    # LRU emptied).
    embeddings = gateway_app.state.services.recall.embeddings
    embeddings._cache.clear()
    await recall(client, tok, q="billing service owned", limit=10)
    embeddings._cache.clear()
    counting = CountingPattern(placement._PARAM)
    monkeypatch.setattr(placement, "_PARAM", counting)
    first = await recall(client, tok, q="billing service owned", limit=10)
    assert placement._PLACED
    counting.subs = 0
    embeddings._cache.clear()
    again = await recall(client, tok, q="billing service owned", limit=10)
    assert counting.subs == 0
    assert [r["evidenceId"] for r in again["results"]] == [
        r["evidenceId"] for r in first["results"]
    ]


def test_a_parameter_the_part_was_not_given_is_refused() -> None:
    """A part's ``$n`` past its arguments (or ``$0``) would bind another part's
    argument, or the last one, without a word: refused where it is placed."""
    placer = placement.Placer()
    placer.part(["a", "b"])("x = $1 AND y = $2")
    lookup = placer.part(["team", "ids"], {1: "$1"})
    with pytest.raises(ValueError, match=r"\$3"):
        lookup("team_id = $1 AND id = ANY($2) AND z = $3")
    with pytest.raises(ValueError, match=r"\$0"):
        placer.part(["c"])("w = $0")
    assert placer.args == ["a", "b"]  # nothing bound by the refused parts


def _renumbered(sql: str, second: int) -> str:
    """How a lookup riding with a claim was numbered before the claim used
    :class:`placement.Placer` (the narrow copy it replaced)."""
    return re.sub(r"\$2\b", f"${second}", sql)


async def test_a_claim_sends_the_statement_it_sent_before(dsn: str, writes: WriteService) -> None:
    """The idempotency claim with every kind of lookup riding with it: the same SQL
    text and arguments as the numbering it had of its own, and the same answers."""
    team = unique("placed-claim")
    await load_jsonl(writes, jsonl(team_records(team)))
    # ReadModel between the others: a parameter it bound of its own would renumber
    # every lookup after it
    reads: list[store.Read] = [
        store.ReadSpace(None),
        store.ReadVisible("source", ("src-handbook",)),
        store.ReadModel(),
        store.ReadVisible("entity", ("billing", "payments-team", "nowhere")),
        store.ReadSpace("alice"),
    ]
    args: list[Any] = [team, "evidence", "ev-placed", bytes(32), "principal:alice"]
    columns = []
    for i, read in enumerate(reads):
        if isinstance(read, store.ReadSpace):
            sql = store._SPACE
            args.append(read.owner)
        elif isinstance(read, store.ReadModel):
            sql = store._MODEL_AND_PROJECTION  # the team only: the claim's $1
        else:
            sql = store._visible_sql(read.kind)
            args.append(list(read.ids))
        columns.append(
            f",\n       (SELECT coalesce(json_agg(v), '[]') FROM ({_renumbered(sql, len(args))}) v)"
            f" AS read_{i}"
        )
    expected = store._CLAIM.format(reads="".join(columns))
    sent: list[tuple[str, tuple[Any, ...]]] = []
    db = await Database.open(dsn, min_size=1, max_size=1)
    try:
        async with db.admin() as conn:
            conn.add_query_logger(lambda r: sent.append((str(r.query), tuple(r.args))))
            claim, _, answers = await store.claim_write(
                conn, team, "evidence", "ev-placed", bytes(32), "principal:alice", reads=reads
            )
            alone = await store.embedding_model_and_projection(conn, team)
    finally:
        await db.close()
    claims = [(q, a) for q, a in sent if "INSERT INTO write_log" in q]
    assert claims == [(expected, tuple(args))]
    assert claim == "new"
    shared, source, model, entities, private = answers
    # the team's model and projection, as the statement of its own answers them
    assert model == alone and model[0] is not None and model[1] is not None
    assert shared is not None and shared.owner is None
    assert set(source) == {"src-handbook"}
    assert set(entities) == {"billing", "payments-team"}
    assert private is not None and private.owner == "alice"
