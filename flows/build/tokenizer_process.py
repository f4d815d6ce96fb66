"""Where a build's ``hf`` tokenizer trains: a child process of its own, or the flow's process for a small sample.

The ``counts`` trainer (the default, ``pipeline/tokenize/bpe_train.py``) needs none of this: the words were
counted on the workers, and its step merges the counts and learns the merges on one thread of the worker that runs
it, on a heap the size of the sample's distinct words (``flows/build/steps.py``). What follows is ``trainer: hf``.

Training a tokenizer on a large sample is one long, multi-threaded Rust call that allocates for its whole sample:
in a worker process it would run on one thread (the workers' ``RAYON_NUM_THREADS=1``, fixed once Rayon's pool
starts) and leave the worker holding the freed heap. A child process of its own gets the threads the build
gives it and returns its memory by exiting. The child reports the CPU seconds and S3 calls of its training (not
of its start-up), which the caller adds to the ``train-tokenizer`` step's profile. Three ways, one tokenizer
(byte for byte: the dataset id does not depend on where it trained):

- In a local pool worker (``flows/runtime/pool.py``) the child is a fork of the worker (:func:`train_in_fork`):
  it has the stage modules loaded already, so it starts in milliseconds instead of the ~0.5 CPU-s and ~0.5 s of
  an interpreter's start and imports, which sat on the build's critical path. A worker may fork: it is one
  thread, imports no Prefect, and has not started Rayon's pool before this step (no step before it encodes; if
  one did, ``tokenizers`` would run the child's training serially, the same bytes, rather than deadlock).
- Anywhere else, a Dask or Ray worker or a thread of the flow's process, a fresh interpreter
  (``python -m flows.build.tokenizer_process``, :func:`train_in_child`): those processes have threads that a
  fork would not carry over, and daemonic workers may not have ``multiprocessing`` children. Arguments go in
  and the result comes out as JSON.
- With one worker, a thread of the flow's process, a sample of at most :data:`IN_PROCESS_SAMPLE_BYTES` trains
  right there (:func:`train_here`): a process start costs ~0.5 CPU-s, worth paying only when the training is
  large enough that its heap should go back to the OS on exit. That thread already has ``RAYON_NUM_THREADS=1``,
  the one core the build was given.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from flows.build.context import build_context
from flows.runtime import shutdown
from flows.runtime.pool import cores, die_with_parent, in_pool_worker
from pipeline.errors import StageFailed
from pipeline.storage.retry import STATS
from pipeline.tokenize import stage as tokenize

# The largest training sample (the sampled parts' bytes) that trains in the flow's process (:func:`train_here`).
IN_PROCESS_SAMPLE_BYTES = 64 * 1024 * 1024


def train_where_cheapest(
    ctx: dict[str, Any],
    in_folder: str,
    num_parts: int,
    key: str,
    sizes: list[int] | None,
    threads: int,
    measured: dict[str, Any],
    in_process: bool = False,
) -> str:
    """Train the tokenizer of the build ``ctx`` into ``key`` where it costs least (:func:`where_to_train`) and
    return its sha256. ``in_process``: this runs on the flow's one worker, a thread of the flow's process.
    A child's CPU and S3 counters go into ``measured`` (a :func:`flows.runtime.profile.measure` record)."""
    where = where_to_train(build_context(ctx).cfg.tokenize, num_parts, sizes, in_process)
    if where == "here":
        return train_here(ctx, in_folder, num_parts, key, sizes)
    in_child = train_in_fork if where == "fork" else train_in_child
    return in_child(training_args(ctx, in_folder, num_parts, key, sizes), threads, measured)


def training_args(
    ctx: dict[str, Any], in_folder: str, num_parts: int, key: str, sizes: list[int] | None
) -> dict[str, Any]:
    """What a training child is asked (:func:`train`): JSON-able, for a pipe or a fresh interpreter's stdin."""
    return {"ctx": ctx, "in_folder": in_folder, "num_parts": num_parts, "key": key, "sizes": sizes}


def where_to_train(
    cfg: tokenize.TokenizeConfig, num_parts: int, sizes: list[int] | None, in_process: bool
) -> str:
    """``here`` (a small sample on the flow's one worker), ``fork`` (a fork of this local pool worker) or
    ``exec`` (a fresh interpreter). A sample of unknown size (no ``sizes``) gets a child."""
    if in_process and sizes is not None and len(sizes) == num_parts:
        sample = sum(sizes[i] for i in tokenize.sample_parts(sizes, cfg.train_sample_bytes))
        if sample <= IN_PROCESS_SAMPLE_BYTES:
            return "here"
    return "fork" if in_pool_worker() else "exec"


def train_here(ctx: dict[str, Any], in_folder: str, num_parts: int, key: str, sizes: list[int] | None) -> str:
    """Train in this process: its CPU and S3 calls are the step's own. On a thread of its own, which this one
    waits for unless the command stops (:func:`flows.runtime.shutdown.until_stopped`): a Rust call cannot be
    interrupted."""
    c = build_context(ctx)
    cfg = c.cfg
    store = c.store()
    train = functools.partial(
        tokenize.run_train_tokenizer, store, in_folder, num_parts, key, cfg.tokenize, cfg.s3, sizes
    )
    return str(shutdown.until_stopped(train, "train-tokenizer"))


def train_in_child(args: dict[str, Any], threads: int, measured: dict[str, Any]) -> str:
    """Train as ``args`` (:func:`training_args`) say in a fresh interpreter of ``threads`` Rayon threads (0: this
    machine's cores); returns the sha256."""
    env = os.environ | {"RAYON_NUM_THREADS": str(threads or cores())}
    proc = subprocess.run(
        [sys.executable, "-m", __name__],
        input=json.dumps(args),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise training_failed(proc.returncode, proc.stderr)
    return took(json.loads(proc.stdout.strip().splitlines()[-1]), "exec", measured)


def train_in_fork(args: dict[str, Any], threads: int, measured: dict[str, Any]) -> str:
    """Train as ``args`` (:func:`training_args`) say in a fork of this process (a local pool worker) of
    ``threads`` Rayon threads (0: this machine's cores); returns the sha256. The result comes back through a
    pipe; the child returns its memory by exiting (``multiprocessing``'s exit: ``os._exit`` after flushing the
    std streams, which were flushed before the fork, so nothing the worker buffered is written twice; the
    worker's profile records die with the child)."""
    fork = multiprocessing.get_context("fork")
    receiving, sending = fork.Pipe(duplex=False)
    child = fork.Process(
        target=forked_child,
        args=(args, threads or cores(), sending, os.getpid()),
        name="pileworks-tokenizer",
    )
    child.start()
    sending.close()  # the child holds the only sending end now: a child that dies unheard reads as EOF here
    try:
        out: dict[str, Any] | None = receiving.recv()
    except EOFError:
        out = None
    finally:
        receiving.close()
    child.join()
    if out is None or "error" in out:
        error = out["error"] if out else "it died without a result (killed, or out of memory?)"
        raise training_failed(child.exitcode, error)
    return took(out, "fork", measured)


def training_failed(exit_code: int | None, text: str) -> StageFailed:
    """The step's failure, with the last lines of the child's error output (the traceback's end)."""
    tail = "\n".join(text.strip().splitlines()[-5:])
    return StageFailed(f"stage 'train-tokenizer' failed in its training process (exit {exit_code}): {tail}")


def took(out: dict[str, Any], start: str, measured: dict[str, Any]) -> str:
    """Put the child's result ``out`` into ``measured`` (``start``: how it started); return the sha256."""
    measured["child_cpu_s"] = out["cpu_s"]
    measured["child_storage"] = out["storage"]
    measured["child_pid"] = out["pid"]
    measured["child_start"] = start
    return str(out["sha256"])


def train(args: dict[str, Any]) -> dict[str, Any]:
    """The child's work, however it started: train as asked; the result (sha256, the training's CPU and S3 calls,
    the child's pid) as JSON-able values."""
    # Ctrl-C reaches the whole process group: the flow's process handles it, as the workers do
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    c = build_context(args["ctx"])
    cfg = c.cfg
    cpu0 = time.process_time()  # the training's CPU, every thread's; the child's start-up is not stage work
    sha = tokenize.run_train_tokenizer(
        c.store(), args["in_folder"], args["num_parts"], args["key"], cfg.tokenize, cfg.s3, args["sizes"]
    )
    return {
        "sha256": sha,
        "cpu_s": round(time.process_time() - cpu0, 4),
        "storage": STATS.snapshot(),
        "pid": os.getpid(),
    }


def forked_child(args: dict[str, Any], threads: int, sending: Connection, worker: int) -> None:
    """The forked child: it ends with its ``worker`` (:func:`flows.runtime.pool.die_with_parent`), its threads
    set before ``tokenizers`` first starts Rayon's pool, its S3 counters from zero (they were the worker's), then
    :func:`train`; the result, or the error's traceback, goes back through ``sending``."""
    die_with_parent(worker)
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    STATS.reset()
    try:
        out = train(args)
    except Exception:
        sending.send({"error": traceback.format_exc()})
        sys.exit(1)
    sending.send(out)


def main() -> None:
    """The fresh interpreter: train as :func:`train_in_child` asked (JSON on stdin), print the result as one
    JSON line."""
    print(json.dumps(train(json.loads(sys.stdin.read()))))


if __name__ == "__main__":
    main()
