from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway import tokens

ids = st.from_regex(r"^[A-Za-z0-9][A-Za-z0-9-]{2,63}$", fullmatch=True)


@given(ids)
def test_format_parse_round_trip(token_id: str) -> None:
    secret = tokens.new_secret()
    parsed = tokens.parse_token(tokens.format_token(token_id, secret))
    assert parsed == tokens.ParsedToken(token_id, secret)
    assert tokens.secret_matches(tokens.hash_secret(secret), parsed)


@given(st.text(max_size=200))
def test_garbage_never_parses_into_something_odd(raw: str) -> None:
    parsed = tokens.parse_token(raw)
    if parsed is not None:
        assert tokens.format_token(parsed.token_id, parsed.secret) == raw


def test_wrong_secret_does_not_match() -> None:
    parsed = tokens.parse_token(tokens.format_token("t-abc", tokens.new_secret()))
    assert parsed is not None
    assert not tokens.secret_matches(tokens.hash_secret(tokens.new_secret()), parsed)
    assert tokens.parse_token("Bearer x") is None
    assert tokens.parse_token("rgt_ab_" + "a" * 43) is None  # id too short
