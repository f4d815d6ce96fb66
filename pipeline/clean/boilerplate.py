"""Corpus-wide boilerplate lines: lines that recur in many documents (cookie banners, "All rights reserved.",
navigation, licence footers) are removed by the clean stage.

Two steps hand off through files, so each can run on its own worker and be resumed alone:

1. ``run_boilerplate_count_part`` (one per input part): normalise each document exactly as clean does
   (``pipeline.clean.normalize.normalize_text``, so the hashes match what clean will see; a part that ingest
   wrote normalised, as a build's ingest does, is read as it is), hash every stripped line of
   at least ``min_line_chars`` characters with xxhash64 and count the documents that contain it (once per
   document). Writes ``<count_folder>/part-NNNNN.npy`` (a 2 x n uint64 array: sorted hashes, document
   counts), ``part-NNNNN.stats.json`` and, last, ``part-NNNNN.done``.
   Beside it, ``part-NNNNN.fences.npy``: where each of :data:`FENCES` equal ranges of the hash space starts
   in the sorted array, so a merge can read one range of every part (a ranged get) without the rest.
2. ``merge_boilerplate`` (global): sum the counts of all parts and keep the hashes whose document frequency
   reaches ``max(min_docs, ceil(min_fraction * total_docs))``. Writes one sorted uint64 ``.npy`` array (no
   pickle) at ``out_key``. ``run_clean_part`` loads it with :func:`load_boilerplate`.

Memory of the merge does not grow with the corpus: it runs one hash range at a time, as many ranges as it
takes to keep each under ``budget_bytes`` (16 bytes per distinct (part, line) pair in the range), reading
that range of every part's array by its fences. Only the kept hashes (the boilerplate set, small) add up. On a
remote store (S3), where each of those reads would be a round trip, each part's arrays are downloaded once into
a local scratch folder and the ranges read from there.
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from pipeline.clean import normalize
from pipeline.clean.config import CleanConfig
from pipeline.clean.normalize import line_hash, normalize_text
from pipeline.records import Record, iter_part_batches
from pipeline.storage import FileStore, ObjectStore
from pipeline.units import (
    StageStats,
    done_stats_or_fail,
    finish_unit,
    get_npy,
    packed_ranges,
    part_unit,
    put_npy,
    read_part_stats,
    unit_stats,
)


def doc_line_hashes(text: str, min_line_chars: int) -> set[int]:
    """The distinct line hashes of one normalised document (lines shorter than the minimum are skipped)."""
    return {line_hash(line) for line in text.split("\n") if len(line.strip()) >= min_line_chars}


def doc_line_keys(text: str, min_line_chars: int) -> bytes:
    """:func:`doc_line_hashes` as sorted native uint64 bytes: compiled where built (``line_hashes`` of
    ``pipeline/clean/_lines.c``, the same keys: tested), else (and for a text with a lone surrogate) from the
    Python set."""
    kernel = normalize.lines_kernel
    if kernel is not None and (keys := kernel.line_hashes(text, min_line_chars)) is not None:
        return keys
    return np.array(sorted(doc_line_hashes(text, min_line_chars)), dtype=np.uint64).tobytes()


def count_lines_part(records: Iterable[Record], cfg: CleanConfig, normalized: bool = False) -> dict[int, int]:
    """xxhash64 of stripped line -> number of documents containing it (counted once per document).
    ``normalized``: the texts are already normalised with ``cfg`` (a build's ingest does it)."""
    hashes, docs = _count_array([_part_keys(records, cfg, normalized)])
    return dict(zip(hashes.tolist(), docs.tolist(), strict=True))


def _part_keys(records: Iterable[Record], cfg: CleanConfig, normalized: bool) -> bytes:
    scratch: Counter[str] = Counter()
    texts = (rec.text if normalized else normalize_text(rec.text, cfg, scratch) for rec in records)
    return _keys(texts, cfg.boilerplate.min_line_chars)


def _keys(texts: Iterable[str], min_chars: int) -> bytes:
    """Every document's distinct line keys, one document after another."""
    return b"".join(doc_line_keys(text, min_chars) for text in texts)


def _count_array(keys: list[bytes]) -> np.ndarray:
    """A 2 x n uint64 array from documents' distinct keys: row 0 the sorted hashes, row 1 how many documents
    hold each."""
    hashes, docs = np.unique(np.frombuffer(b"".join(keys), dtype=np.uint64), return_counts=True)
    return np.stack([hashes, docs.astype(np.uint64)])


def input_normalized(store: ObjectStore, in_folder: str, index: int) -> bool:
    """Whether ingest wrote the part ``index`` of ``in_folder`` normalised (``run_ingest_part(normalize=...)``)."""
    return bool(read_part_stats(store, in_folder, index).extra.get("normalized_parts"))


def counts_to_array(counts: dict[int, int]) -> np.ndarray:
    """A 2 x n uint64 array: row 0 the sorted hashes, row 1 their document counts."""
    hashes = np.fromiter(counts.keys(), dtype=np.uint64, count=len(counts))
    docs = np.fromiter(counts.values(), dtype=np.uint64, count=len(counts))
    order = np.argsort(hashes, kind="stable")
    return np.stack([hashes[order], docs[order]])


def run_boilerplate_count_part(
    store: ObjectStore,
    in_folder: str,
    out_folder: str,
    index: int,
    cfg: CleanConfig,
    texts: Sequence[str] | None = None,
) -> StageStats:
    """Count the line document-frequencies of one input part; a rerun of a done part reads its stats.

    ``texts``: the part's normalised texts, in order, when the caller has them in memory (a build's ingest task
    keeps what it just wrote): counted without reading the part back from the store."""
    unit = part_unit(out_folder, index)
    if (done := unit_stats(store, unit)) is not None:
        return done
    stats = StageStats(stage="boilerplate_count")
    if texts is not None:
        keys = [_keys(texts, cfg.boilerplate.min_line_chars)]
        stats.docs_in = len(texts)
    else:
        keys, normalized = [], input_normalized(store, in_folder, index)
        for batch in iter_part_batches(store, in_folder, index):
            stats.docs_in += len(batch)
            keys.append(_part_keys(batch, cfg, normalized))
    stats.docs_out = stats.docs_in
    array = _count_array(keys)
    stats.extra = {"distinct_lines": array.shape[1]}
    put_npy(store, f"{unit}.npy", array)
    put_npy(store, f"{unit}.fences.npy", fences_of(array[0]))
    return finish_unit(store, unit, stats)


def boilerplate_threshold(total_docs: int, cfg: CleanConfig) -> int:
    return max(cfg.boilerplate.min_docs, math.ceil(cfg.boilerplate.min_fraction * total_docs))


FENCE_BITS = 8
FENCES = 1 << FENCE_BITS  # equal ranges of the 64-bit hash space; a merge range is a run of them
MERGE_BUDGET_BYTES = 64 * 1024 * 1024


def fences_of(sorted_hashes: np.ndarray) -> np.ndarray:
    """Positions where each of the FENCES hash ranges starts in ``sorted_hashes``, plus its length (int64)."""
    bounds = np.arange(FENCES, dtype=np.uint64) << np.uint64(64 - FENCE_BITS)
    return np.append(np.searchsorted(sorted_hashes, bounds), len(sorted_hashes)).astype(np.int64)


class _PartCounts:
    """One part's sorted (hash, documents) array in the store, read one fence range at a time."""

    def __init__(self, store: ObjectStore, folder: str, index: int) -> None:
        unit = part_unit(folder, index)
        self.store, self.key, fences_key = store, f"{unit}.npy", f"{unit}.fences.npy"
        self.whole: np.ndarray | None = None
        try:
            self.fences = get_npy(store, fences_key)
        except FileNotFoundError:  # counted by an older version: no fences, read the whole (small) array once
            self.whole = get_npy(store, self.key)
            self.fences = fences_of(self.whole[0])
        else:
            head = store.get_range(self.key, 0, 256)  # the .npy header: magic, version, length, dict
            self.offset = 10 + int.from_bytes(head[8:10], "little")

    def size(self, lo: int, hi: int) -> int:
        return int(self.fences[hi] - self.fences[lo])

    def slice(self, lo: int, hi: int) -> np.ndarray:
        a, b, n = int(self.fences[lo]), int(self.fences[hi]), int(self.fences[-1])
        if self.whole is not None:
            return self.whole[:, a:b]
        if a == b:
            return np.zeros((2, 0), np.uint64)
        rows = [self.store.get_range(self.key, self.offset + 8 * (r * n + a), 8 * (b - a)) for r in (0, 1)]
        return np.stack([np.frombuffer(r, dtype="<u8") for r in rows])


def merge_ranges(parts: list[_PartCounts], budget_bytes: int) -> list[tuple[int, int]]:
    """Consecutive fence ranges, each holding at most ``budget_bytes`` of (hash, count) pairs (one fence
    range at least, whatever its size)."""
    return packed_ranges([sum(p.size(f, f + 1) for p in parts) * 16 for f in range(FENCES)], budget_bytes)


def merge_boilerplate(
    store: ObjectStore,
    count_folder: str,
    num_parts: int,
    cfg: CleanConfig,
    out_key: str,
    budget_bytes: int = MERGE_BUDGET_BYTES,
    docs: Sequence[int] = (),
) -> int:
    """Sum the per-part counts, write the sorted hashes of boilerplate lines to ``out_key``; returns how many.
    ``docs``: every part's document count when the caller has them (a build's flow), else read from the
    parts' stats.

    Idempotent: when ``out_key`` exists it is not recomputed.
    """
    if store.exists(out_key):
        return len(get_npy(store, out_key))
    if store.io_threads <= 1:  # a local store: each range of each part is a read at an offset
        return _merge(store, None, count_folder, num_parts, cfg, out_key, budget_bytes, docs)
    # A remote store: every range of every part would be a round trip of its own (two per part and range,
    # hundreds of ranges at 100 GB), so each part's arrays are downloaded once and the ranges read locally.
    with tempfile.TemporaryDirectory(prefix="pileworks-boilerplate-") as tmp:
        return _merge(store, Path(tmp), count_folder, num_parts, cfg, out_key, budget_bytes, docs)


def _merge(
    store: ObjectStore,
    scratch: Path | None,
    count_folder: str,
    num_parts: int,
    cfg: CleanConfig,
    out_key: str,
    budget_bytes: int,
    known_docs: Sequence[int],
) -> int:
    """The merge, reading the parts' count arrays from ``store``, or from a copy in the local ``scratch``."""
    arrays = FileStore(scratch) if scratch else store

    def open_part(index: int) -> tuple[int, _PartCounts]:
        unit = part_unit(count_folder, index)
        if len(known_docs) == num_parts:
            docs = known_docs[index]
        else:
            docs = done_stats_or_fail(store, unit, "run_boilerplate_count_part").docs_in
        if scratch:  # a scratch copy: plain writes, no atomic rename or fsync
            for key in (f"{unit}.npy", f"{unit}.fences.npy"):
                try:
                    data = store.get_bytes(key)
                except FileNotFoundError:
                    if key.endswith(".fences.npy"):
                        continue  # counted by an older version: no fences
                    raise
                path = scratch / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        return docs, _PartCounts(arrays, count_folder, index)

    opened = store.map(open_part, range(num_parts))
    parts = [p for _, p in opened]
    threshold = boilerplate_threshold(sum(docs for docs, _ in opened), cfg)
    kept = []
    for lo, hi in merge_ranges(parts, budget_bytes):
        slices = arrays.map(functools.partial(_PartCounts.slice, lo=lo, hi=hi), parts)
        merged = np.concatenate(slices, axis=1) if parts else np.zeros((2, 0), np.uint64)
        hashes, inverse = np.unique(merged[0], return_inverse=True)
        docs = np.bincount(inverse.ravel(), weights=merged[1], minlength=len(hashes))
        kept.append(hashes[docs >= threshold])
        del slices, merged, hashes, inverse, docs
    keep = np.concatenate(kept) if kept else np.zeros(0, np.uint64)
    put_npy(store, out_key, keep.astype(np.uint64))
    return len(keep)


def load_boilerplate(store: ObjectStore, key: str) -> frozenset[int]:
    array = get_npy(store, key)
    if array.dtype != np.uint64 or array.ndim != 1:
        raise ValueError(f"{store.uri_of(key)} is not a 1-d uint64 boilerplate hash array")
    boilerplate = frozenset(array.tolist())
    if bool(np.all(array[1:] > array[:-1])):  # as the merge writes it: the compiled removal's array as it is
        normalize.remember_sorted_keys(boilerplate, array)
    return boilerplate
