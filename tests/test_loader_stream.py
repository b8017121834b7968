"""Streaming loads: checked whole first, then read one batch ahead, never held whole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.services import loader
from gateway.store.connection import Conn

from .conftest import unique
from .factories import jsonl, team_records
from .test_cli import run


def test_batches_read_one_batch_ahead_only() -> None:
    pulled = [0]

    def lines() -> Iterator[str]:
        for i in range(1000):
            pulled[0] += 1
            yield f'{{"kind": "team", "id": "t{i}", "name": "T"}}'

    chunks = loader.batches(loader.stream(lines()), 10)
    first = next(chunks)
    assert len(first) == 10
    assert pulled[0] <= 11, "the rest of the input is not read yet"


def test_check_counts_records_and_finds_the_model_line() -> None:
    text = jsonl(
        [
            {"kind": "embedding_model", "model": "m", "dimensions": 3},
            {"kind": "team", "id": "a", "name": "A"},
            {"kind": "team", "id": "b", "name": "B"},
        ]
    )
    checked = loader.check(loader.split_lines(text))
    assert checked.records == 2
    assert checked.embedding_model is not None and checked.embedding_model[0] == 1


def test_a_line_that_changed_between_the_passes_stops_the_stream() -> None:
    good = ['{"kind": "team", "id": "a", "name": "A"}', '{"kind": "team", "id": "b", "name": "B"}']
    loader.check(good)
    changed = [good[0], '{"kind": "team", "id": "b"}']
    with pytest.raises(loader.LoadError) as caught:
        list(loader.stream(changed))
    assert "changed while it was loaded" in caught.value.message
    assert caught.value.errors[0].line == 2


def test_invalid_utf8_is_named_by_line() -> None:
    lines = [b'{"kind": "team", "id": "a", "name": "A"}\n', b'{"kind": "team", "id": "\xff"}\n']
    with pytest.raises(loader.LoadError) as caught:
        loader.check(lines)
    assert str(caught.value.errors[0]) == "line 2: not valid UTF-8 (byte 25)"


async def test_a_bad_last_line_of_a_long_file_writes_nothing(
    dsn: str, tmp_path: Path, admin_conn: Conn
) -> None:
    team = unique("streambad")
    records = team_records(team)
    for i in range(30):
        records.append({"kind": "entity", "team": team, "id": f"ent-{i}", "name": f"Entity {i}"})
    records.append({"kind": "entity", "team": team, "id": "bad id", "name": "x"})
    path = tmp_path / "long.jsonl"
    path.write_text(jsonl(records))
    result = run(["load", str(path), "--batch-size", "5"], dsn)
    assert result.returncode == 1
    assert f"line {len(records)}, field 'id'" in result.stderr
    assert "nothing was written" in result.stderr
    assert await admin_conn.fetchval("SELECT count(*) FROM teams WHERE id = $1", team) == 0
    result = run(["load", "-", "--batch-size", "5"], dsn, stdin=jsonl(records[:-1]))
    assert result.returncode == 0, result.stderr
    assert f"loaded {len(records) - 1} record(s)" in result.stdout
