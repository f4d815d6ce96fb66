"""The tasks of ``build_corpus``: small serialisable arguments in (a :class:`BuildContext` dict and a part
index), JSON stats and unit keys out; the data stays in the store under ``work/<build_key>/``.

Per-part tasks go through :func:`_unit`, which restores a unit from an earlier build when its key matches
(``flows/unitcache.py``) and names the stage and part when it fails. I/O tasks retry with backoff; CPU tasks
do not (a deterministic failure would only fail again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows import run_names, unitcache
from flows.corpus_config import CorpusConfig, config_from_dict
from flows.progress import stage_progress
from pipeline import tokenize
from pipeline.clean import boilerplate
from pipeline.clean import stage as clean
from pipeline.dedup import candidates, clusters, exact, near, signatures
from pipeline.errors import StageFailed
from pipeline.ingest import config as ingest_config
from pipeline.ingest import stage as ingest
from pipeline.manifest import DatasetConflictError
from pipeline.storage import ObjectStore, open_store
from pipeline.storage.retry import is_permanent
from pipeline.storage.uploads import UploadJournal
from pipeline.units import StageStats, part_name


def _worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: a whole-unit retry for transient trouble only; a missing input, missing
    credentials, access denied, a missing bucket, a bad config or a full disk fail the run at once."""
    return not is_permanent(state.result(raise_on_failure=False))


# Each S3 call already retries its own transient errors (pipeline.storage.retry); these are for whole units.
IO_RETRIES: dict[str, Any] = dict(
    retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=_worth_retrying
)


@dataclass(frozen=True)
class BuildContext:
    """What every task needs to find its inputs: the store, the work folder and the resolved config."""

    store_uri: str
    work: str
    config: dict[str, Any]
    parts: int = 0  # how many parts the build has (task run names say "part 3/12")

    @property
    def cfg(self) -> CorpusConfig:
        return config_from_dict(self.config)

    def store(self) -> ObjectStore:
        store = open_store(self.store_uri, self.cfg.s3)
        store.uploads = UploadJournal(store)  # multipart uploads recorded in work/uploads until they end
        return store

    def folder(self, name: str) -> str:
        return f"{self.work}/{name}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ctx(data: dict[str, Any]) -> BuildContext:
    return BuildContext(**data)


# ---------------------------------------------------------------- failures name the stage and the part


@contextlib.contextmanager
def stage_errors(stage: str, part: int | None = None) -> Iterator[None]:
    try:
        yield
    except StageFailed:
        raise
    except Exception as exc:
        where = f"stage {stage!r}" + (f" part {part}" if part is not None else "")
        raise StageFailed(f"{where} failed: {type(exc).__name__}: {exc}") from exc


# ---------------------------------------------------------------- per-part units (cached across builds)


def _unit(c: BuildContext, stage: str, key: str, folder: str, index: int, run: Any) -> dict[str, Any]:
    """Restore the unit from an earlier build when its key matches, else run it; then register it."""
    store = c.store()
    with stage_errors(stage, index):
        reused = unitcache.restore(store, stage, key, folder, index)
        with stage_progress.step(stage):
            stats = run(store)
        unitcache.record(store, stage, key, folder, index)
    return {"stats": stats.to_json(), "key": key, "reused": reused}


@task(name="plan-inputs", task_run_name="plan inputs", cache_policy=NO_CACHE, **IO_RETRIES)
def plan_inputs(config: dict[str, Any]) -> dict[str, Any]:
    """List the raw objects with their fingerprints and pack them into parts of similar byte size."""
    with stage_errors("plan-inputs"):
        cfg = config_from_dict(config)
        inputs: list[ingest_config.InputFile] = []
        entry_of: dict[str, int] = {}
        for entry, source in enumerate(cfg.resolved_sources()):
            for inp in ingest.list_inputs(list(source.inputs), s3=cfg.s3, extensions=cfg.ingest.extensions):
                if entry_of.setdefault(inp.uri, entry) != entry:
                    raise ValueError(f"{inp.uri} is in two sources; each input belongs to one source")
                inputs.append(inp)
        inputs.sort(key=lambda i: i.uri)
        plans = ingest.plan_parts(inputs, cfg.ingest.target_part_bytes, cfg=cfg.ingest, s3=cfg.s3)
        plans = ingest.assign_sources(plans, entry_of)
        return {"inputs": [i.to_json() for i in inputs], "plans": [p.to_json() for p in plans]}


@task(name="ingest", task_run_name=run_names.part("ingest part"), cache_policy=NO_CACHE, **IO_RETRIES)
def ingest_task(ctx: dict[str, Any], plan: dict[str, Any], key: str) -> dict[str, Any]:
    c = _ctx(ctx)
    part = ingest_config.PartPlan.from_json(plan)
    return _unit(c, "ingest", key, c.folder("ingest"), part.index,
                 lambda st: ingest.run_ingest_part(st, c.folder("ingest"), part, c.cfg.ingest, s3=c.cfg.s3,
                                                   sources=c.cfg.resolved_sources()))  # fmt: skip


@task(name="boilerplate-count", task_run_name=run_names.part("boilerplate: count"), cache_policy=NO_CACHE)
def boilerplate_count_task(ctx: dict[str, Any], index: int, upstream: str) -> dict[str, Any]:
    c = _ctx(ctx)
    key = unitcache.unit_key("boilerplate", upstream, c.config["clean"])
    return _unit(c, "boilerplate", key, c.folder("boilerplate"), index,
                 lambda st: boilerplate.run_boilerplate_count_part(
                     st, c.folder("ingest"), c.folder("boilerplate"), index, c.cfg.clean))  # fmt: skip


@task(name="boilerplate-merge", task_run_name="boilerplate: merge", cache_policy=NO_CACHE)
def boilerplate_merge_task(ctx: dict[str, Any], num_parts: int, _wait: list[Any]) -> str:
    with stage_errors("boilerplate-merge"):
        c = _ctx(ctx)
        key = c.folder("boilerplate/lines.npy")
        n = boilerplate.merge_boilerplate(c.store(), c.folder("boilerplate"), num_parts, c.cfg.clean, key)
        get_run_logger().info("boilerplate: %d line(s) repeated across many documents will be removed", n)
        return key


@task(name="clean", task_run_name=run_names.part("clean part"), cache_policy=NO_CACHE)
def clean_task(ctx: dict[str, Any], index: int, upstream: str, boilerplate_key: str) -> dict[str, Any]:
    c = _ctx(ctx)
    bp = boilerplate_key if c.cfg.clean.boilerplate.enabled else None
    key = unitcache.unit_key(
        "clean",
        upstream,
        c.config["clean"],
        c.config["sources"],
        unitcache.content_hash(c.store(), boilerplate_key),
    )
    return _unit(c, "clean", key, c.folder("clean"), index,
                 lambda st: clean.run_clean_part(st, c.folder("ingest"), c.folder("clean"), index, c.cfg.clean, bp,
                                                 sources=c.cfg.resolved_sources()))  # fmt: skip


@task(name="exact-hash", task_run_name=run_names.part("exact-dedup: hash"), cache_policy=NO_CACHE)
def exact_hash_task(ctx: dict[str, Any], index: int, upstream: str) -> dict[str, Any]:
    c = _ctx(ctx)
    key = unitcache.unit_key("exact-hash", upstream)
    return _unit(c, "exact-hash", key, c.folder("exact/hash"), index,
                 lambda st: exact.run_exact_hash_part(st, c.folder("clean"), c.folder("exact/hash"), index))  # fmt: skip


@task(name="exact-resolve", task_run_name="exact-dedup: resolve", cache_policy=NO_CACHE)
def exact_resolve_task(ctx: dict[str, Any], num_parts: int, _wait: list[Any]) -> dict[str, Any]:
    with stage_errors("exact-resolve"):
        c = _ctx(ctx)
        return exact.resolve_exact_duplicates(
            c.store(), c.folder("exact/hash"), num_parts, c.folder("exact/drop")
        ).to_json()


@task(name="exact-filter", task_run_name=run_names.part("exact-dedup: filter"), cache_policy=NO_CACHE)
def exact_filter_task(ctx: dict[str, Any], index: int, upstream: str, _wait: Any) -> dict[str, Any]:
    c = _ctx(ctx)
    drop = unitcache.content_hash(c.store(), f"{c.folder('exact/drop')}/{part_name(index)}.npy")
    key = unitcache.unit_key("exact-filter", upstream, drop)
    return _unit(c, "exact dedup", key, c.folder("exact/out"), index,
                 lambda st: exact.run_exact_filter_part(
                     st, c.folder("clean"), c.folder("exact/out"), index, c.folder("exact/drop")))  # fmt: skip


@task(
    name="minhash-signatures", task_run_name=run_names.part("near-dedup: signatures"), cache_policy=NO_CACHE
)
def signatures_task(ctx: dict[str, Any], index: int, in_folder: str, upstream: str) -> dict[str, Any]:
    c = _ctx(ctx)
    key = unitcache.unit_key("signatures", upstream, c.config["dedup"]["near"])
    return _unit(c, "signatures", key, c.folder("near/signatures"), index,
                 lambda st: signatures.run_signatures_part(st, in_folder, c.folder("near/signatures"), index, c.cfg.dedup.near))  # fmt: skip


@task(name="near-plan", task_run_name="near-dedup: plan", cache_policy=NO_CACHE)
def near_plan_task(ctx: dict[str, Any], num_parts: int, _wait: list[Any]) -> dict[str, Any]:
    with stage_errors("near-plan"):
        c = _ctx(ctx)
        return candidates.plan_near_dedup(c.store(), c.folder("near"), num_parts, c.cfg.dedup.near)


@task(name="lsh-bands", task_run_name=run_names.bands, cache_policy=NO_CACHE)
def bands_task(
    ctx: dict[str, Any], index: int, plan: dict[str, Any], from_index: bool = False
) -> dict[str, Any]:
    with stage_errors("lsh-bands"):
        c = _ctx(ctx)
        return candidates.run_bands_part(
            c.store(), c.folder("near"), index, c.cfg.dedup.near, plan, from_index=from_index
        ).to_json()


@task(name="lsh-edges", task_run_name=run_names.edges, cache_policy=NO_CACHE)
def edges_task(ctx: dict[str, Any], partition: int, plan: dict[str, Any], _wait: list[Any]) -> dict[str, Any]:
    with stage_errors("lsh-edges"):
        c = _ctx(ctx)
        return candidates.run_edges_part(
            c.store(), c.folder("near"), partition, c.cfg.dedup.near, plan
        ).to_json()


@task(name="near-clusters", task_run_name="near-dedup: clusters", cache_policy=NO_CACHE)
def clusters_task(
    ctx: dict[str, Any], in_folder: str, num_parts: int, exact_stats: dict[str, Any] | None, _wait: list[Any]
) -> dict[str, Any]:
    with stage_errors("near-clusters"):
        c = _ctx(ctx)
        es = StageStats.from_json(exact_stats) if exact_stats else None
        return clusters.run_clusters(
            c.store(), in_folder, c.folder("near"), num_parts, c.cfg.dedup.near, exact_stats=es
        ).to_json()


@task(name="near-filter", task_run_name=run_names.part("near-dedup: filter"), cache_policy=NO_CACHE)
def near_filter_task(
    ctx: dict[str, Any], index: int, in_folder: str, upstream: str, _wait: Any
) -> dict[str, Any]:
    c = _ctx(ctx)
    drop = unitcache.content_hash(c.store(), f"{c.folder('near/clusters/drop')}/{part_name(index)}.npz")
    key = unitcache.unit_key("near-filter", upstream, drop)
    return _unit(c, "near dedup", key, c.folder("dedup"), index,
                 lambda st: near.run_near_filter_part(st, in_folder, c.folder("dedup"), index, c.folder("near/clusters")))  # fmt: skip


# ---------------------------------------------------------------- tasks: tokenize and publish


@task(name="train-tokenizer", task_run_name="train tokenizer", cache_policy=NO_CACHE)
def tokenizer_task(ctx: dict[str, Any], in_folder: str, num_parts: int, _wait: list[Any]) -> str:
    """Train (or load) the tokenizer. A trained tokenizer is pinned per dataset name and tokenizer config, so a
    scheduled rebuild keeps its token ids and re-tokenizes only the parts that changed."""
    with stage_errors("train-tokenizer"):
        c = _ctx(ctx)
        store, cfg = c.store(), c.cfg
        key = c.folder("tokenizer.json")
        pin = f"cache/tokenizers/{unitcache.unit_key('tokenizer', cfg.name, c.config['tokenize'])}.json"
        if (
            cfg.tokenize.tokenizer is None
            and cfg.pin_tokenizer
            and store.exists(pin)
            and not store.exists(key)
        ):
            store.copy(pin, key)
            get_run_logger().info(
                "reusing the pinned tokenizer of dataset %s (%s)", cfg.name, store.uri_of(pin)
            )
        sha = tokenize.run_train_tokenizer(store, in_folder, num_parts, key, cfg.tokenize, s3=cfg.s3)
        if cfg.tokenize.tokenizer is None and not store.exists(pin):
            store.copy(key, pin)
        get_run_logger().info("tokenizer %s (sha256 %s)", key, sha[:12])
        return key


@task(name="tokenize", task_run_name=run_names.part("tokenize part"), cache_policy=NO_CACHE)
def tokenize_task(
    ctx: dict[str, Any], index: int, in_folder: str, upstream: str, tokenizer_key: str
) -> dict[str, Any]:
    c = _ctx(ctx)
    key = unitcache.unit_key(
        "tokenize", upstream, unitcache.content_hash(c.store(), tokenizer_key), c.config["tokenize"]
    )
    return _unit(c, "tokenize", key, c.folder("tokens"), index,
                 lambda st: tokenize.run_tokenize_part(st, in_folder, c.folder("tokens"), index, tokenizer_key, c.cfg.tokenize))  # fmt: skip


@task(name="shard-and-publish", task_run_name="shard and publish", cache_policy=NO_CACHE, **IO_RETRIES)
def publish_task(
    ctx: dict[str, Any],
    num_parts: int,
    tokenizer_key: str,
    inputs: list[dict[str, Any]],
    stats: dict[str, dict[str, Any]],
    lineage: dict[str, Any],
    _wait: list[Any],
) -> str:
    with stage_errors("shard-and-publish"):
        c = _ctx(ctx)
        cfg = c.cfg
        try:
            return tokenize.run_shard_and_publish(
                c.store(), c.folder("tokens"), num_parts, tokenizer_key, cfg.shard, cfg.name,
                inputs=inputs, stats={k: StageStats.from_json(v) for k, v in stats.items()},
                config=cfg.to_dict() | {"output": None, "s3": None}, lineage=lineage,
                eos_token=cfg.tokenize.eos_token, pad_token=cfg.tokenize.pad_token,
                sources=cfg.resolved_sources(),
            )  # fmt: skip
        except DatasetConflictError as exc:
            # Same content (the dataset id is a content hash) but, e.g., touched input mtimes: the published
            # dataset is the one to use; it stays immutable.
            get_run_logger().warning("dataset already published with other metadata: %s", exc)
            return exc.existing_uri


@task(name="save-dedup-index", task_run_name="save dedup index", cache_policy=NO_CACHE, **IO_RETRIES)
def save_index_task(ctx: dict[str, Any], num_parts: int, dataset_id: str) -> str:
    """Persist the kept documents' signatures so a later build can drop what this dataset already holds
    (``--set dedup.near.index_uri=<this URI>``)."""
    with stage_errors("save-dedup-index"):
        c = _ctx(ctx)
        store = c.store()
        uri = store.uri_of(f"indexes/{c.cfg.name}/{dataset_id}")
        if not store.exists(f"indexes/{c.cfg.name}/{dataset_id}/index.json"):
            signatures.save_index(store, c.folder("near"), num_parts, c.cfg.dedup.near, uri)
        return uri
