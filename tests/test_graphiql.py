"""The GraphiQL page: its files, its policy, its examples (the browser test runs it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from graphql import parse, validate

from gateway.graphiql import AssetError, GraphiQLPage, vendor
from gateway.graphiql.assets import VENDOR_DIR, load, read_manifest
from gateway.graphiql.page import examples
from gateway.http import limits as http_limits
from gateway.schema import build_schema
from gateway.settings import Settings

from .conftest import app_for


def test_the_examples_are_valid_and_cheap_enough_for_production() -> None:
    schema = build_schema()._schema
    # every production bound (cost, depth, selections, repeats, ...), then the spec's rules
    production = http_limits.validator(http_limits.resolve(Settings(env="production")))
    found = examples()
    assert [e.name for e in found] == ["1-recall", "2-trace", "3-remember"]
    for example in found:
        errors = production.precheck(schema, parse(example.query))[0]
        errors += validate(schema, parse(example.query))
        assert errors == [], (example.name, errors)
        json.loads(example.variables)
    recall = found[0].query
    for frontier in (
        "results",
        "relatedRelationships",
        "relatedCommunities",
        "relatedHypotheses",
        "conflicts",
        "degradations",
        "suggestedActions",
    ):
        assert frontier in recall


def test_the_page_loads_only_the_gateway_s_files(tmp_path: Path) -> None:
    page = GraphiQLPage()
    response = page.render("/graphql")
    body = bytes(response.body).decode()
    assert response.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', body)
    assert sources and all(s.startswith("/graphiql/3.9.0/") for s in sources), sources
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp
    assert "default-src 'none'" in csp
    # The examples travel as JSON inside the page; "<" is escaped so none can end the block.
    config = re.search(r'type="application/json">(.*?)</script>', body, re.S)
    assert config and "<" not in config.group(1)
    assert json.loads(config.group(1))["endpoint"] == "/graphql"


def test_missing_or_changed_files_are_refused(tmp_path: Path) -> None:
    page = GraphiQLPage(vendor_dir=tmp_path)
    response = page.render("/graphql")
    assert response.status_code == 503 and b"scripts/setup" in response.body
    for asset in read_manifest().files:
        (tmp_path / asset.name).write_bytes((VENDOR_DIR / asset.name).read_bytes())
    assert set(load(tmp_path)) >= {"graphiql.min.js", "react.production.min.js"}
    (tmp_path / "graphiql.min.js").write_bytes(b"alert('not graphiql')")
    with pytest.raises(AssetError, match="not the recorded file"):
        load(tmp_path)


def test_vendoring_refuses_a_package_that_is_not_the_recorded_one(tmp_path: Path) -> None:
    modules = tmp_path / "node_modules"
    for asset in read_manifest().files:
        target = modules / asset.package / asset.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((VENDOR_DIR / asset.name).read_bytes())
        (modules / asset.package / "package.json").write_text(
            json.dumps({"version": asset.version})
        )
    installed = vendor(modules, tmp_path / "vendor")
    assert {a.package for a in installed} == {"graphiql", "react", "react-dom"}
    (modules / "react" / "umd" / "react.production.min.js").write_text("tampered")
    with pytest.raises(AssetError, match="SHA-256"):
        vendor(modules, tmp_path / "vendor2")
    assert not (tmp_path / "vendor2").exists()


async def test_the_page_sends_each_security_header_once(dsn: str) -> None:
    """The page sets ``Cache-Control`` and ``X-Content-Type-Options`` itself and
    the GraphQL view added both again: two of each reached the browser."""
    import httpx

    app = app_for(dsn)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            r = await c.get("/graphql", headers={"accept": "text/html"})
            assert r.status_code == 200 and "GraphiQL" in r.text
            for name in ("cache-control", "x-content-type-options", "content-security-policy"):
                assert len(r.headers.get_list(name)) == 1, (name, r.headers.get_list(name))
            assert r.headers["cache-control"] == "no-store"
            r = await c.post("/graphql", json={"query": "{ __typename }"})
            assert r.headers.get_list("cache-control") == ["no-store"], r.headers
            assert r.headers.get_list("x-content-type-options") == ["nosniff"], r.headers


async def test_production_serves_neither_page_nor_files(dsn: str) -> None:
    import httpx

    app = app_for(dsn, env="production")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            r = await c.get("/graphql", headers={"accept": "text/html"})
            assert r.status_code == 404
            assert (await c.get("/graphiql/3.9.0/graphiql.min.js")).status_code == 404
