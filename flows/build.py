"""``build_corpus``: the Prefect flow that turns raw text into a published dataset.

A thin flow over tasks: per-part stages fan out with ``.map``, global steps (boilerplate merge, exact-duplicate
resolution, near-duplicate clustering, tokenizer training, shard planning + publish) are single tasks. Tasks get
small serialisable arguments (a :class:`BuildContext` dict and a part index) and return JSON stats; the data
stays in the store under ``work/<build_key>/``, where every unit writes its outputs, stats and marker, so a rerun
of a failed flow redoes only the units without a marker.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from prefect import flow, get_run_logger, unmapped

from flows import artifacts, run_names, unitcache
from flows.build_decontam import run_decontam
from flows.build_tasks import (
    BuildContext,
    StageFailed,
    _ctx,
    bands_task,
    boilerplate_count_task,
    boilerplate_merge_task,
    clean_task,
    clusters_task,
    edges_task,
    exact_filter_task,
    exact_hash_task,
    exact_resolve_task,
    ingest_task,
    near_filter_task,
    near_plan_task,
    plan_inputs,
    publish_task,
    save_index_task,
    signatures_task,
    tokenize_task,
    tokenizer_task,
)
from flows.corpus_config import CorpusConfig, load_corpus_config
from flows.heartbeat import with_heartbeat
from flows.progress import stage_progress
from pipeline.storage import open_store
from pipeline.storage.s3 import abort_recorded_uploads
from pipeline.storage.uploads import UploadJournal
from pipeline.units import StageStats, mark_stage_success

__all__ = ["BuildContext", "StageFailed", "build_corpus", "build_key"]


# ---------------------------------------------------------------- the flow


def _merge(stage: str, results: list[dict[str, Any]]) -> StageStats:
    total = StageStats(stage=stage)
    for r in results:
        total.merge(StageStats.from_json(r.get("stats", r)))
    return total


def _keys(results: list[dict[str, Any]]) -> list[str]:
    return [r["key"] for r in results]


def _note_reuse(reuse: dict[str, list[int]], stage: str, results: list[dict[str, Any]]) -> None:
    """Count, per stage, the units restored from earlier builds (rebuilds report it in the summary)."""
    reuse[stage] = [sum(bool(r.get("reused")) for r in results), len(results)]


def build_key(cfg: CorpusConfig, inputs: list[dict[str, Any]], plans: list[dict[str, Any]]) -> str:
    """Work folder key: the config fingerprint, every input's fingerprint (size, etag/mtime) and the part plan."""
    h = hashlib.sha256(cfg.fingerprint().encode())
    for i in inputs:
        h.update(json.dumps([i["uri"], i["size"], i["etag"]]).encode())
    h.update(json.dumps(plans, sort_keys=True).encode())
    return h.hexdigest()[:16]


def ingest_keys(cfg: CorpusConfig, plans: list[dict[str, Any]], inputs: list[dict[str, Any]]) -> list[str]:
    """A part's key: its plan plus the fingerprint (size, ETag/mtime) of every object it reads."""
    fp = {i["uri"]: [i["size"], i["etag"]] for i in inputs}
    ing = cfg.to_dict()["ingest"], cfg.to_dict()["sources"]
    return [
        unitcache.unit_key("ingest", p["pieces"], [fp.get(x["uri"]) for x in p["pieces"]], ing) for p in plans
    ]


def run_dedup(
    ctx: dict[str, Any],
    cfg: CorpusConfig,
    n: int,
    keys: list[str],
    stats: dict[str, StageStats],
    reuse: dict[str, list[int]],
) -> tuple[str, list[str]]:
    """Exact then near dedup; returns the folder of the deduplicated parts and their unit keys."""
    c = _ctx(ctx)
    folder = c.folder("clean")
    if cfg.dedup.exact.enabled:
        hashes = exact_hash_task.map(unmapped(ctx), range(n), keys).result()
        resolved = exact_resolve_task(ctx, n, hashes)
        results = exact_filter_task.map(unmapped(ctx), range(n), keys, unmapped(resolved)).result()
        stats["exact_dedup"] = _merge("exact_dedup", results)
        folder, keys = c.folder("exact/out"), _keys(results)
        mark_stage_success(c.store(), folder, n)
    if not cfg.dedup.near.enabled:
        return folder, keys
    sigs = signatures_task.map(unmapped(ctx), range(n), unmapped(folder), keys).result()
    _note_reuse(reuse, "signatures", sigs)
    plan = near_plan_task(ctx, n, sigs)
    bands = bands_task.map(unmapped(ctx), range(n), unmapped(plan)).result()
    if plan["index_parts"]:
        bands += bands_task.map(
            unmapped(ctx), range(plan["index_parts"]), unmapped(plan), from_index=True
        ).result()
    edges = edges_task.map(
        unmapped(ctx), range(plan["num_partitions"]), unmapped(plan), unmapped(bands)
    ).result()
    exact_json = stats["exact_dedup"].to_json() if "exact_dedup" in stats else None
    clusters = clusters_task(ctx, folder, n, exact_json, edges)
    results = near_filter_task.map(
        unmapped(ctx), range(n), unmapped(folder), keys, unmapped(clusters)
    ).result()
    stats["near_dedup"] = _merge("near_dedup", results)
    report_key = c.folder("near/clusters/dedup_report.json")
    report = json.loads(c.store().get_bytes(report_key))
    stats["near_dedup"].extra["report"] = {
        k: v for k, v in report.items() if k not in ("sampled_pairs", "largest_clusters")
    }
    stats["near_dedup"].extra["report_key"] = report_key
    mark_stage_success(c.store(), c.folder("dedup"), n)
    return c.folder("dedup"), _keys(results)


def ingest_and_clean(ctx: dict[str, Any], cfg: CorpusConfig, planned: dict[str, Any], stats: dict[str, StageStats],
                     reuse: dict[str, list[int]]) -> list[str]:  # fmt: skip
    """Ingest every part, count boilerplate lines globally, clean every part; returns the clean unit keys."""
    c, plans, n = _ctx(ctx), planned["plans"], len(planned["plans"])
    results = ingest_task.map(unmapped(ctx), plans, ingest_keys(cfg, plans, planned["inputs"])).result()
    _note_reuse(reuse, "ingest", results)
    stats["ingest"], keys = _merge("ingest", results), _keys(results)
    mark_stage_success(c.store(), c.folder("ingest"), n)
    counts = boilerplate_count_task.map(unmapped(ctx), range(n), keys).result()
    bp_key = boilerplate_merge_task(ctx, n, counts)
    results = clean_task.map(unmapped(ctx), range(n), keys, unmapped(bp_key)).result()
    _note_reuse(reuse, "clean", results)
    stats["clean"] = _merge("clean", results)
    mark_stage_success(c.store(), c.folder("clean"), n)
    return _keys(results)


def tokenize_parts(ctx: dict[str, Any], n: int, folder: str, keys: list[str], stats: dict[str, StageStats],
                   reuse: dict[str, list[int]]) -> tuple[str, list[dict[str, Any]]]:  # fmt: skip
    """Train (or load) the tokenizer, then tokenize every part; returns the tokenizer key and the results."""
    c = _ctx(ctx)
    stage_progress.stage("tokenizer (trained once per dataset name)")
    tok_key = tokenizer_task(ctx, folder, n, [])
    results = tokenize_task.map(unmapped(ctx), range(n), unmapped(folder), keys, unmapped(tok_key)).result()
    mark_stage_success(c.store(), c.folder("tokens"), n)
    stats["tokenize"] = _merge("tokenize", results)
    _note_reuse(reuse, "tokenize", results)
    return tok_key, results


# persist_result=False: a persisted result shows up as an untitled "result" artifact on the run page.
@flow(name="build_corpus", flow_run_name=run_names.build_run_name, log_prints=False, persist_result=False)
@with_heartbeat
def build_corpus(
    config_path: str | None = None,
    inputs: list[str] | None = None,
    output: str | None = None,
    name: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build and publish a dataset; returns the summary (manifest URI, dataset id, per-stage stats)."""
    started = time.perf_counter()
    cfg = load_corpus_config(config_path, inputs=inputs, output=output, name=name, overrides=overrides)
    stage_progress.stage("listing inputs")
    planned = plan_inputs(cfg.to_dict())
    n, store = len(planned["plans"]), open_store(cfg.output, cfg.s3)
    # Uploads still recorded belong to earlier runs that died: abort them now rather than after an hour.
    abort_recorded_uploads(UploadJournal(store), cfg.s3)
    work = f"work/{build_key(cfg, planned['inputs'], planned['plans'])}"
    ctx = BuildContext(store_uri=store.uri, work=work, config=cfg.to_dict(), parts=n).to_json()
    get_run_logger().info("build %s: %d input object(s) in %d part(s); work folder %s",
                          cfg.name, len(planned["inputs"]), n, store.uri_of(work))  # fmt: skip
    stages = build_stages(cfg)  # the terminal's bars and the UI's progress artifact count the same stages
    stage_progress.start_units({s: 1 if s == "publish" else n for s in stages})
    progress = artifacts.RunProgress(stages, key="build-progress")
    stats: dict[str, StageStats] = {}
    reuse: dict[str, list[int]] = {}
    keys = ingest_and_clean(ctx, cfg, planned, stats, reuse)
    progress.finished("ingest", "boilerplate", "clean")
    dedup_folder, keys = run_dedup(ctx, cfg, n, keys, stats, reuse)
    dedup_folder, keys = run_decontam(ctx, cfg, n, dedup_folder, keys, stats)
    progress.finished(*(s for s in stages if s in ("exact dedup", "signatures", "near dedup")))
    tok_key, results = tokenize_parts(ctx, n, dedup_folder, keys, stats, reuse)
    progress.finished("tokenize")
    lineage = {"prefect_flow_run_id": _flow_run_id(), "build_key": work.split("/")[-1]}
    stats_json = {k: v.to_json() for k, v in stats.items()}
    with stage_progress.step("publish"):
        manifest_uri = publish_task(ctx, n, tok_key, planned["inputs"], stats_json, lineage, results)
    progress.finished("publish")
    summary = artifacts.build_summary(manifest_uri, stats, cfg, time.perf_counter() - started)
    summary["reused_units"] = reuse
    if cfg.dedup.near.enabled:
        stage_progress.stage("saving the dedup index")
        summary["dedup_index_uri"] = save_index_task(ctx, n, summary["dataset_id"])
    artifacts.publish_build_artifacts(summary, cfg)
    run_names.rename_flow_run(f"build {cfg.name} {summary['dataset_id'][:8]}")
    get_run_logger().info(
        "published %s (dataset %s) in %.1f s", manifest_uri, summary["dataset_id"], summary["seconds"]
    )
    return summary


def build_stages(cfg: CorpusConfig) -> list[str]:
    """The stages of this build, in order, as the terminal and the UI's progress artifact name them."""
    dedup = ["exact dedup"] * cfg.dedup.exact.enabled + ["signatures", "near dedup"] * cfg.dedup.near.enabled
    return ["ingest", "boilerplate", "clean", *dedup, "tokenize", "publish"]


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    run_id = flow_run.id
    return str(run_id) if run_id else None
