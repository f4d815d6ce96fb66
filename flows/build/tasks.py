"""The tasks of ``build_corpus`` as Prefect sees them: each a ``@task`` (its name, run name and retries, which the
UI and the build's profile show) whose body, a plain function of ``flows/build/steps.py``, runs where
:func:`flows.runtime.workers.hand_over` sends it: a local worker process, or in-line in the task on a Dask or
Ray worker. Small serialisable arguments in (a :class:`BuildContext` dict and a part index), JSON stats and unit
keys out; the data stays in the store under ``work/<build_key>/``.

I/O tasks retry with backoff; CPU tasks do not (a deterministic failure would only fail again).
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.build import steps
from flows.build.context import IO_RETRIES
from flows.runtime.runners import workers_in_process
from flows.runtime.workers import hand_over
from flows.ui import run_names


@task(name="plan-inputs", task_run_name="plan inputs", cache_policy=NO_CACHE, **IO_RETRIES)
def plan_inputs(config: dict[str, Any]) -> dict[str, Any]:
    """List the raw objects with their fingerprints and pack them into parts of similar byte size."""
    return hand_over(steps.plan_inputs, config)


@task(
    name="ingest",
    task_run_name=run_names.parts("ingest + count", "plans"),
    cache_policy=NO_CACHE,
    **IO_RETRIES,
)
def ingest_chunk_task(
    ctx: dict[str, Any], plans: list[dict[str, Any]], keys: list[str]
) -> list[dict[str, Any]]:
    """Ingest each part (its text normalised as the clean config says, once for the count and clean), then count
    its lines for the corpus-wide boilerplate set."""
    return hand_over(steps.ingest_chunk, ctx, plans, keys)


@task(name="clean", task_run_name=run_names.parts("clean + exact hash"), cache_policy=NO_CACHE)
def clean_chunk_task(
    ctx: dict[str, Any], indices: list[int], upstream: list[str], boilerplate_key: str
) -> list[dict[str, Any]]:
    """Clean each part (boilerplate lines out, quality filters), then hash its documents for exact dedup. With a
    classifier's ``keep_fraction``, clean writes the scored parts and :func:`classifier_filter_chunk_task` the
    filtered parts, then the hashes."""
    return hand_over(steps.clean_chunk, ctx, indices, upstream, boilerplate_key)


@task(name="classifier-cuts", task_run_name="classifier: cut per source", cache_policy=NO_CACHE)
def classifier_cuts_task(ctx: dict[str, Any], num_parts: int) -> str:
    """The global step of ``keep_fraction``: each source's cut over the scores of every scored part."""
    return hand_over(steps.classifier_cuts, ctx, num_parts)


@task(
    name="classifier-filter",
    task_run_name=run_names.parts("classifier filter + exact hash"),
    cache_policy=NO_CACHE,
)
def classifier_filter_chunk_task(
    ctx: dict[str, Any], indices: list[int], upstream: list[str], cuts_key: str
) -> list[dict[str, Any]]:
    """Keep each scored part's documents above their source's cut (``classifier_low`` for the others), then hash
    them for exact dedup."""
    return hand_over(steps.classifier_filter_chunk, ctx, indices, upstream, cuts_key)


@task(
    name="minhash-signatures",
    task_run_name=run_names.parts("exact filter + signatures"),
    cache_policy=NO_CACHE,
)
def signatures_chunk_task(
    ctx: dict[str, Any], indices: list[int], upstream: list[str], _wait: Any
) -> list[dict[str, Any]]:
    """Drop each part's exact duplicates (when enabled), then MinHash its documents (when near dedup is on)."""
    return hand_over(steps.signatures_chunk, ctx, indices, upstream, _wait)


@task(name="near-filter", task_run_name=run_names.parts("near-dedup: filter"), cache_policy=NO_CACHE)
def near_filter_chunk_task(
    ctx: dict[str, Any], indices: list[int], in_folder: str, upstream: list[str], _wait: Any
) -> list[dict[str, Any]]:
    return hand_over(steps.near_filter_chunk, ctx, indices, in_folder, upstream, _wait)


@task(name="tokenize", task_run_name=run_names.parts("tokenize"), cache_policy=NO_CACHE)
def tokenize_chunk_task(
    ctx: dict[str, Any], indices: list[int], in_folder: str, upstream: list[str], tokenizer_key: str
) -> list[dict[str, Any]]:
    """Tokenize each part, then count its tokens per source and split for the shard plan (so the serial shard
    step only adds up the counts instead of reading every token part twice)."""
    return hand_over(steps.tokenize_chunk, ctx, indices, in_folder, upstream, tokenizer_key)


@task(
    name="boilerplate-range",
    task_run_name="boilerplate: hash range {rng}",
    cache_policy=NO_CACHE,
    **IO_RETRIES,
)
def boilerplate_range_task(
    ctx: dict[str, Any], rng: int, ranges: int, docs_total: int | None
) -> dict[str, Any]:
    """The boilerplate lines of one range of the line hashes, read from every part's counts (``docs_total``: the
    corpus's documents, from the count units' results; None: read from their stats)."""
    return hand_over(steps.boilerplate_range, ctx, rng, ranges, docs_total)


@task(name="exact-resolve", task_run_name="exact-dedup: resolve", cache_policy=NO_CACHE)
def exact_resolve_task(
    ctx: dict[str, Any], num_parts: int, _wait: list[Any], checked: bool = False
) -> dict[str, Any]:
    """Exact duplicates across the corpus (``checked``: every part's hash unit came back to the flow)."""
    return hand_over(steps.exact_resolve, ctx, num_parts, _wait, checked)


@task(name="exact-range", task_run_name="exact-dedup: hash range {rng}", cache_policy=NO_CACHE, **IO_RETRIES)
def exact_range_task(ctx: dict[str, Any], rng: int, ranges: int, checked: bool) -> dict[str, Any]:
    """The exact duplicates of one range of the hashes, read from every part's hashes (``checked``: as above)."""
    return hand_over(steps.exact_range, ctx, rng, ranges, checked)


@task(
    name="exact-drop-lists",
    task_run_name=run_names.parts("exact-dedup: drop lists"),
    cache_policy=NO_CACHE,
    **IO_RETRIES,
)
def exact_drops_task(ctx: dict[str, Any], indices: list[int], ranges: int) -> dict[str, Any]:
    """The drop lists of a run of parts, from every hash range's rows."""
    return hand_over(steps.exact_drops, ctx, indices, ranges)


@task(name="near-plan", task_run_name="near-dedup: plan", cache_policy=NO_CACHE)
def near_plan_task(ctx: dict[str, Any], num_parts: int, sig_stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The near-dedup plan (``sig_stats``: every part's signature stats, from the signature units' results)."""
    return hand_over(steps.near_plan, ctx, num_parts, sig_stats)


@task(name="lsh-bands", task_run_name=run_names.parts("near-dedup: bands"), cache_policy=NO_CACHE)
def bands_task(
    ctx: dict[str, Any], indices: list[int], plan: dict[str, Any], from_index: bool = False
) -> list[dict[str, Any]]:
    return hand_over(steps.lsh_bands, ctx, indices, plan, from_index)


@task(
    name="lsh-edges", task_run_name=run_names.parts("near-dedup: edges", "partitions"), cache_policy=NO_CACHE
)
def edges_task(
    ctx: dict[str, Any], partitions: list[int], plan: dict[str, Any], _wait: list[Any]
) -> list[dict[str, Any]]:
    return hand_over(steps.lsh_edges, ctx, partitions, plan, _wait)


@task(name="near-clusters", task_run_name="near-dedup: clusters", cache_policy=NO_CACHE)
def clusters_task(
    ctx: dict[str, Any],
    in_folder: str,
    num_parts: int,
    exact_stats: dict[str, Any] | None,
    sig_stats: list[dict[str, Any]],
) -> dict[str, Any]:
    """Cluster the verified edges (``sig_stats``: every part's signature stats, from the units' results)."""
    return hand_over(steps.near_clusters, ctx, in_folder, num_parts, exact_stats, sig_stats)


@task(name="word-count", task_run_name=run_names.parts("tokenizer: count words"), cache_policy=NO_CACHE)
def word_count_chunk_task(
    ctx: dict[str, Any], indices: list[int], in_folder: str, upstream: list[str], budgets: list[int]
) -> list[dict[str, Any]]:
    """Count the words of each part of the tokenizer's training sample, within its budget."""
    return hand_over(steps.word_count_chunk, ctx, indices, in_folder, upstream, budgets)


@task(name="train-tokenizer", task_run_name="train tokenizer", cache_policy=NO_CACHE)
def tokenizer_task(
    ctx: dict[str, Any],
    in_folder: str,
    num_parts: int,
    _wait: list[Any],
    sizes: list[int] | None = None,
    threads: int = 0,
) -> dict[str, Any]:
    """Train (or load) the tokenizer; returns its key and the sample it was trained on. A trained tokenizer is
    pinned per dataset name and tokenizer config, so a scheduled rebuild keeps its token ids and re-tokenizes
    only the parts that changed. ``sizes``: every input part's bytes, from the units' results. Trained in a
    process of its own with ``threads`` threads (0: the cores where it runs), or, a small sample, in the flow's
    process when the body runs there (the flow's one local worker: no process start for a small training)."""
    in_process = workers_in_process() == 1
    return hand_over(steps.train_tokenizer, ctx, in_folder, num_parts, _wait, sizes, threads, in_process)


@task(name="shard-plan", task_run_name="shards: plan", cache_policy=NO_CACHE, **IO_RETRIES)
def shard_plan_task(
    ctx: dict[str, Any], num_parts: int, tokenizer_key: str, tasks: int, counted: list[dict[str, Any]]
) -> dict[str, Any]:
    """Plan the shards from the per-part token counts (``counted``: the split-count units' stats the tokenize
    pass returned; else they are read from the store): the windows each write task gets, and the work folder
    they write to (named by the plan, so a changed plan never reuses another's shards)."""
    return hand_over(steps.shard_plan, ctx, num_parts, tokenizer_key, tasks, counted)


@task(
    name="write-shards", task_run_name=run_names.windows("shards: write"), cache_policy=NO_CACHE, **IO_RETRIES
)
def write_shards_task(
    ctx: dict[str, Any], windows: list[dict[str, Any]], folder: str, dtype: str
) -> dict[str, Any]:
    """Write a run of each split's shards into the work folder (a unit: a rerun reuses it)."""
    return hand_over(steps.write_shards, ctx, windows, folder, dtype)


@task(
    name="publish-shards",
    task_run_name=run_names.windows("shards: publish"),
    cache_policy=NO_CACHE,
    **IO_RETRIES,
)
def publish_shards_task(
    ctx: dict[str, Any], windows: list[dict[str, Any]], files: list[list[Any]], folder: str, prefix: str
) -> dict[str, Any]:
    """Copy the windows' shard files (``[key, sha256, size]`` each) from the work folder under the dataset's
    prefix, verifying each."""
    return hand_over(steps.publish_shards, ctx, windows, files, folder, prefix)


@task(name="manifest", task_run_name="manifest: make", cache_policy=NO_CACHE, **IO_RETRIES)
def manifest_task(
    ctx: dict[str, Any],
    num_parts: int,
    tokenizer_key: str,
    units: list[dict[str, Any]],
    inputs: list[dict[str, Any]],
    stats: dict[str, dict[str, Any]],
    lineage: dict[str, Any],
) -> dict[str, Any]:
    """The dataset's manifest from the written shards (its id names the prefix they are published under)."""
    return hand_over(steps.make_manifest, ctx, num_parts, tokenizer_key, units, inputs, stats, lineage)


@task(name="publish", task_run_name="manifest: publish", cache_policy=NO_CACHE, **IO_RETRIES)
def commit_task(ctx: dict[str, Any], tokenizer_key: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Upload the tokenizer files and the data card, then write the manifest (create-only) and ``latest.json``: the
    dataset is visible from here on. Returns the manifest URI and whether a published dataset was reused."""
    return hand_over(steps.commit, ctx, tokenizer_key, manifest)


@task(
    name="save-dedup-index",
    task_run_name=run_names.parts("dedup index: save"),
    cache_policy=NO_CACHE,
    **IO_RETRIES,
)
def save_index_chunk_task(ctx: dict[str, Any], indices: list[int], dataset_id: str) -> dict[str, Any]:
    """Persist the kept documents' signatures of these parts, so a later build can drop what this dataset already
    holds (``--set dedup.near.index_uri=<the index URI>``); the flow writes ``index.json`` after every part."""
    return hand_over(steps.save_index_chunk, ctx, indices, dataset_id)


@task(name="dedup-index-meta", task_run_name="dedup index: index.json", cache_policy=NO_CACHE, **IO_RETRIES)
def index_meta_task(ctx: dict[str, Any], num_parts: int, dataset_id: str, docs: int) -> str:
    """``index.json`` of the saved dedup index (its parts are all written): the index is usable from now on."""
    return hand_over(steps.index_meta, ctx, num_parts, dataset_id, docs)
