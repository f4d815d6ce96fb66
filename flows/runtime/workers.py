"""Worker processes on this machine, started only when a flow first hands them a task.

Prefect enters a flow's task runner before the flow's first line runs. Dask's runner would then start its
cluster the first time anything asks it for its client; a build that finds its dataset already published
submits nothing, and must not pay the 2-4 CPU-s of starting and stopping worker processes (nor import Dask).
:class:`LocalWorkers` holds the cluster's settings and makes Prefect's own ``DaskTaskRunner`` at the first
``submit``, with at most :attr:`LocalWorkers.size` workers: the cores it may use, fewer when the flow says its
passes have fewer task chunks (:meth:`LocalWorkers.fit`). One worker runs in the flow's own process, on one
thread of Prefect's ``ThreadPoolTaskRunner``: a worker process would cost 5-6 CPU-s more for a small build (its
start, importing Prefect and the pipeline again, Dask's scheduler and nanny, each task and its context pickled)
and one busy thread beside a waiting flow has the GIL to itself. Only public interfaces of Prefect and Dask are
used.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from prefect.task_runners import TaskRunner


class LocalWorkers(TaskRunner[Any]):
    """A ``LocalCluster`` of up to ``workers`` one-thread processes with ``env`` set, or one thread in this
    process when :attr:`size` is 1 (``env`` set here meanwhile), started at the first task submitted
    (:meth:`start_soon` starts it in the background before that)."""

    def __init__(
        self, workers: int, env: dict[str, str] | None = None, configure: Callable[[], None] | None = None
    ) -> None:
        super().__init__()
        self.workers = workers  # the most it starts: the cores it may use
        self.env = dict(env or {})
        self.configure = configure  # run before the cluster starts (Dask's config, which workers inherit)
        self.limit: int | None = None  # the flow's count of task chunks (:meth:`fit`)
        self.pool: Any = None  # Prefect's DaskTaskRunner (or ThreadPoolTaskRunner for one), once started
        self.started_workers = (
            0  # the worker processes it started (0: the flow submitted nothing, or in-process)
        )
        self.in_process = 0  # the workers it runs as threads of this process (1 or 0)
        self.env_added: list[str] = []  # the names of ``env`` the in-process worker set in this process
        self.starting: threading.Thread | None = None
        self.lock = threading.Lock()

    @property
    def size(self) -> int:
        """The workers it starts (or started)."""
        return max(1, min(self.workers, self.limit or self.workers))

    @property
    def cluster_kwargs(self) -> dict[str, Any]:
        """The ``LocalCluster`` it starts: :attr:`size` processes of one thread each, no dashboard."""
        return {
            "n_workers": self.size,
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": None,
            "env": self.env,
            # the terminal's Ctrl-C reaches the whole process group: the flow's process handles it, workers ignore it
            "preload": ["flows.runtime.worker_signals"],
        }

    def fit(self, chunks: int) -> int:
        """Start no more workers than ``chunks``, the task chunks of the flow's widest pass (a worker more would
        only start, idle and stop). No effect once started. Returns :attr:`size`."""
        if self.pool is None:
            self.limit = max(1, chunks)
        return self.size

    def duplicate(self) -> LocalWorkers:
        return type(self)(self.workers, self.env, self.configure)

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
                self.pool = self.threads() if self.size == 1 else self.cluster()
            return self.pool

    def threads(self) -> Any:
        """One worker: a thread of this process, with the workers' ``env`` unless the user set its names."""
        from prefect.task_runners import ThreadPoolTaskRunner

        self.env_added = [k for k in self.env if k not in os.environ]
        os.environ.update({k: self.env[k] for k in self.env_added})
        pool: ThreadPoolTaskRunner[Any] = ThreadPoolTaskRunner(max_workers=1)
        pool.__enter__()
        self.in_process = 1
        return pool

    def cluster(self) -> Any:
        """Prefect's Dask runner, its cluster of :attr:`size` processes started now, not at the first task."""
        from prefect_dask import DaskTaskRunner

        if self.configure is not None:
            self.configure()
        dask = DaskTaskRunner(cluster_kwargs=self.cluster_kwargs)
        dask.__enter__()
        try:
            dask.client  # noqa: B018 - the client property starts the cluster
        except BaseException:
            dask.__exit__(None, None, None)
            raise
        self.started_workers = self.size
        return dask

    def submit(
        self,
        task: Any,
        parameters: dict[str, Any],
        wait_for: Iterable[Any] | None = None,
        dependencies: dict[str, set[Any]] | None = None,
    ) -> Any:
        return self.runner().submit(task, parameters, wait_for, dependencies)

    # Prefect ships the flow's context, this runner in it, with every task to the workers: the copy there holds
    # the settings only (a lock, a thread and a live cluster do not pickle, nor would mean anything there).
    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"pool": None, "starting": None, "lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if self.starting is not None:
            self.starting.join()
        if self.pool is not None:
            self.pool.__exit__(exc_type, exc_value, traceback)
            self.pool = None
        for name in self.env_added:  # the in-process worker's env, gone with it
            os.environ.pop(name, None)
        self.env_added = []
        self.starting = None
        super().__exit__(exc_type, exc_value, traceback)
