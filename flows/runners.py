"""Task runner choice: local threads (default), a local process pool, or Dask (embedded or a scheduler)."""

from __future__ import annotations

import os
from typing import Any


def make_task_runner(spec: str) -> Any:
    """``local`` | ``process`` | ``dask`` (an embedded LocalCluster) | ``dask://host:port`` / ``tcp://host:port``."""
    from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

    workers = max(1, os.cpu_count() or 1)
    if spec == "local":
        return ThreadPoolTaskRunner(max_workers=workers)
    if spec == "process":
        return ProcessPoolTaskRunner(max_workers=workers)
    if spec == "dask" or spec.startswith(("dask://", "tcp://")):
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as exc:
            raise ValueError("the dask task runner needs `pip install pileworks[dask]`") from exc
        if spec == "dask":
            return DaskTaskRunner(
                cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True}
            )
        return DaskTaskRunner(address="tcp://" + spec.split("://", 1)[1])
    raise ValueError(f"--task-runner must be local, process, dask or dask://host:port; got {spec!r}")


def with_task_runner(flow: Any, spec: str) -> Any:
    return flow.with_options(task_runner=make_task_runner(spec))
