"""Hydrated rows become ``EligibleEvidence`` without the frozen dataclass's generated
``__init__`` (gateway/store/recall.py ``parse_eligible``): the same objects, faster."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest

from gateway.store import recall
from gateway.store.recall import EligibleEvidence, parse_eligible


def _rows() -> list[tuple[Any, ...]]:
    now = datetime.now(UTC)
    space = uuid4()
    return [
        (
            f"ev-{i % 7}",
            space,
            f"src-{i}",
            f"text {i}",
            None if i % 3 else now,
            now + timedelta(i),
            [f"rel-{j}" for j in range(i % 4)],
        )
        for i in range(20)  # repeated IDs: the last row of an ID wins, at its first place
    ]


def _by_constructor(rows: list[tuple[Any, ...]]) -> dict[str, EligibleEvidence]:
    return {
        r[0]: EligibleEvidence(
            id=r[0],
            space_id=r[1],
            source_id=r[2],
            content=r[3],
            observed_at=r[4],
            recorded_at=r[5],
            relationship_ids=tuple(r[6]),
        )
        for r in rows
    }


def test_the_same_objects_as_the_constructor() -> None:
    rows = _rows()
    got, expected = parse_eligible(rows), _by_constructor(rows)
    assert list(got) == list(expected)
    for key, value in got.items():
        assert type(value) is EligibleEvidence
        assert value == expected[key] and hash(value) == hash(expected[key])
        assert dataclasses.astuple(value) == dataclasses.astuple(expected[key])
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.content = "changed"  # type: ignore[misc]  # on purpose: frozen at run time too


def test_rows_skip_the_generated_init(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    generated = EligibleEvidence.__init__

    def counting(self: EligibleEvidence, *args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        generated(self, *args, **kwargs)

    monkeypatch.setattr(recall.EligibleEvidence, "__init__", counting)
    assert len(parse_eligible(_rows())) == 7
    assert calls == 0


def test_every_field_is_set() -> None:
    """A field added to EligibleEvidence must be set by parse_eligible too: the
    module checks its list against the dataclass's fields when it loads."""
    assert recall._ELIGIBLE_FIELDS == tuple(f.name for f in dataclasses.fields(EligibleEvidence))
    (value,) = parse_eligible(_rows()[:1]).values()
    for f in dataclasses.fields(EligibleEvidence):
        getattr(value, f.name)  # an unset slot raises AttributeError
