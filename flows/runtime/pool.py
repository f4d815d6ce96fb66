"""The worker processes of a local build, without Prefect: a pool forked from a server that loaded the stages once.

A task's body runs here as a plain call (:func:`run_captured`): its profile records (``profile.LOCAL_RECORDS``)
and its log records come back with its result, and the Prefect task in the flow's process that handed it over
re-emits the log in its task run (``flows/runtime/workers.py``). Nothing here imports Prefect or Dask: a worker
costs a fork of the ``forkserver`` process, which imported :data:`PRELOAD` (the one-thread env first, then the
stage modules) once per flow process, about 0.75 CPU-s, instead of 2-3 CPU-s of imports per worker process.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import itertools
import json
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from flows.runtime import profile
from pipeline.errors import StageFailed
from pipeline.storage.retry import STATS

# Each worker process encodes with one thread: N workers use N cores, with no oversubscription.
ONE_THREAD = {"PILEWORKS_THREADS": "1", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}

# What the fork server imports before it forks a worker: the env before numpy and tokenizers read it, then the
# stage modules (the task bodies in flows/build/steps.py load the rest on their first call, in each worker).
PRELOAD = [
    "flows.runtime.pool_env",
    # the command's script (the ``pileworks`` entry point), imported once here rather than again in every worker
    "__main__",
    "pipeline.ingest.stage",
    "pipeline.clean.stage",
    "pipeline.dedup.signatures",
    "pipeline.dedup.candidates",
    "pipeline.dedup.clusters",
    "pipeline.tokenize",
    "pipeline.publish",
]


def cores() -> int:
    """The cores this process may use (the affinity mask on Linux, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def set_one_thread_env() -> None:
    """:data:`ONE_THREAD` in this process's env, except the names the user set."""
    for name, value in ONE_THREAD.items():
        os.environ.setdefault(name, value)


# The pid of this process once :func:`init_worker` ran in it (0: not a worker), for :func:`in_pool_worker`.
_worker_pid = 0


PR_SET_PDEATHSIG = 1  # Linux's prctl(2) option


def die_with_parent(parent: int | None = None) -> None:
    """On Linux, end this process (SIGKILL) when the process that forked it ends. A pool's worker waits for its
    next call on a pipe whose write end it holds itself, so a command that leaves at once (``os._exit`` after
    Ctrl-C, or killed) would otherwise leave it waiting for ever, holding the command's stdout and stderr; its
    units are written whole or not at all, so a kill loses nothing a rerun needs. ``parent``: that process's pid
    when known, checked after (it may have ended before this ran)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def init_worker(forked: bool = False, env: dict[str, str] | None = None, parent: int | None = None) -> None:
    """In each worker process, first: Ctrl-C reaches the whole process group, and the flow's process handles it
    (it shuts the pool down); a worker finishes or drops the call at hand instead of printing a traceback. The
    process is marked as a worker (:func:`in_pool_worker`), with ``env``, the environment of the process that
    started its pool then (a fork server started earlier has an older one: credentials set since would be
    missing). A worker ``forked`` from the command's process (:func:`start_pool`) drops the logging it
    inherited, as a fresh interpreter has none: its log lines go back to the task run (:func:`run_captured`),
    not straight to the command's terminal as well."""
    global _worker_pid
    die_with_parent(parent)  # ``parent``: the command, for a pool forked from it (else the fork server)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    set_one_thread_env()
    _worker_pid = os.getpid()
    if forked:
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.setLevel(logging.WARNING)


def in_pool_worker() -> bool:
    """Whether this process is a worker of a pool of :func:`start_pool` (not a process forked from one). A worker
    may fork a child that starts with the stage modules loaded (``flows/build/tokenizer_process.py``): it runs
    one thread and imports no Prefect, unlike the flow's process or a Dask or Ray worker, whose other threads a
    fork would leave behind, holding their locks."""
    return _worker_pid == os.getpid()


def start_pool(size: int, fork: bool = False) -> ProcessPoolExecutor:
    """A pool of ``size`` worker processes, forked on demand from the fork server (started here if none runs
    yet: one per flow process, shared by every later pool); with ``fork``, forked from this process at the
    first call, all at once (multiprocessing never forks a "fork" pool's workers later). Only a process with no
    other thread may fork (another thread's locks would stay held in the child): ``pileworks build`` before it
    imports Prefect (:func:`start_early`), whose imports the workers then share instead of the fork server
    starting an interpreter and importing the stages again (~0.6 CPU-s)."""
    if fork:
        forks = multiprocessing.get_context("fork")
        initargs = (True, None, os.getpid())
        return ProcessPoolExecutor(size, mp_context=forks, initializer=init_worker, initargs=initargs)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # used when the fork server starts, ignored once it runs
    env = dict(os.environ)  # this process's now, not the fork server's from when it started
    return ProcessPoolExecutor(size, mp_context=context, initializer=init_worker, initargs=(False, env))


# ---------------------------------------------------------------- calls submitted before the task runner exists


@dataclass
class Early:
    """A pool started, and calls submitted to it, before the flow's task runner existed (``pileworks build``'s
    head start, ``flows/build/head_start.py``); the task runs claim the calls, and a runner of as many worker
    processes adopts the pool (one worker runs in the flow's process: the pool stops after its calls)."""

    pool: ProcessPoolExecutor
    workers: int
    started: float  # when the first call was submitted (epoch seconds)
    forked: bool  # the workers are forks of this process (else of the fork server)
    calls: dict[str, Future[Any]] = field(default_factory=dict)  # call_key -> the future of run_captured
    submitted: int = 0
    claimed: int = 0
    adopted: bool = False  # a task runner owns (and shuts down) the pool from then on


_EARLY: Early | None = None
_EARLY_LOCK = threading.Lock()  # the task runs of a pass claim from their threads


def call_key(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """A body and its arguments (JSON: contexts, plans, keys), as a task would hand them over."""
    return json.dumps([fn.__module__, fn.__qualname__, list(args)], sort_keys=True, default=repr)


def can_fork() -> bool:
    """Whether this process may fork its workers from itself: it runs no other thread (whose locks a fork would
    leave held in the child)."""
    return threading.active_count() == 1


def start_early(size: int, calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> Early:
    """Start a pool of ``size`` workers and submit ``calls`` (each as :func:`run_captured`) to it now: forks of
    this process while it runs no other thread (:func:`start_pool`), else from the fork server."""
    global _EARLY
    close_early()
    forked = can_fork()
    if forked:  # what the fork server would import, loaded here once and shared by the forks
        for name in PRELOAD:
            if name not in ("flows.runtime.pool_env", "__main__"):  # not the workers' env: this process's
                importlib.import_module(name)
    pool = start_pool(size, fork=forked)
    early = Early(pool, size, time.time(), forked)
    for fn, args in calls:
        early.calls[call_key(fn, args)] = pool.submit(run_captured, fn, args)
    early.submitted = len(calls)
    _EARLY = early
    return early


def adopt_early(size: int) -> ProcessPoolExecutor | None:
    """The early pool for a task runner of ``size`` workers, which shuts it down from now on; None when there is
    none (a pool of another size is closed once its calls finish)."""
    early = _EARLY
    if early is None or early.adopted:
        return None
    if early.workers != size:
        close_early()
        return None
    early.adopted = True
    return early.pool


def claim_early(fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any] | None:
    """The early future of ``fn(*args)``, once; None when no such call was submitted early (the caller submits
    it). A call that finds unclaimed early calls but is not one of them waits for them first: what they write
    is then complete, and reused, never computed twice at the same time. A pool no task runner adopted (the
    flow's one worker is a thread of its process) stops once its last call is claimed and done."""
    with _EARLY_LOCK:
        early = _EARLY
        if early is None or not early.calls:
            return None
        future = early.calls.pop(call_key(fn, args), None)
        if future is not None:
            early.claimed += 1
        else:
            wait(list(early.calls.values()))
            early.calls.clear()
        if not early.calls and not early.adopted:  # no task runner took the pool (one worker): it stops
            early.pool.shutdown(wait=False)  # once the claimed call is done, its worker exiting
        return future


def early_summary() -> dict[str, Any] | None:
    """When the first early call was submitted (epoch seconds), and the early calls (claimed, or waited for by a
    call of another plan) and those claimed."""
    early = _EARLY
    if early is None:
        return None
    return {
        "start": early.started,
        "calls": early.submitted,
        "claimed": early.claimed,
        "forked": early.forked,
    }


def close_early(wait: bool = True) -> None:
    """Forget the early pool; unless a task runner adopted it, shut it down once its calls finish (their units
    are then complete: a later build reuses them), or at once without ``wait`` (Ctrl-C, a failure: queued calls
    dropped, a running one finishes in its worker, which then exits)."""
    global _EARLY
    early, _EARLY = _EARLY, None
    if early is not None and not early.adopted:
        early.pool.shutdown(wait=wait, cancel_futures=not wait)


def ready() -> int:
    """A call that makes a worker process start (and says which)."""
    return os.getpid()


class Collected(logging.Handler):
    """The log records of one thread (a task's body), as (level, message) pairs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.thread = threading.get_ident()
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.lines.append((record.levelno, record.getMessage()))


def capture_logs(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, list[tuple[int, str]]]:
    """``fn(*args)`` with the records its module's logger gets meanwhile on this thread."""
    logger, handler = logging.getLogger(fn.__module__), Collected()
    logger.addHandler(handler)
    try:
        return fn(*args), handler.lines
    finally:
        logger.removeHandler(handler)


def run_captured(fn: Callable[..., Any], args: tuple[Any, ...]) -> dict[str, Any]:
    """In a worker process: ``fn(*args)`` with its profile records, log lines and the S3 calls it made outside
    its steps (the records count those inside). A failure comes back as its exception chain (pickling an
    exception drops its ``__cause__``, which the retry policy reads)."""
    start = len(profile.LOCAL_RECORDS)
    storage0, measured0 = STATS.snapshot(), profile.counters(profile.MEASURED)
    try:
        result, logs = capture_logs(fn, args)
        return {
            "result": result,
            "logs": logs,
            "profile": profile.LOCAL_RECORDS[start:],
            "storage": profile.unmeasured_since(storage0, measured0),  # S3 calls outside its steps
        }
    except Exception as exc:
        return {"error": exception_chain(exc)}
    finally:
        del profile.LOCAL_RECORDS[start:]


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, each as it pickles (else as a ``RuntimeError`` of its text)."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 20:
        try:
            pickle.loads(pickle.dumps(seen))
            chain.append(seen)
        except Exception:
            chain.append(RuntimeError(f"{type(seen).__name__}: {seen}"))
        seen = seen.__cause__ or seen.__context__
    return chain


def relinked(chain: list[BaseException]) -> BaseException:
    """The first exception of ``chain``, with the others as its causes again."""
    for outer, inner in itertools.pairwise(chain):
        outer.__cause__ = inner
    return chain[0]


class WorkerDied(StageFailed):
    """A worker process died under a task (killed, out of memory): the pool is gone, and so is the build (a
    retry would find the pool broken too)."""
