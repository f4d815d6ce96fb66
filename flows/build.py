"""``build_corpus``: the Prefect flow that turns raw text into a published dataset.

A thin flow over tasks: per-part stages fan out with ``.map``, global steps (boilerplate merge, exact-duplicate
resolution, near-duplicate clustering, tokenizer training, shard planning + publish) are single tasks. Tasks get
small serialisable arguments (a :class:`BuildContext` dict and a part index) and return JSON stats; the data
stays in the store under ``work/<build_key>/``, where every unit writes its outputs, stats and marker, so a rerun
of a failed flow redoes only the units without a marker.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.cache_policies import NO_CACHE

from flows import artifacts
from flows.corpus_config import CorpusConfig, config_from_dict, load_corpus_config
from flows.progress import stage_progress
from pipeline import boilerplate, clean, ingest, tokenize
from pipeline.dedup import exact, near
from pipeline.records import StageStats, mark_stage_success
from pipeline.storage import ObjectStore, S3Options, open_store

IO_RETRIES = dict(retries=3, retry_delay_seconds=[2, 10, 30])


@dataclass(frozen=True)
class BuildContext:
    """What every task needs to find its inputs: the store, the work folder and the resolved config."""

    store_uri: str
    work: str
    config: dict[str, Any]

    @property
    def cfg(self) -> CorpusConfig:
        return config_from_dict(self.config)

    def store(self) -> ObjectStore:
        return open_store(self.store_uri, s3=self.cfg.s3)

    def folder(self, name: str) -> str:
        return f"{self.work}/{name}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ctx(data: dict[str, Any]) -> BuildContext:
    return BuildContext(**data)


def _s3(cfg: CorpusConfig) -> S3Options:
    return cfg.s3


# ---------------------------------------------------------------- tasks: planning and ingest


@task(name="plan-inputs", cache_policy=NO_CACHE, **IO_RETRIES)
def plan_inputs(config: dict[str, Any]) -> dict[str, Any]:
    """List the raw objects with their fingerprints and pack them into parts of similar byte size."""
    cfg = config_from_dict(config)
    inputs = ingest.list_inputs(list(cfg.resolved_inputs()), s3=cfg.s3, extensions=cfg.ingest.extensions)
    plans = ingest.plan_parts(inputs, cfg.ingest.target_part_bytes, cfg=cfg.ingest, s3=cfg.s3)
    return {"inputs": [i.to_json() for i in inputs], "plans": [p.to_json() for p in plans]}


@task(name="ingest", cache_policy=NO_CACHE, **IO_RETRIES)
def ingest_task(ctx: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    c = _ctx(ctx)
    cfg = c.cfg
    part = ingest.PartPlan.from_json(plan)
    with stage_progress.step("ingest"):
        return ingest.run_ingest_part(c.store(), c.folder("ingest"), part, cfg.ingest, s3=cfg.s3).to_json()


# ---------------------------------------------------------------- tasks: clean


@task(name="boilerplate-count", cache_policy=NO_CACHE)
def boilerplate_count_task(ctx: dict[str, Any], index: int) -> dict[str, Any]:
    c = _ctx(ctx)
    with stage_progress.step("boilerplate"):
        return boilerplate.run_boilerplate_count_part(
            c.store(), c.folder("ingest"), c.folder("boilerplate"), index, c.cfg.clean
        ).to_json()


@task(name="boilerplate-merge", cache_policy=NO_CACHE)
def boilerplate_merge_task(ctx: dict[str, Any], num_parts: int, _wait: list[Any]) -> str:
    c = _ctx(ctx)
    key = c.folder("boilerplate/lines.npy")
    n = boilerplate.merge_boilerplate(c.store(), c.folder("boilerplate"), num_parts, c.cfg.clean, key)
    get_run_logger().info("boilerplate: %d line(s) repeated across many documents will be removed", n)
    return key


@task(name="clean", cache_policy=NO_CACHE)
def clean_task(ctx: dict[str, Any], index: int, boilerplate_key: str) -> dict[str, Any]:
    c = _ctx(ctx)
    key = boilerplate_key if c.cfg.clean.boilerplate.enabled else None
    with stage_progress.step("clean"):
        return clean.run_clean_part(c.store(), c.folder("ingest"), c.folder("clean"), index, c.cfg.clean, key).to_json()


# ---------------------------------------------------------------- tasks: dedup


@task(name="exact-hash", cache_policy=NO_CACHE)
def exact_hash_task(ctx: dict[str, Any], index: int) -> dict[str, Any]:
    c = _ctx(ctx)
    return exact.run_exact_hash_part(c.store(), c.folder("clean"), c.folder("exact/hash"), index).to_json()


@task(name="exact-resolve", cache_policy=NO_CACHE)
def exact_resolve_task(ctx: dict[str, Any], num_parts: int, _wait: list[Any]) -> dict[str, Any]:
    c = _ctx(ctx)
    return exact.resolve_exact_duplicates(c.store(), c.folder("exact/hash"), num_parts, c.folder("exact/drop")).to_json()


@task(name="exact-filter", cache_policy=NO_CACHE)
def exact_filter_task(ctx: dict[str, Any], index: int, _wait: Any) -> dict[str, Any]:
    c = _ctx(ctx)
    with stage_progress.step("exact dedup"):
        return exact.run_exact_filter_part(
            c.store(), c.folder("clean"), c.folder("exact/out"), index, c.folder("exact/drop")
        ).to_json()


@task(name="minhash-signatures", cache_policy=NO_CACHE)
def signatures_task(ctx: dict[str, Any], index: int, in_folder: str) -> dict[str, Any]:
    c = _ctx(ctx)
    with stage_progress.step("signatures"):
        return near.run_signatures_part(c.store(), in_folder, c.folder("near/signatures"), index, c.cfg.dedup.near).to_json()


@task(name="near-plan", cache_policy=NO_CACHE)
def near_plan_task(ctx: dict[str, Any], num_parts: int, _wait: list[Any]) -> dict[str, Any]:
    c = _ctx(ctx)
    return near.plan_near_dedup(c.store(), c.folder("near"), num_parts, c.cfg.dedup.near)


@task(name="lsh-bands", cache_policy=NO_CACHE)
def bands_task(ctx: dict[str, Any], index: int, plan: dict[str, Any], from_index: bool = False) -> dict[str, Any]:
    c = _ctx(ctx)
    return near.run_bands_part(c.store(), c.folder("near"), index, c.cfg.dedup.near, plan, from_index=from_index).to_json()


@task(name="lsh-edges", cache_policy=NO_CACHE)
def edges_task(ctx: dict[str, Any], partition: int, plan: dict[str, Any], _wait: list[Any]) -> dict[str, Any]:
    c = _ctx(ctx)
    return near.run_edges_part(c.store(), c.folder("near"), partition, c.cfg.dedup.near, plan).to_json()


@task(name="near-clusters", cache_policy=NO_CACHE)
def clusters_task(
    ctx: dict[str, Any], in_folder: str, num_parts: int, exact_stats: dict[str, Any] | None, _wait: list[Any]
) -> dict[str, Any]:
    c = _ctx(ctx)
    es = StageStats.from_json(exact_stats) if exact_stats else None
    return near.run_clusters(
        c.store(), in_folder, c.folder("near"), num_parts, c.cfg.dedup.near, exact_stats=es
    ).to_json()


@task(name="near-filter", cache_policy=NO_CACHE)
def near_filter_task(ctx: dict[str, Any], index: int, in_folder: str, _wait: Any) -> dict[str, Any]:
    c = _ctx(ctx)
    with stage_progress.step("near dedup"):
        return near.run_near_filter_part(
            c.store(), in_folder, c.folder("dedup"), index, c.folder("near/clusters")
        ).to_json()


# ---------------------------------------------------------------- tasks: tokenize and publish


@task(name="train-tokenizer", cache_policy=NO_CACHE)
def tokenizer_task(ctx: dict[str, Any], in_folder: str, num_parts: int, _wait: list[Any]) -> str:
    c = _ctx(ctx)
    key = c.folder("tokenizer.json")
    sha = tokenize.run_train_tokenizer(c.store(), in_folder, num_parts, key, c.cfg.tokenize, s3=c.cfg.s3)
    get_run_logger().info("tokenizer %s (sha256 %s)", key, sha[:12])
    return key


@task(name="tokenize", cache_policy=NO_CACHE)
def tokenize_task(ctx: dict[str, Any], index: int, in_folder: str, tokenizer_key: str) -> dict[str, Any]:
    c = _ctx(ctx)
    with stage_progress.step("tokenize"):
        return tokenize.run_tokenize_part(
            c.store(), in_folder, c.folder("tokens"), index, tokenizer_key, c.cfg.tokenize
        ).to_json()


@task(name="shard-and-publish", cache_policy=NO_CACHE, **IO_RETRIES)
def publish_task(
    ctx: dict[str, Any],
    num_parts: int,
    tokenizer_key: str,
    inputs: list[dict[str, Any]],
    stats: dict[str, dict[str, Any]],
    lineage: dict[str, Any],
    _wait: list[Any],
) -> str:
    c = _ctx(ctx)
    cfg = c.cfg
    return tokenize.run_shard_and_publish(
        c.store(),
        c.folder("tokens"),
        num_parts,
        tokenizer_key,
        cfg.shard,
        cfg.name,
        inputs=inputs,
        stats={k: StageStats.from_json(v) for k, v in stats.items()},
        config=cfg.to_dict() | {"output": None, "s3": None},
        lineage=lineage,
        eos_token=cfg.tokenize.eos_token,
        pad_token=cfg.tokenize.pad_token,
    )


# ---------------------------------------------------------------- the flow


def _merge(stage: str, results: list[dict[str, Any]]) -> StageStats:
    total = StageStats(stage=stage)
    for r in results:
        total.merge(StageStats.from_json(r))
    return total


def build_key(cfg: CorpusConfig, inputs: list[dict[str, Any]]) -> str:
    """Work folder key: the config fingerprint + every input's fingerprint (size, etag/mtime)."""
    import hashlib

    h = hashlib.sha256(cfg.fingerprint().encode())
    for i in inputs:
        h.update(json.dumps([i["uri"], i["size"], i["etag"]]).encode())
    return h.hexdigest()[:16]


def run_dedup(ctx: dict[str, Any], cfg: CorpusConfig, n: int, stats: dict[str, StageStats]) -> str:
    """Exact then near dedup; returns the folder of the deduplicated parts."""
    c = _ctx(ctx)
    folder = c.folder("clean")
    if cfg.dedup.exact.enabled:
        hashes = exact_hash_task.map(unmapped(ctx), range(n)).result()
        resolved = exact_resolve_task(ctx, n, hashes)
        stats["exact_dedup"] = _merge("exact_dedup", exact_filter_task.map(unmapped(ctx), range(n), unmapped(resolved)).result())
        folder = c.folder("exact/out")
        mark_stage_success(c.store(), folder, n)
    if not cfg.dedup.near.enabled:
        return folder
    sigs = signatures_task.map(unmapped(ctx), range(n), unmapped(folder)).result()
    plan = near_plan_task(ctx, n, sigs)
    bands = bands_task.map(unmapped(ctx), range(n), unmapped(plan)).result()
    if plan["index_parts"]:
        bands += bands_task.map(unmapped(ctx), range(plan["index_parts"]), unmapped(plan), from_index=True).result()
    edges = edges_task.map(unmapped(ctx), range(plan["num_partitions"]), unmapped(plan), unmapped(bands)).result()
    clusters = clusters_task(ctx, folder, n, stats["exact_dedup"].to_json() if "exact_dedup" in stats else None, edges)
    stats["near_dedup"] = _merge("near_dedup", near_filter_task.map(unmapped(ctx), range(n), unmapped(folder), unmapped(clusters)).result())
    report = json.loads(c.store().get_bytes(c.folder("near/clusters/dedup_report.json")))
    stats["near_dedup"].extra["report"] = {k: v for k, v in report.items() if k not in ("sampled_pairs", "largest_clusters")}
    stats["near_dedup"].extra["report_key"] = c.folder("near/clusters/dedup_report.json")
    mark_stage_success(c.store(), c.folder("dedup"), n)
    return c.folder("dedup")


@flow(name="build_corpus", log_prints=False)
def build_corpus(
    config_path: str | None = None,
    inputs: list[str] | None = None,
    output: str | None = None,
    name: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build and publish a dataset; returns the summary (manifest URI, dataset id, per-stage stats)."""
    log = get_run_logger()
    started = time.perf_counter()
    cfg = load_corpus_config(config_path, inputs=inputs, output=output, name=name, overrides=overrides)
    planned = plan_inputs(cfg.to_dict())
    plans, input_list = planned["plans"], planned["inputs"]
    n = len(plans)
    store = open_store(cfg.output, s3=cfg.s3)
    ctx = BuildContext(store_uri=store.uri, work=f"work/{build_key(cfg, input_list)}", config=cfg.to_dict()).to_json()
    c = _ctx(ctx)
    log.info("build %s: %d input object(s) in %d part(s); work folder %s", cfg.name, len(input_list), n, store.uri_of(c.work))
    stage_progress.start({"ingest": n, "boilerplate": n, "clean": n, "exact dedup": n, "signatures": n,
                          "near dedup": n, "tokenize": n})  # fmt: skip
    stats: dict[str, StageStats] = {}
    stats["ingest"] = _merge("ingest", ingest_task.map(unmapped(ctx), plans).result())
    mark_stage_success(store, c.folder("ingest"), n)
    counts = boilerplate_count_task.map(unmapped(ctx), range(n)).result()
    bp_key = boilerplate_merge_task(ctx, n, counts)
    stats["clean"] = _merge("clean", clean_task.map(unmapped(ctx), range(n), unmapped(bp_key)).result())
    mark_stage_success(store, c.folder("clean"), n)
    dedup_folder = run_dedup(ctx, cfg, n, stats)
    tok_key = tokenizer_task(ctx, dedup_folder, n, [])
    token_stats = tokenize_task.map(unmapped(ctx), range(n), unmapped(dedup_folder), unmapped(tok_key)).result()
    mark_stage_success(store, c.folder("tokens"), n)
    stats["tokenize"] = _merge("tokenize", token_stats)
    lineage = {"prefect_flow_run_id": _flow_run_id(), "build_key": c.work.split("/")[-1]}
    manifest_uri = publish_task(
        ctx, n, tok_key, input_list, {k: v.to_json() for k, v in stats.items()}, lineage, token_stats
    )
    stage_progress.stop()
    summary = artifacts.build_summary(manifest_uri, stats, cfg, time.perf_counter() - started)
    artifacts.publish_build_artifacts(summary)
    log.info("published %s (dataset %s) in %.1f s", manifest_uri, summary["dataset_id"], summary["seconds"])
    return summary


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    run_id = flow_run.id
    return str(run_id) if run_id else None
