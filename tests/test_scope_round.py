"""The scope round: the view with the lists that need no query embedding.

A recall sends the view together with the full-text and entity lists, their
hydration and discovery by full text (gateway/store/round_trips.py,
scope_round) while its question is embedded, and the vector parts after it.
These tests check, against the real PostgreSQL, that the two rounds answer
exactly what the one first round answers (lists in order, hydration,
discovery, path groups) for the current view and for knownAt and validAt
views, and that a recall really sends the lexical work before the query
embedding returns (a provider that holds its answer back until then).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from gateway.embeddings import EmbeddingProvider, embed_queries
from gateway.embeddings.base import Vectors
from gateway.embeddings.local import LocalEmbeddingProvider
from gateway.services.recall_types import overfetch
from gateway.services.writes import WriteService
from gateway.store import database as database_module
from gateway.store import recall as view_store
from gateway.store import related, round_trips, search
from gateway.store.database import Database

from .conftest import app_for, load_jsonl, unique
from .factories import jsonl
from .test_conflicts import ownership_case
from .test_recall import more_evidence, recall, token
from .test_round_trips import QUERY, _setup


def _queries(
    team: str,
    branches: Sequence[search.BranchSearch],
    text: str | None,
    vector: np.ndarray | None,
    t_sys: datetime,
    t_valid: datetime,
    as_of: datetime | None,
    known: tuple[list[str], list[str]] = ([], []),
) -> tuple[search.CandidateQuery, related.DiscoveryQuery]:
    spaces = [b.space_id for b in branches]
    shared = branches[0]
    cq = search.CandidateQuery(
        team, tuple(branches), text, vector, ("billing",), (), overfetch(10), t_sys, as_of
    )
    dq = related.DiscoveryQuery(
        team,
        shared.space_id,
        shared.generation,
        spaces,
        t_sys,
        t_valid,
        text,
        vector,
        overfetch(5),
        [],
        known[0],
        known[1],
        as_of,
    )
    return cq, dq


@pytest.mark.parametrize("view", ["current", "knownAt", "validAt", "vector known"])
async def test_scope_and_vector_rounds_answer_the_first_round(
    writes: WriteService, db: Database, embedder: EmbeddingProvider, view: str
) -> None:
    team, branches, _ = await _setup(writes, db)
    vector = np.asarray((await embed_queries(embedder, [QUERY]))[0], dtype=np.float32)
    spaces = [b.space_id for b in branches]
    async with db.tenant(team, spaces) as conn:
        now: datetime = await conn.fetchval("SELECT now()")
        # Known IDs, whose groups discovery covers: the scope round reads those
        # (the vector round is sent without them, as the recall sends it).
        known = (
            [await conn.fetchval("SELECT min(id) FROM evidence WHERE team_id = $1", team)],
            [await conn.fetchval("SELECT max(id) FROM relationships WHERE team_id = $1", team)],
        )
        known_at = now - timedelta(milliseconds=1) if view == "knownAt" else None
        valid_at = now - timedelta(days=3650) if view == "validAt" else None
        t_sys = known_at or now
        t_valid = valid_at or t_sys
        # The queries as the recall makes them before the view: placeholders where
        # the view's values go (generation 0, an instant the statement replaces).
        placeholder = datetime(1, 1, 1, tzinfo=now.tzinfo)
        early_t = known_at or placeholder
        early_branches = [search.BranchSearch(b.branch, b.space_id, 0) for b in branches]
        ready = vector if view == "vector known" else None
        early_cq, early_dq = _queries(
            team, early_branches, QUERY, ready, early_t, valid_at or early_t, known_at, known
        )
        got = await round_trips.scope_round(
            conn,
            round_trips.ScopeQuery(team, spaces, known_at, valid_at),
            early_cq,
            early_dq,
        )
        # What the view statement and the one first round answer.
        view_now, view_spaces = await view_store.resolve_view(conn, team, spaces, known_at)
        cq, dq = _queries(team, branches, QUERY, vector, t_sys, t_valid, known_at, known)
        whole = await round_trips.first_round(conn, cq, t_valid, dq)
        late = None
        assert got.first is not None
        if ready is None:
            checked = sorted({i for ids in got.first.lists.values() for i in ids})
            late = await round_trips.first_round(
                conn,
                search.CandidateQuery(
                    team, tuple(branches), None, vector, (), (), overfetch(10), t_sys, known_at
                ),
                t_valid,
                related.DiscoveryQuery(
                    team,
                    branches[0].space_id,
                    branches[0].generation,
                    spaces,
                    t_sys,
                    t_valid,
                    None,
                    vector,
                    overfetch(5),
                    [],
                    [],
                    [],
                    known_at,
                ),
                checked=checked,
            )
            assert late is not None
            # Each candidate is hydrated once: the vector round only the new ones.
            assert not set(late.eligible) & set(checked)
        merged = round_trips.merge_rounds(cq, dq, got.first, late)
    assert got.now == view_now == now
    assert sorted(got.spaces, key=lambda s: s.kind) == sorted(view_spaces, key=lambda s: s.kind)
    assert whole is not None and whole.discovery is not None
    assert list(merged.lists.items()) == list(whole.lists.items())
    assert {k for k, v in whole.lists.items() if v} >= {
        ("shared", "fulltext"),
        ("shared", "vector"),
        ("shared", "entity"),
        ("private", "fulltext"),
    }
    assert merged.eligible == whole.eligible and whole.eligible
    assert merged.discovery == whole.discovery and whole.discovery.lists["fulltext"]
    assert whole.discovery.covered_groups
    assert list(merged.discovery.lists) == list(whole.discovery.lists)
    assert merged.path_groups == whole.path_groups and whole.path_groups


async def test_a_space_without_a_generation_has_no_lists(
    writes: WriteService, db: Database
) -> None:
    """A knownAt view before the private space existed: its branch gets NULL for
    a generation in the statement, and empty lists."""
    team, branches, _ = await _setup(writes, db)
    spaces = [b.space_id for b in branches]
    async with db.tenant(team, spaces) as conn:
        before = await conn.fetchval(
            "SELECT min(recorded_at) - interval '1 second' FROM space_generations "
            "WHERE team_id = $1",
            team,
        )
        early = [search.BranchSearch(b.branch, b.space_id, 0) for b in branches]
        cq, dq = _queries(team, early, QUERY, None, before, before, before)
        got = await round_trips.scope_round(
            conn, round_trips.ScopeQuery(team, spaces, before, None), cq, dq
        )
    assert {s.generation for s in got.spaces} == {None}
    assert got.first is not None
    assert not any(got.first.lists.values()) and not got.first.eligible


class HeldBackProvider(LocalEmbeddingProvider):
    """The bundled model, whose answer waits until the recall's evidence full-text
    list has been answered by the server (``seen``; at most ``patience``
    seconds): a recall that sends it only after the embedding waits out the
    patience, and ``answered_first`` then lacks it."""

    def __init__(self, answered: list[str], seen: asyncio.Event, patience: float) -> None:
        super().__init__()
        self.answered = answered
        self.seen = seen
        self.patience = patience
        self.answered_first: list[str] = []

    async def embed(self, texts: Sequence[str]) -> Vectors:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.seen.wait(), self.patience)
        self.answered_first = list(self.answered)
        return await super().embed(texts)


@pytest.mark.parametrize("side_connections", [0, 2])
async def test_the_full_text_lists_are_sent_before_the_query_embedding_returns(
    dsn: str, writes: WriteService, monkeypatch: pytest.MonkeyPatch, side_connections: int
) -> None:
    """Without side connections, relationship discovery by full text goes with the
    view too; with them, discovery goes to a side connection once the embedding
    is known (gateway/services/recall.py, _DiscoveryBeside), and the view's
    statement carries only the evidence lists."""
    team = unique("early")
    await load_jsonl(writes, jsonl(ownership_case(team) + more_evidence(team, 8)))
    tok = await token(writes, team, "alice")
    question = "who owns the billing service invoices"
    app = app_for(dsn, side_connections=side_connections)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client,
    ):
        await _early_lists(app, client, tok, question, monkeypatch, side_connections > 0)


async def _early_lists(
    gateway_app: Starlette,
    client: httpx.AsyncClient,
    tok: str,
    question: str,
    monkeypatch: pytest.MonkeyPatch,
    beside: bool,
) -> None:
    service = gateway_app.state.services.recall
    expected = await recall(client, tok, q=question)  # the shipped provider's answer

    answered: list[str] = []
    seen = asyncio.Event()
    counted = database_module.StatementCounter.__call__

    def logged(self: Any, record: Any) -> None:
        # asyncpg calls query loggers in the event loop, once a statement is answered.
        sql = str(getattr(record, "query", ""))
        answered.append(sql)
        if "evidence_fulltext_top_k" in sql:
            seen.set()
        counted(self, record)

    monkeypatch.setattr(database_module.StatementCounter, "__call__", logged)
    held = HeldBackProvider(answered, seen, patience=10.0)
    monkeypatch.setattr(service.embeddings, "embedder", held)
    monkeypatch.setattr(service.embeddings, "_cache", type(service.embeddings._cache)())
    try:
        got = await recall(client, tok, q=question)
    finally:
        await held.aclose()
    first = held.answered_first
    # Answered before the embedding returned: the evidence full-text lists, the
    # hydration of their candidates and (without side connections) discovery by
    # full text, with the view.
    assert any("evidence_fulltext_top_k" in sql for sql in first), [s[:60] for s in first]
    assert any("relationship_fulltext_top_k" in sql for sql in first) is not beside
    assert any("WITH scope AS MATERIALIZED" in sql for sql in first)
    if beside:  # discovery, both lists, in one statement on a side connection
        [side] = [sql for sql in answered if sql.startswith("WITH side_tenant")]
        assert "relationship_fulltext_top_k" in side and "relationship_vector_candidates" in side
    # ... and nothing that needs the vector.
    assert not any("vector_candidates" in sql for sql in first)
    assert any("evidence_vector_candidates" in sql for sql in answered)
    for answer in (expected, got):
        for key in ("recallId", "recallEventId", "suggestedActions"):
            answer.pop(key, None)
    assert got == expected and got["results"]
