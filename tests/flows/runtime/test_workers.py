"""The local workers start at the first task, never for a flow that submits none, and no more than its chunks."""

from __future__ import annotations

import os
import pickle

import psutil
import pytest

from flows.runtime.runners import make_task_runner, quiet_dask
from flows.runtime.workers import LocalWorkers


def test_the_pool_is_sized_by_the_work_and_keeps_its_settings_across_copies() -> None:
    runner = make_task_runner("local", 4)
    assert isinstance(runner, LocalWorkers) and runner.size == 4
    assert runner.fit(2) == 2 and runner.cluster_kwargs["n_workers"] == 2  # two chunks: two workers, not four
    assert runner.fit(9) == 4  # never more than asked for
    assert runner.cluster_kwargs["env"]["PILEWORKS_THREADS"] == "1"
    copy = runner.duplicate()  # what Prefect enters for each flow run
    assert (copy.workers, copy.env, copy.configure) == (4, runner.env, quiet_dask)
    shipped = pickle.loads(pickle.dumps(runner))  # the flow context ships it with every task
    assert (shipped.size, shipped.started_workers, shipped.pool) == (4, 0, None)
    with pytest.raises(ValueError, match="--workers"):
        make_task_runner("local", 0)


def test_a_flow_that_submits_nothing_starts_no_process_nor_dask() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    runner = make_task_runner("local", 2).duplicate()
    with runner:
        pass
    assert runner.started_workers == 0 and runner.pool is None
    assert {p.pid for p in me.children(recursive=True)} <= before


def test_one_worker_is_a_thread_of_this_process_with_the_workers_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of one starts no process (no Dask, no second Prefect): its tasks run on a thread here, with the
    workers' one-thread env while it runs (a name the user set is kept), gone after."""
    monkeypatch.delenv("PILEWORKS_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    runner = make_task_runner("local", 4).duplicate()
    runner.fit(1)
    with runner:
        pool = runner.runner()
        assert (runner.in_process, runner.started_workers) == (1, 0)
        assert type(pool).__name__ == "ThreadPoolTaskRunner"
        assert os.environ["PILEWORKS_THREADS"] == "1" and os.environ["OMP_NUM_THREADS"] == "3"
        assert {p.pid for p in me.children(recursive=True)} <= before
    assert "PILEWORKS_THREADS" not in os.environ and os.environ["OMP_NUM_THREADS"] == "3"
    assert runner.pool is None
