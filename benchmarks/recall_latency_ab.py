"""Recall latency of two (or more) versions of the gateway, interleaved, over HTTP.

    git archive COMMIT | tar -x -C PATH/TO/BEFORE
    python benchmarks/recall_latency_ab.py --data-dir HELD100K \\
        --arm before=PATH/TO/BEFORE --arm after=. --queries 100

recall_ab.py compares settings of one version in one process; this compares
versions of the code: each arm is a source tree (a checkout or ``git archive``
of a commit) run as ``recall-gateway serve --workers 1`` with that tree first
on ``PYTHONPATH``, on one dataset kept by ``recall_bench.py --data-dir`` (its
embedded server started once, here), all arms up at once. Questions are sent
one at a time (the latency of one recall, not throughput): every question to
every arm, the arms' order rotated one place per question, so that the load of
a shared machine falls on all arms alike. Kinds of recall:

- ``fresh``: a full recall (recall_bench.py's FULL) of a question never asked
  before, so its query embedding is the model's;
- ``repeated``: the same question again, its embedding from the LRU;
- ``knownAt``: a full recall of a fresh question as a knownAt view;
- ``evidence-only``: recall_bench.py's EVIDENCE_ONLY (``relationshipLimit: 0,
  communityLimit: 0``) of a fresh question.

``--kinds`` chooses them (default: the first three).

Prints per kind and arm p50 and p95 end to end (the first five questions warm
up and are not counted), each arm's p50 against the first arm's, the median of
the paired differences (each question's latency on the arm less its latency on
the first arm, asked back to back: steadier than the difference of the p50s
on a loaded machine) and the share of questions the arm answered faster; the
load average; and the number of questions whose ranked results and related
relationships differ between arms (exit 1 if any).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import recall_bench as rb  # noqa: E402
import worker_cpu_ab  # noqa: E402
from bench_common import p50_p95, start_gateway, stop, wait_ready  # noqa: E402

WARM = 5


def ask(
    client: httpx.Client, token: str, document: str, variables: dict[str, Any]
) -> tuple[float, str]:
    started = time.perf_counter()
    r = client.post(
        "/graphql",
        json={"query": document, "variables": variables},
        headers={"Authorization": f"Bearer {token}"},
    )
    elapsed = (time.perf_counter() - started) * 1000
    body = r.json()
    if "errors" in body:
        raise SystemExit(f"recall failed: {body['errors']}")
    got = body["data"]["recallMemory"]
    return elapsed, json.dumps([got["results"], got.get("relatedRelationships")], sort_keys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--arm", type=worker_cpu_ab.parse_arm, action="append", required=True)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--port", type=int, default=8795, help="the first arm's; then +1 each")
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument(
        "--kinds",
        default="fresh,repeated,knownAt",
        help="comma-separated: fresh, repeated, knownAt, evidence-only",
    )
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = set(kinds) - {"fresh", "repeated", "knownAt", "evidence-only"}
    if unknown:
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    corpus = rb.Zipf(np.random.default_rng(args.seed))
    rng = np.random.default_rng(args.seed + 1)
    questions = [
        corpus.query(rng, int(rng.integers(0, len(rb.TOPICS))))
        for _ in range(3 * (args.queries + WARM))
    ]
    n = args.queries + WARM
    fresh, historic, bare = questions[:n], questions[n : 2 * n], questions[2 * n :]
    names = [name for name, _ in args.arm]
    times: dict[tuple[str, str], list[float]] = {}
    differ = 0
    with rb.database(args.data_dir) as dsn:
        import asyncio

        data = asyncio.run(rb.reuse(dsn, 7))
        if data is None:
            raise SystemExit("no dataset in that folder: run recall_bench.py with --data-dir first")
        known_at = asyncio.run(rb.known_instant(dsn, "bench-00"))
        procs = [
            start_gateway(dsn, args.port + k, 1, source) for k, (_, source) in enumerate(args.arm)
        ]
        try:
            for k in range(len(procs)):
                wait_ready(args.port + k)
            clients = [
                httpx.Client(base_url=f"http://127.0.0.1:{args.port + k}", timeout=60)
                for k in range(len(procs))
            ]
            load = os.getloadavg()
            started = time.monotonic()
            plan = [
                ("fresh", rb.FULL, fresh, {}),
                ("repeated", rb.FULL, fresh, {}),
                ("knownAt", rb.FULL_AT, historic, {"knownAt": known_at}),
                ("evidence-only", rb.EVIDENCE_ONLY, bare, {}),
            ]
            for kind, document, asked, extra in plan:
                if kind not in kinds:
                    continue
                for i, question in enumerate(asked):
                    answers = set()
                    for j in range(len(clients)):
                        k = (i + j) % len(clients)
                        ms, answer = ask(
                            clients[k], data["token"], document, {"q": question, **extra}
                        )
                        answers.add(answer)
                        if i >= WARM:
                            times.setdefault((kind, names[k]), []).append(ms)
                    differ += len(answers) > 1
            for c in clients:
                c.close()
            side = [rb.side_discoveries(args.port + k) for k in range(len(procs))]
        finally:
            stop(*procs)
    print(
        f"{args.queries} questions per kind, arms interleaved, one recall at a time "
        f"({time.monotonic() - started:.0f} s; load average {load[0]:.1f} {load[1]:.1f} "
        f"-> {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}); answers that differ "
        f"between arms: {differ}"
    )
    for name, got in zip(names, side, strict=True):
        print(f"  {name}: relationship discovery on a side connection: {rb._side_text(got)}")
    for kind in dict.fromkeys(k for k, _ in times):
        first = times[(kind, names[0])]
        base = p50_p95(first)[0]
        for name in names:
            p50, p95 = p50_p95(times[(kind, name)])
            paired = ""
            if name != names[0]:
                diffs = [b - a for a, b in zip(first, times[(kind, name)], strict=True)]
                faster = sum(d < 0 for d in diffs) / len(diffs)
                paired = (
                    f"   p50 {p50 / base:.2f}x {names[0]}'s; paired difference median "
                    f"{statistics.median(diffs):+.1f} ms, faster on {faster:.0%}"
                )
            print(f"  {kind:9} {name:10} p50 {p50:6.1f} ms   p95 {p95:6.1f} ms{paired}")
    if differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
