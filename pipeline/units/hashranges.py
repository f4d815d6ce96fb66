"""Per-part tables sorted by a 64-bit hash, read one range of hashes at a time: what lets a global step that
grows with the corpus (the exact-duplicate resolve, the boilerplate merge) run as one task per hash range, each
reading its slice of every part's table with a ranged GET instead of the whole table.

A table is one 1-d uint64 ``.npy`` (so numpy reads it whole as it is)::

    columns, fence_bits, fence_0 ... fence_F, row 0 (``columns`` values), row 1, ...

Rows are sorted by their first column, the hash; ``fence_f`` is the first row whose hash is at or past
``f << (64 - fence_bits)`` (``F = 2 ** fence_bits``, so ``fence_F`` is the number of rows). A range task reads
the first :data:`HEAD_BYTES` of each part's table (the ``.npy`` header, the fences and the first rows: all of a
small table), then one ranged GET for the rows of the fences its range overlaps that did not come with it: at most
two calls and about ``HEAD_BYTES`` plus ``1 / ranges`` of the table, where a whole read is one call and all of it,
and never more bytes than the whole.

The arrays written before this layout (2-d) are read whole; the caller says how to turn one into sorted rows.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np

from pipeline.storage import ObjectStore
from pipeline.units.protocol import get_npy, npy_bytes, put_npy

FENCE_BITS = 8
FENCES = 1 << FENCE_BITS
_SHIFT = np.uint64(64 - FENCE_BITS)
_PREFIX = 2 + FENCES + 1  # columns, fence bits, the fences
# The first read of a table: its .npy header (128 bytes) and 2 KiB prefix, and the rows after them up to 64 KiB.
# A table that small (an exact-dedup part of 2,500 documents) comes in that one call, as a whole read would; a larger
# one costs a second call for the range's other rows. 64 KiB take about 1 ms at 60 MB/s, against 20 ms or more of
# round trip for any S3 call: the rows that come with the head are almost free.
HEAD_BYTES = 64 * 1024
LAST_HASH = np.uint64(2**64 - 1)

Legacy = Callable[[np.ndarray], np.ndarray]  # an array of the older layout -> its sorted rows


def hash_range(rng: int, ranges: int) -> tuple[np.uint64, np.uint64]:
    """The inclusive bounds of range ``rng`` of ``ranges`` equal slices of the 64-bit hash space."""
    lo, stop = (rng << 64) // ranges, ((rng + 1) << 64) // ranges
    return np.uint64(lo), np.uint64(stop - 1)


def fence_of(h: np.uint64) -> int:
    """The fence (slice of the hash space) that hash ``h`` falls in."""
    return int(h >> _SHIFT)


def fences_of(hashes: np.ndarray) -> np.ndarray:
    """Where each of the :data:`FENCES` equal slices of the hash space starts in sorted ``hashes``, then its
    length (int64, ``FENCES + 1``)."""
    bounds = np.arange(FENCES, dtype=np.uint64) << _SHIFT
    return np.append(np.searchsorted(hashes, bounds), len(hashes)).astype(np.int64)


def table_array(rows: np.ndarray) -> np.ndarray:
    """The table of ``rows`` ((n, columns) uint64, sorted by column 0) as its 1-d array."""
    if rows.ndim != 2 or rows.dtype != np.uint64:
        raise ValueError(f"a hash table holds 2-d uint64 rows, not {rows.dtype} of shape {rows.shape}")
    if len(rows) > 1 and bool(np.any(rows[1:, 0] < rows[:-1, 0])):
        raise ValueError("a hash table's rows must be sorted by their hash (column 0)")
    head = np.concatenate([[rows.shape[1], FENCE_BITS], fences_of(rows[:, 0])]).astype(np.uint64)
    return np.concatenate([head, rows.ravel()])


def put_table(store: ObjectStore, key: str, rows: np.ndarray) -> None:
    put_npy(store, key, table_array(rows))


def _rows_of(array: np.ndarray, key: str) -> np.ndarray:
    columns, bits = int(array[0]), int(array[1])
    if bits != FENCE_BITS or columns < 1 or (len(array) - _PREFIX) % columns:
        raise ValueError(f"{key} is not a hash table of this version ({columns} columns, {bits} fence bits)")
    return array[_PREFIX:].reshape(-1, columns)


def read_table(store: ObjectStore, key: str, legacy: Legacy) -> np.ndarray:
    """Every row of a part's table, read whole (an older 2-d array through ``legacy``)."""
    array = get_npy(store, key)
    return _rows_of(array, key) if array.ndim == 1 else legacy(array)


class RangeReader:
    """The rows of one part's table whose hash lies in ``[lo, hi]``, opened by one read of the table's head: the
    fences inside the range are kept (not the table's others: a task opens every part of the corpus), and the
    range's rows that came with the head; the others are read on demand, by fence runs."""

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        lo: np.uint64,
        hi: np.uint64,
        legacy: Legacy,
        keep_bytes: int | None = None,
    ) -> None:
        # keep_bytes: the most of the head's rows of the range to keep (a caller that reads its range in runs under
        # a memory budget gives each part its share); when they are more, none is kept and they are read again.
        self.store, self.key, self.keep_bytes = store, key, keep_bytes
        self.first, last = fence_of(lo), fence_of(hi) + 1  # the fences the range overlaps
        head = store.get_range(key, 0, HEAD_BYTES)
        stream = io.BytesIO(head)
        version = np.lib.format.read_magic(stream)
        header = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = header(stream)
        if len(shape) != 1:  # the older layout: read whole, once
            rows = legacy(get_npy(store, key))
            self.columns, self.fences = rows.shape[1], fences_of(rows[:, 0])[self.first : last + 1]
            self._keep(rows, len(rows))
            return
        self.data = stream.tell()
        if dtype != np.dtype("<u8") or len(head) < self.data + 8 * _PREFIX:
            raise ValueError(f"{store.uri_of(key)} is not a hash table of this version")
        prefix = np.frombuffer(head, "<u8", _PREFIX, self.data)
        self.columns = int(prefix[0])
        if int(prefix[1]) != FENCE_BITS or shape[0] != _PREFIX + self.columns * int(prefix[-1]):
            raise ValueError(f"{store.uri_of(key)} is not a hash table of this version (or is cut short)")
        self.fences = prefix[2 + self.first : 2 + last + 1].astype(np.int64)
        came = (len(head) - self.data - 8 * _PREFIX) // (8 * self.columns)  # whole rows in the head
        self._keep(np.frombuffer(head, "<u8", _PREFIX + came * self.columns, self.data), came)

    def _keep(self, table: np.ndarray, came: int) -> None:
        """Keep the rows ``[0, came)`` of ``table`` (its rows, or its 1-d array) that are in the range."""
        rows = table if table.ndim == 2 else table[_PREFIX:].reshape(-1, self.columns)
        start, stop = int(self.fences[0]), min(int(self.fences[-1]), came)
        if (
            table.ndim == 1
            and self.keep_bytes is not None
            and (stop - start) * 8 * self.columns > self.keep_bytes
        ):
            stop = start
        self.cached = (
            rows[start:stop].astype(np.uint64) if stop > start else np.zeros((0, self.columns), np.uint64)
        )
        self.cached_from = start

    def fence_sizes(self) -> np.ndarray:
        """How many rows each fence of the range holds (the first and last: of the whole fence)."""
        return np.diff(self.fences)

    def read(self, bounds: tuple[np.uint64, np.uint64]) -> np.ndarray:
        """The rows whose hash lies in ``bounds`` (inclusive, inside the reader's range): those that came with the
        head, then one ranged GET for the others, if any."""
        lo, hi = bounds
        a, b = int(self.fences[fence_of(lo) - self.first]), int(self.fences[fence_of(hi) + 1 - self.first])
        cached_to = self.cached_from + len(self.cached)
        start, stop = max(a, self.cached_from), min(b, cached_to)
        pieces = [self.cached[start - self.cached_from : stop - self.cached_from]] if stop > start else []
        if b > max(a, cached_to):
            pieces.append(self._fetch(max(a, cached_to), b))
        rows = np.concatenate(pieces) if pieces else np.zeros((0, self.columns), np.uint64)
        return rows[(rows[:, 0] >= lo) & (rows[:, 0] <= hi)]

    def _fetch(self, a: int, b: int) -> np.ndarray:
        """Rows ``[a, b)`` of the table, by one ranged GET."""
        size = 8 * (b - a) * self.columns
        data = self.store.get_range(self.key, self.data + 8 * (_PREFIX + a * self.columns), size)
        if len(data) != size:
            raise ValueError(f"{self.store.uri_of(self.key)} is cut short: rerun the step that wrote it")
        return np.frombuffer(data, "<u8").reshape(-1, self.columns).astype(np.uint64)


def fence_bounds(first: int, stop: int, lo: np.uint64, hi: np.uint64) -> tuple[np.uint64, np.uint64]:
    """The hashes of fences ``[first, stop)`` inside ``[lo, hi]``."""
    start = np.uint64(first) << _SHIFT
    end = LAST_HASH if stop == FENCES else (np.uint64(stop) << _SHIFT) - np.uint64(1)
    return max(lo, start), min(hi, end)


def range_key(folder: str, rng: int) -> str:
    """Where range ``rng`` of a step spread over hash ranges leaves its sorted uint64 result."""
    return f"{folder}/ranges/r-{rng:05d}.npy"


def join_ranges(store: ObjectStore, folder: str, ranges: int, out_key: str) -> int:
    """The ranges' sorted results (:func:`range_key`), in range order, as one sorted uint64 ``.npy`` at
    ``out_key``: the bytes a single process would have written. Returns its length."""
    arrays = store.map(lambda r: get_npy(store, range_key(folder, r)), range(ranges))
    joined = np.concatenate(arrays).astype(np.uint64) if arrays else np.zeros(0, np.uint64)
    store.put_bytes(out_key, npy_bytes(joined))
    return len(joined)
