"""Task runners: worker processes on this machine (the default), in-process threads, or a Dask scheduler.

``local`` (default; ``process`` and ``dask`` are the same) starts a Dask ``LocalCluster`` of ``workers`` processes
with one thread each: the stages are CPU-bound Python, so threads would share one core through the GIL.
``workers`` is the number of cores the build uses: each worker process also encodes with one thread
(``PILEWORKS_THREADS=1``, ``RAYON_NUM_THREADS=1``), and the steps that run in the flow's own process between
passes (tokenizer training) use ``workers`` threads (:func:`use_cores`).
``dask://host:port`` (or ``tcp://host:port``) sends the same tasks to an existing Dask scheduler, whose workers
need pileworks installed and access to the store (``s3://`` across machines). ``threads`` keeps everything in
the flow's process (debugging).

Every worker reports its task runs to the flow's Prefect API, never to a server of its own:
:func:`prefect_api` starts one local server when none is configured and puts its URL into the settings that
Prefect ships to the workers with each task.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import os
from collections.abc import Iterator
from typing import Any

RUNNERS = ("local", "process", "dask", "threads")


def default_workers() -> int:
    """The cores this process may use (the affinity mask on Linux, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def make_task_runner(spec: str = "local", workers: int | None = None) -> Any:
    """``local`` | ``process`` | ``dask`` (a LocalCluster of ``workers`` processes) | ``threads`` |
    ``dask://host:port`` / ``tcp://host:port`` (an existing scheduler; ``workers`` is its business)."""
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    n = workers or default_workers()
    if spec == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=n)
    if spec not in RUNNERS and not spec.startswith(("dask://", "tcp://")):
        raise ValueError(f"--task-runner must be local, threads or dask://host:port; got {spec!r}")
    try:
        runner = _unhashed_runner()
    except ImportError as exc:
        raise ValueError("worker processes need `pip install pileworks[dask]` (dask, distributed)") from exc
    if "://" in spec:
        return runner(address="tcp://" + spec.split("://", 1)[1])
    quiet_dask()
    one_thread = {"PILEWORKS_THREADS": "1", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    cluster = {"n_workers": n, "threads_per_worker": 1, "processes": True, "dashboard_address": None}
    return runner(cluster_kwargs=cluster | {"env": one_thread})


def __getattr__(name: str) -> Any:
    """``UnhashedDaskTaskRunner`` on first use, in any process (a worker unpickling a flow run's context)."""
    if name == "UnhashedDaskTaskRunner":
        return _unhashed_runner()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unhashed_runner() -> Any:
    """``DaskTaskRunner`` whose client submits tasks as impure. Prefect's client submits them as pure, so Dask
    derives each key by hashing every argument (the task, its parameters and Prefect's whole serialised
    context): about 20 ms of the flow process's CPU per task run, for a key that is unique anyway (each
    submission carries a new task-run id). Defined once, as this module's ``UnhashedDaskTaskRunner``, so it
    pickles by name like any class."""
    if (cls := globals().get("UnhashedDaskTaskRunner")) is not None:
        return cls
    from prefect_dask import DaskTaskRunner

    lighter_task_runs()  # in the flow's process, and in a worker as it unpickles its first task

    class UnhashedDaskTaskRunner(DaskTaskRunner):  # type: ignore[misc]
        @property
        def client(self) -> Any:
            client = super().client  # created on first use
            if "submit" not in vars(client):
                client.submit = functools.partial(type(client).submit, client, pure=False)
            return client

    UnhashedDaskTaskRunner.__qualname__ = "UnhashedDaskTaskRunner"
    globals()["UnhashedDaskTaskRunner"] = UnhashedDaskTaskRunner
    return UnhashedDaskTaskRunner


def lighter_task_runs() -> None:
    """Take repeated work out of Prefect's per-task-run bookkeeping (:func:`settings_context_once`,
    :func:`shared_tls_context`): about 110 ms of CPU per task run in the flow's process and its worker before,
    ~15 ms after (``tests/bench/bench_task_runs.py``). ``PILEWORKS_PREFECT_PATCHES=0`` leaves Prefect as it is
    (should a Prefect release change what these rely on)."""
    if os.environ.get("PILEWORKS_PREFECT_PATCHES", "1") == "0":
        return
    settings_context_once()
    shared_tls_context()


class _SharedTls:
    """The ``ssl`` module as Prefect's client module sees it, with ``create_default_context(cafile=F)``
    answered once per file."""

    def __init__(self, real: Any) -> None:
        self.real, self.contexts = real, {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def create_default_context(self, *args: Any, **kwargs: Any) -> Any:
        if args or set(kwargs) != {"cafile"} or not kwargs["cafile"]:
            return self.real.create_default_context(*args, **kwargs)  # e.g. the insecure path, which edits it
        cafile = str(kwargs["cafile"])
        if (ctx := self.contexts.get(cafile)) is None:
            ctx = self.contexts[cafile] = self.real.create_default_context(cafile=cafile)
        return ctx


def shared_tls_context() -> None:
    """One verifying TLS context per CA file for Prefect's API clients in this process.

    Prefect builds a new API client for every task run in a worker (two of them, in fact), and each one builds
    a TLS context from the CA bundle (``ssl.create_default_context(cafile=certifi.where())``: ~20 ms of
    parsing certificates), even for ``http://127.0.0.1``. A verifying context is not changed once made and may be
    shared by any number of clients (httpx does so itself); the insecure one Prefect edits after creating it is
    still made fresh. Idempotent.
    """
    import prefect.client.orchestration as orchestration

    if not isinstance(orchestration.ssl, _SharedTls):
        orchestration.ssl = _SharedTls(orchestration.ssl)  # type: ignore[assignment]


def settings_context_once() -> None:
    """Serialise Prefect's settings context once per settings, and validate it once per worker.

    Prefect ships its whole settings model with every task run it submits to a worker: the flow's process
    serialises it to a dict (``SettingsContext.serialize``, ~14 ms) and the worker validates that dict back
    into a settings model (~24 ms), identical each time; a third of a task run's bookkeeping CPU. Here the flow's
    process serialises a settings context object once (the object is immutable: new settings make a new
    context), and a worker validates a given serialised form once, then builds later contexts from the
    validated profile and settings objects (pydantic takes model instances as they are). The values are the
    same; only repeated work goes. Idempotent.
    """
    from prefect.context import SettingsContext

    if getattr(SettingsContext.serialize, "pileworks", False):
        return
    serialize, init = SettingsContext.serialize, SettingsContext.__init__
    last: list[Any] = [None, None, None]  # context, include_secrets, its serialised form

    def serialize_once(self: Any, include_secrets: bool = True) -> dict[str, Any]:
        context, secrets, done = last
        if context is not self or secrets != include_secrets:
            done = serialize(self, include_secrets=include_secrets)
            last[:] = [self, include_secrets, done]
        return done

    validated: dict[str, tuple[Any, Any]] = {}

    def init_once(self: Any, **data: Any) -> None:
        if not isinstance(data.get("settings"), dict) or set(data) != {"profile", "settings"}:
            init(self, **data)
            return
        key = json.dumps(data, sort_keys=True, default=str)
        if (hit := validated.get(key)) is None:
            init(self, **data)
            if len(validated) >= 8:
                validated.clear()
            validated[key] = (self.profile, self.settings)
            return
        init(self, profile=hit[0], settings=hit[1])

    serialize_once.pileworks = True  # type: ignore[attr-defined]
    SettingsContext.serialize = serialize_once  # type: ignore[method-assign]
    SettingsContext.__init__ = init_once  # type: ignore[method-assign]


# Dask's background loops cost about 7% of a core on an idle 2-worker cluster (measured: 1.38 CPU-s per 20 s;
# 0.39 with these), most of it the statistical profiler sampling every worker's stack every 10 ms, which
# also taxes every task. Nanny ships this config to the worker processes it starts.
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


# A Dask scheduler asks up to 10 workers for a heartbeat every 0.5 s (``distributed.scheduler.heartbeat_interval``,
# not a config key): a third of an idle worker's CPU. Task results do not wait for heartbeats (they travel on
# the batched stream), and a dead worker's nanny or closed connection reports it at once, so the local
# cluster's scheduler, which lives in the flow's process, asks every 5 s.
LOCAL_HEARTBEAT_S = 5.0


def quiet_dask() -> None:
    """Apply :data:`QUIET_DASK` in this process (and so in the local cluster's workers), and space the heartbeats
    of the schedulers started here (the local cluster's) to at least :data:`LOCAL_HEARTBEAT_S`."""
    import dask
    import distributed.scheduler

    dask.config.set(QUIET_DASK)
    dask_interval = distributed.scheduler.heartbeat_interval
    if not getattr(dask_interval, "pileworks", False):

        def heartbeat_interval(n: int) -> float:
            return max(LOCAL_HEARTBEAT_S, dask_interval(n))

        heartbeat_interval.pileworks = True  # type: ignore[attr-defined]
        distributed.scheduler.heartbeat_interval = heartbeat_interval


_USER_RAYON = os.environ.get("RAYON_NUM_THREADS")  # a user's own setting wins


def use_cores(workers: int) -> None:
    """Size this process's Rust thread pools (``tokenizers`` training) to the build's workers, at most the
    cores here, unless the user set ``RAYON_NUM_THREADS``. Takes effect when the pool starts (its first use in
    the process), which for a build's flow process is tokenizer training."""
    if _USER_RAYON is None:
        os.environ["RAYON_NUM_THREADS"] = str(max(1, min(workers, default_workers())))


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``); False where there is none.

    Tokenizer training in the flow's process allocates for its whole sample (hundreds of MB) and frees it all,
    but glibc keeps the freed pages; the shard step's allocations then come on top of them. Trimming after
    training keeps the process's peak at the training peak, which the training sample's size bounds."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    trim(0)
    return True


def with_task_runner(flow: Any, spec: str = "local", workers: int | None = None) -> Any:
    return flow.with_options(task_runner=make_task_runner(spec, workers))


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """The Prefect API for a flow and all its workers: the configured one, else one local server started here.

    Without this, Prefect starts a temporary server lazily in each process that needs a client, so every
    worker process would run (and pay for) a server of its own and the UI would see none of their task runs.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = PREFECT_API_URL.value()
    if url:
        yield url
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's own client would start: one per process
    server.start()
    with temporary_settings({PREFECT_API_URL: server.api_url}):
        yield server.api_url


def worker_count() -> int:
    """Workers of the running flow's task runner (a Dask cluster's live workers, a thread pool's size)."""
    from prefect.context import FlowRunContext
    from prefect_dask import DaskTaskRunner

    ctx = FlowRunContext.get()
    runner = ctx.task_runner if ctx else None
    if isinstance(runner, DaskTaskRunner):  # the client starts the cluster (the first task would anyway)
        return max(1, len(runner.client.scheduler_info(n_workers=-1)["workers"]))
    return max(1, int(getattr(runner, "_max_workers", None) or 1))
