"""What one task run costs the orchestration: N empty tasks on the local 2-worker cluster, against the local
Prefect server, each run in a fresh process (Prefect and Dask as released: pileworks replaces none of their
code).

CPU is the flow's process and its workers (``getrusage`` of the process and its reaped children) plus the
server's own; the per-task figure is the difference between N tasks and a handful, divided by the difference,
so the cluster's start-up cancels out.

    .venv/bin/python tests/bench/bench_task_runs.py [--tasks 200] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FEW = 5


def _server_cpu() -> float:
    import psutil
    from bench_scale import server_pids  # this folder is the script's first import path

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in server_pids())


def child(tasks: int, workers: int) -> None:
    """One measured run (in its own process): prints a JSON line."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    from flows.runtime.local_server import resolve_api, using_api
    from flows.runtime.runners import make_task_runner

    @task(cache_policy=NO_CACHE)
    def empty(i: int, payload: dict[str, list[int]]) -> dict[str, int]:
        return {"i": i}

    @flow(task_runner=make_task_runner("local", workers))
    def many(n: int) -> float:
        t0 = time.perf_counter()
        futures = [empty.submit(i, {"x": list(range(100))}) for i in range(n)]
        for f in futures:
            f.result()
        return time.perf_counter() - t0

    with using_api(resolve_api()):
        server0 = _server_cpu()
        tasks_wall = many(tasks)
        server1 = _server_cpu()
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    print(json.dumps({"tasks": tasks, "cpu": cpu, "server": server1 - server0, "wall": tasks_wall}))


def measure(tasks: int, workers: int) -> dict[str, float]:
    env = os.environ | {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(tasks), "--workers", str(workers)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.workers)
        return
    print(f"{'CPU ms/task':>13}{'server ms/task':>16}{'wall ms/task':>14}")
    few, many = measure(FEW, args.workers), measure(args.tasks, args.workers)
    n = args.tasks - FEW
    print(
        f"{(many['cpu'] - few['cpu']) / n * 1000:13.1f}{(many['server'] - few['server']) / n * 1000:16.1f}"
        f"{(many['wall'] - few['wall']) / n * 1000:14.1f}"
    )


if __name__ == "__main__":
    main()
