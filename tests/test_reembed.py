"""``recall-gateway reembed``: resumable, switch-at-the-end re-embedding, against PostgreSQL.

Each test gets a database of its own (``fresh_dsn``): a re-embed changes the
model of the whole store, which the session database shared by the other tests
must keep.
The target model is a deterministic test double (the store only needs 384
unit rows and a name); the source is the real local MiniLM the loader uses.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest
import pytest_asyncio
from pgvector.asyncpg import register_vector

from gateway import cli
from gateway.embeddings import (
    LOCAL_MODELS,
    EmbeddingProvider,
    FollowingProvider,
    LocalEmbeddingProvider,
    LocalModel,
    Vectors,
    create_provider,
)
from gateway.embeddings.base import validate_vectors
from gateway.errors import ConfigurationError, EmbeddingError
from gateway.services import loader
from gateway.services import reembed as reembed_service
from gateway.services.reembed import ReembedBusy, read_store_model, reembed
from gateway.services.writes import Actor, WriteService
from gateway.settings import Settings
from gateway.store import reembed as reembed_store
from gateway.store.database import Database
from gateway.store.search import BranchSearch, CandidateQuery, evidence_candidates
from tests.conftest import app_for
from tests.factories import jsonl, team_records


class Double:
    """A deterministic 384-dimension model: a text's vector comes from its hash."""

    def __init__(self, model: str = "test-double-v1") -> None:
        self.model = model
        self.dimensions = 384
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.texts += list(texts)
        return self.vectors(texts)

    def vectors(self, texts: Sequence[str]) -> Vectors:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256((self.model + text).encode()).digest()[:8])
            rows.append(np.random.default_rng(seed).standard_normal(384))
        return validate_vectors(np.array(rows), len(rows), 384)

    async def aclose(self) -> None:
        return None


def registered_double(monkeypatch: pytest.MonkeyPatch, model: str) -> Double:
    """A :class:`Double` of ``model``, registered as the local model ``double`` for
    the test (what ``reembed --model double`` and a gateway naming it load)."""
    double = Double(model)
    monkeypatch.setitem(
        LOCAL_MODELS, "double", LocalModel("double", double.model, "none", lambda _: double)
    )
    return double


class Interrupted(Exception):
    """Stands for Ctrl-C or a killed process half way through a run."""


@pytest_asyncio.fixture(loop_scope="session")
async def store(fresh_dsn: str) -> AsyncIterator[Database]:
    """A pool on the test's own database (fresh_dsn: conftest)."""
    db = await Database.open(fresh_dsn, min_size=1, max_size=4)
    try:
        yield db
    finally:
        await db.close()


def extra_evidence(team: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "kind": "evidence",
            "team": team,
            "id": f"ev-extra-{i}",
            "source": "src-handbook",
            "content": f"Note {i}: the {['billing', 'search', 'checkout'][i % 3]} service "
            f"was deployed on day {i} of the quarter.",
        }
        for i in range(n)
    ]


async def load(db: Database, embedder: EmbeddingProvider, records: list[dict[str, Any]]) -> None:
    parsed = loader.parse(loader.split_lines(jsonl(records)))
    await loader.load(WriteService(db, embedder), parsed, batch_size=50, actor=Actor.operator())


async def live_vectors(db: Database) -> dict[tuple[str, str], tuple[str, np.ndarray]]:
    """Every live vector: (kind, id) -> (model, vector)."""
    async with db.admin(readonly=True) as conn:
        ev = await conn.fetch("SELECT evidence_id, model, embedding FROM evidence_embeddings")
        rel = await conn.fetch(
            "SELECT relationship_id, model, embedding FROM relationship_embeddings"
        )
    out = {("evidence", r[0]): (r[1], r[2].to_numpy()) for r in ev}
    out |= {("relationship", r[0]): (r[1], r[2].to_numpy()) for r in rel}
    return out


async def texts_of(db: Database) -> dict[tuple[str, str], str]:
    async with db.admin(readonly=True) as conn:
        ev = await conn.fetch("SELECT id, content FROM evidence")
        rel = await conn.fetch("SELECT id, statement FROM relationships")
    return {("evidence", r[0]): r[1] for r in ev} | {("relationship", r[0]): r[1] for r in rel}


async def top_vector_hit(db: Database, team: str, vector: np.ndarray) -> str:
    async with db.admin(readonly=True) as conn:
        space = await conn.fetchval(
            "SELECT id FROM memory_spaces WHERE team_id = $1 AND kind = 'shared'", team
        )
    query = CandidateQuery(
        team_id=team,
        branches=(BranchSearch("shared", space, 1),),
        text=None,
        vector=vector,
        entity_ids=(),
        exclude_ids=(),
        per_list=5,
        known_at=None,
    )
    async with db.tenant(team, [space]) as conn:
        lists = await evidence_candidates(conn, query)
    return next(ids for (_, name), ids in lists.items() if name == "vector")[0]


async def test_interrupted_run_keeps_serving_old_vectors_then_resumes_and_switches(
    store: Database, embedder: EmbeddingProvider
) -> None:
    team = "acme"
    await load(store, embedder, team_records(team) + extra_evidence(team, 9))
    before = await live_vectors(store)
    total = len(before)
    assert total >= 12 and {m for m, _ in before.values()} == {embedder.model}

    target = Double()
    seen: list[tuple[int, int]] = []

    def stop_half_way(done: int, total_: int) -> None:
        seen.append((done, total_))
        if done >= total // 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        await reembed(store, target, batch_size=3, progress=stop_half_way)
    staged = len(target.texts)
    assert 0 < staged < total

    # Nothing live changed: same model, same vectors, and recall's vector list
    # still answers questions embedded with the old model.
    assert await read_store_model(store) == embedder.model
    during = await live_vectors(store)
    assert during.keys() == before.keys()
    assert all(np.array_equal(during[k][1], before[k][1]) for k in before)
    question = (await embedder.embed(["who owns the billing service of acme"]))[0]
    assert await top_vector_hit(store, team, question) == "ev-owner"

    # A write lands between the two runs, with the old model.
    await load(store, embedder, [extra_evidence(team, 10)[-1] | {"id": "ev-late"}])

    resumed_target = Double()
    report = await reembed(store, resumed_target, batch_size=3)
    assert report.resumed and report.switched and report.from_model == embedder.model
    # Only what the interrupted run had not staged was embedded again (plus the late write).
    assert len(resumed_target.texts) == total + 1 - staged
    assert report.embedded == total + 1 - staged

    after = await live_vectors(store)
    texts = await texts_of(store)
    assert len(after) == total + 1
    for key, (model, vector) in after.items():
        assert model == target.model
        assert np.allclose(vector, target.vectors([texts[key]])[0], atol=1e-6), key
    assert await read_store_model(store) == target.model
    async with store.admin(readonly=True) as conn:
        assert {r[0] for r in await conn.fetch("SELECT model FROM relationship_projections")} == {
            target.model
        }
        assert await conn.fetchval("SELECT count(*) FROM reembed_evidence") == 0
        assert await conn.fetchval("SELECT count(*) FROM reembed_relationships") == 0
        assert await conn.fetch("SELECT status FROM reembed_runs ORDER BY id") == [("completed",)]

    # The new vectors serve: a question embedded by the new model finds its evidence.
    owner = texts[("evidence", "ev-owner")]
    assert await top_vector_hit(store, team, target.vectors([owner])[0]) == "ev-owner"

    # A writer still on the old model is refused instead of mixing vectors.
    with pytest.raises(loader.LoadError, match="refusing to mix"):
        await load(store, embedder, [extra_evidence(team, 12)[-1] | {"id": "ev-mixed"}])

    # Running it again is a no-op that says so.
    again = await reembed(store, Double())
    assert not again.switched and "already holds" in again.note


async def test_a_run_for_another_model_abandons_the_unfinished_one(
    store: Database, embedder: EmbeddingProvider
) -> None:
    await load(store, embedder, team_records("globex") + extra_evidence("globex", 6))

    def stop(done: int, total: int) -> None:
        if done >= 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        await reembed(store, Double("first-choice"), batch_size=2, progress=stop)
    report = await reembed(store, Double("second-choice"), batch_size=4)
    assert report.abandoned == "first-choice" and not report.resumed and report.switched
    assert await read_store_model(store) == "second-choice"
    async with store.admin(readonly=True) as conn:
        rows = await conn.fetch("SELECT to_model, status FROM reembed_runs ORDER BY id")
    assert [tuple(r) for r in rows] == [
        ("first-choice", "abandoned"),
        ("second-choice", "completed"),
    ]


async def test_one_run_at_a_time_and_nothing_to_do_on_an_empty_store(store: Database) -> None:
    empty = await reembed(store, Double())
    assert not empty.switched and "no vectors" in empty.note
    async with store.acquire() as holder:
        assert await reembed_store.try_lock(holder)
        try:
            with pytest.raises(ReembedBusy):
                await reembed(store, Double())
        finally:
            await reembed_store.unlock(holder)


async def test_a_gateway_follows_the_store_or_refuses_after_the_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    double = registered_double(monkeypatch, "double-model")
    minilm = LOCAL_MODELS["minilm"]

    following = FollowingProvider(minilm, Double(minilm.model_id), follow=True, batch_size=8)
    following.observe(minilm.model_id)
    assert following.model == minilm.model_id
    following.observe(double.model)  # the re-embed switched the store
    vectors = await following.embed(["after the switch"])
    assert following.model == double.model
    assert np.array_equal(vectors, double.vectors(["after the switch"]))

    pinned = FollowingProvider(minilm, Double(minilm.model_id), follow=False, batch_size=8)
    pinned.observe(double.model)
    with pytest.raises(EmbeddingError, match="RECALL_EMBEDDING_MODEL"):
        await pinned.embed(["anything"])
    await following.aclose()
    await pinned.aclose()


def test_auto_follows_the_store_model_and_keeps_old_stores_working() -> None:
    auto = Settings(embedding_provider="local")
    assert auto.embedding_model == "auto"
    fresh = create_provider(auto, None)
    assert isinstance(fresh, FollowingProvider)
    assert fresh.model == LOCAL_MODELS["minilm"].model_id
    kept = create_provider(auto, LOCAL_MODELS["minilm"].model_id)
    assert isinstance(kept, FollowingProvider) and isinstance(kept.current, LocalEmbeddingProvider)
    e5 = create_provider(auto, LOCAL_MODELS["e5-small"].model_id)
    assert e5.model == LOCAL_MODELS["e5-small"].model_id
    with pytest.raises(ConfigurationError, match="reembed"):
        create_provider(auto, "openai:text-embedding-3-small")
    named = create_provider(Settings(embedding_model="e5-small"), None)
    assert named.model == LOCAL_MODELS["e5-small"].model_id


def test_cli_reembed_off_a_terminal_prints_progress_lines_and_switches(
    fresh_dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = registered_double(monkeypatch, "double-cli")
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    monkeypatch.setenv("RECALL_LOAD_PROGRESS_INTERVAL_S", "0.001")
    file = tmp_path / "memory.jsonl"
    file.write_text(jsonl(team_records("umbrella") + extra_evidence("umbrella", 4)), "utf-8")
    assert cli.main(["load", str(file)]) == 0
    capsys.readouterr()
    assert cli.main(["reembed", "--model", "double", "--batch-size", "2"]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("re-embedding to")]
    assert lines, captured.err
    assert re.fullmatch(
        r"re-embedding to double-cli: [\d,]+/[\d,]+ vectors \(\d+%\), [\d,]+ vectors/s.*",
        lines[-1],
    ), lines[-1]
    assert "the store now holds vectors of model 'double-cli'" in captured.out
    assert len(target.texts) > 4


def test_cli_reembed_outpaced_by_writes_fails_with_its_own_code_then_resumes(
    fresh_dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Writes that land before every switch, MAX_SWITCH_ATTEMPTS times running:
    the run gives up with REEMBED_OUTPACED (not INTERNAL), exit status 1, nothing
    live changed; run again without the writes, it resumes and switches.

    The writer is a second connection committing one evidence with an old-model
    vector (as the owner, directly) right before each switch takes its lock."""
    target = registered_double(monkeypatch, "double-outpaced")
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    file = tmp_path / "memory.jsonl"
    file.write_text(jsonl(team_records("outpaced") + extra_evidence("outpaced", 3)), "utf-8")
    assert cli.main(["load", str(file)]) == 0
    real_switch = reembed_store.switch
    written: list[str] = []

    async def write_then_switch(conn: Any, run: Any) -> int:
        writer = await asyncpg.connect(fresh_dsn)
        try:
            await register_vector(writer)
            n = len(written)
            async with writer.transaction():
                row = await writer.fetchrow(
                    "SELECT e.space_id, e.model, e.embedding FROM evidence_embeddings e "
                    "WHERE e.team_id = 'outpaced' AND e.evidence_id = 'ev-owner'"
                )
                assert row is not None
                space, model, vector = row
                await writer.execute(
                    "INSERT INTO evidence (team_id, id, space_id, generation, source_id, "
                    "content, content_sha256) VALUES ('outpaced', $1, $2, 1, 'src-handbook', "
                    "$3, sha256(convert_to($3, 'UTF8')))",
                    f"ev-during-{n}",
                    space,
                    f"Written during switch {n}.",
                )
                await writer.execute(
                    "INSERT INTO evidence_embeddings (team_id, space_id, evidence_id, model, "
                    "dimensions, embedding) VALUES ('outpaced', $1, $2, $3, 384, $4)",
                    space,
                    f"ev-during-{n}",
                    model,
                    vector,
                )
            written.append(f"ev-during-{n}")
        finally:
            await writer.close()
        return await real_switch(conn, run)

    monkeypatch.setattr(reembed_store, "switch", write_then_switch)
    monkeypatch.setattr(reembed_service, "MAX_SWITCH_ATTEMPTS", 3)
    capsys.readouterr()
    assert cli.main(["reembed", "--model", "double", "--batch-size", "4"]) == 1
    err = capsys.readouterr().err
    assert "recall-gateway: error REEMBED_OUTPACED: writes kept adding vectors" in err, err
    assert "INTERNAL" not in err
    assert len(written) == 3
    assert asyncio.run(_store_model(fresh_dsn)) != target.model

    monkeypatch.setattr(reembed_store, "switch", real_switch)
    assert cli.main(["reembed", "--model", "double", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "(resumed)" in out and "the store now holds vectors of model 'double-outpaced'" in out
    # the vectors written during the failed run were embedded too, once each
    assert sorted(t for t in target.texts if t.startswith("Written during")) == [
        f"Written during switch {i}." for i in range(3)
    ]


async def _store_model(dsn: str) -> str | None:
    db = await Database.open(dsn, min_size=1, max_size=1)
    try:
        return await read_store_model(db)
    finally:
        await db.close()


def test_cli_reembed_needs_a_model_under_auto_and_reports_a_current_store(
    fresh_dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    monkeypatch.delenv("RECALL_EMBEDDING_MODEL", raising=False)
    assert cli.main(["reembed"]) == 1
    assert "reembed --model" in capsys.readouterr().err
    assert cli.main(["reembed", "--model", "minilm"]) == 0
    assert "no vectors yet" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        cli.main(["reembed", "--model", "nonsense"])
    assert bad.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


async def test_a_serving_gateway_follows_the_switch_within_a_second(
    fresh_dsn: str, embedder: EmbeddingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = registered_double(monkeypatch, "double-followed")
    app = app_for(fresh_dsn)
    async with app.router.lifespan_context(app):
        services = app.state.services
        await load(services.db, embedder, team_records("initech"))
        assert services.embedder.model == embedder.model
        question = "who owns the billing service"
        before = await services.recall.embeddings.vector(
            question, [], ("reembed", "alice", "private")
        )  # now cached
        report = await reembed(services.db, Double(target.model))
        assert report.switched
        await asyncio.sleep(2.5)  # the watcher reads the store's model every second
        vectors = await services.embedder.embed(["a question after the switch"])
        assert services.embedder.model == target.model
        assert np.array_equal(vectors, target.vectors(["a question after the switch"]))
        # recall's query cache does not hand out the old model's vector
        after = await services.recall.embeddings.vector(
            question, [], ("reembed", "alice", "private")
        )
        assert before is not None and after is not None
        assert np.array_equal(after, target.vectors([question])[0])
