"""A recall's nested fields (sources, supporting relationships, their entities)
answer from the rows the recall primed its loaders with, synchronously: no
asyncio task per result (gateway/schema/recall_types.py, gateway/services/loaders.py).
What the recall did not read is still loaded, and answers the same."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import httpx
import pytest

from gateway.schema import recall as recall_schema
from gateway.services.loaders import ReadLoaders
from gateway.services.writes import WriteService
from gateway.store.database import Database
from gateway.store.recall import RelationshipRow

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import more_evidence, token

NESTED = """query Nested($q: String, $limit: Int) { recallMemory(query: $q, limit: $limit) {
  results { evidenceId source { id title status authority }
            supportingRelationships { id statement status subject { id name } object { id } } }
  relatedRelationships { representativeId representative { statement subject { name } } }
  conflicts { id ... on RelationshipConflict { positions { id relationships { id } } } } } }"""

T = TypeVar("T")


@contextmanager
def counted_tasks() -> Iterator[list[int]]:
    """Count the asyncio tasks the running loop creates inside the block."""
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()
    created = [0]

    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, T] | Generator[Any, None, T],
        /,
        **kwargs: Any,
    ) -> asyncio.Future[T]:
        created[0] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        yield created
    finally:
        loop.set_task_factory(previous)


async def _ask(client: httpx.AsyncClient, tok: str, **variables: Any) -> dict[str, Any]:
    r = await client.post(
        "/graphql",
        json={"query": NESTED, "variables": variables},
        headers={"Authorization": f"Bearer {tok}"},
    )
    body: dict[str, Any] = r.json()
    assert "errors" not in body, body
    return body


async def test_nested_fields_take_no_task_per_result(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    """The tasks of a request do not grow with its results: a nested field of a
    primed row is a value, not an awaitable graphql-core must run as a task."""
    team = unique("nestedtasks")
    await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, 12)))
    tok = await token(writes, team, "alice")
    await _ask(client, tok, q="billing note invoices batch", limit=1)  # warm
    tasks = {}
    for limit in (1, 10):
        with counted_tasks() as created:
            body = await _ask(client, tok, q="billing note invoices batch", limit=limit)
        results = body["data"]["recallMemory"]["results"]
        assert len(results) == limit
        assert all(r["source"]["title"] and r["supportingRelationships"] for r in results)
        tasks[limit] = created[0]
    assert tasks[1] == tasks[10], tasks


async def test_rows_not_primed_are_loaded_and_answer_the_same(
    client: httpx.AsyncClient, writes: WriteService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the recall's rows (a loader that was not primed), every nested
    field reads its rows through the loaders: the answer is the same."""
    team = unique("nestedload")
    await load_jsonl(writes, jsonl(team_records(team) + more_evidence(team, 6)))
    tok = await token(writes, team, "alice")
    primed = await _ask(client, tok, q="billing service owner invoices", limit=6)

    def unprimed(db: Database, view: Any, nested: Any = None) -> ReadLoaders:
        return ReadLoaders(db, view)

    monkeypatch.setattr(recall_schema, "ReadLoaders", unprimed)
    loaded = await _ask(client, tok, q="billing service owner invoices", limit=6)
    assert loaded == primed
    results = primed["data"]["recallMemory"]["results"]
    assert len(results) == 6 and all(r["supportingRelationships"] for r in results)
    assert any(
        rel["subject"] and rel["subject"]["name"]
        for r in results
        for rel in r["supportingRelationships"]
    )


async def test_primed_rows_are_handed_over_whole_or_not_at_all(db: Database) -> None:
    """``primed_many`` answers only when every key was primed (else the loader reads
    them all, in one batch); ``primed`` is None for a key that was not."""
    from datetime import UTC, datetime

    from gateway.services.recall_types import ReadView

    view = ReadView(team_id="t", space_kinds={}, t_sys=datetime.now(UTC), t_valid=datetime.now(UTC))
    loaders = ReadLoaders(db, view)
    # stand-ins: the loader hands rows over, it does not read them
    row_a, row_b = cast(RelationshipRow, "row-a"), cast(RelationshipRow, "row-b")
    loaders.relationships.prime_rows({"a": row_a, "b": row_b})
    assert loaders.relationships.primed("a") == row_a
    assert loaders.relationships.primed("c") is None
    assert loaders.relationships.primed_many(["b", "a"]) == [row_b, row_a]
    assert loaders.relationships.primed_many(["a", "c"]) is None
    assert loaders.relationships.primed_many([]) == []
