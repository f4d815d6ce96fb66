"""The decontamination step of ``build_corpus`` (after dedup, before tokenize; skipped without eval sets).

One task builds the n-gram index of every evaluation set once; chunk tasks stream runs of the deduplicated
parts against it (each part its own cached unit); a last task merges the parts' matched n-grams into
``decontam/report.json``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.build.context import IO_RETRIES, build_context, stage_errors
from flows.build.passes import Passes
from flows.build.tasks import one_step_chunk
from flows.runtime import profile
from flows.ui import run_names
from pipeline import decontam, unitcache
from pipeline.corpus_config import CorpusConfig
from pipeline.units import StageStats, mark_stage_success


@task(name="decontam-index", task_run_name="decontam: index", cache_policy=NO_CACHE, **IO_RETRIES)
def decontam_index_task(ctx: dict[str, Any]) -> str:
    with stage_errors("decontam-index"), profile.measure("decontam-index"):
        c = build_context(ctx)
        key = c.folder("decontam/index.npz")
        index = decontam.build_eval_index(c.store(), key, c.cfg.decontam, s3=c.cfg.s3)
        get_run_logger().info("decontam: %d n-grams of %s", len(index.hashes), index.texts)
        return key


@task(name="decontam", task_run_name=run_names.parts("decontam"), cache_policy=NO_CACHE)
def decontam_chunk_task(
    ctx: dict[str, Any], indices: list[int], in_folder: str, upstream: list[str], index_key: str
) -> list[dict[str, Any]]:
    c = build_context(ctx)
    store = c.store()
    index_hash = unitcache.content_hash(store, index_key)
    return one_step_chunk(
        c,
        store,
        "decontam",
        "decontam",
        indices,
        upstream,
        c.folder("decontam/out"),
        partial(
            decontam.run_decontam_part,
            in_folder=in_folder,
            out_folder=c.folder("decontam/out"),
            index_key=index_key,
            cfg=c.cfg.decontam,
        ),
        lambda store, index: index_hash,
    )


@task(name="decontam-report", task_run_name="decontam: report", cache_policy=NO_CACHE)
def decontam_report_task(ctx: dict[str, Any], num_parts: int, index_key: str, _wait: list[Any]) -> str:
    with stage_errors("decontam-report"), profile.measure("decontam-report"):
        c = build_context(ctx)
        key = c.folder("decontam/report.json")
        decontam.merge_reports(c.store(), c.folder("decontam/out"), num_parts, index_key, key)
        mark_stage_success(c.store(), c.folder("decontam/out"), num_parts)
        return key


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
