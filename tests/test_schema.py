"""``schema.graphql`` is the exported schema: a stale copy fails here."""

from __future__ import annotations

from gateway.schema import export_sdl

from .conftest import REPO


def test_committed_schema_is_current() -> None:
    committed = (REPO / "schema.graphql").read_text(encoding="utf-8")
    assert committed == export_sdl(), (
        "schema.graphql is stale: run `recall-gateway export-schema -o schema.graphql`"
    )
