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
from typing import Any

from prefect import flow, get_run_logger

from flows.build import head_start, steps, unchanged
from flows.build.context import (
    DAMAGE_ROUNDS,
    BuildContext,
    build_context,
    take_build_lease,
    unit_not_done,
)
from flows.build.decontam import run_decontam
from flows.build.inputs import build_key, pin_model
from flows.build.passes import Passes
from flows.build.plan import chunks
from flows.build.prepare import prepare
from flows.build.steps import dedup_index_prefix
from flows.build.tasks import (
    bands_task,
    boilerplate_range_task,
    classifier_cuts_task,
    classifier_filter_chunk_task,
    clean_chunk_task,
    clusters_task,
    commit_task,
    edges_task,
    exact_drops_task,
    exact_range_task,
    index_meta_task,
    ingest_chunk_task,
    manifest_task,
    near_filter_chunk_task,
    near_plan_task,
    plan_inputs,
    publish_shards_task,
    save_index_chunk_task,
    shard_plan_task,
    signatures_chunk_task,
    tokenize_chunk_task,
    tokenizer_task,
    word_count_chunk_task,
    write_shards_task,
)
from flows.runtime.heartbeat import with_heartbeat
from flows.runtime.pool import early_summary
from flows.runtime.profile import BuildProfile
from flows.runtime.runners import (
    fit_workers,
    make_task_runner,
    start_workers_soon,
    training_threads,
    worker_count,
    workers_in_process,
    workers_started,
)
from flows.ui import build_artifacts, run_names
from flows.ui.progress import RunProgress, stage_progress
from pipeline.corpus_config import CorpusConfig, load_corpus_config
from pipeline.dataset.manifest import MANIFEST_KEY, dataset_prefix
from pipeline.dataset.shards import ShardInfo
from pipeline.dedup import exact
from pipeline.errors import StageFailed
from pipeline.storage.uploads import release_lease
from pipeline.tokenize import stage as tokenize_stage
from pipeline.units import hashranges
from pipeline.units.protocol import StageStats

__all__ = ["BuildContext", "StageFailed", "build_corpus", "build_key"]


# ---------------------------------------------------------------- the flow


def ingest_and_clean(
    run: Passes,
    cfg: CorpusConfig,
    ingest_calls: list[tuple[Any, list[Any], list[str]]],
    stats: dict[str, StageStats],
) -> None:
    """Ingest + count every part (``ingest_calls``: :meth:`Prepared.ingest_calls`), merge the boilerplate counts,
    clean + hash every part."""
    c = build_context(run.ctx)
    run.fan_out("ingest+count", ingest_chunk_task, [a[1] for a in ingest_calls], [a[2] for a in ingest_calls])
    run.note_reuse("ingest", "boilerplate")
    stats["ingest"] = run.merged("ingest")
    run.mark_done(c.folder("ingest"), "ingest")
    bp_key = merge_boilerplate(run)
    run.fan_out(
        "clean+hash", clean_chunk_task, run.index_chunks(), run.keyed("ingest"), boilerplate_key=bp_key
    )
    run.note_reuse("clean")
    stats["clean"] = run.merged("clean")
    if cfg.clean.classifier is not None and cfg.clean.classifier.keep_fraction is not None:
        run.mark_done(c.folder("scored"), "clean")
        keep_best_scored(run, stats)
    run.mark_done(c.folder("clean"), "clean")


def keep_best_scored(run: Passes, stats: dict[str, StageStats]) -> None:
    """``keep_fraction``: the cut of each source over every part's scores, then the filter of every part."""
    cuts_key = run.once("classifier-cuts", classifier_cuts_task, run.ctx, run.n)
    run.fan_out(
        "classifier+hash",
        classifier_filter_chunk_task,
        run.index_chunks(),
        run.keyed("clean"),
        cuts_key=cuts_key,
    )
    run.note_reuse("classifier")
    stats["classifier"] = run.merged("classifier")
    # the steps after clean read the filtered parts: their unit keys chain from the filter's
    run.units["clean"] = run.units["classifier"]


def run_dedup(run: Passes, cfg: CorpusConfig, stats: dict[str, StageStats]) -> tuple[str, str]:
    """Exact then near dedup; returns the folder of the deduplicated parts and the step whose keys name them."""
    c, n = build_context(run.ctx), run.n
    folder, step = c.folder("clean"), "clean"
    resolved = resolve_exact(run) if cfg.dedup.exact.enabled else None
    if cfg.dedup.exact.enabled or cfg.dedup.near.enabled:
        run.fan_out(
            "filter+signatures",
            signatures_chunk_task,
            run.index_chunks(),
            run.keyed("clean"),
            resolved=resolved,
        )
    if cfg.dedup.exact.enabled:
        stats["exact_dedup"] = run.merged("exact dedup", "exact_dedup")
        folder, step = c.folder("exact/out"), "exact dedup"
        run.mark_done(folder, "exact dedup")
    if not cfg.dedup.near.enabled:
        return folder, step
    run.note_reuse("signatures")
    sig_stats = [u["stats"] for u in run.units.get("signatures", [])]
    plan = run.on_worker("near-plan", near_plan_task, run.ctx, n, sig_stats)
    run.fan_out("lsh-bands", bands_task, run.index_chunks(light=True), plan=plan)
    if plan["index_parts"]:
        run.fan_out(
            "lsh-bands-index",
            bands_task,
            run.index_chunks(plan["index_parts"], light=True),
            plan=plan,
            from_index=True,
        )
    run.fan_out(
        "lsh-edges", edges_task, run.index_chunks(plan["num_partitions"], light=True), plan=plan, wait=[]
    )
    exact_json = stats["exact_dedup"].to_json() if "exact_dedup" in stats else None
    clusters = run.on_worker("near-clusters", clusters_task, run.ctx, folder, n, exact_json, sig_stats)
    chunked = run.index_chunks(light=True)
    run.fan_out(
        "near-filter",
        near_filter_chunk_task,
        chunked,
        [folder] * len(chunked),
        run.keyed(step, True),
        clusters=clusters,
    )
    stats["near_dedup"] = run.merged("near dedup", "near_dedup")
    report_key = c.folder("near/clusters/dedup_report.json")
    report = json.loads(json.dumps(clusters["extra"]["report"]))  # as the clusters step wrote it
    stats["near_dedup"].extra["report"] = {
        k: v for k, v in report.items() if k not in ("sampled_pairs", "largest_clusters")
    }
    stats["near_dedup"].extra["report_key"] = report_key
    run.mark_done(c.folder("dedup"), "near dedup")
    return c.folder("dedup"), "near dedup"


def merge_boilerplate(run: Passes) -> str:
    """The corpus's boilerplate lines: a task per range of the line hashes on the workers (as many as the exact
    resolve's), each reading its slice of every part's counts; the flow joins the ranges' small sorted results.
    Returns the set's key."""
    c = build_context(run.ctx)
    store, key, folder = c.store(), c.folder("boilerplate/lines.npy"), c.folder("boilerplate")
    if store.exists(key):
        return key
    docs = [u["stats"]["docs_in"] for u in run.units.get("boilerplate", [])]
    total = sum(docs) if len(docs) == run.n else None
    ranges = len(run.index_chunks(light=True))
    run.spread(
        "boilerplate-merge", boilerplate_range_task, list(range(ranges)), ranges=ranges, docs_total=total
    )
    lines = hashranges.join_ranges(store, folder, ranges, key)
    get_run_logger().info("boilerplate: %d line(s) repeated across many documents will be removed", lines)
    return key


def resolve_exact(run: Passes) -> dict[str, Any]:
    """Exact duplicates across the corpus, on the workers: a task per range of the hashes (about one per worker),
    then the drop lists by runs of parts; the flow adds up the ranges' counts. Returns the resolve's stats."""
    c = build_context(run.ctx)
    store, folder = c.store(), c.folder("exact/drop")
    if (done := exact.resolved(store, folder)) is not None:
        return done.to_json()
    checked = len(run.units.get("exact-hash", [])) == run.n  # every hash unit came back: no marker look-ups
    ranges = len(run.index_chunks(light=True))
    found = run.spread("exact-resolve", exact_range_task, list(range(ranges)), ranges=ranges, checked=checked)
    run.spread("exact-drop-lists", exact_drops_task, run.index_chunks(light=True), ranges=ranges)
    return exact.finish_resolve(store, folder, run.n, [f["counts"] for f in found]).to_json()


def count_words(run: Passes, folder: str, step: str, sizes: list[int]) -> None:
    """The ``counts`` trainer's pass: the words of each part of the tokenizer's sample counted on the workers,
    within the part's budget (``pipeline/tokenize/word_counts.py``); the training step merges them."""
    budgets = tokenize_stage.sample_budgets(sizes, build_context(run.ctx).cfg.tokenize.train_sample_bytes)
    chunked = chunks(sorted(budgets), run.light_size)  # a light pass: one task per worker
    keys = [u["key"] for u in run.units[step]]
    run.fan_out(
        "word-count",
        word_count_chunk_task,
        chunked,
        [folder] * len(chunked),
        [[keys[i] for i in chunk] for chunk in chunked],
        [[budgets[i] for i in chunk] for chunk in chunked],
    )


def tokenize_parts(run: Passes, folder: str, step: str, stats: dict[str, StageStats]) -> str:
    """Train (or load) the tokenizer, then tokenize every part; returns the tokenizer key."""
    c = build_context(run.ctx)
    stage_progress.stage("tokenizer (trained once per dataset name)")
    units = run.units.get(step, [])  # the parts' sizes, so training reads only its sample's parts
    sizes = [u["stats"]["bytes_out"] for u in units] if len(units) == run.n else None
    if sizes is not None and steps.counts_to_train(run.ctx):
        count_words(run, folder, step, sizes)
    threads = training_threads()  # training, a process of its own, gets the build's cores
    tokenizer = run.on_worker("train-tokenizer", tokenizer_task, run.ctx, folder, run.n, [], sizes, threads)
    run.profile.passes[-1]["threads"] = threads  # the pass just timed: the Rayon threads it was given
    tok_key, sample = tokenizer["key"], tokenizer["sample"]
    stats["train_tokenizer"] = StageStats(
        stage="train_tokenizer",
        docs_in=sample.get("sample_docs", 0),
        bytes_in=sample.get("sample_bytes", 0),
        extra={"sample": sample},
    )
    chunked = run.index_chunks()
    run.fan_out(
        "tokenize",
        tokenize_chunk_task,
        chunked,
        [folder] * len(chunked),
        run.keyed(step),
        tokenizer_key=tok_key,
    )
    run.mark_done(c.folder("tokens"), "tokenize")
    stats["tokenize"] = run.merged("tokenize")
    run.note_reuse("tokenize")
    return tok_key


def shard_and_publish(
    run: Passes,
    tok_key: str,
    inputs: list[dict[str, Any]],
    stats_json: dict[str, Any],
    lineage: dict[str, Any],
    workers: int,
) -> dict[str, Any]:
    """Plan the shards, write them on the workers (runs of each split's shards), make the manifest, copy and
    verify the shards under the dataset's prefix on the workers, then write the manifest last. Returns the
    manifest URI and whether a published dataset of the same content was reused (:func:`steps.commit`)."""
    counted = [u["stats"] for u in run.units.get("split counts", [])]
    # two runs of shards per worker, so none idles at the end; one where the heavy passes ran one task per worker
    # (a small build, flows/build/plan.py: each task run costs more there than the balance gains)
    tasks = 1 if workers <= 1 else workers * (1 if len(run.index_chunks()) <= workers else 2)
    plan = run.once("shard-plan", shard_plan_task, run.ctx, run.n, tok_key, tasks, counted)
    folder, tasks = plan["folder"], plan["tasks"]
    units = run.spread("write-shards", write_shards_task, tasks, folder=folder, dtype=plan["dtype"])
    manifest = run.once(
        "manifest",
        manifest_task,
        run.ctx,
        run.n,
        tok_key,
        [u["stats"] for u in units],
        inputs,
        stats_json,
        lineage,
    )
    store = build_context(run.ctx).store()
    prefix = dataset_prefix(manifest["name"], manifest["dataset_id"])
    if not store.exists(f"{prefix}/{MANIFEST_KEY}"):  # published before: its shards were verified then
        shards = {(s["split"], s["index"]): s for s in manifest["shards"]}
        files = [
            [pair for w in ws for k in range(w["first"], w["stop"]) for pair in _files(shards[w["split"], k])]
            for ws in tasks
        ]
        run.spread("publish-shards", publish_shards_task, tasks, files, folder=folder, prefix=prefix)
    return run.once("publish", commit_task, run.ctx, tok_key, manifest)


def _files(shard: dict[str, Any]) -> list[list[Any]]:
    """A shard's three objects with their sha256 and size, as the manifest lists them."""
    return [list(obj) for obj in ShardInfo(**shard).objects()]


# persist_result=False: a persisted result shows up as an untitled "result" artifact on the run page.
@flow(
    name=run_names.BUILD_FLOW,
    flow_run_name=run_names.build_run_name,
    log_prints=False,
    persist_result=False,
    task_runner=make_task_runner(),
)
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
    cfg = pin_model(cfg)  # a bad model file or label fails here, before any work
    build_profile = BuildProfile()
    stage_progress.stage("listing inputs")
    with build_profile.run_pass("plan-inputs"):
        planned = plan_inputs(cfg.to_dict())
    # one preparation, the head start's when the command made one (its context, lease and first calls as they
    # are), else this flow's: the work folder, and no more workers than the widest pass has task chunks, each of
    # at least MIN_TASK_BYTES of input (a small build: one chunk per pass, run in this process)
    prepared = prepare(cfg, planned, worker_count(), fit=fit_workers)
    head = head_start.take(cfg.to_dict(), prepared.work)
    work, store, n, workers = prepared.work, prepared.store, prepared.parts, prepared.workers
    # The uploads and temp files of earlier runs that died go now rather than after an hour; this run's lease
    # keeps a janitor or another build off its own.
    lease = take_build_lease(store, cfg.s3, run=head.lease if head is not None else None)
    record = unchanged.published_record(store, work, cfg)
    if record is not None:  # published before from the same inputs and config: no worker starts
        release_lease(store, lease)
        found = unchanged.Published(
            cfg=cfg, store=store, work=work, record=record, input_root=planned.get("root", "")
        )
        return nothing_changed(found, build_profile, started)
    ctx = head.ctx if head is not None else prepared.context(lease)
    ingest_calls = head.calls if head is not None else prepared.ingest_calls(ctx)
    start_workers_soon()  # they start while the flow prepares its first pass
    run = Passes(ctx, n, prepared.size, prepared.light, build_profile)
    get_run_logger().info(
        "build %s: %d input object(s) in %d part(s), %d per task, %d worker(s); work folder %s",
        cfg.name,
        len(planned["inputs"]),
        n,
        run.size,
        workers,
        store.uri_of(work),
    )
    from pipeline.clean.stage import missing_kernels  # the clean rules load only for a build with work

    if missing := missing_kernels():
        get_run_logger().warning(
            "compiled kernels not built: %s; clean takes its numpy paths (same output, about "
            "1.7x the CPU). Reinstall where a C compiler is found: pip install -e .",
            ", ".join(missing),
        )
    stages = build_stages(cfg)  # the terminal's bars and the UI's progress artifact count the same stages
    stage_progress.start_units({s: 1 if s == "publish" else n for s in stages})
    progress = RunProgress(stages, key="build-progress")
    # where the inputs lie: outside what the dataset id hashes (document ids name objects under this root)
    lineage = {
        "prefect_flow_run_id": _flow_run_id(),
        "build_key": work.split("/")[-1],
        "input_root": planned.get("root", ""),
    }
    stats: dict[str, StageStats] = {}
    for attempt in range(1, DAMAGE_ROUNDS + 1):
        try:
            published = run_steps(
                run, cfg, ingest_calls, stats, progress, planned["inputs"], lineage, workers
            )
            break
        except Exception as exc:  # a unit read as damaged lost its marker: the steps again recompute it
            if (damaged := unit_not_done(exc)) is None or attempt == DAMAGE_ROUNDS:
                raise
            get_run_logger().warning("%s: running the steps again (intact units are skipped)", damaged)
    manifest_uri, reused = published["manifest_uri"], published["reused"]
    if reused is not None:  # from here on, everything reports the published dataset, as its manifest lists it
        stats, reused = unchanged.reused_dataset(manifest_uri, cfg, stats, reused)
    summary = build_artifacts.build_summary(manifest_uri, stats, cfg, time.perf_counter() - started)
    if reused is not None:
        summary["reused"] = reused
        get_run_logger().warning(unchanged.reused_line(summary))
    summary["reused_units"] = run.reuse
    summary["lineage"] = lineage
    if cfg.dedup.near.enabled:
        stage_progress.stage("saving the dedup index")
        summary["dedup_index_uri"] = save_dedup_index(run, summary["dataset_id"])
    summary["profile"] = run.profile.to_json() | {
        "parts": n,
        "parts_per_task": run.size,
        "workers": workers,
        "workers_started": workers_started(),
        "workers_in_process": workers_in_process(),
        "head_start": early_summary(),  # the ingest calls the command started before Prefect, if any
    }
    build_artifacts.publish_build_artifacts(summary, cfg)
    unchanged.record_published(store, work, cfg, summary)
    run_names.rename_flow_run(f"build {cfg.name} {summary['dataset_id'][:8]}")
    get_run_logger().info(
        "%s %s (dataset %s) in %.1f s",
        "reused" if reused is not None else "published",
        manifest_uri,
        summary["dataset_id"],
        summary["seconds"],
    )
    release_lease(store, lease)
    return summary


def run_steps(
    run: Passes,
    cfg: CorpusConfig,
    ingest_calls: list[tuple[Any, list[Any], list[str]]],
    stats: dict[str, StageStats],
    progress: RunProgress,
    inputs: list[dict[str, Any]],
    lineage: dict[str, Any],
    workers: int,
) -> dict[str, Any]:
    """Every step from ingest to publish (a unit done before, in this run or an earlier one, is skipped);
    returns :func:`shard_and_publish`'s result."""
    stages = build_stages(cfg)
    ingest_and_clean(run, cfg, ingest_calls, stats)
    progress.finished("ingest", "boilerplate", "clean")
    dedup_folder, step = run_dedup(run, cfg, stats)
    dedup_folder, step = run_decontam(run, cfg, dedup_folder, step, stats)
    progress.finished(*(s for s in stages if s in ("exact dedup", "signatures", "near dedup")))
    tok_key = tokenize_parts(run, dedup_folder, step, stats)
    progress.finished("tokenize")
    stats_json = {k: v.to_json() for k, v in stats.items()}
    with stage_progress.step("publish"):
        published = shard_and_publish(run, tok_key, inputs, stats_json, lineage, workers)
    progress.finished("publish")
    return published


def nothing_changed(
    found: unchanged.Published, build_profile: BuildProfile, started: float
) -> dict[str, Any]:
    """The summary of a build whose dataset is already published from the same inputs and config: the
    dataset becomes ``latest`` again, the run page says nothing changed and links it; no task is submitted."""
    summary = unchanged.republished(found, build_profile, started, _flow_run_id(), workers_started())
    build_artifacts.publish_unchanged_artifacts(summary, found.cfg)
    run_names.rename_flow_run(run_names.unchanged_run_name(found.cfg.name, summary["dataset_id"]))
    get_run_logger().info(unchanged.nothing_changed_line(summary))
    return summary


def save_dedup_index(run: Passes, dataset_id: str) -> str:
    """The kept documents' signatures under ``indexes/<name>/<dataset id>``, for a later build's
    ``dedup.near.index_uri``: each part's unit on the workers, then ``index.json`` (an index already saved
    for this dataset is kept as it is). Returns the index's URI."""
    c = build_context(run.ctx)
    store, prefix = c.store(), dedup_index_prefix(c.cfg.name, dataset_id)
    if store.exists(f"{prefix}/index.json"):
        return store.uri_of(prefix)
    saved = run.spread(
        "save-dedup-index", save_index_chunk_task, run.index_chunks(light=True), dataset_id=dataset_id
    )
    docs = sum(k for r in saved for k in r["kept"])
    return str(run.on_worker("dedup-index-meta", index_meta_task, run.ctx, run.n, dataset_id, docs))


def build_stages(cfg: CorpusConfig) -> list[str]:
    """The stages of this build, in order, as the terminal and the UI's progress artifact name them."""
    dedup = ["exact dedup"] * cfg.dedup.exact.enabled + ["signatures", "near dedup"] * cfg.dedup.near.enabled
    return ["ingest", "boilerplate", "clean", *dedup, "tokenize", "publish"]


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    run_id = flow_run.id
    return str(run_id) if run_id else None
