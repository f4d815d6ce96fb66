"""A rebuild that finds its dataset already published does almost nothing.

The work folder's name (``build_key``) hashes the config, the code version, every input's size and ETag/mtime
and the part plan: a rebuild with the same key reads the same bytes with the same rules, so it would publish
the same dataset id. A published build leaves ``work/<build_key>/published.json`` (the summary it returned and
a digest of the few files its config names besides the inputs: blocklists, bad words, a given tokenizer); a
later build with the same key, the same digest and the dataset's manifest still in place returns that summary
at once, before any worker process starts (``flows/build/flow.py``). Configs that read data we cannot
fingerprint cheaply (decontamination eval sets, a dedup index of an earlier dataset) always take the full path,
where every unit is still reused.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pipeline.corpus_config import CorpusConfig
from pipeline.manifest import MANIFEST_KEY, dataset_prefix
from pipeline.storage import ObjectStore, read_object

RECORD = "published.json"


def config_files(cfg: CorpusConfig) -> list[tuple[str, str]] | None:
    """The small files the config names besides the inputs, as ``(field, uri)``; None when it reads data that
    only a full build checks (eval sets, an earlier dataset's dedup index)."""
    if cfg.decontam.enabled or cfg.dedup.near.index_uri:
        return None
    files = [("clean.url.blocklist", uri) for uri in cfg.clean.url.blocklist] if cfg.clean.url.enabled else []
    if cfg.clean.c4.enabled and cfg.clean.c4.bad_words_file:
        files.append(("clean.c4.bad_words_file", cfg.clean.c4.bad_words_file))
    if cfg.tokenize.tokenizer:
        files.append(("tokenize.tokenizer", cfg.tokenize.tokenizer))
    return files


def files_digest(cfg: CorpusConfig) -> str | None:
    """sha256 of the contents of :func:`config_files` (None: no shortcut for this config)."""
    files = config_files(cfg)
    if files is None:
        return None
    h = hashlib.sha256()
    for field, uri in files:
        h.update(hashlib.sha256(read_object(uri, cfg.s3, field)).digest())
    return h.hexdigest()[:24]


def published_record(store: ObjectStore, work: str, cfg: CorpusConfig) -> dict[str, Any] | None:
    """The record of the build that published this work folder's dataset, when nothing it read has changed
    and its manifest is still in place; else None (build as usual)."""
    key = f"{work}/{RECORD}"
    if not store.exists(key):
        return None
    record = json.loads(store.get_bytes(key))
    digest = files_digest(cfg)
    if digest is None or record.get("files_digest") != digest:
        return None
    summary = record["summary"]
    if not store.exists(f"{dataset_prefix(summary['name'], summary['dataset_id'])}/{MANIFEST_KEY}"):
        return None  # the dataset was deleted since: build it again (its units are reused)
    return dict(record)


def record_published(store: ObjectStore, work: str, cfg: CorpusConfig, summary: dict[str, Any]) -> None:
    """Leave the record a later build with the same inputs and config returns at once (nothing for configs
    :func:`config_files` cannot fingerprint)."""
    digest = files_digest(cfg)
    if digest is not None:
        record = {"files_digest": digest, "summary": summary}
        store.put_bytes(f"{work}/{RECORD}", json.dumps(record).encode())


def unchanged_summary(
    record: dict[str, Any], flow_run_id: str | None, build_key: str, seconds: float
) -> dict[str, Any]:
    """The published build's summary as this run's: every unit reused, this run's lineage and time, and
    ``nothing_changed`` with the run that published it."""
    summary = dict(record["summary"])
    reused = summary.get("reused_units", {})
    summary["reused_units"] = {step: [counts[1], counts[1]] for step, counts in reused.items()}
    summary["nothing_changed"] = {"published_by": summary.get("lineage", {}).get("prefect_flow_run_id")}
    summary["lineage"] = {"prefect_flow_run_id": flow_run_id, "build_key": build_key}
    summary["seconds"] = round(seconds, 2)
    return summary
