"""The passes of ``build_corpus``: chunk tasks over parts dealt round-robin (``chunks``) or one global task, each
timed for the build profile; every part's unit results collected by step name, in part order (``flows/build/flow.py``
and ``flows/build/decontam.py`` both run their steps through it)."""

from __future__ import annotations

import importlib
from typing import Any

from prefect import task, unmapped
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed

from flows.build.context import build_context
from flows.build.plan import chunks, unchunk
from flows.runtime import profile
from flows.runtime.profile import BuildProfile
from flows.ui.progress import stage_progress
from pipeline.units.protocol import StageStats, mark_stage_success


class Passes:
    """Runs the flow's passes: a chunk task per run of ``size`` parts (``fan_out``) or one global task (``once``),
    timing each for the build profile and collecting every part's unit results by step name, in part order."""

    def __init__(
        self,
        ctx: dict[str, Any],
        num_parts: int,
        size: int,
        light_size: int | None = None,
        profile: BuildProfile | None = None,
    ) -> None:
        # ``size``: parts per task of the heavy passes (several tasks per worker, so none idles at the end);
        # ``light_size``: of the cheap ones (LSH bands and edges, the near filter), one task per worker, as
        # each task run costs about 0.1-0.2 s of CPU in Prefect and Dask whatever it does.
        self.ctx, self.n, self.size, self.light_size = ctx, num_parts, size, light_size or size
        self.profile = profile or BuildProfile()  # the flow's, when it timed passes before this (planning)
        self.units: dict[str, list[dict[str, Any]]] = {}
        self.reuse: dict[str, list[int]] = {}
        # per step, the parts whose unit this run computed: one done by an earlier run of the steps (after a unit
        # read as damaged, flows/build/flow.py) is found done by the next, and was not reused
        self.computed: dict[str, set[int]] = {}

    def index_chunks(self, count: int | None = None, light: bool = False) -> list[list[int]]:
        return chunks(
            list(range(self.n if count is None else count)), self.light_size if light else self.size
        )

    def fan_out(self, name: str, task: Any, *mapped: list[Any], **fixed: Any) -> list[dict[str, Any]]:
        with self.profile.run_pass(name) as entry:
            args = [unmapped(self.ctx), *mapped, *(unmapped(v) for v in fixed.values())]
            futures = task.map(*args)
            for done in as_completed(futures):  # the terminal's bars move as chunks finish
                for units in done.result():
                    for step in units:
                        stage_progress.advance(step)
            results = unchunk(futures.result())  # every part's result, in part order
            self.profile.add_results(
                entry, [u for r in results for u in r.values()], task_runs=len(mapped[0])
            )
        for step in results[0] if results else ():
            self.units[step] = [r[step] for r in results]
        return results

    def spread(self, name: str, task: Any, *mapped: list[Any], **fixed: Any) -> list[dict[str, Any]]:
        """A task per item of ``mapped`` (not per part: the shard windows); their results, in order."""
        with self.profile.run_pass(name) as entry:
            futures = task.map(unmapped(self.ctx), *mapped, *(unmapped(v) for v in fixed.values()))
            results = futures.result()
            self.profile.add_results(entry, results, task_runs=len(mapped[0]))
        return results

    def once(self, name: str, task: Any, *args: Any) -> Any:
        with self.profile.run_pass(name):
            return task(*args)

    def on_worker(self, name: str, target: Any, *args: Any) -> Any:
        """A global step (``target``: a task of ``flows/build/tasks.py``) as one task on a worker, not in the flow's
        process: what grows with the corpus (every part's counts, hashes, edges, drop lists) is read and written
        there, and the flow only gets the step's small summary back. Its profile records come back with it,
        from a remote worker too (where :func:`flows.runtime.workers.hand_over` runs the body in-line)."""
        with self.profile.run_pass(name) as entry:
            out = global_step_task.with_options(task_run_name=target.task_run_name or target.name).submit(
                f"{target.fn.__module__}:{target.fn.__name__}", list(args)
            )
            done = out.result()
            self.profile.add_results(entry, [done], task_runs=1)
            entry["pids"] = sorted({r["pid"] for r in done["profile"]})  # where it ran
        return done["result"]

    def mark_done(self, folder: str, step: str) -> None:
        """``_SUCCESS`` in ``folder``, whose parts ``step``'s units wrote: when every part's unit came back, the
        parts are not looked up again (one call each on S3)."""
        checked = len(self.units.get(step, [])) == self.n
        mark_stage_success(build_context(self.ctx).store(), folder, self.n, checked=checked)

    def keyed(self, step: str, light: bool = False) -> list[list[str]]:
        """The unit keys of ``step``, one list per chunk (the next pass's upstream keys)."""
        return chunks([u["key"] for u in self.units[step]], self.light_size if light else self.size)

    def merged(self, step: str, stage: str | None = None) -> StageStats:
        total = StageStats(stage=stage or step)
        for u in self.units[step]:
            total.merge(StageStats.from_json(u["stats"]))
        return total

    def note_reuse(self, *steps: str) -> None:
        """Count, per step, the units this run did not compute: restored from earlier builds or done by an earlier
        run of this work folder, and found intact (rebuilds report it in the summary)."""
        for step in steps:
            units = self.units[step]
            computed = self.computed.setdefault(step, set())
            computed.update(i for i, u in enumerate(units) if not u.get("reused"))
            self.reuse[step] = [len(units) - len(computed), len(units)]


@task(name="global-step", cache_policy=NO_CACHE)
def global_step_task(target: str, args: list[Any]) -> dict[str, Any]:
    """Run the global step ``module:task`` (by name, so only a string crosses to the worker) where its task's body
    goes (a local worker process, or here on a remote worker); return its result and the profile records it left
    in this process, a local worker's brought back here (one global step runs at a time)."""
    module, name = target.split(":")
    step = getattr(importlib.import_module(module), name)
    start = len(profile.LOCAL_RECORDS)  # in a thread of the flow's process, earlier records are the flow's
    result = step.fn(*args)
    records = profile.LOCAL_RECORDS[start:]
    del profile.LOCAL_RECORDS[start:]
    return {"result": result, "profile": records}
