"""Corpus-wide boilerplate lines: lines that recur in many documents (cookie banners, "All rights reserved.",
navigation, licence footers) are removed by the clean stage.

Two steps hand off through files, so each can run on its own worker and be resumed alone:

1. ``run_boilerplate_count_part`` (one per input part): normalise each document exactly as clean does
   (``pipeline.clean.normalize.normalize_text``, so the hashes match what clean will see; a part that ingest
   wrote normalised, as a build's ingest does, is read as it is), hash every stripped line of
   at least ``min_line_chars`` characters with xxhash64 and count the documents that contain it (once per
   document). Writes ``<count_folder>/part-NNNNN.npy``, a hash table (``pipeline.units.hashranges``) of rows (hash,
   document count) sorted by hash, so a merge reads one range of the hashes of every part (a ranged get)
   without the rest; then ``part-NNNNN.stats.json`` and, last, ``part-NNNNN.done``. (Before, a 2 x n array
   beside a ``.fences.npy``: still read, whole.)
2. The merge: sum the counts of all parts and keep the hashes whose document frequency reaches
   ``max(min_docs, ceil(min_fraction * total_docs))``, as one sorted uint64 ``.npy`` array (no pickle) that
   ``run_clean_part`` loads with :func:`load_boilerplate`. In one process, ``merge_boilerplate``; spread over
   workers, ``merge_boilerplate_range`` per range of the hashes (a line's counts are all in one range), each
   leaving its sorted kept hashes in ``<count_folder>/ranges/r-RRRRR.npy``, then
   ``pipeline.units.hashranges.join_ranges`` writes them one after another: the same bytes.

Memory of a merge does not grow with the corpus's lines: a range is read in runs of fences of at most
``budget_bytes`` (16 bytes per distinct (part, line) pair), from every part's table by a ranged get; the rows
that came with the parts' heads are kept only up to ``budget_bytes`` in all. Per part, only the range's fences
are held. Only the kept hashes (the boilerplate set, small) add up.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from pipeline.clean import normalize
from pipeline.clean.config import CleanConfig
from pipeline.clean.normalize import line_hash, normalize_text
from pipeline.records import Record, iter_part_batches
from pipeline.storage import ObjectStore
from pipeline.units.hashranges import (
    LAST_HASH,
    RangeReader,
    fence_bounds,
    fence_of,
    hash_range,
    put_table,
    range_key,
)
from pipeline.units.protocol import (
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
    put_table(store, f"{unit}.npy", np.ascontiguousarray(array.T))
    return finish_unit(store, unit, stats)


def boilerplate_threshold(total_docs: int, cfg: CleanConfig) -> int:
    return max(cfg.boilerplate.min_docs, math.ceil(cfg.boilerplate.min_fraction * total_docs))


MERGE_BUDGET_BYTES = 64 * 1024 * 1024


def _legacy_rows(array: np.ndarray) -> np.ndarray:
    """The rows (hash, documents) of a count array of the older layout (2 x n, sorted by hash)."""
    return np.ascontiguousarray(array.T)


def total_docs(store: ObjectStore, count_folder: str, num_parts: int) -> int:
    """The documents of every counted part, from their units' stats (each unit must be done)."""

    def docs(index: int) -> int:
        return done_stats_or_fail(store, part_unit(count_folder, index), "run_boilerplate_count_part").docs_in

    return sum(store.map(docs, range(num_parts)))


def kept_lines(
    store: ObjectStore,
    count_folder: str,
    num_parts: int,
    threshold: int,
    bounds: tuple[np.uint64, np.uint64],
    budget_bytes: int = MERGE_BUDGET_BYTES,
) -> np.ndarray:
    """The sorted line hashes in ``bounds`` (inclusive) whose document count over every part reaches ``threshold``.

    Every part's table is opened by its head (the fences of the range only), then read a run of fences at a time,
    each run at most ``budget_bytes`` of (hash, count) pairs over all parts (one fence at least, whatever its size).
    """
    lo, hi = bounds
    # Of the rows that come with the parts' heads, each keeps at most its share of the budget.
    share = budget_bytes // max(num_parts, 1)
    readers = store.map(
        lambda i: RangeReader(store, f"{part_unit(count_folder, i)}.npy", lo, hi, _legacy_rows, share),
        range(num_parts),
    )
    if not readers:
        return np.zeros(0, np.uint64)
    sizes, first = np.sum([r.fence_sizes() for r in readers], axis=0), fence_of(lo)
    kept = []
    for a, b in packed_ranges((sizes * 16).tolist(), budget_bytes):
        run = functools.partial(RangeReader.read, bounds=fence_bounds(first + a, first + b, lo, hi))
        merged = np.concatenate(store.map(run, readers))
        hashes, inverse = np.unique(merged[:, 0], return_inverse=True)
        docs = np.bincount(inverse.ravel(), weights=merged[:, 1], minlength=len(hashes))
        kept.append(hashes[docs >= threshold])
        del merged, hashes, inverse, docs
    return np.concatenate(kept).astype(np.uint64)


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
    ``docs``: every part's document count when the caller has them, else read from the parts' stats.

    Idempotent: when ``out_key`` exists it is not recomputed.
    """
    if store.exists(out_key):
        return len(get_npy(store, out_key))
    total = sum(docs) if len(docs) == num_parts else total_docs(store, count_folder, num_parts)
    threshold = boilerplate_threshold(total, cfg)
    keep = kept_lines(store, count_folder, num_parts, threshold, (np.uint64(0), LAST_HASH), budget_bytes)
    put_npy(store, out_key, keep)
    return len(keep)


def merge_boilerplate_range(
    store: ObjectStore,
    count_folder: str,
    num_parts: int,
    cfg: CleanConfig,
    rng: int,
    ranges: int,
    docs_total: int | None = None,
    budget_bytes: int = MERGE_BUDGET_BYTES,
) -> int:
    """The boilerplate lines of range ``rng`` of ``ranges`` of the hashes, sorted, at ``range_key(count_folder,
    rng)`` (``pipeline.units.hashranges.join_ranges`` puts the ranges together); returns how many. ``docs_total``: the
    corpus's document count when the caller has it (the threshold needs it), else read from the parts' stats.
    A rerun of a done range reads its result."""
    key = range_key(count_folder, rng)
    if store.exists(key):
        return len(get_npy(store, key))
    total = docs_total if docs_total is not None else total_docs(store, count_folder, num_parts)
    threshold = boilerplate_threshold(total, cfg)
    keep = kept_lines(store, count_folder, num_parts, threshold, hash_range(rng, ranges), budget_bytes)
    put_npy(store, key, keep)
    return len(keep)


def load_boilerplate(store: ObjectStore, key: str) -> frozenset[int]:
    array = get_npy(store, key)
    if array.dtype != np.uint64 or array.ndim != 1:
        raise ValueError(f"{store.uri_of(key)} is not a 1-d uint64 boilerplate hash array")
    boilerplate = frozenset(array.tolist())
    if bool(np.all(array[1:] > array[:-1])):  # as the merge writes it: the compiled removal's array as it is
        normalize.remember_sorted_keys(boilerplate, array)
    return boilerplate
