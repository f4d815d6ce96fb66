"""Content-addressed reuse of per-part units across builds: what makes a scheduled rebuild incremental.

Every per-part unit of a build has a *unit key*: a hash of its stage, the stage's config, the code version and
the keys of what it reads (for ingest, the part plan with each raw object's name under the input root and the
content digest of its bytes, ``pipeline/ingest/digests.py``: never its URI or mtime). When a unit
with the same key was completed by an earlier build, its files are copied into the new build's folder (a
server-side copy on S3, a hard link locally) instead of being recomputed; the stage runner then sees the
``.done`` marker and skips. Only parts whose inputs changed are reprocessed; global steps (boilerplate merge,
duplicate resolution, clustering) rerun from the cached per-part outputs, which is cheap.

Entries live at ``cache/units/<stage>/<unit_key>.json`` in the store, pointing at the folder/index that holds
the unit. Entries are written after the unit's marker, so an entry never points at a partial unit.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from pipeline import __version__
from pipeline.storage import ObjectStore
from pipeline.units.protocol import CACHE_ENTRY, part_done, part_name, part_unit, unit_stats

log = logging.getLogger(__name__)
CACHE_PREFIX = "cache/units"


def unit_key(stage: str, *parts: Any) -> str:
    """Stable hash of a unit's stage, code version and inputs (JSON-able values)."""
    payload = json.dumps([stage, __version__, *parts], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _entry_key(stage: str, key: str) -> str:
    return f"{CACHE_PREFIX}/{stage}/{key}.json"


def _unit_files(store: ObjectStore, folder: str, index: int) -> list[str]:
    name = part_name(index)
    keys = [i.key for i in store.list(f"{folder}/{name}.")]
    keys += [i.key for i in store.list(f"{folder}/{name}/")]
    keys += [i.key for i in store.list(f"{folder}/quarantine/{name}.")]
    return keys


def restore(store: ObjectStore, stage: str, key: str, folder: str, index: int) -> bool:
    """Copy a cached unit into ``folder``/``index``; True when its files were copied here (False: the unit is
    here already, or there is no intact one to copy). Never copies an object onto itself: an entry naming this
    very unit (a build of the same work folder racing this one recorded it) leaves it to the runner's check."""
    if part_done(store, folder, index):
        return False
    entry_key = _entry_key(stage, key)
    try:
        entry = json.loads(store.get_bytes(entry_key))
    except FileNotFoundError:
        return False
    src_folder, src_index = entry["folder"], int(entry["index"])
    src_unit, dst_unit = part_unit(src_folder, src_index), part_unit(folder, index)
    if src_unit == dst_unit:
        return False
    if unit_stats(store, src_unit) is None:  # incomplete, or damaged (named in a warning): not worth copying
        log.info("unit cache entry %s points at an unfinished or damaged unit; recomputing", entry_key)
        return False
    src_name, dst_name = part_name(src_index), part_name(index)
    src_marker = f"{src_unit}.done"
    for src in _unit_files(store, src_folder, src_index):
        dst = f"{folder}/{src[len(src_folder) + 1 :].replace(src_name, dst_name, 1)}"
        if src != src_marker and src != dst:
            store.copy(src, dst)
    # The copied stats came first: marker last. Its record names outputs relative to the unit, so it holds; it
    # also names the entry it came from, which a reader that finds the bytes damaged drops with the marker.
    marker = json.loads(store.get_bytes(src_marker) or b"{}")
    if isinstance(marker, dict) and "outputs" in marker:
        store.put_bytes(f"{dst_unit}.done", json.dumps({**marker, CACHE_ENTRY: entry_key}, indent=1).encode())
    else:  # a marker from before markers recorded their outputs
        store.copy(src_marker, f"{dst_unit}.done")
    log.info("reused %s unit %s from %s", stage, key[:12], src_folder)
    return True


def record(store: ObjectStore, stage: str, key: str, folder: str, index: int) -> None:
    """Register a completed unit under its key (only after its ``.done`` marker exists)."""
    if not part_done(store, folder, index):
        raise RuntimeError(f"{folder}/{part_name(index)} is not done; refusing to cache it")
    entry = _entry_key(stage, key)
    if not store.exists(entry):
        store.put_bytes(entry, json.dumps({"folder": folder, "index": index}).encode())


def content_hash(store: ObjectStore, key: str) -> str:
    """sha256 of one small object (drop lists, boilerplate sets), part of downstream unit keys."""
    return hashlib.sha256(store.get_bytes(key)).hexdigest()[:24] if store.exists(key) else "none"


# ---------------------------------------------------------------- the key policy: what each stage's unit reads


def _only(section: dict[str, Any], *fields: str) -> dict[str, Any]:
    return {f: section[f] for f in fields}


def _without(section: dict[str, Any], *fields: str) -> dict[str, Any]:
    return {k: v for k, v in section.items() if k not in fields}


def unit_config(stage: str, config: dict[str, Any]) -> dict[str, Any]:
    """The config fields a per-part step reads, and nothing else: a unit's key holds exactly these, so changing
    any other field (the near-dedup threshold, the boilerplate frequency, the shard size) reuses the unit."""
    clean, near, tok = config["clean"], config["dedup"]["near"], config["tokenize"]
    bp = clean["boilerplate"]
    normalise = _without(
        clean, "boilerplate", "quality", "langid", "c4", "pii", "url", "classifier"
    )  # what ingest normalises with
    # a source's per-source overrides change what its documents become; where its inputs lie does not (which
    # objects a unit reads, and their content digests, are in its key already)
    sources = [_without(source, "inputs") for source in config["sources"]]
    if stage == "ingest":
        return {"ingest": config["ingest"], "sources": sources} | normalise
    if stage == "boilerplate":  # hashes the long lines of the normalised text
        return {"min_line_chars": bp["min_line_chars"]}
    if stage == "clean":  # the repeated-line set itself is keyed by its content hash
        keyed = {
            "langid": clean["langid"],
            "quality": clean["quality"],
            "c4": clean["c4"],
            "pii": clean["pii"],
            "url": clean["url"],  # the blocklists themselves are keyed by their content digest
            "boilerplate": _without(bp, "min_docs", "min_fraction"),
            "sources": sources,
        }
        if (
            clean.get("classifier") is not None
        ):  # only when set: the keys of builds without one stay as they were
            # its model keyed by the sha256 pinned at the start; keep_fraction is the filter step's, so variants
            # keeping 50% and 30% share the scored parts
            keyed["classifier"] = _without(clean["classifier"], "keep_fraction")
        return keyed
    if stage == "classifier-filter":  # the cut per source itself is keyed by its content hash
        return {"keep_fraction": clean["classifier"]["keep_fraction"]}
    if stage == "signatures":
        return _only(near, "num_perm", "seed", "ngram", "shingle", "hash", "scheme")
    if stage == "decontam":  # the eval-set index itself is keyed by its content hash
        return config["decontam"]
    if stage == "tokenize":  # the tokenizer itself is keyed by its content hash
        return _only(tok, "eos_token")
    if stage == "split-count":  # which documents are valid: the split rule
        return _only(config["shard"], "valid_fraction", "seed")
    if stage in (
        "exact-hash",
        "exact-filter",
        "near-filter",
        "word-count",
    ):  # word-count: its budget is keyed
        return {}
    raise ValueError(f"no unit config for stage {stage!r}")
