"""The build profile: CPU per step, task runs per pass, and S3 call counts over every process."""

from __future__ import annotations

import os

from flows.runtime import profile
from flows.runtime.profile import BuildProfile
from pipeline.storage.retry import STATS


def test_measure_records_the_storage_calls_made_inside_the_block() -> None:
    sink: list[dict] = []
    with profile.measure("clean", sink):
        STATS.record()
        STATS.record(retry_reason="throttled")
        STATS.record()
    with profile.measure("tokenize", sink):
        pass
    assert sink[0]["step"] == "clean" and sink[0]["pid"] == os.getpid()
    assert sink[0]["storage"] == {"attempts": 2, "retries": 1, "retries_throttled": 1}
    assert "storage" not in sink[1]  # no S3 call, no entry


def test_storage_counts_worker_units_once_and_the_flow_process_whole() -> None:
    prof = BuildProfile()
    with prof.run_pass("ingest") as entry:
        in_process: list[dict] = []
        with profile.measure("ingest", in_process):
            STATS.record()  # a unit run in the flow's own process (threads runner): in the process's count
        worker = {
            "step": "ingest",
            "cpu_s": 1.0,
            "wall_s": 1.0,
            "pid": os.getpid() + 1,
            "rss_mb": 10.0,
            "storage": {"attempts": 5, "retries": 2, "retries_throttled": 2},
        }
        prof.add_results(entry, [{"profile": in_process}, {"profile": [worker]}], task_runs=2)
    STATS.record(gave_up=True)  # the flow process's own call outside any unit (publish, listing)
    storage = prof.to_json()["storage"]
    assert storage == {"attempts": 6, "gave_up": 1, "retries": 2, "retries_throttled": 2}
    assert prof.to_json()["task_runs"] == 2 and prof.steps["ingest"]["units"] == 2
    assert (
        prof.to_json()["steps"]["ingest"]["s3_calls"] == 6
    )  # per step: the in-process unit's and the worker's


def test_a_child_process_s_cpu_and_s3_calls_count_as_the_step_s_not_the_flow_s() -> None:
    records: list[dict] = []
    with profile.measure("train-tokenizer", records) as record:
        record["child_cpu_s"], record["child_storage"] = 2.5, {"attempts": 3}
    assert records[0]["cpu_s"] >= 2.5 and records[0]["storage"]["attempts"] >= 3
    prof = BuildProfile()  # the step ran in this (the flow's) process, its child's calls are not the flow's
    prof.add_records(records)
    assert prof.steps["train-tokenizer"]["cpu_s"] >= 2.5 and prof.worker_storage == {"attempts": 3}
