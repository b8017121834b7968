"""Vectors supplied in a loader file: stored as given, only for the store's model."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from gateway.embeddings import EmbeddingProvider
from gateway.services import loader
from gateway.services.records import EvidenceRecord
from gateway.services.writes import Actor, RecordError, WriteService
from gateway.store.connection import Conn

from .conftest import load_jsonl, unique
from .factories import jsonl


def _vector(seed: int, dims: int = 384) -> list[float]:
    row = np.random.default_rng(seed).standard_normal(dims)
    return [float(x) for x in row * 3.0]  # not unit length: the loader normalises


def _records(
    team: str, model: str, dims: int, *, with_vectors: bool = True
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"kind": "embedding_model", "model": model, "dimensions": dims},
        {"kind": "team", "id": team, "name": "Vectors"},
        {"kind": "principal", "team": team, "id": "ann", "display_name": "Ann"},
        {"kind": "source", "team": team, "id": "s", "type": "document", "title": "Doc"},
        {"kind": "entity", "team": team, "id": "e", "name": "Engine"},
    ]
    for i in range(3):
        ev: dict[str, Any] = {
            "kind": "evidence",
            "team": team,
            "id": f"ev{i}",
            "source": "s",
            "content": f"The engine runs at {i} rpm.",
        }
        rel: dict[str, Any] = {
            "kind": "relationship",
            "team": team,
            "id": f"r{i}",
            "subject": "e",
            "predicate": "runs_at",
            "object_value": f"{i} rpm",
            "owner": "ann",
            "supports": [{"id": f"sup{i}", "evidence": f"ev{i}"}],
        }
        if with_vectors and i < 2:  # the third pair is embedded by the provider
            ev["embedding"] = _vector(i)
            rel["embedding"] = _vector(100 + i)
        out += [ev, rel]
    return out


async def _vectors(conn: Conn, table: str, column: str, team: str) -> dict[str, Any]:
    rows = await conn.fetch(
        f"SELECT {column} AS id, embedding FROM {table} WHERE team_id = $1", team
    )
    return {r["id"]: r["embedding"].to_numpy() for r in rows}


@pytest.mark.parametrize("set_based", [True, False])
async def test_supplied_vectors_are_stored_normalised_and_the_rest_embedded(
    writes: WriteService,
    embedder: EmbeddingProvider,
    admin_conn: Conn,
    set_based: bool,
) -> None:
    team = unique("vec")
    lines = _records(team, embedder.model, embedder.dimensions)
    parsed = loader.parse(loader.split_lines(jsonl(lines)))
    report = await loader.load(writes, parsed, batch_size=50, set_based=set_based)
    assert report.records == len(lines) - 1, "the embedding_model line is not a record"
    evidence = await _vectors(admin_conn, "evidence_embeddings", "evidence_id", team)
    rels = await _vectors(admin_conn, "relationship_embeddings", "relationship_id", team)
    for i in range(2):
        want = np.array(_vector(i)) / np.linalg.norm(_vector(i))
        assert np.allclose(evidence[f"ev{i}"], want, atol=1e-6)
        want = np.array(_vector(100 + i)) / np.linalg.norm(_vector(100 + i))
        assert np.allclose(rels[f"r{i}"], want, atol=1e-6)
    computed = (await embedder.embed(["The engine runs at 2 rpm."]))[0]
    assert np.allclose(evidence["ev2"], computed, atol=1e-5)


async def test_a_vector_does_not_change_what_counts_as_the_same_record(
    writes: WriteService, embedder: EmbeddingProvider
) -> None:
    team = unique("vecsame")
    await load_jsonl(writes, jsonl(_records(team, embedder.model, embedder.dimensions)))
    again = await load_jsonl(
        writes, jsonl(_records(team, embedder.model, embedder.dimensions, with_vectors=False))
    )
    assert sum(again.created.values()) == 0


def _refused(lines: list[dict[str, Any]]) -> loader.LineError:
    with pytest.raises(loader.LoadError) as caught:
        loader.parse(loader.split_lines(jsonl(lines)))
    return caught.value.errors[0]


def test_bad_supplied_vectors_are_refused_by_line(embedder: EmbeddingProvider) -> None:
    lines = _records("t", embedder.model, embedder.dimensions)
    error = _refused(lines[1:])
    assert (error.line, error.field) == (5, "embedding")
    assert "needs an 'embedding_model' line" in error.message

    short = [dict(x) for x in lines]
    short[5]["embedding"] = [0.1] * 10
    error = _refused(short)
    assert (error.line, error.field) == (6, "embedding")
    assert "10 numbers" in error.message and "makes 384" in error.message

    zero = [dict(x) for x in lines]
    zero[5]["embedding"] = [0.0] * 384
    assert "not all zero" in _refused(zero).message

    text = jsonl(lines).replace('"dimensions": 384', '"dimensions": "many"', 1)
    with pytest.raises(loader.LoadError) as caught:
        loader.parse(loader.split_lines(text))
    assert (caught.value.errors[0].line, caught.value.errors[0].field) == (1, "dimensions")

    twice = [lines[0], *lines]
    assert "named twice" in _refused(twice).message


async def test_another_model_is_refused_before_anything_is_written(
    writes: WriteService, embedder: EmbeddingProvider, admin_conn: Conn
) -> None:
    team = unique("vecother")
    for model, dims in (("text-embedding-3-small", 384), (embedder.model, 256)):
        lines = _records(team, model, dims)
        if dims != embedder.dimensions:
            for line in lines:
                if "embedding" in line:
                    line["embedding"] = line["embedding"][:dims]
        parsed = loader.parse(loader.split_lines(jsonl(lines)))
        with pytest.raises(loader.LoadError) as caught:
            await loader.load(writes, parsed, batch_size=50)
        error = caught.value.errors[0]
        assert (error.line, error.field, error.code) == (1, "model", "EMBEDDING_MODEL_MISMATCH")
        assert model in error.message and "refusing to mix" in error.message
        assert caught.value.committed == 0
    assert await admin_conn.fetchval("SELECT count(*) FROM teams WHERE id = $1", team) == 0


async def test_only_the_loader_supplies_vectors(writes: WriteService) -> None:
    team = unique("vecprin")
    await load_jsonl(writes, jsonl(_records(team, "x", 384, with_vectors=False)[1:5]))
    record = EvidenceRecord(
        kind="evidence", team=team, id="ev-p", source="s", content="hi", embedding=_vector(1)
    )
    with pytest.raises(RecordError) as caught:
        await writes.apply([record], Actor.for_principal(team, "ann", private_bound=True))
    assert (caught.value.field, caught.value.code) == ("embedding", "FORBIDDEN")
    assert json.dumps(caught.value.message)
