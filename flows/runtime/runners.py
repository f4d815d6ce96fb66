"""Task runners: worker processes on this machine (the default), a Dask or Ray cluster, or in-process threads.

``local`` (default; ``process`` is the same) runs Prefect's task runs on threads of the flow's process and their
bodies in a pool of ``workers`` worker processes with one thread each, forked from a server that imported the
stages once (``flows/runtime/workers.py``): the stages are CPU-bound Python, so threads would share one core
through the GIL. A pool of one (``--workers 1``, or a build small enough for one task per pass) is a thread of
the flow's process. ``workers`` is the number of cores the build uses: each worker process encodes with one
thread (``PILEWORKS_THREADS=1``, ``RAYON_NUM_THREADS=1``), and tokenizer training, a process of its own, uses
``workers`` threads (:func:`training_threads`).
``dask`` starts a Dask ``LocalCluster`` of ``workers`` one-thread processes through Prefect's Dask integration:
every worker process imports Prefect and the stages and rebuilds a Prefect context per task (about 2-3 CPU-s
per worker and 0.1-0.2 CPU-s per task more than ``local``); it runs a build exactly as a remote Dask cluster
would, on one machine. ``dask://host:port`` (or ``tcp://host:port``) sends the same tasks to an existing Dask
scheduler, whose workers need pileworks installed and access to the store (``s3://`` across machines).
``threads`` keeps everything in the flow's process (debugging). ``ray`` starts a local Ray instance of
``workers`` CPUs, ``ray://host:port`` sends the tasks to an existing Ray cluster's client server (KubeRay's head
service), both through Prefect's own Ray integration (``pip install pileworks[ray]``). On a Dask or Ray worker,
or a thread, a task's body runs in-line in its task; the tasks, and so the dataset, are the same everywhere.

Every worker reports its task runs to the flow's Prefect API, never to a server of its own:
:func:`prefect_api` uses pileworks' local server when none is configured and puts its URL into the settings that
Prefect ships to the workers with each task.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from prefect.task_runners import ThreadPoolTaskRunner

from flows.runtime.local_server import resolve_api, using_api
from flows.runtime.pool import ONE_THREAD, cores
from flows.runtime.workers import LocalWorkers

RUNNERS = ("local", "process", "dask", "threads")


def default_workers() -> int:
    """The cores this process may use (the affinity mask on Linux, else the CPU count; at most its cgroup's CPU
    quota: ``flows/runtime/cores.py``)."""
    return cores()


def make_task_runner(spec: str = "local", workers: int | None = None) -> Any:
    """``local`` | ``process`` (``workers`` local worker processes) | ``dask`` (a Dask LocalCluster of ``workers``
    processes) | ``threads`` | ``dask://host:port`` / ``tcp://host:port`` (an existing scheduler; ``workers`` is
    its business) | ``ray`` | ``ray://host:port``."""
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    n = workers or default_workers()
    if spec == "threads":
        return _threads_runner(n)
    if spec == "ray" or spec.startswith("ray://"):
        return _ray_runner(spec, n)
    if spec not in RUNNERS and not spec.startswith(("dask://", "tcp://")):
        raise ValueError(
            f"--task-runner must be local, threads, dask://host:port, ray or ray://host:port; got {spec!r}"
        )
    if spec in ("local", "process"):
        # started at the flow's first task, never for a build with nothing to compute (flows/runtime/workers.py)
        return LocalWorkers(n, env=ONE_THREAD)
    import importlib.util

    if importlib.util.find_spec("prefect_dask") is None:  # checked without importing Dask (about 0.5 CPU-s)
        raise ValueError("--task-runner dask needs `pip install pileworks[dask]` (dask, distributed)")
    from prefect_dask import DaskTaskRunner

    if "://" in spec:
        return DaskTaskRunner(address="tcp://" + spec.split("://", 1)[1])
    quiet_dask()  # the cluster's workers inherit this process's Dask config
    return DaskTaskRunner(cluster_kwargs=local_cluster_kwargs(n))


def local_cluster_kwargs(workers: int) -> dict[str, Any]:
    """The Dask ``LocalCluster`` of ``--task-runner dask``: ``workers`` processes of one thread, no dashboard."""
    return {
        "n_workers": workers,
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": None,
        "env": dict(ONE_THREAD),
        # the terminal's Ctrl-C reaches the whole process group: the flow's process handles it, workers ignore it
        "preload": ["flows.runtime.worker_signals"],
    }


# Dask's background loops cost about 7% of a core on an idle 2-worker cluster (measured: 1.38 CPU-s per 20 s;
# 0.39 with these), most of it the statistical profiler sampling every worker's stack every 10 ms, which
# also taxes every task. Nanny ships this config to the worker processes it starts. Only Dask's public config
# is used: nothing of Prefect's, docket's or Dask's code is replaced (tests/test_architecture.py checks it).
QUIET_DASK = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.tick.interval": "1s",
    # a build's tasks return small records, never replicated data to reduce, and wait queued on the scheduler
    # until a worker is free, so there is little to steal
    "distributed.scheduler.active-memory-manager.start": False,
    "distributed.scheduler.work-stealing-interval": "5s",
}


def quiet_dask() -> None:
    """Apply :data:`QUIET_DASK` in this process (and so in the local cluster's workers)."""
    import dask

    dask.config.set(QUIET_DASK)


_USER_RAYON = os.environ.get("RAYON_NUM_THREADS")  # a user's own setting wins


def training_threads() -> int:
    """The threads of the running flow's tokenizer training (a process of its own, except a small sample on one
    in-process worker: ``flows/build/tokenizer_process.py``): the user's ``RAYON_NUM_THREADS`` if set, else the
    flow's workers when they are this machine's (local workers or threads; at most the cores here), else 0: the
    cores of the machine where a Dask or Ray worker runs it."""
    if _USER_RAYON is not None and _USER_RAYON.strip().isdigit():
        return max(1, int(_USER_RAYON))
    runner = _flow_task_runner()
    if runner is None:
        return default_workers()
    if isinstance(runner, (LocalWorkers, SizedThreadPoolTaskRunner)):
        return max(1, min(worker_count(), default_workers()))
    return 0


def with_task_runner(flow: Any, spec: str = "local", workers: int | None = None) -> Any:
    return flow.with_options(task_runner=make_task_runner(spec, workers))


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """The Prefect API for a flow and all its workers: the configured one, else pileworks' local server (started
    if need be: :func:`~flows.runtime.local_server.resolve_api`); and no flow-run heartbeat of Prefect's unless
    the user's settings ask for one (:func:`no_prefect_heartbeat`).

    Without this, Prefect starts a temporary server lazily in each process that needs a client, so every
    worker process would run (and pay for) a server of its own and the UI would see none of their task runs.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(set_defaults=no_prefect_heartbeat()):
        url = PREFECT_API_URL.value()
        if url:
            yield url
            return
        api = resolve_api()
        with using_api(api):
            yield api.url


# Prefect's flow engine sends a heartbeat event every ``flows.heartbeat_frequency`` seconds (180 by default) from a
# thread that sleeps in one-second steps, and a run's end waits for that thread: 0-1 s (0.5 on average) of every
# flow run, about 5% of a small build. Our own heartbeat (``flows/runtime/heartbeat.py``) is what ``pileworks
# reap`` reads. A value set by the user (environment, profile, ``prefect.toml``) still wins: ``set_defaults``.
# Keyed by Prefect's public setting object (string keys there are newer than Prefect 3.4); a Prefect without the
# setting sends no such heartbeat, so there is nothing to turn off.
def no_prefect_heartbeat() -> dict[Any, Any]:
    """The ``set_defaults`` of :func:`prefect_api` that turns Prefect's flow-run heartbeat off."""
    import prefect.settings

    setting = getattr(prefect.settings, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY", None)
    return {setting: None} if setting is not None else {}


def worker_count() -> int:
    """Workers of the running flow's task runner (the local workers it will start, without starting them; a
    Dask scheduler's live workers; a thread pool's size; a Ray cluster's CPUs)."""
    runner = _flow_task_runner()
    if isinstance(runner, LocalWorkers):
        return runner.size
    if type(runner).__module__.startswith("prefect_ray"):  # its runner has started (connected to) Ray
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    dask = sys.modules.get("prefect_dask")  # not imported: the runner is none of Dask's
    if dask is not None and isinstance(runner, dask.DaskTaskRunner):
        return max(1, len(runner.client.scheduler_info(n_workers=-1)["workers"]))
    return max(1, int(getattr(runner, "workers", 1)))


def fit_workers(chunks: int) -> int:
    """Tell the running flow's local workers the task chunks of its widest pass (no more workers start than
    that); returns the workers it will use. Other task runners keep their size."""
    runner = _flow_task_runner()
    return runner.fit(chunks) if isinstance(runner, LocalWorkers) else worker_count()


def start_workers_soon() -> None:
    """Start the running flow's local workers in the background, once it knows it has work for them."""
    runner = _flow_task_runner()
    if isinstance(runner, LocalWorkers):
        runner.start_soon()


def workers_in_process() -> int:
    """The running flow's local workers that run as a thread of its own process (1 or 0)."""
    runner = _flow_task_runner()
    return runner.in_process if isinstance(runner, LocalWorkers) else 0


def workers_started() -> int:
    """The worker processes the running flow's local task runner started (0 for a build that computed nothing,
    and for other task runners, which start none of this machine's processes for the flow)."""
    runner = _flow_task_runner()
    return runner.started_workers if isinstance(runner, LocalWorkers) else 0


def _flow_task_runner() -> Any:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return ctx.task_runner if ctx else None


class SizedThreadPoolTaskRunner(ThreadPoolTaskRunner[Any]):
    """Prefect's thread pool of ``workers`` threads, which also says its size (:func:`worker_count`) as a public
    attribute of our own subclass instead of reading the pool's private one."""

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__(max_workers=max_workers)
        self.workers = max_workers or 1


def _threads_runner(workers: int) -> Any:
    return SizedThreadPoolTaskRunner(max_workers=workers)


# Ray's workers run one task each at a time: one encoder thread each, as the Dask workers (make_task_runner).
RAY_WORKER_ENV = dict(ONE_THREAD)
RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # 0: a local instance of one node, on 127.0.0.1


def _ray_runner(spec: str, workers: int) -> Any:
    """prefect-ray's task runner: a local Ray instance of ``workers`` CPUs (``ray``), or the Ray cluster whose
    client server is at ``ray://host:port`` (its workers need pileworks installed and the store, as Dask's).

    The local instance serves this machine only: Ray would otherwise listen on the machine's network address (its
    GCS and raylet on every interface, with no authentication), letting anyone who reaches it run code here. Ray
    keeps a one-node instance on 127.0.0.1 with its switch for Windows and macOS, read when Ray is first imported
    (so this holds where this is that import, as in ``pileworks build``; a user's own setting of it wins)."""
    if spec == "ray":
        os.environ.setdefault(RAY_LOOPBACK_ENV, "0")
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as exc:
        raise ValueError("--task-runner ray needs `pip install pileworks[ray]` (prefect-ray, ray)") from exc
    init: dict[str, Any] = {"runtime_env": {"env_vars": RAY_WORKER_ENV}, "log_to_driver": False}
    if spec == "ray":
        return RayTaskRunner(init_kwargs=init | {"num_cpus": workers, "include_dashboard": False})
    return RayTaskRunner(address=spec, init_kwargs=init)
