"""The worker processes of a local build, on standard parts: ``concurrent.futures``' ``ProcessPoolExecutor`` and
``logging``'s queue handlers, without Prefect.

A task's body runs here as a plain call (:func:`run_captured`): its profile records (``profile.LOCAL_RECORDS``)
come back with its result, and every log record of the call (any module's: ``pipeline.*``, a library's) goes
through a ``QueueHandler`` to the command, where a ``QueueListener`` hands it to the sink of the call's task run
(:data:`ROUTER`; ``flows/runtime/workers.py`` registers a sink that writes into the Prefect task run's log).
Nothing here imports Prefect or Dask: a worker costs a fork of the ``forkserver`` process, which imported
:data:`PRELOAD` (the one-thread env first, then the stage modules) once per flow process, about 0.75 CPU-s,
instead of 2-3 CPU-s of imports per worker process; or, before the command has a second thread, a fork of the
command itself (``fork=True``).

A pool remembers its processes (:class:`WorkerPool`), so that when one dies under a task (the OOM killer, a stray
``kill``) the caller can say which and of what signal, and run the task again on a fresh pool
(``flows/runtime/workers.py``): ``concurrent.futures`` marks the whole pool broken then, and a retry on it could
never succeed.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import itertools
import json
import logging
import logging.handlers
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, cast

import psutil

from flows.runtime import profile
from flows.runtime.cores import cores
from pipeline.errors import StageFailed
from pipeline.storage.retry import STATS

__all__ = ["ONE_THREAD", "PRELOAD", "WorkerDied", "WorkerPool", "cores", "start_pool"]

# The one-thread environment, defined here only: each local worker process (and each Dask or Ray worker) encodes
# with one thread, so N workers use N cores with no oversubscription. Set in a worker before numpy, OpenMP or
# the tokenizers' Rayon pool first read it (:func:`set_one_thread_env`, from ``flows/runtime/pool_env.py`` in the
# fork server, from the command before numpy for forked workers).
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
    "pipeline.tokenize.stage",
    "pipeline.dataset.publish",
    "flows.runtime.pool_warm",  # pyarrow's pandas import, once for every worker
]

# Loggers whose level the workers copy from the process that starts the pool (its root's, and the libraries the
# command quiets): a worker logs what the command would have logged, had the call run there.
COPIED_LEVELS = ("", "httpx", "httpcore", "botocore", "urllib3", "asyncio", "s3transfer")


def set_one_thread_env() -> None:
    """:data:`ONE_THREAD` in this process's env, except the names the user set."""
    for name, value in ONE_THREAD.items():
        os.environ.setdefault(name, value)


# The pid of this process once :func:`init_worker` ran in it (0: not a worker), for :func:`in_pool_worker`.
_worker_pid = 0
# In a worker: the queue its log records go to, and the call whose body runs now (stamped on each record).
_log_queue: Any = None
_current_call = ""


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


class _QueueHandler(logging.handlers.QueueHandler):
    """A worker's records to the command, each stamped with the call it belongs to, written synchronously (a
    ``SimpleQueue``: a record is in the pipe before the call's result, so the command has it before the task
    run ends)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record = super().prepare(record)
        record.pileworks_call = _current_call
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        cast(Any, self.queue).put(record)


def init_worker(
    forked: bool = False,
    env: dict[str, str] | None = None,
    parent: int | None = None,
    logs: Any = None,
    levels: dict[str, int] | None = None,
) -> None:
    """In each worker process, first: Ctrl-C (and a closed terminal's SIGHUP, as a shell sends it) reaches the whole
    process group, and the flow's process handles it (it shuts the pool down); a worker finishes or drops the call
    at hand instead of printing a traceback. The process is marked as a worker (:func:`in_pool_worker`), with
    ``env``, the environment of the process that started its pool then (a fork server started earlier has an
    older one: credentials set since would be missing). Its logging is one handler that sends every record to
    ``logs`` (the command routes it to the call's task run), at the ``levels`` of the command: a forked worker
    drops the handlers it inherited, which would write to the command's terminal as well."""
    global _worker_pid, _log_queue
    die_with_parent(parent)  # ``parent``: the command, for a pool forked from it (else the fork server)
    # a terminal's signals, sent to the whole group: the command's to take
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    set_one_thread_env()
    _worker_pid = os.getpid()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if logs is not None:
        _log_queue = logs
        root.addHandler(_QueueHandler(logs))
    for name, level in (levels or {"": logging.WARNING}).items():
        logging.getLogger(name or None).setLevel(level)


def in_pool_worker() -> bool:
    """Whether this process is a worker of a pool of :func:`start_pool` (not a process forked from one). A worker
    may fork a child that starts with the stage modules loaded (``flows/build/tokenizer_process.py``): it runs
    one thread and imports no Prefect, unlike the flow's process or a Dask or Ray worker, whose other threads a
    fork would leave behind, holding their locks."""
    return _worker_pid == os.getpid()


# ---------------------------------------------------------------- log records, from the workers to the task runs

START, END = "pileworks.pool.start", "pileworks.pool.end"  # the names of a call's first and last marks
Sink = Callable[[logging.LogRecord], None]


class Router(logging.Handler):
    """In the command: the handler of every pool's ``QueueListener``. It keeps each record for its call, which
    the task thread waiting on that call takes (:meth:`drain`) and handles in its own Prefect context (the
    listener's thread has none: a Prefect log handler there would look for an API of its own); knows which call
    each worker process runs (to name the task a dead worker ran); and tells a caller when a call's last record
    is in (:meth:`wait_done`)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.guard = threading.Lock()
        self.where: dict[str, str] = {}
        self.waiting: dict[str, list[logging.LogRecord]] = {}
        self.done: dict[str, threading.Event] = {}
        self.running: dict[int, str] = {}  # worker pid -> the call it runs

    def route(self, call: str, where: str) -> None:
        with self.guard:
            self.where[call] = where

    def emit(self, record: logging.LogRecord) -> None:
        call = getattr(record, "pileworks_call", "")
        if record.name in (START, END):
            with self.guard:
                if record.name == START:
                    self.running[record.process or 0] = call
                else:
                    self.running.pop(record.process or 0, None)
                    self.done.setdefault(call, threading.Event()).set()
            return
        if not call:  # logged outside any call (a module imported in a worker): this process's record
            logging.getLogger(record.name).handle(record)
            return
        with self.guard:
            self.waiting.setdefault(call, []).append(record)

    def drain(self, call: str, sink: Sink) -> None:
        """Hand the call's records that came in so far to ``sink``, here (the caller's thread)."""
        with self.guard:
            records = self.waiting.pop(call, [])
        for record in records:
            sink(record)

    def wait_done(self, call: str, sink: Sink, timeout_s: float = 10.0) -> None:
        """Until the call's last record is in (its end mark, written after them), each handed to ``sink``; then
        forget the call."""
        with self.guard:
            event = self.done.setdefault(call, threading.Event())
        event.wait(timeout_s)
        self.drain(call, sink)
        self.forget(call)

    def forget(self, call: str) -> None:
        with self.guard:
            for table in (self.where, self.waiting, self.done):
                table.pop(call, None)

    def running_where(self, pid: int) -> str | None:
        """The task (as its caller named it) that worker ``pid`` ran last, if it had not finished."""
        with self.guard:
            call = self.running.get(pid)
            return self.where.get(call) if call is not None else None


ROUTER = Router()


class _QueueListener(logging.handlers.QueueListener):
    """``QueueListener`` over a ``SimpleQueue`` (no ``get(block)`` nor ``put_nowait``: the overridable hooks)."""

    def dequeue(self, block: bool) -> logging.LogRecord:
        return cast(Any, self.queue).get()

    def enqueue_sentinel(self) -> None:
        cast(Any, self.queue).put(None)  # the listener's sentinel is None


# ---------------------------------------------------------------- a pool


class _Recording:
    """A multiprocessing context that keeps every ``Process`` it makes: the pool's workers, each with its exit
    code once it ends (``multiprocessing.active_children()`` forgets a child that died before it was asked)."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.made: list[Any] = []

    def Process(self, *args: Any, **kwargs: Any) -> Any:
        process = self.context.Process(*args, **kwargs)
        self.made.append(process)
        return process

    def __getattr__(self, name: str) -> Any:
        return getattr(self.context, name)


def start_pool(size: int, fork: bool = False) -> WorkerPool:
    """A pool of ``size`` worker processes, all started now. They are forks of the fork server (started here if
    none runs yet: one per flow process, shared by every later pool), or with ``fork`` forks of this process.
    Only a process with no other thread may fork (another thread's locks would stay held in the child):
    ``pileworks build`` before it imports Prefect (:func:`start_early`), whose imports the workers then share
    instead of the fork server starting an interpreter and importing the stages again (~0.6 CPU-s)."""
    return WorkerPool(size, fork)


class WorkerPool:
    """A ``ProcessPoolExecutor`` of ``size`` one-thread workers, the queue their log records come back on (and its
    listener here), and the worker processes themselves (:meth:`died`)."""

    def __init__(self, size: int, fork: bool = False) -> None:
        context = multiprocessing.get_context("fork" if fork else "forkserver")
        if not fork:
            context.set_forkserver_preload(PRELOAD)  # used when the fork server starts, ignored once it runs
        self.size, self.forked, self.broken = size, fork, False
        self.logs = context.SimpleQueue()
        levels = {name: logging.getLogger(name or None).level for name in COPIED_LEVELS}
        # a forked worker has this process's environment; the fork server's would be that of its own start
        env = None if fork else dict(os.environ)
        initargs = (fork, env, os.getpid() if fork else None, self.logs, levels)
        recording = _Recording(context)
        self.executor = ProcessPoolExecutor(
            size, mp_context=cast(Any, recording), initializer=init_worker, initargs=initargs
        )
        for _ in range(size):  # one call each starts them all (a fork pool forks every worker at the first)
            with contextlib.suppress(BrokenProcessPool):  # one killed already: its callers renew the pool
                self.executor.submit(ready)
        self.processes: list[Any] = recording.made
        # started after the workers were forked: a fork pool's process must have no other thread then
        self.listener = _QueueListener(cast(Any, self.logs), ROUTER)
        self.listener.start()
        self.listening, self.stopping = True, threading.Lock()
        # ``concurrent.futures``' shutdown, and the exit statuses it reaps, one thread at a time (:meth:`died`)
        self.ending = threading.Lock()
        self.dead: list[tuple[int, str]] | None = None

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], call: str = "") -> Future[Any]:
        """``fn(*args)`` as :func:`run_captured` in a worker; its log records go to ``call``'s sink. On a pool
        that broke already, a future failed as the call would have (the caller renews the pool either way)."""
        try:
            return self.executor.submit(run_captured, fn, args, call)
        except BrokenProcessPool as exc:
            failed: Future[Any] = Future()
            failed.set_exception(exc)
            return failed

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def died(self) -> list[tuple[int, str]]:
        """The workers that ended abnormally: (pid, how), e.g. ``(1234, "SIGKILL")``. Once one dies,
        ``concurrent.futures`` ends the others with SIGTERM: those are left out when another died otherwise.

        The pool's manager thread reaps the processes of a broken pool; it is waited for first (a shutdown that
        waits), so that only one thread reads each exit status: a fork server's child's status is one message on
        a pipe, and a second reader at the same moment gets none and records exit code 255 over it (CI: a
        SIGKILLed worker said "exit code 255", another none). Said once: every caller gets the same answer.
        The others were ended with SIGTERM, or ran the command's handler of it (exit code 143)."""
        with self.ending:
            if self.dead is None:
                self.executor.shutdown(wait=True, cancel_futures=True)
                dead, deadline = [], time.monotonic() + 2.0
                for process in self.processes:
                    process.join(max(0.0, deadline - time.monotonic()))
                    code = process.exitcode
                    if code is not None and code != 0:
                        how = signal.Signals(-code).name if code < 0 else f"exit code {code}"
                        dead.append((process.pid or 0, how))
                first = [d for d in dead if d[1] not in ("SIGTERM", f"exit code {128 + signal.SIGTERM}")]
                self.dead = first or dead
            return self.dead

    def gone(self) -> bool:
        """Whether a worker process has ended (before a shutdown: it died), as the system sees it: a zombie, or
        reaped already. Reads no exit code: the pool's manager thread may be reading it this moment, and a fork
        server's is read once."""
        for process in self.processes:
            try:
                if psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE:
                    return True
            except psutil.NoSuchProcess:
                return True
        return False

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop the workers (``wait``: after the calls at hand), then the listener once their last records are in
        (without ``wait``, on a thread of its own once the workers are gone: a call still running sends its last
        records after this returns)."""
        if wait and self.gone():
            # a worker that exited before the shutdown was killed, and may have held the call queue's lock (an
            # idle worker waits inside it): the others would wait for that lock, never for the shutdown's word,
            # and ``concurrent.futures`` would join them forever if its shutdown came before it saw the death.
            # Ended here as it ends them once it sees one (``terminate_broken``); said by :meth:`died`.
            for process in self.processes:
                with contextlib.suppress(OSError, ValueError):
                    process.terminate()
        with self.ending:
            self.executor.shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait:
            self._stop_listener()
        else:
            threading.Thread(target=self._stop_listener_after_workers, daemon=True).start()

    def _stop_listener_after_workers(self) -> None:
        for (
            process
        ) in self.processes:  # (a second executor.shutdown would not wait: the first forgot its thread)
            process.join()
        self._stop_listener()  # a worker killed holding the queue's lock would block this daemon thread only

    def _stop_listener(self) -> None:
        with self.stopping:  # once, whichever of shutdown's callers comes first
            if self.listening:
                self.listening = False
                self.listener.stop()


# ---------------------------------------------------------------- calls submitted before the task runner exists


@dataclass
class Early:
    """A pool started, and calls submitted to it, before the flow's task runner existed (``pileworks build``'s
    head start, ``flows/build/head_start.py``); the task runs claim the calls, and a runner of as many worker
    processes adopts the pool (one worker runs in the flow's process: the pool stops after its calls)."""

    pool: WorkerPool
    workers: int
    started: float  # when the first call was submitted (epoch seconds)
    forked: bool  # the workers are forks of this process (else of the fork server)
    calls: dict[str, Claimed] = field(default_factory=dict)  # call_key -> its future and log call
    submitted: int = 0
    claimed: int = 0
    adopted: bool = False  # a task runner owns (and shuts down) the pool from then on
    # the CPUs its workers may use again once the flow runs (:func:`leave_a_core`)
    narrowed: set[int] | None = None


@dataclass(frozen=True)
class Claimed:
    """A call submitted early: its future (of :func:`run_captured`), its log call id and its pool."""

    future: Future[Any]
    call: str
    pool: WorkerPool


_EARLY: Early | None = None
_EARLY_LOCK = threading.Lock()  # the task runs of a pass claim from their threads


def call_key(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """A body and its arguments (JSON: contexts, plans, keys), as a task would hand them over."""
    return json.dumps([fn.__module__, fn.__qualname__, list(args)], sort_keys=True, default=repr)


def new_call() -> str:
    """The id that ties a call's log records to its task run."""
    return uuid.uuid4().hex


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
    early = Early(pool, size, time.time(), forked, narrowed=leave_a_core(pool))
    for fn, args in calls:
        call = new_call()
        early.calls[call_key(fn, args)] = Claimed(pool.submit(fn, args, call), call, pool)
    early.submitted = len(calls)
    _EARLY = early
    return early


def leave_a_core(pool: WorkerPool) -> set[int] | None:
    """While the command imports Prefect and starts the flow (its critical path: about a second of one core),
    workers as many as the CPUs it may run on would take turns with it on every core: they are kept off one
    (``os.sched_setaffinity``) until the flow runs (:func:`widen`). Returns the CPUs they had, or None when they
    leave one free already (fewer workers than CPUs) or the platform cannot say. On 2 cores, 2 workers, 39 MB:
    the command reached the flow's first pass 0.25-0.35 s later than with 1 worker, its Prefect import taking
    1.1 s of samples instead of 0.87 (py-spy), while the head start's ingest needs about 0.7 s of one core."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2 or pool.size < len(cpus):
        return None
    narrow = set(sorted(cpus)[1:])
    for process in pool.processes:
        with contextlib.suppress(OSError):  # one gone already: the flow finds it dead
            os.sched_setaffinity(process.pid, narrow)
    return cpus


def widen(early: Early) -> None:
    """The early pool's workers back on every CPU they had (:func:`leave_a_core`), once."""
    cpus, early.narrowed = early.narrowed, None
    if cpus is None:
        return
    for process in early.pool.processes:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(process.pid, cpus)


def adopt_early(size: int) -> WorkerPool | None:
    """The early pool for a task runner of ``size`` workers, which shuts it down from now on; None when there is
    none (a pool of another size is closed once its calls finish)."""
    early = _EARLY
    if early is None or early.adopted:
        return None
    if early.workers != size:
        close_early()
        return None
    early.adopted = True
    widen(early)
    return early.pool


def claim_early(fn: Callable[..., Any], args: tuple[Any, ...]) -> Claimed | None:
    """The early call of ``fn(*args)``, once; None when no such call was submitted early (the caller submits
    it). A call that finds unclaimed early calls but is not one of them waits for them first: what they write
    is then complete, and reused, never computed twice at the same time. A pool no task runner adopted (the
    flow's one worker is a thread of its process) stops once its last call is claimed and done."""
    with _EARLY_LOCK:
        early = _EARLY
        if early is None or not early.calls:
            return None
        claimed = early.calls.pop(call_key(fn, args), None)
        widen(early)  # the flow runs: every core is the workers' again
        if claimed is not None:
            early.claimed += 1
        else:
            wait([c.future for c in early.calls.values()])
            for other in early.calls.values():
                ROUTER.forget(other.call)
            early.calls.clear()
        if not early.calls and not early.adopted:  # no task runner took the pool (one worker): it stops
            early.pool.shutdown(wait=False)  # once the claimed call is done, its worker exiting
        return claimed


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
    if early is None:
        return
    for claimed in early.calls.values():
        ROUTER.forget(claimed.call)
    if not early.adopted:
        early.pool.shutdown(wait=wait, cancel_futures=not wait)


def ready() -> int:
    """A call that makes a worker process start (and says which)."""
    return os.getpid()


# ---------------------------------------------------------------- a call in a worker


def _mark(name: str, call: str) -> None:
    """A call's start or end, through the log queue (:class:`Router` learns which worker runs what, and when a
    call's last record is through)."""
    if _log_queue is not None:
        _log_queue.put(logging.makeLogRecord({"name": name, "pileworks_call": call, "process": os.getpid()}))


def _own_logging() -> None:
    """The worker's root logger writes to the log queue only, also after a call's module configured logging when
    it was imported (Prefect does, on import: its handlers would print to the command's terminal and drop ours)."""
    root = logging.getLogger()
    if _log_queue is None or [type(h) for h in root.handlers] == [_QueueHandler]:
        return
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_QueueHandler(_log_queue))


def run_captured(fn: Callable[..., Any], args: tuple[Any, ...], call: str = "") -> dict[str, Any]:
    """In a worker process: ``fn(*args)`` with its profile records and the S3 calls it made outside its steps
    (the records count those inside); its log records go to the command as they come, stamped with ``call``. A
    failure comes back as its exception chain (pickling an exception drops its ``__cause__``, which the retry
    policy reads)."""
    global _current_call
    start = len(profile.LOCAL_RECORDS)
    storage0, measured0 = STATS.snapshot(), profile.counters(profile.MEASURED)
    _current_call = call
    _own_logging()
    _mark(START, call)
    try:
        return {
            "result": fn(*args),
            "profile": profile.LOCAL_RECORDS[start:],
            "storage": profile.unmeasured_since(storage0, measured0),  # S3 calls outside its steps
        }
    except Exception as exc:
        return {"error": exception_chain(exc)}
    finally:
        del profile.LOCAL_RECORDS[start:]
        _mark(END, call)
        _current_call = ""


class ThreadRecords(logging.Handler):
    """Every log record of one thread (a task's body run in the flow's process), to a sink, while installed on
    the root logger (:func:`records_to`)."""

    def __init__(self, sink: Sink) -> None:
        super().__init__(logging.DEBUG)
        self.thread, self.sink = threading.get_ident(), sink

    def emit(self, record: logging.LogRecord) -> None:
        # a record the sink handed on comes round again where that logger propagates to the root: once only
        if record.thread == self.thread and not getattr(record, "pileworks_routed", False):
            self.sink(record)


@contextlib.contextmanager
def records_to(sink: Sink) -> Any:
    """This thread's log records, of any module, go to ``sink`` too while the block runs."""
    handler, root = ThreadRecords(sink), logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


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
    """A worker process died under a task (killed, out of memory) on every fresh pool the task was given, or
    while the command stops."""
