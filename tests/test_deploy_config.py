"""The scaled example of docker/compose.yaml, checked without a Docker engine:
two gateway replicas on one database behind HAProxy, health-checked on /readyz.

The compose file is parsed as YAML (merge keys resolved, as compose does) and the
load balancer's configuration is read for the upstreams and checks it must name;
``haproxy -c`` (installed by scripts/setup) checks the configuration's syntax.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from .conftest import REPO

COMPOSE = REPO / "docker" / "compose.yaml"
HAPROXY = REPO / "docker" / "haproxy.cfg"
REPLICAS = ("gateway-a", "gateway-b")


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return loaded


def _backend(text: str) -> list[str]:
    """The lines of the backend the frontend sends requests to."""
    sections = re.split(r"^(?=\S)", text, flags=re.M)
    frontend = next(s for s in sections if s.startswith("frontend "))
    name = re.search(r"^\s*default_backend\s+(\S+)", frontend, re.M)
    assert name, "the frontend names no default_backend"
    backend = next(s for s in sections if s.startswith(f"backend {name[1]}"))
    return [line.strip() for line in backend.splitlines()[1:] if line.strip()]


def test_two_replicas_on_one_database_behind_the_load_balancer() -> None:
    services = _compose()["services"]
    single = services["gateway"]
    for name in REPLICAS:
        replica = services[name]
        assert replica["profiles"] == ["scaled"]
        assert replica["build"] == single["build"]  # the same image
        assert replica["environment"]["DATABASE_URL"] == single["environment"]["DATABASE_URL"]
        assert "ports" not in replica  # reached through the load balancer only
        check = " ".join(replica["healthcheck"]["test"])
        assert "/readyz" in check and "127.0.0.1:8000" in check
        assert replica["depends_on"]["db"]["condition"] == "service_healthy"
    lb = services["lb"]
    assert lb["profiles"] == ["scaled"]
    assert lb["image"].startswith("haproxy:")
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in lb["volumes"]
    assert {name: lb["depends_on"][name]["condition"] for name in REPLICAS} == {
        name: "service_healthy" for name in REPLICAS
    }
    # the published port is the one HAProxy binds
    published = lb["ports"][0].rsplit(":", 1)[1]
    assert re.search(rf"^\s*bind\s+:{published}\s*$", HAPROXY.read_text(), re.M)


def test_the_load_balancer_checks_readyz_on_both_replicas() -> None:
    lines = _backend(HAPROXY.read_text(encoding="utf-8"))
    assert "option httpchk GET /readyz" in lines
    assert "http-check expect status 200" in lines
    defaults = next(line for line in lines if line.startswith("default-server"))
    assert " check" in f" {defaults}"
    servers = {
        parts[1]: parts[2] for parts in (line.split() for line in lines) if parts[0] == "server"
    }
    assert servers == {name: f"{name}:8000" for name in REPLICAS}
    services = _compose()["services"]
    assert set(servers) <= set(services)


def test_haproxy_accepts_the_configuration() -> None:
    haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    if haproxy is None:
        pytest.skip("haproxy is not installed (scripts/setup installs it as root)")
    checked = subprocess.run(
        [haproxy, "-c", "-f", str(HAPROXY)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Configuration file is valid" in checked.stdout + checked.stderr
