"""Worker processes on this machine, started only when a flow first has work for them.

Prefect's task runs stay in the flow's process, on a ``ThreadPoolTaskRunner`` of :attr:`LocalWorkers.size`
threads (a task run costs about 9 ms of its CPU there); each task's body, a plain function of
``flows/build/steps.py``, is handed by :func:`hand_over` to a pool of as many worker processes
(``flows/runtime/pool.py``), forked from a server that imported the stage modules once. A worker imports no
Prefect and no Dask, and nothing rebuilds a Prefect context or client per task: it computes and returns its
result and profile records; every log record it makes (any module's) comes back through the pool's log queue
and is handled in this process as a record of the task run (:func:`task_run_sink`), so it shows in the UI. A
worker that dies under a task (killed, out of memory) costs a fresh pool, not the build (:meth:`LocalWorkers.renew`).

A build that finds its dataset already published submits nothing and starts no process. At most
:attr:`LocalWorkers.size` workers start: the cores it may use, fewer when the flow says its passes have fewer
task chunks (:meth:`LocalWorkers.fit`). One worker runs in the flow's own process, on one thread (no pool):
one busy thread beside a waiting flow has the GIL to itself. Under another task runner (a Dask scheduler, Ray,
``threads``) a task's body runs in-line in its task, wherever that runs.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar, cast

from prefect import get_run_logger
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import MissingContextError
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.runtime import profile, shutdown
from flows.runtime.pool import (
    ROUTER,
    Claimed,
    Sink,
    WorkerDied,
    WorkerPool,
    adopt_early,
    claim_early,
    new_call,
    records_to,
    relinked,
    start_pool,
)

R = TypeVar("R")

# Fresh pools a call is given when the worker under it dies: a task that kills its worker every time (out of
# memory on one huge document) fails then, naming the signal, instead of looping.
FRESH_POOLS = 2


class LocalWorkers(TaskRunner[Any]):
    """Up to ``workers`` one-thread worker processes with ``env`` set (a thread of Prefect's task runner each in
    this process), or one thread in this process when :attr:`size` is 1 (``env`` set here meanwhile), started
    at the first task submitted (:meth:`start_soon` starts them in the background before that)."""

    def __init__(self, workers: int, env: dict[str, str] | None = None) -> None:
        super().__init__()
        self.workers = workers  # the most it starts: the cores it may use
        self.env = dict(env or {})
        self.limit: int | None = None  # the flow's count of task chunks (:meth:`fit`)
        self.pool: Any = None  # Prefect's ThreadPoolTaskRunner, once started
        self.processes: WorkerPool | None = None  # the worker processes (none for one worker)
        self.started_workers = 0  # the worker processes it started (0: nothing submitted, or in-process)
        self.in_process = 0  # the workers it runs as threads of this process (1 or 0)
        self.env_added: list[str] = []  # the names of ``env`` the in-process worker set in this process
        self.starting: threading.Thread | None = None
        self.lock = threading.Lock()

    @property
    def size(self) -> int:
        """The workers it starts (or started)."""
        return max(1, min(self.workers, self.limit or self.workers))

    def fit(self, chunks: int) -> int:
        """Start no more workers than ``chunks``, the task chunks of the flow's widest pass (a worker more would
        only start, idle and stop). No effect once started. Returns :attr:`size`."""
        if self.pool is None:
            self.limit = max(1, chunks)
        return self.size

    def duplicate(self) -> LocalWorkers:
        return type(self)(self.workers, self.env)

    def start_soon(self) -> None:
        """Start the workers in the background (while the flow still plans); a submit waits for them."""
        with self.lock:
            if self.pool is None and self.starting is None:
                self.starting = threading.Thread(target=self.runner, name="pileworks-workers", daemon=True)
                self.starting.start()

    def runner(self) -> Any:
        """Prefect's task runner for the workers, started (here, on first use)."""
        with self.lock:
            if self.pool is None:
                self.pool = self.threads() if self.size == 1 else self.start_processes()
            return self.pool

    def threads(self) -> Any:
        """One worker: a thread of this process, with the workers' ``env`` unless the user set its names."""
        self.env_added = [k for k in self.env if k not in os.environ]
        os.environ.update({k: self.env[k] for k in self.env_added})
        pool: ThreadPoolTaskRunner[Any] = ThreadPoolTaskRunner(max_workers=1)
        pool.__enter__()
        self.in_process = 1
        return pool

    def start_processes(self) -> Any:
        """:attr:`size` worker processes, all started now (one call each: the pool forks one per call that finds
        none idle), and as many threads here for Prefect's task runs."""
        self.processes = adopt_early(self.size)  # the pool of the command's head start, working already
        if self.processes is None:
            self.processes = start_pool(self.size)
        self.started_workers = self.size
        pool: ThreadPoolTaskRunner[Any] = ThreadPoolTaskRunner(max_workers=self.size)
        pool.__enter__()
        return pool

    def call(self, fn: Callable[..., R], args: tuple[Any, ...], where: str) -> R:
        """``fn(*args)`` in a worker process (or, for one worker, in this thread unless the head start runs it
        already); its profile records join this process's, its log records reach the task run as they come. A
        worker that dies under it: the call runs again on a fresh pool (:meth:`renew`)."""
        self.runner()
        sink = task_run_sink()
        early = claim_early(fn, args)  # started by the command's head start, in a worker process already
        for fresh in range(FRESH_POOLS + 1):
            if early is None and self.processes is None:  # one worker: in this thread
                # on a thread the command does not wait for when it stops (``records_to`` follows it there)
                return shutdown.until_stopped(functools.partial(in_line, fn, args, sink), fn.__name__)
            claimed = early or self.submit_call(fn, args)
            early = None
            ROUTER.route(claimed.call, where)
            try:
                out = awaited(claimed, sink)
            except BrokenProcessPool:
                ROUTER.drain(claimed.call, sink)
                ROUTER.forget(claimed.call)
                self.renew(claimed.pool, where, last=fresh == FRESH_POOLS)
                continue
            ROUTER.wait_done(claimed.call, sink)
            if "error" in out:
                raise relinked(out["error"])
            profile.LOCAL_RECORDS.extend(out["profile"])
            profile.add_worker_unmeasured(out["storage"])
            return cast(R, out["result"])
        raise AssertionError("unreachable: renew raises on the last fresh pool")

    def submit_call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Claimed:
        pool = self.processes
        assert pool is not None
        call = new_call()
        return Claimed(pool.submit(fn, args, call), call, pool)

    def renew(self, broken: WorkerPool, where: str, last: bool) -> None:
        """After a worker died under ``where``: unless the command stops or this was the call's ``last`` pool,
        replace the broken pool (once, whichever of its callers comes first) with a fresh one of the same size,
        saying once which worker died of what under which task. The broken pool's other calls run again too:
        their units are written whole or not at all."""
        dead = ", ".join(
            f"{pid} ({how}, running {ROUTER.running_where(pid) or where})" for pid, how in broken.died()
        )
        what = f"{where} failed: the worker process running it died ({dead or 'killed'})"
        if shutdown.STOPPING.is_set():
            raise WorkerDied(f"{what} while the command stops")
        if last:
            raise WorkerDied(
                f"{what} on {FRESH_POOLS + 1} pools in a row (out of memory?); see the log above"
            )
        with self.lock:
            if broken.broken:
                return  # another caller renewed it
            broken.broken = True
            broken.shutdown(wait=False)
            get_run_logger().warning(
                "worker process %s died; its tasks run again on a fresh pool", dead or "?"
            )
            if self.processes is broken:
                self.processes = start_pool(self.size)

    def submit(
        self,
        task: Any,
        parameters: dict[str, Any],
        wait_for: Iterable[Any] | None = None,
        dependencies: dict[str, set[Any]] | None = None,
    ) -> Any:
        return self.runner().submit(task, parameters, wait_for, dependencies)

    # A task's context holds this runner; a copy that travels (pickled) holds its settings only.
    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"pool": None, "processes": None, "starting": None, "lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if self.starting is not None:
            self.starting.join()
        if self.processes is not None:  # after Ctrl-C: queued calls dropped, the running ones finish
            self.processes.shutdown(wait=exc_type is None, cancel_futures=True)
            if exc_type is None:
                said_dead(self.processes)
            self.processes = None
        if self.pool is not None:
            self.pool.__exit__(exc_type, exc_value, traceback)
            self.pool = None
        for name in self.env_added:  # the in-process worker's env, gone with it
            os.environ.pop(name, None)
        self.env_added = []
        self.starting = None
        super().__exit__(exc_type, exc_value, traceback)


def said_dead(pool: WorkerPool) -> None:
    """Say a worker of ``pool`` that died after its last call (killed between tasks, or in the last pass once
    its work was done): nothing was cut short, and no call renewed the pool, but a dead worker is always said
    (an OOM kill the user should see). A renewed pool was said when it was renewed."""
    if pool.broken or shutdown.STOPPING.is_set():
        return
    dead = pool.died()
    if dead:
        try:
            logger: Any = get_run_logger()
        except MissingContextError:
            logger = logging.getLogger(__name__)
        logger.warning(
            "worker process %s died after its last task; nothing was cut short",
            ", ".join(f"{pid} ({how})" for pid, how in dead),
        )


def awaited(claimed: Claimed, sink: Sink, poll_s: float = 0.1) -> Any:
    """The call's result, its log records handed to ``sink`` on this thread as they come (within ``poll_s``)."""
    while True:
        try:
            return claimed.future.result(timeout=poll_s)
        except FutureTimeout:
            ROUTER.drain(claimed.call, sink)


def in_line(fn: Callable[..., R], args: tuple[Any, ...], sink: Sink) -> R:
    """``fn(*args)`` here, every log record of it also in the task run's log (its profile records stay here)."""
    if sink is local_sink:  # no run to log to: its records are this process's as they are
        return fn(*args)
    with records_to(sink):
        return fn(*args)


def task_run_sink() -> Sink:
    """Where the log records of this task run's body go: its Prefect task run log (shown in the UI), under the
    record's own logger name and level, from whichever thread hands them on (the pools' listener). Outside a
    run (a test's call): :func:`local_sink`."""
    try:
        adapter: Any = get_run_logger()
    except MissingContextError:
        return local_sink
    extra = dict(adapter.extra or {})
    runs_logger = adapter.logger

    def sink(record: logging.LogRecord) -> None:
        record.__dict__.update(extra)
        record.pileworks_routed = True
        runs_logger.handle(record)

    return sink


def local_sink(record: logging.LogRecord) -> None:
    """A worker's record handled in this process as if logged here."""
    logging.getLogger(record.name).handle(record)


def hand_over(fn: Callable[..., R], *args: Any) -> R:
    """Run a task's body ``fn(*args)`` (a plain function of ``flows/build/steps.py``): in a local worker process
    when the flow runs on :class:`LocalWorkers`, else here, in-line in the task (on a Dask or Ray worker, or a
    thread). Its log lines reach the task run's log either way."""
    flow = FlowRunContext.get()
    runner = flow.task_runner if flow is not None else None
    # before the flow starts its workers (planning, a rebuild that finds everything done) a body runs here
    if isinstance(runner, LocalWorkers) and (runner.pool is not None or runner.starting is not None):
        task = TaskRunContext.get()
        where = f"task {task.task_run.name!r}" if task is not None else f"step {fn.__name__!r}"
        return runner.call(fn, args, where)
    return in_line(fn, args, task_run_sink())
