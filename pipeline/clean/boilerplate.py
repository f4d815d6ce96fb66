"""Corpus-wide boilerplate lines: lines that recur in many documents (cookie banners, "All rights reserved.",
navigation, licence footers) are removed by the clean stage.

Two steps hand off through files, so each can run on its own worker and be resumed alone:

1. ``run_boilerplate_count_part`` (one per input part): normalise each document exactly as clean does
   (``pipeline.clean.normalize.normalize_text``, so the hashes match what clean will see), hash every stripped line of
   at least ``min_line_chars`` characters with xxhash64 and count the documents that contain it (once per
   document). Writes ``<count_folder>/part-NNNNN.npy`` (a 2 x n uint64 array: sorted hashes, document
   counts), ``part-NNNNN.stats.json`` and, last, ``part-NNNNN.done``.
2. ``merge_boilerplate`` (global): sum the counts of all parts and keep the hashes whose document frequency
   reaches ``max(min_docs, ceil(min_fraction * total_docs))``. Writes one sorted uint64 ``.npy`` array (no
   pickle) at ``out_key``. ``run_clean_part`` loads it with :func:`load_boilerplate`.

Memory of the merge: 16 bytes per distinct (part, line) pair, as every part's counts are concatenated
before one sort; a corpus with billions of distinct lines would need a hash-partitioned merge.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

from pipeline.clean.config import CleanConfig
from pipeline.clean.normalize import line_hash, normalize_text
from pipeline.records import Record, iter_part_batches
from pipeline.storage import ObjectStore
from pipeline.units import (
    StageStats,
    done_stats_or_fail,
    finish_unit,
    get_npy,
    part_unit,
    put_npy,
    unit_stats,
)


def doc_line_hashes(text: str, min_line_chars: int) -> set[int]:
    """The distinct line hashes of one normalised document (lines shorter than the minimum are skipped)."""
    return {line_hash(line) for line in text.split("\n") if len(line.strip()) >= min_line_chars}


def count_lines_part(records: Iterable[Record], cfg: CleanConfig) -> dict[int, int]:
    """xxhash64 of stripped line -> number of documents containing it (counted once per document)."""
    counts: Counter[int] = Counter()
    scratch: Counter[str] = Counter()
    min_chars = cfg.boilerplate.min_line_chars
    for rec in records:
        counts.update(doc_line_hashes(normalize_text(rec.text, cfg, scratch), min_chars))
    return dict(counts)


def counts_to_array(counts: dict[int, int]) -> np.ndarray:
    """A 2 x n uint64 array: row 0 the sorted hashes, row 1 their document counts."""
    hashes = np.fromiter(counts.keys(), dtype=np.uint64, count=len(counts))
    docs = np.fromiter(counts.values(), dtype=np.uint64, count=len(counts))
    order = np.argsort(hashes, kind="stable")
    return np.stack([hashes[order], docs[order]])


def run_boilerplate_count_part(
    store: ObjectStore, in_folder: str, out_folder: str, index: int, cfg: CleanConfig
) -> StageStats:
    """Count the line document-frequencies of one input part; a rerun of a done part reads its stats."""
    unit = part_unit(out_folder, index)
    if (done := unit_stats(store, unit)) is not None:
        return done
    counts: Counter[int] = Counter()
    stats = StageStats(stage="boilerplate_count")
    for batch in iter_part_batches(store, in_folder, index):
        stats.docs_in += len(batch)
        counts.update(count_lines_part(batch, cfg))
    stats.docs_out = stats.docs_in
    stats.extra = {"distinct_lines": len(counts)}
    put_npy(store, f"{unit}.npy", counts_to_array(counts))
    return finish_unit(store, unit, stats)


def boilerplate_threshold(total_docs: int, cfg: CleanConfig) -> int:
    return max(cfg.boilerplate.min_docs, math.ceil(cfg.boilerplate.min_fraction * total_docs))


def merge_boilerplate(
    store: ObjectStore, count_folder: str, num_parts: int, cfg: CleanConfig, out_key: str
) -> int:
    """Sum the per-part counts, write the sorted hashes of boilerplate lines to ``out_key``; returns how many.

    Idempotent: when ``out_key`` exists it is not recomputed.
    """
    if store.exists(out_key):
        return len(load_boilerplate(store, out_key))
    arrays, total_docs = [], 0
    for index in range(num_parts):
        unit = part_unit(count_folder, index)
        total_docs += done_stats_or_fail(store, unit, "run_boilerplate_count_part").docs_in
        arrays.append(get_npy(store, f"{unit}.npy"))
    merged = np.concatenate(arrays, axis=1) if arrays else np.zeros((2, 0), np.uint64)
    hashes, inverse = np.unique(merged[0], return_inverse=True)
    docs = np.bincount(inverse.ravel(), weights=merged[1], minlength=len(hashes))
    keep = hashes[docs >= boilerplate_threshold(total_docs, cfg)]
    put_npy(store, out_key, keep.astype(np.uint64))
    return len(keep)


def load_boilerplate(store: ObjectStore, key: str) -> frozenset[int]:
    array = get_npy(store, key)
    if array.dtype != np.uint64 or array.ndim != 1:
        raise ValueError(f"{store.uri_of(key)} is not a 1-d uint64 boilerplate hash array")
    return frozenset(array.tolist())
