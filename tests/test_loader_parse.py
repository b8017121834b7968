"""Parsing a loader line: one JSON decoding for a valid record, the same messages
for every other line.

Both passes of a load (the check, then the stream that is written) parse every
line; a valid record is decoded once, by pydantic's validation, and only the
other lines (the ``embedding_model`` line, invalid ones) take the checks that
decode them again with ``json.loads`` to say what is wrong. The messages below
are those the loader gave before that change, line for line.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.services import loader

_MODEL = '{"kind": "embedding_model", "model": "m", "dimensions": 3}'
_EVIDENCE = '{"kind": "evidence", "team": "t1", "id": "%s", "source": "s", "content": "c"'

# (line, what the loader makes of it: a record's id, or the message)
_LINES: list[tuple[str, str]] = [
    ('{"kind": "team", "id": "t1", "name": "T"}', "record t1"),
    (
        '{"kind": "team", "id": "t1", "name": "T", "colour": "red"}',
        "field 'colour': Extra inputs are not permitted",
    ),
    (
        '{"kind": "team", "id": "t1", "name": "T\\ud800"}',
        "Invalid JSON: unexpected end of hex escape at line 1 column 46",
    ),
    ('{"kind": "team", "id": "t1", "name": NaN}', "field 'name': Input should be a valid string"),
    (
        '{"kind": "team", "id": "t1", "name": "a\tb"}',
        "not valid JSON (Invalid control character at at column 40)",
    ),
    ("[1, 2]", "a record must be a JSON object"),
    ('"team"', "a record must be a JSON object"),
    ('{"kind": "gossip", "id": "x"}', "field 'kind': unknown kind 'gossip'; one of: "),
    ('{"id": "x"}', "field 'kind': missing; one of: "),
    (
        '{"kind": "team", "id": "t1", "name": "T",}',
        "not valid JSON (Expecting property name enclosed in double quotes at column 42)",
    ),
    (
        _EVIDENCE % "e1" + ', "embedding": [1, 0, 0]}',
        "field 'embedding': a supplied vector needs an 'embedding_model' line earlier "
        "in the file naming the model and dimensions it was made with",
    ),
    (_MODEL, "model"),
    (
        _EVIDENCE % "e1" + ', "embedding": [1, 0]}',
        "field 'embedding': 2 numbers; the file's embedding model 'm' makes 3",
    ),
    (
        _EVIDENCE % "e1" + ', "embedding": [NaN, 0, 1]}',
        "field 'embedding': the vector must hold finite numbers, not all zero",
    ),
    (
        _EVIDENCE % "e1" + ', "embedding": [Infinity, 0, 1]}',
        "field 'embedding': the vector must hold finite numbers, not all zero",
    ),
    (
        _EVIDENCE % "e1" + ', "embedding": [0, 0, 0]}',
        "field 'embedding': the vector must hold finite numbers, not all zero",
    ),
    (_EVIDENCE % "e2" + ', "embedding": [0.5, 0, 1]}', "record e2"),
    (
        _EVIDENCE % "e3" + ', "embedding": [1e400, 0, 1]}',
        "field 'embedding': the vector must hold finite numbers, not all zero",
    ),
    (_MODEL, "field 'kind': the embedding model is named twice"),
    # duplicate keys: the last one counts, for both decoders
    ('{"kind": "embedding_model", "id": "t2", "name": "T", "kind": "team"}', "record t2"),
    ('{"kind": "team", "id": "t4", "name": "T", "created_at": 5}', "field 'created_at': "),
]


def _outcomes(lines: list[str]) -> list[str]:
    errors: list[loader.LineError] = []
    out: dict[int, str] = {}
    for number, item in loader._parse(lines, errors):
        out[number] = (
            "model" if isinstance(item, loader.EmbeddingModelLine) else f"record {item.id}"
        )
    for error in errors:
        where = f"field '{error.field}': " if error.field else ""
        out.setdefault(error.line, f"{where}{error.message}")
    return [out.get(n, "?") for n in range(1, len(lines) + 1)]


def test_every_line_is_what_it_was_before() -> None:
    found = _outcomes([line for line, _ in _LINES])
    for (line, expected), got in zip(_LINES, found, strict=True):
        assert got.startswith(expected), (line, got)


def test_a_valid_record_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[str] = []
    real = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        decoded.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)  # the module loader reads with
    lines = [
        _MODEL,
        '{"kind": "team", "id": "t1", "name": "T"}',
        _EVIDENCE % "e1" + ', "embedding": [0.5, 0, 1]}',
        '{"kind": "team", "id": "t1", "name": "T", "colour": "red"}',
    ]
    assert _outcomes(lines) == [
        "model",
        "record t1",
        "record e1",
        "field 'colour': Extra inputs are not permitted",
    ]
    # only the model line and the invalid one are decoded by json.loads
    assert decoded == [lines[0], lines[3]]


@pytest.mark.parametrize(
    "deep",
    [
        "[" * 5000 + "]" * 5000,
        '{"a": ' * 5000 + "1" + "}" * 5000,
        '{"kind": "team", "id": "t1", "name": "T", "x": ' + "[" * 5000 + "]" * 5000 + "}",
    ],
    ids=["list", "object", "inside-a-record"],
)
def test_a_deeply_nested_line_is_a_line_error(deep: str) -> None:
    """A line nested thousands deep is refused with its line number like any other
    invalid JSON, not a RecursionError out of the decoder (review L4); the lines
    around it are checked as usual."""
    lines = ['{"kind": "team", "id": "t1", "name": "T"}', deep, '{"kind": "team", "id": "t2"}']
    assert _outcomes(lines) == [
        "record t1",
        "not valid JSON (nested too deeply)",
        "field 'name': Field required",
    ]
    with pytest.raises(loader.LoadError) as caught:
        loader.check(lines)
    assert [(e.line, e.message) for e in caught.value.errors][:1] == [
        (2, "not valid JSON (nested too deeply)")
    ]
