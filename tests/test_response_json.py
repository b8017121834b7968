"""Response bodies are encoded with orjson (gateway/http/view.py ``encode_json``):
the same JSON values as the standard library's encoder, UTF-8 text, and what
orjson refuses still encoded."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.http.view import encode_json
from gateway.services.writes import WriteService

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token

ANSWERS: list[Any] = [
    {"data": {"viewer": {"principalId": "alice", "readableSpaces": ["SHARED", "PRIVATE"]}}},
    {
        "data": None,
        "errors": [{"message": "x", "path": ["a", 0, "b"], "extensions": {"code": "C"}}],
    },
    {"data": {"t": 'Zoë — 東京 \u2028 \x00 \\ " /', "n": [0, -1, 2**62, 1.5, True, None]}},
]


@pytest.mark.parametrize("answer", ANSWERS)
def test_same_json_values_as_the_standard_library(answer: Any) -> None:
    body = encode_json(answer)
    assert isinstance(body, bytes)
    assert json.loads(body) == json.loads(json.dumps(answer)) == answer
    assert b" " not in encode_json({"a": [1, 2], "b": {"c": "d"}})  # compact


def test_text_is_utf8_not_escapes() -> None:
    assert encode_json({"t": "Zoë"}) == '{"t":"Zoë"}'.encode()


def test_what_orjson_refuses_is_still_encoded() -> None:
    # a lone surrogate (orjson refuses it) and an integer beyond 64 bits
    for odd in ({"t": "a\ud800b"}, {"n": 2**70}):
        assert json.loads(encode_json(odd)) == odd

    # a key that is not a string, a subclass of float: as the standard library writes them
    class Score(float):
        pass

    for other in ({1: "a"}, {"s": Score(0.25)}):
        assert encode_json(other) == json.dumps(other, separators=(",", ":")).encode()


async def test_an_answer_with_non_ascii_text_is_utf8(
    client: httpx.AsyncClient, writes: WriteService
) -> None:
    team = unique("utf8")
    records = [
        *team_records(team),
        {"kind": "principal", "team": team, "id": "zoe", "display_name": "Zoë Zürich"},
    ]
    await load_jsonl(writes, jsonl(records))
    tok = await token(writes, team, "zoe")
    r = await client.post(
        "/graphql",
        json={"query": "{ viewer { displayName } }"},
        headers={"Authorization": f"Bearer {tok}"},
    )
    assert "Zoë Zürich".encode() in r.content and b"\\u00eb" not in r.content
    assert r.json() == {"data": {"viewer": {"displayName": "Zoë Zürich"}}}
