"""Scale-out must not change the result, and every worker reports to the flow's own Prefect API.

The tiny corpus is built with 1 worker (a thread of the flow's process), with 2 worker processes, and on an external
2-worker Dask scheduler that the test starts on 127.0.0.1 (``dask://host:port``), each into its own store (so no
unit is reused): same dataset id, shard for shard. Task runs are recorded by the test's one Prefect server.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.prefect_runs import settled_task_runs
from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def build(spec: str, workers: int | None, inputs: list[str], output: Path) -> dict[str, Any]:
    from flows.build.flow import build_corpus
    from flows.runtime.runners import with_task_runner

    return with_task_runner(build_corpus, spec, workers)(
        inputs=inputs, output=str(output), overrides=dict(TINY_OVERRIDES)
    )


def worker_pids(summary: dict[str, Any]) -> set[int]:
    return {int(p) for p in summary["profile"]["process_peak_rss_mb"]}


def test_runner_choice_and_sizes() -> None:
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    from flows.runtime.runners import default_workers, make_task_runner
    from flows.runtime.workers import LocalWorkers

    local = make_task_runner("local", 3)
    assert isinstance(local, LocalWorkers) and local.size == 3
    assert make_task_runner().size == default_workers()
    # ``dask``: a Dask LocalCluster on this machine, as a remote cluster would run the build
    dask = make_task_runner("dask", 2)
    assert isinstance(dask, DaskTaskRunner) and dask.cluster_kwargs["n_workers"] == 2
    assert make_task_runner("dask://127.0.0.1:8786").address == "tcp://127.0.0.1:8786"
    assert isinstance(make_task_runner("threads", 2), ThreadPoolTaskRunner)
    with pytest.raises(ValueError, match="--workers"):
        make_task_runner("local", 0)
    with pytest.raises(ValueError, match="--task-runner"):
        make_task_runner("spark")


def test_a_flow_run_of_ours_has_no_prefect_heartbeat_unless_the_user_sets_one(prefect_harness) -> None:
    """Prefect's flow-run heartbeat thread sleeps in one-second steps and each run's end waits for it: our flows
    run without it (``pileworks reap`` reads our own heartbeat), and a frequency the user set is kept."""
    from prefect import flow
    from prefect.settings import get_current_settings, temporary_settings

    from flows.runtime.runners import prefect_api

    @flow
    def beats() -> int | None:  # what Prefect's flow engine reads to start its heartbeat thread, or not
        return get_current_settings().flows.heartbeat_frequency

    assert beats() == 180  # Prefect's default, outside our commands' flow runs
    with prefect_api():
        assert beats() is None
    with temporary_settings(updates={"flows.heartbeat_frequency": 45}), prefect_api():
        assert beats() == 45  # the user's choice


def test_one_worker_two_workers_and_an_external_scheduler_publish_the_same_dataset(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed import LocalCluster
    from prefect import get_client

    monkeypatch.setenv(
        "PILEWORKS_MIN_TASK_BYTES", "1"
    )  # the tiny corpus's parts dealt to 2 workers, not one task

    inputs = write_tiny_corpus(tmp_path / "raw")
    one = build("local", 1, inputs, tmp_path / "store-1")
    two = build("local", 2, inputs, tmp_path / "store-2")
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        port = cluster.scheduler_address.rsplit(":", 1)[1]
        ext = build(f"dask://127.0.0.1:{port}", None, inputs, tmp_path / "store-ext")
        external_workers = {w.pid for w in cluster.scheduler.workers.values()}

    assert one["dataset_id"] == two["dataset_id"] == ext["dataset_id"]
    assert one["shard_table"] == two["shard_table"] == ext["shard_table"]
    assert one["stages"] == two["stages"] == ext["stages"]
    # Not a vacuous equality: the build did real work, including both dedup steps.
    assert one["exact_duplicates"] == 1 and one["near_duplicates"] == 1
    assert sum(one["tokens"].values()) > 1000 and one["shards"]["train"] >= 2

    # The per-part work ran in the flow's process with one worker, else in worker processes: 2, then the
    # external ones.
    me = os.getpid()
    assert worker_pids(one) == {me} and one["profile"]["workers_in_process"] == 1
    assert len(worker_pids(two) - {me}) == 2
    assert worker_pids(ext) - {me} <= external_workers and len(worker_pids(ext) - {me}) >= 1
    # The global steps that grow with the corpus ran on the workers too, the flow only adding up their summaries;
    # the boilerplate merge and the exact resolve as a task per range of the hashes (one per worker), the exact
    # drop lists by runs of parts.
    # (One worker is a thread of the flow's process: there they ran in that thread.)
    for summary, flow_pid_allowed in ((one, True), (two, False), (ext, False)):
        on_worker = {p["name"]: p for p in summary["profile"]["passes"] if "pids" in p}
        assert {"near-plan", "near-clusters", "train-tokenizer", "dedup-index-meta"} <= set(on_worker)
        if flow_pid_allowed:
            assert all(set(p["pids"]) == {me} for p in on_worker.values()), on_worker
        else:
            assert all(p["pids"] and me not in p["pids"] for p in on_worker.values()), on_worker
    runs = [{p["name"]: p["task_runs"] for p in s["profile"]["passes"]} for s in (one, two)]
    assert [r["exact-resolve"] for r in runs] == [1, 2] and [r["exact-drop-lists"] for r in runs] == [1, 2]
    assert [r["boilerplate-merge"] for r in runs] == [1, 2]
    # the tokenizer's words counted per part on the workers (tasks of runs of parts), merged by its training
    assert runs[0]["word-count"] >= 1 and runs[1]["word-count"] >= 2
    # Shards are written, then copied under the dataset's prefix, by several tasks (runs of shards) on the
    # workers; the shard tables above show the same bytes (sha256) however many wrote them.
    passes = {p["name"]: p for p in two["profile"]["passes"]}
    assert passes["write-shards"]["task_runs"] >= 2 and passes["publish-shards"]["task_runs"] >= 2
    assert two["profile"]["steps"]["write-shards"]["units"] == passes["write-shards"]["task_runs"]
    assert {p["name"]: p for p in one["profile"]["passes"]}["write-shards"]["task_runs"] == 1
    # The dedup index is saved part by part on the workers too, then its index.json in the flow's process;
    # every build saves the same index.
    assert passes["save-dedup-index"]["task_runs"] >= 2
    assert {p["name"]: p for p in one["profile"]["passes"]}["save-dedup-index"]["task_runs"] == 1
    assert two["profile"]["steps"]["save-dedup-index"]["units"] == passes["save-dedup-index"]["task_runs"] + 1
    metas = [
        json.loads(Path(s["dedup_index_uri"].removeprefix("file://"), "index.json").read_text())
        for s in (one, two, ext)
    ]
    assert metas[0] == metas[1] == metas[2] and metas[0]["docs"] > 0
    # Listing the inputs is stage work too, timed in the flow's process.
    assert one["profile"]["steps"]["plan-inputs"]["units"] == 1
    assert one["profile"]["passes"][0]["name"] == "plan-inputs"

    # ... and they reported their task runs to this test's Prefect server (no server of their own).
    with get_client(sync_client=True) as client:
        for summary in (one, two, ext):
            run_id = summary["lineage"]["prefect_flow_run_id"]
            runs = settled_task_runs(client, run_id, summary["profile"]["task_runs"])
            assert len(runs) == summary["profile"]["task_runs"] > 0
            assert all(r.state is not None and r.state.is_completed() for r in runs)


def _thread_env() -> tuple[str | None, str | None]:
    return os.environ.get("PILEWORKS_THREADS"), os.environ.get("RAYON_NUM_THREADS")


def _background(dask_worker: Any) -> dict[str, Any]:
    import dask

    return {"profile": dask.config.get("distributed.worker.profile.enabled")}


def test_n_workers_use_n_cores_one_thread_per_worker_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker process of ``--task-runner dask`` encodes with one thread (N workers = N cores, no
    oversubscription); tokenizer training gets the workers' count, capped at the cores here."""
    from distributed import Client, LocalCluster

    from flows.runtime import runners
    from pipeline.tokenize.stage import TokenizeConfig, encoder_threads

    runners.quiet_dask()  # what the local workers apply when they start
    with (
        LocalCluster(**runners.local_cluster_kwargs(2)) as cluster,
        Client(cluster) as client,
    ):
        seen = client.run(_thread_env)
        background = client.run(_background)
        scheduler_loops = set(cluster.scheduler.periodic_callbacks)
    assert len(seen) == 2 and set(seen.values()) == {("1", "1")}
    # the local cluster's background loops are quieter through Dask's public config only: no statistical
    # profiler, no active memory manager
    assert len(background) == 2 and not any(b["profile"] for b in background.values())
    assert not any(name.startswith("amm") for name in scheduler_loops)

    monkeypatch.setenv("PILEWORKS_THREADS", "1")
    assert encoder_threads(TokenizeConfig()) == 1 and encoder_threads(TokenizeConfig(num_threads=3)) == 3
    monkeypatch.delenv("PILEWORKS_THREADS")
    assert encoder_threads(TokenizeConfig()) == (os.cpu_count() or 1)

    monkeypatch.setattr(runners, "_USER_RAYON", None)
    assert runners.training_threads() == runners.default_workers()  # outside a flow: this machine's cores
    monkeypatch.setattr(runners, "_USER_RAYON", "3")  # the user's own setting wins
    assert runners.training_threads() == 3
