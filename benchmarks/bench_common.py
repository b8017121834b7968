"""Pieces several benchmark scripts share: a gateway as a child process on
loopback, the percentiles they print, and CPU time read from ``/proc``.

The scripts take their p95 in more than one way (nearest rank from below, from
above, or from the count): each keeps its own, named here, so that its figures
stay comparable with those docs/benchmarks.md recorded. Import it as the
scripts import one another (the ``benchmarks`` folder on ``sys.path``).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# --- a gateway as a child process --------------------------------------------------


def free_port() -> int:
    """A loopback port no one listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(
    dsn: str, port: int, workers: int, source: Path = ROOT
) -> subprocess.Popen[bytes]:
    """``recall-gateway serve --port PORT --workers N`` on ``dsn``, warnings only,
    with the tree ``source`` (a folder holding the ``gateway`` package) first on
    the path: this checkout by default, another one for an A/B of versions."""
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "RECALL_LOG_LEVEL": "warning",
        "PYTHONPATH": str(source),
    }
    return subprocess.Popen(  # noqa: S603 - the gateway's own CLI
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        env=env,
        cwd=source,
    )


def wait_ready(port: int) -> None:
    """Until the gateway on ``port`` answers ``/readyz`` (its start-up warm-up
    done), for 150 s at the most."""
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the gateway never said ready")


def stop(*procs: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM to every process at once (each drains for a few seconds), then wait
    for each; one still running after ``timeout`` seconds is killed."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- percentiles ----------------------------------------------------------------


def rank_below(ordered: Sequence[float], q: float) -> float:
    """The value at ``q`` of the way from the smallest to the largest of ``ordered``
    (sorted), rounded down to a rank: no interpolation."""
    return ordered[int(q * (len(ordered) - 1))]


def rank_of_count(values: Sequence[float], q: float) -> float:
    """The value with ``int(q * n)`` values below it (the largest for ``q`` = 1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def p50_p95(values: Sequence[float]) -> tuple[float, float]:
    """The median, and the 95th percentile as the A/B scripts have always taken it
    (the value below which 95 % of the others lie, nearest rank)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return statistics.median(ordered), ordered[max(0, int(len(ordered) * 0.95) - 1)]


# --- CPU time from /proc -----------------------------------------------------------


def schedstat_ns(path: str | Path) -> int:
    """Nanoseconds a process or thread has run on a CPU (the first field of its
    ``/proc/.../schedstat``); 0 once it is gone. ``/proc/PID/stat`` counts in
    clock ticks (10 ms here), too coarse for one request's CPU."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
