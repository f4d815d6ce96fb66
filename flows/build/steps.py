"""The bodies of ``build_corpus``'s tasks, as plain functions: small serialisable arguments in (a
:class:`BuildContext` dict and a part index), JSON stats and unit keys out; the data stays in the store under
``work/<build_key>/``.

No Prefect here: ``flows/build/tasks.py`` wraps each in a Prefect task that hands the call to a worker process
(``flows/runtime/workers.py``), which imports only this module and the stages (forked, already loaded). Per-part
steps go through :func:`flows.build.context.run_unit`, which restores a unit from an earlier build when its key
matches (``pipeline/units/cache.py``) and names the stage and part when it fails. Messages go to :data:`log`, which
the task wrapper re-emits in its task run's log.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from flows.build.context import BuildContext, build_context, run_unit, stage_errors
from flows.build.inputs import list_and_plan, located_config, take_listing
from flows.build.tokenizer_process import train_where_cheapest
from flows.runtime import profile
from pipeline import decontam
from pipeline.dataset import publish
from pipeline.dataset.manifest import (
    DatasetConflictError,
    Manifest,
    copy_verified,
    point_latest,
)
from pipeline.dedup import candidates, clusters, exact, near, signatures
from pipeline.ingest import config as ingest_config
from pipeline.ingest import stage as ingest
from pipeline.sources import mixture_from_runs
from pipeline.storage import ObjectStore
from pipeline.tokenize import stage as tokenize
from pipeline.tokenize import word_counts
from pipeline.units import cache as unitcache
from pipeline.units.protocol import StageStats, mark_stage_success, merged_stats, part_name

# Its records reach the task run's log through the task wrapper (flows/runtime/workers.py), not twice.
log = logging.getLogger(__name__)
log.setLevel(logging.INFO)
log.propagate = False


def _unit_key(c: BuildContext, stage: str, upstream: str, *inputs: Any) -> str:
    return unitcache.unit_key(stage, upstream, unitcache.unit_config(stage, c.config), *inputs)


def plan_inputs(config: dict[str, Any]) -> dict[str, Any]:
    """List the raw objects with their fingerprints and pack them into parts of similar byte size."""
    with stage_errors("plan-inputs"), profile.measure("plan-inputs"):
        return take_listing(config) or list_and_plan(config)


# ---------------------------------------------------------------- chunk tasks: a pass over a run of parts
#
# One task per run of parts and pass, each step of a part still its own cached unit (``_unit``). A chunk
# task returns one dict per part: step name -> the unit's stats, key, reuse flag and profile.


class _Written:
    """The ingest normaliser that also keeps each text it returns: the part's texts, for its line count."""

    def __init__(self, normalize: Callable[[str, Counter[str]], str]) -> None:
        self.normalize = normalize
        self.texts: list[str] = []

    def __call__(self, text: str, counts: Counter[str]) -> str:
        text = self.normalize(text, counts)
        self.texts.append(text)
        return text


def ingest_chunk(ctx: dict[str, Any], plans: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    """Ingest each part (its text normalised as the clean config says, once for the count and clean), then count
    its lines for the corpus-wide boilerplate set."""
    from pipeline.clean import boilerplate  # the clean rules (ftfy, kernels: 0.3 CPU-s) load where they run
    from pipeline.clean.normalize import normalizer

    c = build_context(ctx)
    store, cfg, out = c.store(), c.cfg, []
    ing, bp = c.folder("ingest"), c.folder("boilerplate")
    for plan, key in zip(plans, keys, strict=True):
        part, written = ingest_config.PartPlan.from_json(plan), _Written(normalizer(cfg.clean))
        units = {
            "ingest": run_unit(
                store,
                "ingest",
                key,
                ing,
                part.index,
                partial(
                    ingest.run_ingest_part,
                    out_folder=ing,
                    plan=part,
                    cfg=cfg.ingest,
                    s3=cfg.s3,
                    sources=cfg.resolved_sources(),
                    normalize=written,
                ),
            )
        }
        # the texts ingest just wrote, unless the part was already done (restored or resumed: nothing passed by)
        texts = written.texts if len(written.texts) == units["ingest"]["stats"]["docs_out"] else None
        units["boilerplate"] = run_unit(
            store,
            "boilerplate",
            _unit_key(c, "boilerplate", key),
            bp,
            part.index,
            partial(
                boilerplate.run_boilerplate_count_part,
                in_folder=ing,
                out_folder=bp,
                index=part.index,
                cfg=cfg.clean,
                texts=texts,
            ),
        )
        out.append(units)
    return out


def clean_chunk(
    ctx: dict[str, Any], indices: list[int], upstream: list[str], boilerplate_key: str
) -> list[dict[str, Any]]:
    """Clean each part (boilerplate lines out, quality filters), then hash its documents for exact dedup. With a
    classifier's ``keep_fraction``, clean writes the scored parts and :func:`classifier_filter_chunk_task` the
    filtered parts, then the hashes."""
    from pipeline.clean import stage as clean
    from pipeline.clean.c4 import load_bad_words
    from pipeline.clean.url import load_url_rules

    c = build_context(ctx)
    store, cfg, out = c.store(), c.cfg, []
    ranked = cfg.clean.classifier is not None and cfg.clean.classifier.keep_fraction is not None
    clean_folder = c.folder("scored" if ranked else "clean")
    bp = boilerplate_key if cfg.clean.boilerplate.enabled else None
    bp_hash = unitcache.content_hash(store, boilerplate_key)
    bad_words = load_bad_words(cfg.clean.c4.bad_words_file, cfg.s3) if cfg.clean.c4.enabled else None
    url_rules = load_url_rules(cfg.clean.url, cfg.s3)  # its content is in the key: a new list redoes clean
    digests = [rules.digest for rules in (bad_words, url_rules) if rules is not None]
    for index, up in zip(indices, upstream, strict=True):
        key = _unit_key(c, "clean", up, bp_hash, *digests)
        units = {
            "clean": run_unit(
                store,
                "clean",
                key,
                clean_folder,
                index,
                partial(
                    clean.run_clean_part,
                    in_folder=c.folder("ingest"),
                    out_folder=clean_folder,
                    index=index,
                    cfg=cfg.clean,
                    boilerplate_key=bp,
                    sources=cfg.resolved_sources(),
                ),
            )
        }
        if cfg.dedup.exact.enabled and not ranked:
            units["exact-hash"] = _exact_hash_unit(c, store, key, index)
        out.append(units)
    return out


def _exact_hash_unit(c: BuildContext, store: ObjectStore, upstream: str, index: int) -> dict[str, Any]:
    return run_unit(
        store,
        "exact-hash",
        _unit_key(c, "exact-hash", upstream),
        c.folder("exact/hash"),
        index,
        partial(
            exact.run_exact_hash_part,
            in_folder=c.folder("clean"),
            hash_folder=c.folder("exact/hash"),
            index=index,
        ),
    )


def classifier_cuts(ctx: dict[str, Any], num_parts: int) -> str:
    """The global step of ``keep_fraction``: each source's cut over the scores of every scored part."""
    from pipeline.clean.scores import write_cuts

    c = build_context(ctx)
    keep = c.cfg.clean.classifier.keep_fraction if c.cfg.clean.classifier else None
    if keep is None:
        raise ValueError("classifier-cuts runs only for clean.classifier.keep_fraction")
    with stage_errors("classifier-cuts"), profile.measure("classifier-cuts"):
        return write_cuts(c.store(), c.folder("scored"), num_parts, keep, c.folder("classifier/cuts.json"))


def classifier_filter_chunk(
    ctx: dict[str, Any], indices: list[int], upstream: list[str], cuts_key: str
) -> list[dict[str, Any]]:
    """Keep each scored part's documents above their source's cut (``classifier_low`` for the others), then hash
    them for exact dedup."""
    from pipeline.clean.scores import run_classifier_filter_part

    c = build_context(ctx)
    store, cfg, out = c.store(), c.cfg, []
    cuts_hash = unitcache.content_hash(store, cuts_key)
    for index, up in zip(indices, upstream, strict=True):
        key = _unit_key(c, "classifier-filter", up, cuts_hash)
        run = partial(
            run_classifier_filter_part,
            in_folder=c.folder("scored"),
            out_folder=c.folder("clean"),
            index=index,
            cuts_key=cuts_key,
        )
        units = {"classifier": run_unit(store, "classifier", key, c.folder("clean"), index, run)}
        if cfg.dedup.exact.enabled:
            units["exact-hash"] = _exact_hash_unit(c, store, key, index)
        out.append(units)
    return out


def signatures_chunk(
    ctx: dict[str, Any], indices: list[int], upstream: list[str], _wait: Any
) -> list[dict[str, Any]]:
    """Drop each part's exact duplicates (when enabled), then MinHash its documents (when near dedup is on)."""
    c = build_context(ctx)
    store, cfg, out = c.store(), c.cfg, []
    for index, up in zip(indices, upstream, strict=True):
        units, folder = {}, c.folder("clean")
        if cfg.dedup.exact.enabled:
            drop = unitcache.content_hash(store, f"{c.folder('exact/drop')}/{part_name(index)}.npy")
            units["exact dedup"] = run_unit(
                store,
                "exact dedup",
                _unit_key(c, "exact-filter", up, drop),
                c.folder("exact/out"),
                index,
                partial(
                    exact.run_exact_filter_part,
                    in_folder=folder,
                    out_folder=c.folder("exact/out"),
                    index=index,
                    drop_folder=c.folder("exact/drop"),
                ),
            )
            up, folder = units["exact dedup"]["key"], c.folder("exact/out")
        if cfg.dedup.near.enabled:
            units["signatures"] = run_unit(
                store,
                "signatures",
                _unit_key(c, "signatures", up),
                c.folder("near/signatures"),
                index,
                partial(
                    signatures.run_signatures_part,
                    in_folder=folder,
                    out_folder=c.folder("near/signatures"),
                    index=index,
                    cfg=cfg.dedup.near,
                ),
            )
        out.append(units)
    return out


def one_step_chunk(
    c: BuildContext,
    store: ObjectStore,
    step: str,
    key_stage: str,
    indices: list[int],
    upstream: list[str],
    out_folder: str,
    run_part: Callable[..., StageStats],
    extra: Callable[[ObjectStore, int], str],
) -> list[dict[str, Any]]:
    """A chunk task of one step per part: each part's unit keyed by its upstream key and ``extra(store, index)`` (the
    content hash of what the step reads besides its part), run as ``run_part(store, index=...)``."""
    return [
        {
            step: run_unit(
                store,
                step,
                _unit_key(c, key_stage, up, extra(store, index)),
                out_folder,
                index,
                partial(run_part, index=index),
            )
        }
        for index, up in zip(indices, upstream, strict=True)
    ]


def near_filter_chunk(
    ctx: dict[str, Any], indices: list[int], in_folder: str, upstream: list[str], _wait: Any
) -> list[dict[str, Any]]:
    c = build_context(ctx)
    drops = c.folder("near/clusters/drop")
    return one_step_chunk(
        c,
        c.store(),
        "near dedup",
        "near-filter",
        indices,
        upstream,
        c.folder("dedup"),
        partial(
            near.run_near_filter_part,
            in_folder=in_folder,
            out_folder=c.folder("dedup"),
            clusters_folder=c.folder("near/clusters"),
        ),
        lambda store, index: unitcache.content_hash(store, f"{drops}/{part_name(index)}.npz"),
    )


def tokenize_chunk(
    ctx: dict[str, Any], indices: list[int], in_folder: str, upstream: list[str], tokenizer_key: str
) -> list[dict[str, Any]]:
    """Tokenize each part, then count its tokens per source and split for the shard plan (so the serial shard
    step only adds up the counts instead of reading every token part twice)."""
    c = build_context(ctx)
    store = c.store()
    tok_hash = unitcache.content_hash(store, tokenizer_key)
    out = one_step_chunk(
        c,
        store,
        "tokenize",
        "tokenize",
        indices,
        upstream,
        c.folder("tokens"),
        partial(
            tokenize.run_tokenize_part,
            in_folder=in_folder,
            out_folder=c.folder("tokens"),
            tokenizer_key=tokenizer_key,
            cfg=c.cfg.tokenize,
        ),
        lambda store, index: tok_hash,
    )
    for index, units in zip(indices, out, strict=True):
        units["split counts"] = run_unit(
            store,
            "split counts",
            _unit_key(c, "split-count", units["tokenize"]["key"]),
            c.folder("split-counts"),
            index,
            partial(
                publish.run_split_count_part,
                token_folder=c.folder("tokens"),
                out_folder=c.folder("split-counts"),
                index=index,
                shard_cfg=c.cfg.shard,
            ),
        )
    return out


def word_count_chunk(
    ctx: dict[str, Any], indices: list[int], in_folder: str, upstream: list[str], budgets: list[int]
) -> list[dict[str, Any]]:
    """Count the words of each part of the tokenizer's training sample, within its budget (the ``counts``
    trainer's per-part step: ``pipeline/tokenize/word_counts.py``)."""
    c = build_context(ctx)
    store, folder = c.store(), c.folder("wordcounts")
    return [
        {
            "word count": run_unit(
                store,
                "word count",
                _unit_key(c, "word-count", up, budget),
                folder,
                index,
                partial(
                    word_counts.run_word_count_part,
                    in_folder=in_folder,
                    out_folder=folder,
                    index=index,
                    budget=budget,
                ),
            )
        }
        for index, up, budget in zip(indices, upstream, budgets, strict=True)
    ]


def boilerplate_range(ctx: dict[str, Any], rng: int, ranges: int, docs_total: int | None) -> dict[str, Any]:
    """The boilerplate lines of one range of the line hashes, read from every part's counts (``docs_total``: the
    corpus's documents, from the count units' results; None: read from their stats)."""
    from pipeline.clean import boilerplate

    records: list[dict[str, Any]] = []
    with stage_errors("boilerplate-merge"), profile.measure("boilerplate-merge", records):
        c = build_context(ctx)
        lines = boilerplate.merge_boilerplate_range(
            c.store(), c.folder("boilerplate"), c.parts, c.cfg.clean, rng, ranges, docs_total
        )
    return {"lines": lines, "profile": records}


def exact_resolve(
    ctx: dict[str, Any], num_parts: int, _wait: list[Any], checked: bool = False
) -> dict[str, Any]:
    """Exact duplicates across the corpus (``checked``: every part's hash unit came back to the flow)."""
    with stage_errors("exact-resolve"), profile.measure("exact-resolve"):
        c = build_context(ctx)
        return exact.resolve_exact_duplicates(
            c.store(), c.folder("exact/hash"), num_parts, c.folder("exact/drop"), checked
        ).to_json()


def exact_range(ctx: dict[str, Any], rng: int, ranges: int, checked: bool) -> dict[str, Any]:
    """The exact duplicates of one range of the hashes, read from every part's hashes (``checked``: as above)."""
    records: list[dict[str, Any]] = []
    with stage_errors("exact-resolve"), profile.measure("exact-resolve", records):
        c = build_context(ctx)
        counts = exact.resolve_hash_range(
            c.store(), c.folder("exact/hash"), c.parts, c.folder("exact/drop"), rng, ranges, checked
        )
    return {"counts": counts, "profile": records}


def exact_drops(ctx: dict[str, Any], indices: list[int], ranges: int) -> dict[str, Any]:
    """The drop lists of a run of parts, from every hash range's rows."""
    records: list[dict[str, Any]] = []
    with stage_errors("exact-resolve"), profile.measure("exact-drop-lists", records):
        c = build_context(ctx)
        exact.write_drop_lists(c.store(), c.folder("exact/drop"), indices, ranges)
    return {"profile": records}


def near_plan(ctx: dict[str, Any], num_parts: int, sig_stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The near-dedup plan (``sig_stats``: every part's signature stats, from the signature units' results)."""
    with stage_errors("near-plan"), profile.measure("near-plan"):
        c = build_context(ctx)
        known = [StageStats.from_json(s) for s in sig_stats]
        return candidates.plan_near_dedup(c.store(), c.folder("near"), num_parts, c.cfg.dedup.near, known)


def lsh_bands(
    ctx: dict[str, Any], indices: list[int], plan: dict[str, Any], from_index: bool = False
) -> list[dict[str, Any]]:
    c = build_context(ctx)
    store, cfg, out = c.store(), c.cfg, []
    for index in indices:
        records: list[dict[str, Any]] = []
        with stage_errors("lsh-bands", index), profile.measure("lsh-bands", records):
            stats = candidates.run_bands_part(
                store, c.folder("near"), index, cfg.dedup.near, plan, from_index=from_index
            )
        out.append({"lsh-bands": {"stats": stats.to_json(), "profile": records}})
    return out


def lsh_edges(
    ctx: dict[str, Any], partitions: list[int], plan: dict[str, Any], _wait: list[Any]
) -> list[dict[str, Any]]:
    c = build_context(ctx)
    store, cfg, out = c.store(), c.cfg, []
    for partition in partitions:
        records: list[dict[str, Any]] = []
        with stage_errors("lsh-edges", partition), profile.measure("lsh-edges", records):
            stats = candidates.run_edges_part(store, c.folder("near"), partition, cfg.dedup.near, plan)
        out.append({"lsh-edges": {"stats": stats.to_json(), "profile": records}})
    return out


def near_clusters(
    ctx: dict[str, Any],
    in_folder: str,
    num_parts: int,
    exact_stats: dict[str, Any] | None,
    sig_stats: list[dict[str, Any]],
) -> dict[str, Any]:
    """Cluster the verified edges (``sig_stats``: every part's signature stats, from the units' results)."""
    with stage_errors("near-clusters"), profile.measure("near-clusters"):
        c = build_context(ctx)
        es = StageStats.from_json(exact_stats) if exact_stats else None
        known = [StageStats.from_json(s) for s in sig_stats]
        return clusters.run_clusters(
            c.store(),
            in_folder,
            c.folder("near"),
            num_parts,
            c.cfg.dedup.near,
            exact_stats=es,
            known_sig_stats=known,
        ).to_json()


# ---------------------------------------------------------------- tokenize and publish


def train_tokenizer(
    ctx: dict[str, Any],
    in_folder: str,
    num_parts: int,
    _wait: list[Any],
    sizes: list[int] | None = None,
    threads: int = 0,
    in_process: bool = False,
) -> dict[str, Any]:
    """Train (or load) the tokenizer; returns its key and the sample it was trained on. A trained tokenizer is
    pinned per dataset name and tokenizer config, so a scheduled rebuild keeps its token ids and re-tokenizes
    only the parts that changed. ``sizes``: every input part's bytes, from the units' results. Training runs in
    a child process of ``threads`` threads (0: this machine's cores), whose CPU counts as this step's, or, a
    small sample, here when this is the flow's one worker (``in_process``; ``flows/build/tokenizer_process.py``)."""
    with stage_errors("train-tokenizer"), profile.measure("train-tokenizer") as measured:
        c = build_context(ctx)
        store, cfg = c.store(), c.cfg
        key, pin = tokenizer_keys(c)
        if (
            cfg.tokenize.tokenizer is None
            and cfg.pin_tokenizer
            and store.exists(pin)
            and not store.exists(key)
        ):
            _copy_tokenizer(store, pin, key)
            log.info("reusing the pinned tokenizer of dataset %s (%s)", cfg.name, store.uri_of(pin))
        if cfg.tokenize.tokenizer is None and not store.exists(key) and cfg.tokenize.trainer == "hf":
            sha = train_where_cheapest(ctx, in_folder, num_parts, key, sizes, threads, measured, in_process)
        else:  # the counts trainer (merged word counts, one thread), or the given or pinned tokenizer: here
            sha = tokenize.run_train_tokenizer(
                store, in_folder, num_parts, key, cfg.tokenize, cfg.s3, sizes, c.folder("wordcounts")
            )
        if cfg.tokenize.tokenizer is None and not store.exists(pin):
            _copy_tokenizer(store, key, pin)
        record = tokenize.sample_record_key(key)
        sample = json.loads(store.get_bytes(record)) if store.exists(record) else {"source": "pinned"}
        log.info(
            "tokenizer %s (sha256 %s), trained on %s",
            key,
            sha[:12],
            {k: v for k, v in sample.items() if k != "sample_parts"},
        )
        return {"key": key, "sample": sample}


def tokenizer_keys(c: BuildContext) -> tuple[str, str]:
    """The build's tokenizer key and where a trained tokenizer is pinned for its dataset name and config."""
    pin = unitcache.unit_key("tokenizer", c.cfg.name, c.config["tokenize"])
    return c.folder("tokenizer.json"), f"cache/tokenizers/{pin}.json"


def counts_to_train(ctx: dict[str, Any]) -> bool:
    """Whether the build ``ctx`` trains its tokenizer with the ``counts`` trainer: none given, none trained by an
    earlier run of its work folder, none pinned for its name (then its word-count pass has work)."""
    c = build_context(ctx)
    store, cfg = c.store(), c.cfg.tokenize
    key, pin = tokenizer_keys(c)
    if cfg.tokenizer is not None or cfg.trainer != "counts" or store.exists(key):
        return False
    return not (c.cfg.pin_tokenizer and store.exists(pin))


def _copy_tokenizer(store: ObjectStore, src: str, dst: str) -> None:
    if store.exists(tokenize.sample_record_key(src)):
        store.copy(tokenize.sample_record_key(src), tokenize.sample_record_key(dst))
    store.copy(src, dst)


def shard_plan(
    ctx: dict[str, Any], num_parts: int, tokenizer_key: str, tasks: int, counted: list[dict[str, Any]]
) -> dict[str, Any]:
    """Plan the shards from the per-part token counts (``counted``: the split-count units' stats the tokenize
    pass returned; else they are read from the store): the windows each write task gets, and the work folder
    they write to (named by the plan, so a changed plan never reuses another's shards)."""
    with stage_errors("shard-plan"), profile.measure("shard-plan"):
        c = build_context(ctx)
        store, cfg = c.store(), c.cfg
        tok = publish.TokenizerFiles.load(
            store.get_bytes(tokenizer_key), cfg.tokenize.eos_token, cfg.tokenize.pad_token
        )
        rule = [cfg.shard.valid_fraction, cfg.shard.seed]
        if len(counted) == num_parts and all(u["extra"].get("split") == rule for u in counted):
            counts = [u["extra"]["source_tokens"] for u in counted]
        else:
            counts = publish.part_counts(
                store, c.folder("tokens"), num_parts, cfg.shard, c.folder("split-counts")
            )
        plan = publish.plan_windows(counts, cfg.shard.target_tokens(tok.dtype), tasks)
        folder = publish.shards_folder(c.work, tok.info().sha256, tok.dtype, cfg.shard, counts)
        return {
            "folder": folder,
            "dtype": tok.dtype.name,
            "tasks": [[w.to_json() for w in ws] for ws in plan],
        }


def write_shards(
    ctx: dict[str, Any], windows: list[dict[str, Any]], folder: str, dtype: str
) -> dict[str, Any]:
    """Write a run of each split's shards into the work folder (a unit: a rerun reuses it)."""
    records: list[dict[str, Any]] = []
    with stage_errors("write-shards"), profile.measure("write-shards", records):
        c = build_context(ctx)
        stats = publish.run_window_unit(
            c.store(),
            c.folder("tokens"),
            folder,
            [publish.Window.from_json(w) for w in windows],
            np.dtype(dtype),
            c.cfg.shard,
        )
    return {"stats": stats.to_json(), "profile": records}


def publish_shards(
    ctx: dict[str, Any], windows: list[dict[str, Any]], files: list[list[Any]], folder: str, prefix: str
) -> dict[str, Any]:
    """Copy the windows' shard files (``[key, sha256, size]`` each) from the work folder under the dataset's
    prefix, verifying each."""
    records: list[dict[str, Any]] = []
    with stage_errors("publish-shards"), profile.measure("publish-shards", records):
        store = build_context(ctx).store()
        for key, sha256, size in files:
            copy_verified(store, f"{folder}/{key}", f"{prefix}/{key}", sha256, size)
    return {"profile": records}


def make_manifest(
    ctx: dict[str, Any],
    num_parts: int,
    tokenizer_key: str,
    units: list[dict[str, Any]],
    inputs: list[dict[str, Any]],
    stats: dict[str, dict[str, Any]],
    lineage: dict[str, Any],
) -> dict[str, Any]:
    """The dataset's manifest from the written shards (its id names the prefix they are published under)."""
    with stage_errors("manifest"), profile.measure("manifest"):
        c = build_context(ctx)
        store, cfg = c.store(), c.cfg
        tok = publish.TokenizerFiles.load(
            store.get_bytes(tokenizer_key), cfg.tokenize.eos_token, cfg.tokenize.pad_token
        )
        written, runs = publish.window_results(units)
        all_stats = dict(stats)
        if "tokenize" not in all_stats:  # a build passes its tokenize pass's merged stats
            all_stats["tokenize"] = merged_stats(store, c.folder("tokens"), num_parts, "tokenize").to_json()
        mixture = mixture_from_runs(written, runs, cfg.resolved_sources())
        config = located_config(cfg, lineage.get("input_root", ""))
        return publish.dataset_manifest(
            cfg.name, tok, written, mixture, all_stats, inputs, config, lineage
        ).to_json()


def commit(ctx: dict[str, Any], tokenizer_key: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Upload the tokenizer files and the data card, then write the manifest (create-only) and ``latest.json``: the
    dataset is visible from here on. Returns ``{"manifest_uri", "reused"}``: ``reused`` is None, or, when the
    dataset id was already published with other metadata, what differs (:func:`reuse_published`)."""
    with stage_errors("publish"), profile.measure("publish"):
        c = build_context(ctx)
        store, cfg = c.store(), c.cfg
        m = Manifest.from_json(manifest)
        tok = publish.TokenizerFiles.load(
            store.get_bytes(tokenizer_key), cfg.tokenize.eos_token, cfg.tokenize.pad_token
        )
        try:
            return {"manifest_uri": publish.commit_dataset(store, m, tok), "reused": None}
        except DatasetConflictError as exc:
            return reuse_published(store, m, exc)


def reuse_published(store: ObjectStore, manifest: Manifest, conflict: DatasetConflictError) -> dict[str, Any]:
    """Same content (the dataset id is a content hash) as a published dataset, other metadata: inputs that changed
    without changing the shards (a document the build drops, touched mtimes). The published dataset is the one to
    use and stays as it is; it becomes ``latest`` again, as a rebuild that found nothing changed makes it."""
    point_latest(store, manifest.name, manifest.dataset_id)
    log.info("dataset %s already published with other metadata: %s", manifest.dataset_id, conflict)
    return {"manifest_uri": conflict.existing_uri, "reused": {"fields_differ": list(conflict.differ)}}


def dedup_index_prefix(name: str, dataset_id: str) -> str:
    """Where a build saves its dedup index: ``indexes/<name>/<dataset id>`` in the build store."""
    return f"indexes/{name}/{dataset_id}"


def save_index_chunk(ctx: dict[str, Any], indices: list[int], dataset_id: str) -> dict[str, Any]:
    """Persist the kept documents' signatures of these parts, so a later build can drop what this dataset already
    holds (``--set dedup.near.index_uri=<the index URI>``); the flow writes ``index.json`` after every part."""
    records: list[dict[str, Any]] = []
    with stage_errors("save-dedup-index"), profile.measure("save-dedup-index", records):
        c = build_context(ctx)
        store = c.store()
        uri = store.uri_of(dedup_index_prefix(c.cfg.name, dataset_id))
        kept = signatures.save_index_parts(store, c.folder("near"), indices, c.cfg.dedup.near, uri)
    return {"kept": kept, "profile": records}


def index_meta(ctx: dict[str, Any], num_parts: int, dataset_id: str, docs: int) -> str:
    """``index.json`` of the saved dedup index (its parts are all written): the index is usable from now on."""
    with stage_errors("save-dedup-index"), profile.measure("save-dedup-index"):
        c = build_context(ctx)
        store = c.store()
        uri = store.uri_of(dedup_index_prefix(c.cfg.name, dataset_id))
        signatures.write_index_meta(store, num_parts, c.cfg.dedup.near, uri, docs)
        return uri


# ---------------------------------------------------------------- decontamination (flows/build/decontam.py)


def decontam_index(ctx: dict[str, Any]) -> str:
    with stage_errors("decontam-index"), profile.measure("decontam-index"):
        c = build_context(ctx)
        key = c.folder("decontam/index.npz")
        index = decontam.build_eval_index(c.store(), key, c.cfg.decontam, s3=c.cfg.s3)
        log.info("decontam: %d n-grams of %s", len(index.hashes), index.texts)
        return key


def decontam_chunk(
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


def decontam_report(ctx: dict[str, Any], num_parts: int, index_key: str, _wait: list[Any]) -> str:
    with stage_errors("decontam-report"), profile.measure("decontam-report"):
        c = build_context(ctx)
        key = c.folder("decontam/report.json")
        decontam.merge_reports(c.store(), c.folder("decontam/out"), num_parts, index_key, key)
        mark_stage_success(c.store(), c.folder("decontam/out"), num_parts)
        return key
