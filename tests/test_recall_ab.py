"""benchmarks/recall_ab.py: the interleaving of its arms, its percentiles, and the
names it gives a recall's statements (checked on a real recall, against the
store's own statements)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from types import ModuleType
from typing import TYPE_CHECKING

import httpx
import pytest

import gateway.store.database as database_module
from gateway.services.writes import WriteService

from .conftest import REPO, app_for, load_jsonl, unique
from .factories import jsonl, team_records
from .test_answer_round import QUERY as ANSWER_ROUND_QUERY
from .test_answer_round import _records as answer_round_records
from .test_answer_round import recall as answer_round_recall
from .test_recall import more_evidence, recall, token


def _ab() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))
    path = REPO / "benchmarks" / "recall_ab.py"
    spec = importlib.util.spec_from_file_location("recall_ab", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("recall_ab", module)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:  # mypy reads the script itself (pyproject: benchmarks/ is checked too)
    import recall_ab as ab
    from bench_common import p50_p95
else:
    ab = _ab()
    p50_p95 = ab.p50_p95


@pytest.mark.parametrize("arms", [1, 2, 3, 4])
@pytest.mark.parametrize("start", [0, 1, 5])
def test_every_arm_takes_every_position_once_in_any_run_of_questions(arms: int, start: int) -> None:
    """Load from elsewhere falls on the arms alike only if no arm keeps a position
    (the first asked after a pause, the last before the next question)."""
    orders = [ab.arm_order(arms, q) for q in range(start, start + arms)]
    for order in orders:
        assert sorted(order) == list(range(arms))
    for position in range(arms):
        assert Counter(order[position] for order in orders) == Counter(range(arms))


def test_two_arms_alternate_as_before() -> None:
    assert [ab.arm_order(2, q) for q in range(4)] == [[0, 1], [1, 0], [0, 1], [1, 0]]


def test_p50_and_p95() -> None:
    assert p50_p95([float(v) for v in range(20, 0, -1)]) == (10.5, 19.0)
    assert p50_p95([float(v) for v in range(1, 81)]) == (40.5, 76.0)
    assert p50_p95([3.0]) == (3.0, 3.0)
    with pytest.raises(ValueError):
        p50_p95([])


def test_a_step_missing_from_a_recall_counts_zero_in_its_median() -> None:
    """Otherwise a step that only some recalls send (the community snapshot)
    would show the median of those alone, and the steps would not add up."""
    recalls = [
        {"first round": 10.0, "community snapshot": 4.0},
        {"first round": 20.0},
        {"first round": 30.0},
    ]
    assert ab.step_medians(recalls) == {"first round": 20.0, "community snapshot": 0.0}


def test_statements_of_one_step_add_up_and_unknown_ones_are_other() -> None:
    records = [
        ("COMMIT;", 0.001),
        ("\n  WITH cands AS\n    MATERIALIZED (SELECT 1)", 0.010),
        ("COMMIT", 0.002),
        ("WITH query_lexemes AS MATERIALIZED (SELECT 1)", 0.004),
    ]
    times = ab.step_times(records)
    assert times == pytest.approx({"commit": 3.0, "first round": 10.0, "other": 4.0})


async def test_every_statement_of_a_real_recall_has_its_step(
    dsn: str, writes: WriteService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step names follow the store's statements: a full recall (evidence,
    relationships, hypotheses and conflicts asked) names every statement it
    sends, in the order of :data:`STEPS`, none of them "other"."""
    team = unique("abstep")
    await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, 5)))
    tok = await token(writes, team, "alice")
    monkeypatch.setattr(database_module, "StatementCounter", ab.RecordingCounter)
    app = app_for(dsn, pool_max_size=1)
    async with app.router.lifespan_context(app):
        counter = app.state.services.db.counter
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            counter.take()
            before = counter.count
            assert (await recall(client, tok, q="billing note invoices"))["results"]
            records = counter.take()
            counted = counter.count - before
    steps = [ab.statement_step(sql) for sql, _ in records]
    assert "other" not in steps, [sql[:80] for sql, _ in records]
    order = [name for _, name in ab.STEPS]
    # discovery on its side connection runs beside the unit's rounds: in any place
    assert steps.count("discovery beside") == 1
    steps = [s for s in steps if s != "discovery beside"]
    assert steps == sorted(steps, key=order.index)
    for step in ("token", "scope round", "first round", "hypotheses, conflicts", "commit"):
        assert step in steps
    # Exactly the statements the counter counts (not the driver's own).
    assert len(records) == counted
    assert all(seconds > 0 for _, seconds in records)


async def test_the_answer_round_with_handles_has_its_step(
    dsn: str, writes: WriteService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall whose related relationships have handles reads them in the answer
    round (``WITH handles``): it is named, not "other", and comes where the
    hypotheses and conflicts do."""
    team = unique("abhandles")
    await load_jsonl(writes, jsonl(answer_round_records(team)))
    tok = await token(writes, team, "alice", "shared_only")
    monkeypatch.setattr(database_module, "StatementCounter", ab.RecordingCounter)
    app = app_for(dsn, pool_max_size=1)
    async with app.router.lifespan_context(app):
        counter = app.state.services.db.counter
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            counter.take()
            got = await answer_round_recall(
                client, tok, q=ANSWER_ROUND_QUERY, limit=1, rels=20, communities=0
            )
            records = counter.take()
    assert got["relatedRelationships"], got
    steps = [ab.statement_step(sql) for sql, _ in records]
    assert "other" not in steps, [sql[:80] for sql, _ in records]
    assert "answer round" in steps
    order = [name for _, name in ab.STEPS]
    steps = [s for s in steps if s != "discovery beside"]
    assert steps == sorted(steps, key=order.index)
