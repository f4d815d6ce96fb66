"""Tokenizer training in a fresh child process (``python -m flows.build.tokenizer_process``).

Training a tokenizer on a large sample is one long, multi-threaded Rust call that allocates for its whole sample:
in a worker process it would run on one thread (the workers' ``RAYON_NUM_THREADS=1``, fixed once Rayon's pool
starts) and leave the worker holding the freed heap. A child process of its own gets the threads the build
gives it, returns its memory by exiting, and can be started from anywhere, a Dask or Ray worker included
(``subprocess``, not ``multiprocessing``: those workers' processes are daemonic and may not have children of
their kind). Arguments go in and the result comes out as JSON; the child reports the CPU seconds and S3 calls of
its training (not of its start-up), which the caller adds to the ``train-tokenizer`` step's profile.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from flows.build.context import build_context
from pipeline import tokenize
from pipeline.errors import StageFailed
from pipeline.storage.retry import STATS


def cores_here() -> int:
    """The cores this process may use (the affinity mask on Linux, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def train_in_child(
    ctx: dict[str, Any],
    in_folder: str,
    num_parts: int,
    key: str,
    sizes: list[int] | None,
    threads: int,
    measured: dict[str, Any],
) -> str:
    """Train the tokenizer of the build ``ctx`` into ``key`` in a child process of ``threads`` Rayon threads
    (0: this machine's cores); returns its sha256. The child's CPU and S3
    counters go into ``measured`` (a :func:`flows.runtime.profile.measure` record)."""
    args = {"ctx": ctx, "in_folder": in_folder, "num_parts": num_parts, "key": key, "sizes": sizes}
    env = os.environ | {"RAYON_NUM_THREADS": str(threads or cores_here())}
    proc = subprocess.run(
        [sys.executable, "-m", __name__],
        input=json.dumps(args),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise StageFailed(
            f"stage 'train-tokenizer' failed in its training process (exit {proc.returncode}): {tail}"
        )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    measured["child_cpu_s"] = out["cpu_s"]
    measured["child_storage"] = out["storage"]
    measured["child_pid"] = out["pid"]
    return str(out["sha256"])


def main() -> None:
    """The child: train as ``train_in_child`` asked (JSON on stdin), print the result as one JSON line."""
    # Ctrl-C reaches the whole process group: the flow's process handles it, as the workers do
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = json.loads(sys.stdin.read())
    c = build_context(args["ctx"])
    cfg = c.cfg
    cpu0 = time.process_time()  # the training's CPU, every thread's; the child's start-up is not stage work
    sha = tokenize.run_train_tokenizer(
        c.store(), args["in_folder"], args["num_parts"], args["key"], cfg.tokenize, cfg.s3, args["sizes"]
    )
    print(
        json.dumps(
            {
                "sha256": sha,
                "cpu_s": round(time.process_time() - cpu0, 4),
                "storage": STATS.snapshot(),
                "pid": os.getpid(),
            }
        )
    )


if __name__ == "__main__":
    main()
