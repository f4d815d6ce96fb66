"""The passes of ``build_corpus``: chunk tasks over parts dealt round-robin (``chunks``) or one global task, each
timed for the build profile; every part's unit results collected by step name, in part order (``flows/build/flow.py``
and ``flows/build/decontam.py`` both run their steps through it)."""

from __future__ import annotations

from typing import Any

from prefect import unmapped
from prefect.futures import as_completed

from flows.build.context import build_context
from flows.build.plan import chunks, unchunk
from flows.runtime.profile import BuildProfile
from flows.ui.progress import stage_progress
from pipeline.units import StageStats, mark_stage_success


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
        """Count, per step, the units restored from earlier builds (rebuilds report it in the summary)."""
        for step in steps:
            units = self.units[step]
            self.reuse[step] = [sum(bool(u.get("reused")) for u in units), len(units)]
