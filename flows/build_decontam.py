"""The decontamination step of ``build_corpus`` (after dedup, before tokenize; skipped without eval sets).

One task builds the n-gram index of every evaluation set once; per-part tasks stream the deduplicated
parts against it; a last task merges the parts' matched n-grams into ``decontam/report.json``.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task, unmapped
from prefect.cache_policies import NO_CACHE

from flows import unitcache
from flows.build_tasks import IO_RETRIES, _ctx, _unit, stage_errors
from flows.corpus_config import CorpusConfig
from pipeline import decontam
from pipeline.units import StageStats, mark_stage_success


@task(name="decontam-index", cache_policy=NO_CACHE, **IO_RETRIES)
def decontam_index_task(ctx: dict[str, Any]) -> str:
    with stage_errors("decontam-index"):
        c = _ctx(ctx)
        key = c.folder("decontam/index.npz")
        index = decontam.build_eval_index(c.store(), key, c.cfg.decontam, s3=c.cfg.s3)
        get_run_logger().info("decontam: %d n-grams of %s", len(index.hashes), index.texts)
        return key


@task(name="decontam", cache_policy=NO_CACHE)
def decontam_task(
    ctx: dict[str, Any], index: int, in_folder: str, upstream: str, index_key: str
) -> dict[str, Any]:
    c = _ctx(ctx)
    key = unitcache.unit_key(
        "decontam", upstream, c.config["decontam"], unitcache.content_hash(c.store(), index_key)
    )
    return _unit(c, "decontam", key, c.folder("decontam/out"), index,
                 lambda st: decontam.run_decontam_part(st, in_folder, c.folder("decontam/out"), index, index_key, c.cfg.decontam))  # fmt: skip


@task(name="decontam-report", cache_policy=NO_CACHE)
def decontam_report_task(ctx: dict[str, Any], num_parts: int, index_key: str, _wait: list[Any]) -> str:
    with stage_errors("decontam-report"):
        c = _ctx(ctx)
        key = c.folder("decontam/report.json")
        decontam.merge_reports(c.store(), c.folder("decontam/out"), num_parts, index_key, key)
        mark_stage_success(c.store(), c.folder("decontam/out"), num_parts)
        return key


def run_decontam(
    ctx: dict[str, Any], cfg: CorpusConfig, n: int, folder: str, keys: list[str], stats: dict[str, StageStats]
) -> tuple[str, list[str]]:
    """Decontaminate the parts in ``folder``; returns the folder and unit keys tokenize reads next."""
    if not cfg.decontam.enabled:
        return folder, keys
    index_key = decontam_index_task(ctx)
    results = decontam_task.map(unmapped(ctx), range(n), unmapped(folder), keys, unmapped(index_key)).result()
    total = StageStats(stage="decontam")
    for r in results:
        total.merge(StageStats.from_json(r["stats"]))
    total.extra["report_key"] = decontam_report_task(ctx, n, index_key, results)
    stats["decontam"] = total
    return _ctx(ctx).folder("decontam/out"), [r["key"] for r in results]
