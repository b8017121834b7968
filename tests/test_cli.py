"""The command line, run as a user runs it: a subprocess of the installed console script."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from gateway.cli import check_listen_address
from gateway.errors import ConfigurationError
from gateway.services.records import RECORD_KINDS

from .conftest import REPO, unique
from .factories import jsonl, team_records

CLI = [sys.executable, "-m", "gateway.cli"]


def run(
    args: list[str], dsn: str | None, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RECALL_DATABASE_URL")
    }
    if dsn is not None:
        environ["DATABASE_URL"] = dsn
    environ.update(env)
    return subprocess.run(
        CLI + args, input=stdin, capture_output=True, text=True, env=environ, timeout=120, cwd=REPO
    )


def test_migrate_is_idempotent(dsn: str) -> None:
    result = run(["migrate"], dsn)
    assert result.returncode == 0, result.stderr
    assert "nothing to apply" in result.stdout


def test_load_file_then_again_then_stdin(dsn: str, tmp_path: Path) -> None:
    team = unique("cli")
    path = tmp_path / "memory.jsonl"
    path.write_text(jsonl(team_records(team)))
    first = run(["load", str(path)], dsn)
    assert first.returncode == 0, first.stderr
    assert f"loaded {len(team_records(team))} record(s)" in first.stdout
    assert "0 already present" in first.stdout
    again = run(["load", "-"], dsn, stdin=path.read_text())
    assert again.returncode == 0, again.stderr
    assert " 0 written" in again.stdout


def test_load_reports_progress_without_a_terminal(dsn: str, tmp_path: Path) -> None:
    team = unique("cliprog")
    path = tmp_path / "memory.jsonl"
    path.write_text(jsonl(team_records(team)))
    result = run(["load", str(path)], dsn, RECALL_LOAD_PROGRESS_INTERVAL_S="0.05")
    assert result.returncode == 0, result.stderr
    total = len(team_records(team))
    lines = [x for x in result.stderr.splitlines() if x.startswith("loading: ")]
    assert lines, result.stderr
    assert re.fullmatch(rf"loading: {total}/{total} records \(100%\), [\d,]+ records/s", lines[-1])


def test_bad_line_names_line_and_field(dsn: str, tmp_path: Path) -> None:
    team = unique("clibad")
    records = team_records(team)
    records[3]["authority"] = "supreme"
    path = tmp_path / "bad.jsonl"
    path.write_text(jsonl(records))
    result = run(["load", str(path)], dsn)
    assert result.returncode == 1
    assert "line 4, field 'authority'" in result.stderr
    assert "nothing was written" in result.stderr
    assert "Traceback" not in result.stderr


def test_refusals_lead_with_their_stable_code(dsn: str, tmp_path: Path) -> None:
    """A refused file prints each refusal's code from docs/errors.md before its
    line-precise message: the lines' own codes and the load's LOAD_REFUSED for an
    invalid file; the record's code (here NOT_FOUND) for a batch the database
    refused; and a command's failure its code too."""
    team = unique("clicode")
    records = team_records(team)
    records[3]["authority"] = "supreme"
    records[5] = {"kind": "gossip", "team": team, "id": "g"}
    invalid = tmp_path / "invalid.jsonl"
    invalid.write_text(jsonl(records))
    result = run(["load", str(invalid)], dsn)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "recall-gateway: error BAD_USER_INPUT: line 4, field 'authority': Input should be "
        "'unverified', 'low', 'medium', 'high' or 'authoritative'",
        "recall-gateway: error BAD_USER_INPUT: line 6, field 'kind': unknown kind 'gossip'; "
        "one of: " + ", ".join(RECORD_KINDS),
        "recall-gateway: error LOAD_REFUSED: 2 invalid line(s); nothing was written",
    ]

    unknown = tmp_path / "unknown.jsonl"
    lines = [
        *team_records(team),
        {"kind": "evidence", "team": team, "id": "ev-x", "source": "nope", "content": "x"},
    ]
    unknown.write_text(jsonl(lines))
    refused = run(["load", str(unknown)], dsn)
    assert refused.returncode == 1
    last = [x for x in refused.stderr.splitlines() if x.startswith("recall-gateway:")]
    assert len(last) == 1, refused.stderr
    assert last[0].startswith(
        f"recall-gateway: error NOT_FOUND: line {len(lines)}, field 'source': "
        f"no source 'nope' in team '{team}'"
    ), refused.stderr
    assert "were not written" in last[0]

    missing = run(["load", "no-such-file.jsonl"], dsn)
    assert missing.stderr == (
        "recall-gateway: error BAD_USER_INPUT: no such file: no-such-file.jsonl\n"
    )
    nobody = run(["tokens", "issue", "--team", team, "--principal", "nobody"], dsn)
    assert nobody.returncode == 1
    assert nobody.stderr.startswith("recall-gateway: error NOT_FOUND: "), nobody.stderr


def test_missing_file_and_bad_flag(dsn: str) -> None:
    result = run(["load", "no-such-file.jsonl"], dsn)
    assert result.returncode == 1 and "no such file" in result.stderr
    result = run(["load", "-", "--batch-size", "0"], dsn, stdin="")
    assert result.returncode == 2 and "between 1 and 100000" in result.stderr


def test_tokens_issue_prints_a_working_token(dsn: str) -> None:
    team = unique("clitok")
    assert run(["load", "-"], dsn, stdin=jsonl(team_records(team))).returncode == 0
    result = run(["tokens", "issue", "--team", team, "--principal", "bob"], dsn)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"rgt_t-[0-9a-f]{16}_[A-Za-z0-9_-]{43}\n", result.stdout)
    refused = run(["tokens", "issue", "--team", team, "--principal", "nobody"], dsn)
    assert refused.returncode == 1 and "no principal 'nobody'" in refused.stderr


def test_tokens_issue_refuses_a_lifetime_that_is_not_a_positive_number_of_days(
    dsn: str,
) -> None:
    """``--expires-in-days 0`` once issued a token that never expired (0 read as
    "no expiry"), a negative value or one under a minute a token expired by the
    time it is printed, and ``nan``, ``inf`` or ``1e9`` a traceback after the
    database had started: each is refused by the argument parser (exit 2, naming
    the flag) and no token is written. A fraction of a day still issues a token
    that expires."""
    team = unique("clidays")
    assert run(["load", "-"], dsn, stdin=jsonl(team_records(team))).returncode == 0
    issue = ["tokens", "issue", "--team", team, "--principal", "bob"]
    for days in ("0", "-1", "1e-9", "0.0006", "nan", "inf", "1e9"):
        refused = run([*issue, "--expires-in-days", days, "--label", f"days {days}"], dsn)
        assert refused.returncode == 2, (days, refused.stdout, refused.stderr)
        assert "--expires-in-days" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr, refused.stderr
    listed = run(["tokens", "list", "--team", team], dsn)
    assert listed.returncode == 0, listed.stderr
    assert "days " not in listed.stdout, listed.stdout
    issued = run([*issue, "--expires-in-days", "0.5", "--label", "half a day"], dsn)
    assert issued.returncode == 0, issued.stderr
    line = next(
        x
        for x in run(["tokens", "list", "--team", team], dsn).stdout.splitlines()
        if x.endswith("half a day")
    )
    fields = line.split()
    assert fields[4] == "active" and fields[6] != "-", line


def test_export_schema_matches_committed(tmp_path: Path) -> None:
    out = tmp_path / "schema.graphql"
    assert run(["export-schema", "-o", str(out)], None).returncode == 0
    assert out.read_text() == (REPO / "schema.graphql").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "command", [["serve"], ["demo"], ["mcp", "--transport", "http"]], ids=lambda c: c[0]
)
def test_a_port_in_use_is_refused_before_anything_starts(
    command: list[str], tmp_path: Path
) -> None:
    """A second gateway on a port another process listens on (a demo left
    running in another terminal) once started the embedded database, migrated,
    and for ``demo`` loaded the data, issued a token and printed "demo is
    starting" with its URL, before uvicorn failed to bind (exit 3, under that
    banner). It is refused first, naming the port and how to choose another,
    and nothing starts: the data folder stays empty."""
    data = tmp_path / "data"
    data.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run(
            command, None, RECALL_DATA_DIR=str(data), RECALL_PORT=str(port), RECALL_HOST="127.0.0.1"
        )
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith(
        f"recall-gateway: error CONFIGURATION_ERROR: cannot listen on 127.0.0.1:{port}: "
    ), result.stderr
    assert "--port" in result.stderr and "RECALL_PORT" in result.stderr, result.stderr
    assert "demo is starting" not in result.stdout and "RECALL_TOKEN" not in result.stdout
    assert list(data.iterdir()) == [], "a database was started"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _listening(family: socket.AddressFamily, host: str, port: int = 0) -> socket.socket:
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's listener
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, port))
    sock.listen()
    return sock


def test_the_port_probe_refuses_only_what_the_bind_would() -> None:
    """The probe must never refuse a start that would have worked (review of
    the busy-port check): each case is what the bind that follows does, asyncio's
    ``create_server`` for one worker, uvicorn's ``bind_socket`` for several."""
    # a port left in TIME_WAIT by a gateway stopped after serving a request (the
    # common Ctrl-C and start again) is free to listen on, as SO_REUSEADDR makes it
    with _listening(socket.AF_INET, "127.0.0.1") as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            served, _ = listener.accept()
            served.close()  # the server side closes first: it keeps the TIME_WAIT
            client.recv(1)
    check_listen_address("127.0.0.1", port)
    check_listen_address("127.0.0.1", 0)  # any free port
    # busy: the same address, or the wildcard over a listening loopback
    with _listening(socket.AF_INET, "127.0.0.1") as busy:
        port = busy.getsockname()[1]
        for host in ("127.0.0.1", "0.0.0.0", "localhost"):
            with pytest.raises(ConfigurationError, match="Address already in use") as refused:
                check_listen_address(host, port)
            assert f"{host}:{port}" in str(refused.value) and "RECALL_PORT" in str(refused.value)
    # an address that is not this machine's is refused without blaming another gateway
    with pytest.raises(ConfigurationError) as foreign:
        check_listen_address("192.0.2.1", 18000)
    assert "cannot listen on 192.0.2.1:18000" in str(foreign.value)
    assert "another gateway" not in str(foreign.value)
    if not _ipv6_loopback():
        return
    # one worker listens IPv6-only on "::" (asyncio sets IPV6_V6ONLY), so an IPv4
    # listener on the same port does not stop it; several workers share uvicorn's
    # dual-stack socket, which it does stop
    with _listening(socket.AF_INET, "0.0.0.0") as ipv4:
        port = ipv4.getsockname()[1]
        check_listen_address("::", port)
        with pytest.raises(ConfigurationError, match="Address already in use"):
            check_listen_address("::", port, workers=2)
    with _listening(socket.AF_INET6, "::1") as busy6:
        port = busy6.getsockname()[1]
        with pytest.raises(ConfigurationError) as refused6:
            check_listen_address("::1", port)
        assert f"cannot listen on [::1]:{port}: " in str(refused6.value)


@pytest.mark.slow
def test_demo_serves_viewer_and_stops_its_database(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The README's demo path, on its own embedded database."""
    data = tmp_path_factory.mktemp("demo")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RECALL_DATABASE_URL")}
    env.update(RECALL_DATA_DIR=str(data), RECALL_PORT=str(port))
    proc = subprocess.Popen(
        [*CLI, "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    try:
        token = None
        deadline = time.monotonic() + 90
        assert proc.stdout is not None
        while time.monotonic() < deadline and token is None:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"demo exited: {proc.stderr.read() if proc.stderr else ''}")
            match = re.search(r"RECALL_TOKEN=(rgt_\S+)", line)
            token = match.group(1) if match else None
        assert token, "the demo printed no token"
        url = f"http://127.0.0.1:{port}"
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        answer = httpx.post(
            f"{url}/graphql",
            json={"query": "{ viewer { principalId team { id } readableSpaces } }"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        ).json()
        assert answer == {
            "data": {
                "viewer": {
                    "principalId": "ines",
                    "team": {"id": "northwind"},
                    "readableSpaces": ["SHARED", "PRIVATE"],
                }
            }
        }
        # One worker serving, after loading and embedding the demo in the same
        # process: within the 400 MB a worker may take (docs/benchmarks.md).
        rss_mib = psutil.Process(proc.pid).memory_info().rss / 2**20
        assert rss_mib <= 400, f"the demo process holds {rss_mib:.0f} MiB"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    postmaster = data / "pgdata" / "postmaster.pid"
    assert not postmaster.exists(), "the demo left its database running"
    shutil.rmtree(data, ignore_errors=True)


def test_progress_bar_on_a_terminal(dsn: str, tmp_path: Path) -> None:
    """On a terminal the loader shows a progress bar; piped, it prints only the summary."""
    import pty

    team = unique("clipty")
    path = tmp_path / "memory.jsonl"
    path.write_text(jsonl(team_records(team)))
    controller, terminal = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k != "RECALL_DATABASE_URL"}
    environ.update(DATABASE_URL=dsn, COLUMNS="100", TERM="xterm")
    proc = subprocess.run(
        [*CLI, "load", str(path), "--batch-size", "2"],
        stdout=subprocess.PIPE,
        stderr=terminal,
        env=environ,
        cwd=REPO,
        timeout=120,
        text=True,
    )
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert proc.returncode == 0, shown.decode(errors="replace")
    assert "loading" in shown.decode(errors="replace")
    assert f"/{len(team_records(team))}" in shown.decode(errors="replace")
