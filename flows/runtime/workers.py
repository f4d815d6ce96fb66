"""Worker processes on this machine, started only when a flow first has work for them.

Prefect's task runs stay in the flow's process, on a ``ThreadPoolTaskRunner`` of :attr:`LocalWorkers.size`
threads (a task run costs about 9 ms of its CPU there); each task's body, a plain function of
``flows/build/steps.py``, is handed by :func:`hand_over` to a pool of as many worker processes
(``flows/runtime/pool.py``), forked from a server that imported the stage modules once. A worker imports no
Prefect and no Dask, and nothing rebuilds a Prefect context or client per task: it computes, and returns its
result, its profile records and its log lines, which the task re-emits in its task run.

A build that finds its dataset already published submits nothing and starts no process. At most
:attr:`LocalWorkers.size` workers start: the cores it may use, fewer when the flow says its passes have fewer
task chunks (:meth:`LocalWorkers.fit`). One worker runs in the flow's own process, on one thread (no pool):
one busy thread beside a waiting flow has the GIL to itself. Under another task runner (a Dask scheduler, Ray,
``threads``) a task's body runs in-line in its task, wherever that runs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from prefect import get_run_logger
from prefect.context import FlowRunContext, TaskRunContext
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.runtime import profile
from flows.runtime.pool import (
    WorkerDied,
    adopt_early,
    capture_logs,
    claim_early,
    ready,
    relinked,
    run_captured,
    start_pool,
)

R = TypeVar("R")


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
        self.processes: ProcessPoolExecutor | None = None  # the worker processes (none for one worker)
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
            for _ in range(self.size):
                self.processes.submit(ready)
        self.started_workers = self.size
        pool: ThreadPoolTaskRunner[Any] = ThreadPoolTaskRunner(max_workers=self.size)
        pool.__enter__()
        return pool

    def call(self, fn: Callable[..., R], args: tuple[Any, ...], where: str) -> R:
        """``fn(*args)`` in a worker process (or, for one worker, in this thread unless the head start runs it
        already); its profile records join this process's, its log lines come back."""
        self.runner()
        early = claim_early(fn, args)  # started by the command's head start, in a worker process already
        if early is None and self.processes is None:  # one worker: in this thread
            return in_line(fn, args)
        try:
            future = early or self.processes.submit(run_captured, fn, args)  # type: ignore[union-attr]
            out = future.result()
        except BrokenProcessPool as exc:
            raise WorkerDied(
                f"{where} failed: the worker process running it died (killed, or out of memory?); "
                "rerun the same command to continue"
            ) from exc
        if "error" in out:
            raise relinked(out["error"])
        profile.LOCAL_RECORDS.extend(out["profile"])
        profile.add_worker_unmeasured(out["storage"])
        emit(out["logs"])
        return out["result"]

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
            self.processes = None
        if self.pool is not None:
            self.pool.__exit__(exc_type, exc_value, traceback)
            self.pool = None
        for name in self.env_added:  # the in-process worker's env, gone with it
            os.environ.pop(name, None)
        self.env_added = []
        self.starting = None
        super().__exit__(exc_type, exc_value, traceback)


def in_line(fn: Callable[..., R], args: tuple[Any, ...]) -> R:
    """``fn(*args)`` here, its log lines re-emitted in the task run's log (its profile records stay here)."""
    result, logs = capture_logs(fn, args)
    emit(logs)
    return result


def emit(lines: list[tuple[int, str]]) -> None:
    if lines:
        logger = get_run_logger()
        for level, message in lines:
            logger.log(level, "%s", message)


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
    return in_line(fn, args)
