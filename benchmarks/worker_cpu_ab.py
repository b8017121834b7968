"""Worker CPU per full recall of two (or more) versions of the gateway, interleaved.

    python benchmarks/worker_cpu_ab.py --data-dir HELD10K \\
        --arm before=CHECKOUT_OF_MAIN --arm after=. --rounds 6
    python benchmarks/worker_cpu_ab.py --data-dir HELD10K --arm after=. --rounds 1 \\
        --profile profiles/            # py-spy on every worker (if installed)

recall_bench.py's throughput step for versions of the code: each arm is a source
tree (a checkout or ``git archive`` of a commit), run as ``recall-gateway serve
--workers N`` with that tree first on ``PYTHONPATH``, on one dataset kept by
``recall_bench.py --data-dir`` (its embedded server started once, here). Per
round and arm: the gateway starts, ``--warmup`` recalls ask every question
(so the query embeddings come from each worker's LRU, as in the throughput
step's repeated questions), then ``--requests`` full recalls over
``--clients`` keep-alive connections (benchmarks/load_test.py's client), and
the CPU time of the gateway's processes and of PostgreSQL's over them, per
recall. The arms' order alternates every round, so each sees the machine's
load alike; on a shared machine read the medians and the per-round ratios,
not one round. With ``--profile DIR``, ``py-spy record --format raw`` samples
every worker during the measured requests (one file per worker; sum the
stacks to see where a worker's CPU goes). Each round also prints how many query
embeddings the workers ran during its measured requests (``/metrics``): each
worker has its own LRU, so when the measured requests' connections land on the
workers otherwise than the warm-up's did, questions new to a worker run the
model (about 8 ms of CPU each) and count in the workers' CPU per recall; compare
rounds with the same number of model runs, or none.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import load_test  # noqa: E402
import recall_bench  # noqa: E402
from bench_common import start_gateway, stop, wait_ready  # noqa: E402


def parse_arm(text: str) -> tuple[str, Path]:
    """``NAME=SOURCE_DIR``: a tree holding the ``gateway`` package."""
    name, sep, folder = text.partition("=")
    source = Path(folder).resolve()
    if not sep or not name or not (source / "gateway" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=DIR with DIR/gateway/")
    return name, source


def workers_of(proc: subprocess.Popen[bytes]) -> list[int]:
    """uvicorn's worker processes (spawned children, not the resource tracker)."""
    found = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        line = " ".join(child.cmdline())
        if "multiprocessing" in line and "resource_tracker" not in line:
            found.append(child.pid)
    return found


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def worker_connections(workers: list[psutil.Process], port: int) -> list[int]:
    """The clients' connections each worker holds (established, on the gateway's
    port): which worker accepted which keep-alive client."""
    counts = []
    for worker in workers:
        held = worker.net_connections(kind="tcp")
        counts.append(
            sum(1 for c in held if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port)
        )
    return counts


async def _load_and_look(
    args: argparse.Namespace, token: str, workers: list[psutil.Process]
) -> dict[str, Any]:
    """The measured requests; half a second in (every client connected by then),
    the clients' connections each worker holds."""
    load = asyncio.create_task(
        load_test.run_load(args.port, token, args.requests, args.clients, recall_bench.FULL)
    )
    await asyncio.sleep(0.5)
    held = await asyncio.to_thread(worker_connections, workers, args.port)
    result: dict[str, Any] = dict(await load)
    result["connections"] = held
    return result


def one_run(
    source: Path, dsn: str, token: str, args: argparse.Namespace, server: list[int], label: str
) -> dict[str, Any]:
    proc = start_gateway(dsn, args.port, args.workers, source)
    spies: list[subprocess.Popen[bytes]] = []
    try:
        wait_ready(args.port)
        asyncio.run(
            load_test.run_load(args.port, token, args.warmup, args.clients, recall_bench.FULL)
        )
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            for pid in workers_of(proc):
                out = args.profile / f"{label}.{pid}.txt"
                spies.append(
                    subprocess.Popen(  # noqa: S603
                        [
                            py_spy,
                            "record",
                            "--pid",
                            str(pid),
                            "--format",
                            "raw",
                            "-o",
                            str(out),
                            "--rate",
                            "250",
                            "--nonblocking",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            time.sleep(1.0)
        workers = [psutil.Process(pid) for pid in workers_of(proc)]
        load_before = os.getloadavg()[0]
        runs0 = recall_bench._model_runs(args.port)
        gw0, pg0 = recall_bench._tree_cpu([proc.pid]), recall_bench._tree_cpu(server)
        each0 = [_cpu(w) for w in workers]
        result = asyncio.run(_load_and_look(args, token, workers))
        gw1, pg1 = recall_bench._tree_cpu([proc.pid]), recall_bench._tree_cpu(server)
        runs1 = recall_bench._model_runs(args.port)
        result["model_runs"] = None if runs0 is None or runs1 is None else round(runs1 - runs0)
        result["side"] = recall_bench.side_discoveries(args.port)  # warm-up included
        result["worker_cpu_s"] = [_cpu(w) - c for w, c in zip(workers, each0, strict=True)]
        result["load"] = (load_before, os.getloadavg()[0])
    finally:
        for spy in spies:
            spy.send_signal(2)
        for spy in spies:
            spy.wait(timeout=60)
        stop(proc)
    count = max(int(result["requests"]), 1)
    result["gateway_cpu_ms"] = (gw1 - gw0) / count * 1000
    result["server_cpu_ms"] = (pg1 - pg0) / count * 1000
    result["per_s"] = count / result["elapsed_s"]
    return result


def _shares(seconds: list[float]) -> str:
    total = sum(seconds) or 1.0
    return "/".join(f"{100 * s / total:.0f}%" for s in seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--arm", type=parse_arm, action="append", required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--profile", type=Path, help="py-spy raw profiles of the workers here")
    args = parser.parse_args()
    # recall_bench.py's questions (its --queries and --seed), in its order
    corpus = recall_bench.Zipf(np.random.default_rng(args.seed + 3))
    rng = np.random.default_rng(args.seed + 2)
    load_test.QUERIES[:] = [
        corpus.query(rng, int(rng.integers(0, len(recall_bench.TOPICS))))
        for _ in range(args.queries)
    ]
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in args.arm}
    with recall_bench.database(args.data_dir) as dsn:
        data = asyncio.run(recall_bench.reuse(dsn, args.seed))
        if data is None:
            raise SystemExit(f"no recall_bench dataset in {args.data_dir}")
        server = recall_bench._server_processes(dsn)
        for r in range(args.rounds):
            order = args.arm if r % 2 == 0 else args.arm[::-1]
            for name, source in order:
                got = one_run(source, dsn, data["token"], args, server, f"{name}.r{r}")
                rows[name].append(got)
                print(
                    f"round {r} {name:10} workers {got['gateway_cpu_ms']:5.1f} ms  PostgreSQL "
                    f"{got['server_cpu_ms']:5.1f} ms per recall  {got['per_s']:5.1f}/s  "
                    f"p50 {got['p50_ms']:.0f} ms  errors {len(got['failures'])}  load average "
                    f"{got['load'][0]:.1f} -> {got['load'][1]:.1f}  connections per worker "
                    f"{got['connections']}  CPU share per worker "
                    f"{_shares(got['worker_cpu_s'])}  model runs {got['model_runs']}  side "
                    f"discoveries (warm-up included) {recall_bench._side_text(got['side'])}",
                    flush=True,
                )
    first = args.arm[0][0]
    for name, _ in args.arm:
        mine = rows[name]
        line = (
            f"{name:10} median over {len(mine)} rounds: workers "
            f"{statistics.median(g['gateway_cpu_ms'] for g in mine):.2f} ms, PostgreSQL "
            f"{statistics.median(g['server_cpu_ms'] for g in mine):.2f} ms per recall, "
            f"{statistics.median(g['per_s'] for g in mine):.1f} recalls/s"
        )
        if name != first:
            ratios = [
                g["gateway_cpu_ms"] / b["gateway_cpu_ms"]
                for g, b in zip(mine, rows[first], strict=True)
            ]
            line += f"; workers' CPU / {first}'s, median of the rounds' ratios: " + (
                f"{statistics.median(ratios):.3f}"
            )
        print(line)


if __name__ == "__main__":
    main()
