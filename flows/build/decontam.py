"""The decontamination step of ``build_corpus`` (after dedup, before tokenize; skipped without eval sets).

One task builds the n-gram index of every evaluation set once; chunk tasks stream runs of the deduplicated
parts against it (each part its own cached unit); a last task merges the parts' matched n-grams into
``decontam/report.json``.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.build import steps
from flows.build.context import IO_RETRIES, build_context
from flows.build.passes import Passes
from flows.runtime.workers import hand_over
from flows.ui import run_names
from pipeline.corpus_config import CorpusConfig
from pipeline.units.protocol import StageStats


@task(name="decontam-index", task_run_name="decontam: index", cache_policy=NO_CACHE, **IO_RETRIES)
def decontam_index_task(ctx: dict[str, Any]) -> str:
    return hand_over(steps.decontam_index, ctx)


@task(name="decontam", task_run_name=run_names.parts("decontam"), cache_policy=NO_CACHE)
def decontam_chunk_task(
    ctx: dict[str, Any], indices: list[int], in_folder: str, upstream: list[str], index_key: str
) -> list[dict[str, Any]]:
    return hand_over(steps.decontam_chunk, ctx, indices, in_folder, upstream, index_key)


@task(name="decontam-report", task_run_name="decontam: report", cache_policy=NO_CACHE)
def decontam_report_task(ctx: dict[str, Any], num_parts: int, index_key: str, _wait: list[Any]) -> str:
    return hand_over(steps.decontam_report, ctx, num_parts, index_key, _wait)


def run_decontam(
    run: Passes, cfg: CorpusConfig, folder: str, step: str, stats: dict[str, StageStats]
) -> tuple[str, str]:
    """Decontaminate the parts in ``folder`` (named by ``step``'s unit keys); returns the folder tokenize reads
    next and the step whose keys name its parts."""
    if not cfg.decontam.enabled:
        return folder, step
    index_key = run.once("decontam-index", decontam_index_task, run.ctx)
    chunked = run.index_chunks()
    run.fan_out(
        "decontam",
        decontam_chunk_task,
        chunked,
        [folder] * len(chunked),
        run.keyed(step),
        index_key=index_key,
    )
    run.note_reuse("decontam")
    total = run.merged("decontam")
    total.extra["report_key"] = run.once(
        "decontam-report", decontam_report_task, run.ctx, run.n, index_key, []
    )
    stats["decontam"] = total
    return build_context(run.ctx).folder("decontam/out"), "decontam"
