"""Exact deduplication: documents whose cleaned text is byte-identical; the first one is kept.

"First" is a deterministic order, independent of which worker ran which part or when: the lowest part index,
then the lowest position inside the part. The text is hashed with xxh3_128 (a collision among 10^12
documents has probability ~1e-15).

Three steps hand off through files (keys relative to the store; ``NNNNN`` is the part index):

1. ``run_exact_hash_part`` -> ``<hash_folder>/part-NNNNN.npy``: a hash table (``pipeline.units.hashranges``) of rows
   (high 64 bits, low 64 bits of each record's hash, its position in the part), sorted; then
   ``part-NNNNN.stats.json``; then ``part-NNNNN.done``. (Before, a (n, 2) array of the hashes in part order:
   still read, whole.)
2. ``resolve_exact_duplicates`` (global) -> ``<drop_folder>/part-NNNNN.npy`` for every part: int64 array of
   shape (k, 3), one row per record to drop: (position, part of the kept copy, position of the kept copy),
   sorted by position; then ``<drop_folder>/resolve.stats.json``; then ``<drop_folder>/_SUCCESS``.
3. ``run_exact_filter_part`` -> an ordinary docs part in ``out_folder`` (``pipeline.records.write_part``).

Step 2 also runs spread over workers, with the same drop lists: ``resolve_hash_range`` per range of the hashes'
high 64 bits (every copy of a text has the same hash, so a range holds whole duplicate groups), reading only
that range of every part's table (ranged GETs) -> ``<drop_folder>/ranges/r-RRRRR.npz``; ``write_drop_lists`` per run of parts gathers each part's rows from every
range; ``finish_resolve`` adds up the ranges' counts into the stats and ``_SUCCESS``. No process holds more than
one range of the corpus's hashes.

Every unit is skipped on a rerun when its marker exists.
"""

from __future__ import annotations

import numpy as np
import xxhash

from pipeline.records import Record, iter_part_batches, write_part
from pipeline.sources import tally_document
from pipeline.storage import ObjectStore
from pipeline.units.hashranges import RangeReader, hash_range, put_table, read_table
from pipeline.units.protocol import (
    StageStats,
    done_part_stats,
    finish_folder,
    finish_unit,
    folder_stats,
    get_npy,
    get_npz,
    part_name,
    part_unit,
    put_npy,
    put_npz,
    require_done,
    require_success,
    unit_stats,
)

DROP_REASON = "exact_duplicate"
RESOLVE_STATS = "resolve.stats.json"


def text_hashes(records: list[Record]) -> np.ndarray:
    """(n, 2) uint64: high and low halves of xxh3_128 of each record's UTF-8 text."""
    digests = b"".join(xxhash.xxh3_128_digest(r.text.encode("utf-8", "surrogatepass")) for r in records)
    return np.frombuffer(digests, dtype=">u8").reshape(-1, 2).astype(np.uint64)


def run_exact_hash_part(store: ObjectStore, in_folder: str, hash_folder: str, index: int) -> StageStats:
    """Hash every record of one part (in order); a rerun of a done part reads its stats."""
    unit = part_unit(hash_folder, index)
    if (done := unit_stats(store, unit)) is not None:
        return done
    chunks = [text_hashes(batch) for batch in iter_part_batches(store, in_folder, index)]
    hashes = np.concatenate(chunks) if chunks else np.zeros((0, 2), np.uint64)
    stats = StageStats(stage="exact_hash", docs_in=len(hashes), docs_out=len(hashes))
    put_table(store, f"{unit}.npy", hash_rows(hashes))
    return finish_unit(store, unit, stats)


def hash_rows(hashes: np.ndarray) -> np.ndarray:
    """(n, 3) uint64 rows (high, low, position) of a part's hashes (in part order), sorted: a hash table's rows.
    Also how the older layout (the hashes alone, in part order) is read."""
    rows = np.column_stack([hashes, np.arange(len(hashes), dtype=np.uint64)]).astype(np.uint64)
    return rows[np.lexsort((rows[:, 2], rows[:, 1], rows[:, 0]))]


def part_hashes(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The hashes ((k, 2) uint64) and positions (int64) of a part's table rows."""
    return rows[:, :2], rows[:, 2].astype(np.int64)


def find_duplicates(
    hashes: np.ndarray, parts: np.ndarray, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Indexes (into the inputs) of the duplicates, and for each the index of the copy that is kept.

    Sort by (hash, part, position); inside each run of equal hashes the first row is kept.
    """
    order = np.lexsort((positions, parts, hashes[:, 1], hashes[:, 0]))
    h = hashes[order]
    same_as_prev = np.zeros(len(order), dtype=bool)
    same_as_prev[1:] = (h[1:] == h[:-1]).all(axis=1)
    group_start = np.maximum.accumulate(np.where(same_as_prev, 0, np.arange(len(order))))
    return order[same_as_prev], order[group_start[same_as_prev]]


def resolve_exact_duplicates(
    store: ObjectStore, hash_folder: str, num_parts: int, out_folder: str, checked: bool = False
) -> StageStats:
    """Decide globally which records are exact duplicates; write one drop list per part. ``checked``: the caller
    knows every hash unit is done (a build's flow, from its tasks' results), so their markers are not looked up
    (one call less per part on S3)."""
    if (done := folder_stats(store, out_folder, RESOLVE_STATS)) is not None:
        return done

    def hashes_of(index: int) -> tuple[np.ndarray, np.ndarray]:
        unit = part_unit(hash_folder, index)
        if not checked:
            require_done(store, unit, "run_exact_hash_part")
        return part_hashes(read_table(store, f"{unit}.npy", hash_rows))

    picked = store.map(hashes_of, range(num_parts))
    hashes, parts, positions = _gathered(picked, num_parts)
    dup, kept = find_duplicates(hashes, parts, positions)
    rows = np.stack([parts[dup], positions[dup], parts[kept], positions[kept]], axis=1)
    rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
    bounds = np.searchsorted(rows[:, 0], np.arange(num_parts + 1))  # rows are sorted by part
    store.map(
        lambda i: put_npy(
            store, f"{out_folder}/{part_name(i)}.npy", rows[bounds[i] : bounds[i + 1], 1:].copy()
        ),
        range(num_parts),
    )
    stats = StageStats(stage="exact_dedup", docs_in=len(hashes), docs_out=len(hashes) - len(dup))
    stats.drop(DROP_REASON, len(dup))
    stats.extra = {"duplicate_groups": len(np.unique(kept)), "parts": num_parts}
    return finish_folder(store, out_folder, stats, RESOLVE_STATS)


def _gathered(
    picked: list[tuple[np.ndarray, np.ndarray]], num_parts: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every part's (hashes, positions) together, with the part of each row."""
    hashes = np.concatenate([h for h, _ in picked]) if picked else np.zeros((0, 2), np.uint64)
    parts = np.repeat(np.arange(num_parts, dtype=np.int64), [len(p) for _, p in picked])
    positions = np.concatenate([p for _, p in picked]) if picked else parts
    return hashes, parts, positions


def resolve_hash_range(
    store: ObjectStore,
    hash_folder: str,
    num_parts: int,
    out_folder: str,
    rng: int,
    ranges: int,
    checked: bool = False,
) -> dict[str, int]:
    """The duplicates whose hash falls in range ``rng`` of ``ranges``, as rows (part, position, part and position of
    the kept copy) sorted by part then position, with each part's bounds in them; returns the range's counts.
    Each part's table is read by its head and the rows of the range (``pipeline.units.hashranges``), not whole."""
    lo, hi = hash_range(rng, ranges)

    def in_range(index: int) -> tuple[np.ndarray, np.ndarray]:
        unit = part_unit(hash_folder, index)
        if not checked:
            require_done(store, unit, "run_exact_hash_part")
        return part_hashes(RangeReader(store, f"{unit}.npy", lo, hi, hash_rows).read((lo, hi)))

    hashes, parts, positions = _gathered(store.map(in_range, range(num_parts)), num_parts)
    dup, kept = find_duplicates(hashes, parts, positions)
    rows = np.stack([parts[dup], positions[dup], parts[kept], positions[kept]], axis=1)
    rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
    bounds = np.searchsorted(rows[:, 0], np.arange(num_parts + 1))
    put_npz(store, range_key(out_folder, rng), rows=rows, bounds=bounds)
    return {"docs": len(hashes), "duplicates": len(dup), "groups": len(np.unique(kept))}


def range_key(out_folder: str, rng: int) -> str:
    return f"{out_folder}/ranges/r-{rng:05d}.npz"


def write_drop_lists(store: ObjectStore, out_folder: str, indices: list[int], ranges: int) -> int:
    """The drop lists of parts ``indices`` from every range's rows (as ``resolve_exact_duplicates`` writes them);
    returns how many rows they hold."""
    found = store.map(lambda r: get_npz(store, range_key(out_folder, r)), range(ranges))

    def put(index: int) -> int:
        rows = np.concatenate(
            [f["rows"][f["bounds"][index] : f["bounds"][index + 1]] for f in found]
        ).reshape(-1, 4)
        rows = rows[np.argsort(rows[:, 1], kind="stable")]  # one part's rows, by position
        put_npy(store, f"{out_folder}/{part_name(index)}.npy", rows[:, 1:].copy())
        return len(rows)

    return sum(store.map(put, indices))


def finish_resolve(
    store: ObjectStore, out_folder: str, num_parts: int, counts: list[dict[str, int]]
) -> StageStats:
    """The stats and ``_SUCCESS`` of a resolve spread over ranges (``counts``: each range's, every drop list
    written)."""
    docs, dups = sum(c["docs"] for c in counts), sum(c["duplicates"] for c in counts)
    stats = StageStats(stage="exact_dedup", docs_in=docs, docs_out=docs - dups)
    stats.drop(DROP_REASON, dups)
    stats.extra = {"duplicate_groups": sum(c["groups"] for c in counts), "parts": num_parts}
    return finish_folder(store, out_folder, stats, RESOLVE_STATS)


def resolved(store: ObjectStore, out_folder: str) -> StageStats | None:
    """The stats of an exact resolve already done in ``out_folder``, else None."""
    return folder_stats(store, out_folder, RESOLVE_STATS)


def load_drop_positions(store: ObjectStore, drop_folder: str, index: int) -> np.ndarray:
    require_success(store, drop_folder, "resolve_exact_duplicates")
    rows = get_npy(store, f"{drop_folder}/{part_name(index)}.npy")
    return rows[:, 0] if len(rows) else np.zeros(0, np.int64)


def run_exact_filter_part(
    store: ObjectStore, in_folder: str, out_folder: str, index: int, drop_folder: str
) -> StageStats:
    """Copy one part without its exact duplicates; a rerun of a done part reads its stats."""
    if (done := done_part_stats(store, out_folder, index)) is not None:
        return done
    drop = set(load_drop_positions(store, drop_folder, index).tolist())
    stats = StageStats(stage="exact_dedup")
    kept: list[Record] = []
    position = 0
    for batch in iter_part_batches(store, in_folder, index):
        for rec in batch:
            size = len(rec.text.encode("utf-8", "surrogatepass"))
            stats.docs_in += 1
            stats.bytes_in += size
            if position in drop:
                stats.drop(DROP_REASON)
                tally_document(stats, DROP_REASON, rec.id, rec.text, rec.source, rec.meta, size)
            else:
                kept.append(rec)
                stats.docs_out += 1
                stats.bytes_out += size
            position += 1
    if stats.dropped[DROP_REASON] != len(drop):
        raise RuntimeError(
            f"{in_folder}/{part_name(index)} has {position} records but the drop list expects more"
        )
    write_part(store, out_folder, index, kept, stats)
    return stats
