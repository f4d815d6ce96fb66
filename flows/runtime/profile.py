"""Where a build's time goes: CPU and wall per step, task runs and peak memory per worker process.

Every unit of work (a per-part step inside a task, or a global step) is timed where it runs with
:func:`measure`, which returns a small JSON record: the step, its CPU seconds (the whole process, so encoder
threads count), its wall seconds, the process id and the process's peak RSS so far. Per-part tasks return
their records with their results; global steps, which run in the flow's own process, leave theirs in
:data:`LOCAL_RECORDS`. The flow folds both into :class:`BuildProfile`, whose JSON goes into the build summary
(``summary["profile"]``): what ``tests/bench/bench_scale.py`` reads to separate stage work from orchestration.
``profile["storage"]`` counts the build's S3 calls over every process: attempts, retries by reason and
give-ups (``pipeline.storage.retry.STATS``, per process: worker processes report theirs with each unit, and a
local worker those its task body made outside a unit with the body's result; ``pileworks build`` counts from
its start, so its listing and lease before the flow are in). Not counted: what the flow does after it wrote the
profile (its artifacts read the manifest, card and a cluster sample; the published record; the lease released:
six calls for the test corpus), and the calls a Dask or Ray worker makes outside a step.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeline.storage.retry import STATS

LOCAL_RECORDS: list[dict[str, Any]] = []

# S3 counters beside the steps'. A worker process reports the calls its steps made in their records, and the
# calls a task body made outside any step (reading its context, done markers, stats) with its result
# (``flows/runtime/pool.py``): this process adds those to WORKERS_UNMEASURED. MEASURED counts this process's
# calls inside steps, for a worker to tell the two apart. COMMAND_STORAGE0: this process's counters when
# ``pileworks build`` started (the listing and lease it does before the flow are the build's calls too).
_LOCK = threading.Lock()
MEASURED: dict[str, int] = {}
WORKERS_UNMEASURED: dict[str, int] = {}
COMMAND_STORAGE0: dict[str, int] | None = None


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6


@contextlib.contextmanager
def measure(step: str, sink: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    """Time the block; the yielded record is filled in on exit and appended to ``sink`` (default: local).

    A block that runs part of its work in a child process puts the child's CPU seconds and S3 counters in the
    record as ``child_cpu_s`` and ``child_storage``: they are added to the step's (stage work wherever it ran);
    ``child_storage`` stays in the record, as the calls of a process other than this one.
    """
    record: dict[str, Any] = {"step": step}
    cpu0, wall0, storage0 = time.process_time(), time.perf_counter(), STATS.snapshot()
    try:
        yield record
    finally:
        child_cpu = record.pop("child_cpu_s", 0.0)
        child_storage = record.get("child_storage", {})
        record.update(
            cpu_s=round(time.process_time() - cpu0 + child_cpu, 4),
            wall_s=round(time.perf_counter() - wall0, 4),
            pid=os.getpid(),
            rss_mb=round(peak_rss_mb(), 1),
        )
        storage = counter_delta(storage0, STATS.snapshot())
        with _LOCK:
            add_counts(MEASURED, storage)  # this process's own calls (a child's are in its own counters)
        add_counts(storage, child_storage)
        if storage:
            record["storage"] = storage  # S3 calls, retries by reason, give-ups made in the block
        (LOCAL_RECORDS if sink is None else sink).append(record)


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def add_counts(total: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        total[k] = total.get(k, 0) + v


def counters(counts: dict[str, int]) -> dict[str, int]:
    """A copy of ``counts`` (:data:`MEASURED` or :data:`WORKERS_UNMEASURED`), taken under their lock."""
    with _LOCK:
        return dict(counts)


def unmeasured_since(storage0: dict[str, int], measured0: dict[str, int]) -> dict[str, int]:
    """This process's S3 calls since ``storage0`` (:data:`STATS`) that no step measured since ``measured0``."""
    return counter_delta(
        counter_delta(measured0, counters(MEASURED)), counter_delta(storage0, STATS.snapshot())
    )


def add_worker_unmeasured(counts: dict[str, int]) -> None:
    """A worker process's calls outside its steps (:func:`unmeasured_since` there), into this process's count."""
    with _LOCK:
        add_counts(WORKERS_UNMEASURED, counts)


def command_storage0() -> dict[str, int]:
    """Where a build's count of this process's S3 calls starts: when ``pileworks build`` started, if it runs
    this build, else now."""
    return dict(COMMAND_STORAGE0) if COMMAND_STORAGE0 is not None else STATS.snapshot()


def drain_local() -> list[dict[str, Any]]:
    out = list(LOCAL_RECORDS)
    LOCAL_RECORDS.clear()
    return out


@dataclass
class BuildProfile:
    """Per step: CPU, wall summed over units, unit count and the largest process peak RSS seen; per pass (a fan
    out or a global step, as the flow runs them): its wall window and task-run count."""

    steps: dict[str, dict[str, float]] = field(default_factory=dict)
    passes: list[dict[str, Any]] = field(default_factory=list)
    processes: dict[int, float] = field(default_factory=dict)
    # S3 calls made by units in worker processes (the flow's own process is counted whole, at the end).
    worker_storage: dict[str, int] = field(default_factory=dict)
    flow_pid: int = field(default_factory=os.getpid)
    flow_storage0: dict[str, int] = field(default_factory=command_storage0)
    # and those the worker processes' task bodies made outside their steps
    workers_unmeasured0: dict[str, int] = field(default_factory=lambda: counters(WORKERS_UNMEASURED))
    flow_cpu0: float = field(
        default_factory=time.process_time
    )  # after start-up: the flow's own CPU from here

    def add_records(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            s = self.steps.setdefault(r["step"], {"cpu_s": 0.0, "wall_s": 0.0, "units": 0, "rss_mb": 0.0})
            s["cpu_s"] += r["cpu_s"]
            s["wall_s"] += r["wall_s"]
            s["units"] += 1
            s["rss_mb"] = max(s["rss_mb"], r["rss_mb"])
            if calls := r.get("storage", {}).get("attempts"):  # S3 calls of the step, wherever it ran
                s["s3_calls"] = s.get("s3_calls", 0) + calls
            self.processes[r["pid"]] = max(self.processes.get(r["pid"], 0.0), r["rss_mb"])
            if r["pid"] != self.flow_pid:  # in-process units are inside the flow process's own count
                add_counts(self.worker_storage, r.get("storage", {}))
            else:  # but not their child processes' calls
                add_counts(self.worker_storage, r.get("child_storage", {}))

    def storage(self) -> dict[str, int]:
        """The build's S3 calls, retries (by reason) and give-ups, over every process (all zero on a local store)."""
        total = counter_delta(self.flow_storage0, STATS.snapshot())
        add_counts(total, self.worker_storage)
        add_counts(total, counter_delta(self.workers_unmeasured0, counters(WORKERS_UNMEASURED)))
        return dict(sorted(total.items()))

    @contextlib.contextmanager
    def run_pass(self, name: str) -> Iterator[dict[str, Any]]:
        """A pass of the flow: the yielded dict takes ``task_runs``; local records made meanwhile are added."""
        entry: dict[str, Any] = {"name": name, "start": time.time(), "task_runs": 1, "work_cpu_s": 0.0}
        calls0 = STATS.snapshot().get("attempts", 0)
        try:
            yield entry
        finally:
            entry["end"] = time.time()
            # S3 calls this process made during the pass (the flow's own, unless tasks run in its threads)
            entry["flow_s3_calls"] = STATS.snapshot().get("attempts", 0) - calls0
            self.passes.append(entry)
            self._add(entry, drain_local())

    def add_results(self, entry: dict[str, Any], results: list[dict[str, Any]], task_runs: int) -> None:
        """Fold a fan-out's unit results (their profile records) in and count its task runs."""
        entry["task_runs"] = task_runs
        for r in results:
            self._add(entry, r.get("profile", []))

    def _add(self, entry: dict[str, Any], records: list[dict[str, Any]]) -> None:
        self.add_records(records)
        entry["work_cpu_s"] = round(entry["work_cpu_s"] + sum(r["cpu_s"] for r in records), 4)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": {k: {m: round(v, 4) for m, v in s.items()} for k, s in self.steps.items()},
            "passes": self.passes,
            "task_runs": sum(p["task_runs"] for p in self.passes),
            "work_cpu_s": round(sum(s["cpu_s"] for s in self.steps.values()), 3),
            "process_peak_rss_mb": {str(k): v for k, v in self.processes.items()},
            "storage": self.storage(),
            # the flow's own process alone: what a head node would call (the rest is the workers')
            "flow_storage": counter_delta(self.flow_storage0, STATS.snapshot()),
            "flow_cpu_s": round(time.process_time() - self.flow_cpu0, 3),
        }
