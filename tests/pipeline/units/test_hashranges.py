"""Hash tables read by ranges: every range together gives the table's rows, a range reads its head and its own
rows only (bytes counted on a folder and on a moto S3 server), a small table comes in one call, an older array is
read whole through the caller's conversion, and what is not a table of this version is refused."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.storage import FileStore, ObjectStore
from pipeline.units.hashranges import (
    HEAD_BYTES,
    LAST_HASH,
    RangeReader,
    hash_range,
    join_ranges,
    put_table,
    range_key,
    read_table,
)
from pipeline.units.protocol import put_npy
from tests.fixtures.counting_store import counting


def random_rows(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 2**64 - 1, size=(n, 3), dtype=np.uint64)
    rows[: n // 10, 0] = rows[n // 10 : 2 * (n // 10), 0]  # some hashes twice
    return rows[np.argsort(rows[:, 0], kind="stable")]


def test_ranges_of_a_table_read_only_their_rows(store: ObjectStore) -> None:
    """1, 2, 3 or 7 ranges together give exactly the table's rows; each range reads the table's head and its
    rows that did not come with it (two calls at most), never more than the file, far less for 7 ranges."""
    rows = random_rows(60_000)
    put_table(store, "t/part-00000.npy", rows)
    size = store.stat("t/part-00000.npy").size
    assert (read_table(store, "t/part-00000.npy", lambda a: a) == rows).all()
    for ranges in (1, 2, 3, 7):
        got, reads = [], []
        for r in range(ranges):
            counted = counting(store)
            bounds = hash_range(r, ranges)
            got.append(RangeReader(counted, "t/part-00000.npy", *bounds, lambda a: a).read(bounds))
            reads.append(counted.reads)  # type: ignore[attr-defined]
        assert (np.concatenate(got) == rows).all()
        assert all(len(calls) <= 2 and calls[0] == HEAD_BYTES for calls in reads)
        # the head, then its share of the rows, give or take the two fences it shares with its neighbours
        assert all(sum(calls) <= min(size, HEAD_BYTES + size / ranges + 0.02 * size) for calls in reads)
        if ranges == 1:
            assert sum(reads[0]) == size  # the head, then the rest: each byte once
        if ranges == 7:
            assert all(sum(calls) < size / 4 for calls in reads), (reads, size)


def test_a_sub_range_and_a_range_with_no_rows(store: ObjectStore) -> None:
    rows = random_rows(5000, seed=2)
    put_table(store, "t/a.npy", rows)
    lo, hi = np.uint64(2**62), np.uint64(2**62 + 2**58)
    reader = RangeReader(store, "t/a.npy", lo, hi, lambda a: a)
    inside = rows[(rows[:, 0] >= lo) & (rows[:, 0] <= hi)]
    assert len(inside) and (reader.read((lo, hi)) == inside).all()
    mid = np.uint64(2**62 + 2**57)
    assert (np.concatenate([reader.read((lo, mid)), reader.read((mid + np.uint64(1), hi))]) == inside).all()
    assert reader.fence_sizes().sum() >= len(inside)
    put_table(store, "t/empty.npy", np.zeros((0, 2), np.uint64))
    empty = RangeReader(store, "t/empty.npy", np.uint64(0), LAST_HASH, lambda a: a)
    assert empty.read((np.uint64(0), LAST_HASH)).shape == (0, 2)


def test_a_small_table_comes_with_its_head_in_one_call(tmp_path) -> None:
    rows = random_rows(50, seed=3)
    store = counting(FileStore(tmp_path))
    put_table(store, "t/small.npy", rows)
    assert store.stat("t/small.npy").size < HEAD_BYTES
    reader = RangeReader(store, "t/small.npy", np.uint64(0), LAST_HASH, lambda a: a)
    halves = [reader.read(hash_range(r, 2)) for r in range(2)]
    assert (np.concatenate(halves) == rows).all() and len(store.reads) == 1  # type: ignore[attr-defined]
    # Told to keep none of them (a merge's memory budget), it reads the rows again when asked: same rows.
    lean = RangeReader(store, "t/small.npy", np.uint64(0), LAST_HASH, lambda a: a, keep_bytes=0)
    assert (lean.read((np.uint64(0), LAST_HASH)) == rows).all() and len(store.reads) == 3  # type: ignore[attr-defined]


def test_an_older_array_is_read_whole_through_the_callers_conversion(tmp_path) -> None:
    store = FileStore(tmp_path)
    rows = random_rows(3000, seed=4)[:, :2]
    put_npy(store, "old.npy", np.ascontiguousarray(rows.T))  # the 2 x n layout of before
    legacy = lambda a: np.ascontiguousarray(a.T)  # noqa: E731
    assert (read_table(store, "old.npy", legacy) == rows).all()
    bounds = hash_range(1, 3)
    got = RangeReader(store, "old.npy", *bounds, legacy).read(bounds)
    assert (got == rows[(rows[:, 0] >= bounds[0]) & (rows[:, 0] <= bounds[1])]).all() and len(got)


def test_what_is_not_a_table_of_this_version_is_refused(tmp_path) -> None:
    store = FileStore(tmp_path)
    with pytest.raises(ValueError, match="sorted"):
        put_table(store, "t.npy", np.array([[5, 1], [3, 1]], dtype=np.uint64))
    with pytest.raises(ValueError, match="uint64"):
        put_table(store, "t.npy", np.array([[5, 1]], dtype=np.int64))
    put_table(store, "t.npy", random_rows(1000))
    data = store.get_bytes("t.npy")
    store.put_bytes("cut.npy", data[:-8])  # the header promises more than the file holds
    cut = RangeReader(store, "cut.npy", np.uint64(0), LAST_HASH, lambda a: a)
    with pytest.raises(ValueError, match="cut short"):
        cut.read((np.uint64(0), LAST_HASH))
    put_npy(store, "other.npy", np.arange(10, dtype=np.uint64))
    with pytest.raises(ValueError, match="not a hash table"):
        read_table(store, "other.npy", lambda a: a)


def test_join_ranges_writes_the_ranges_in_order(tmp_path) -> None:
    store = FileStore(tmp_path)
    parts = [np.array([1, 5], np.uint64), np.zeros(0, np.uint64), np.array([9], np.uint64)]
    for r, a in enumerate(parts):
        put_npy(store, range_key("f", r), a)
    assert join_ranges(store, "f", 3, "out.npy") == 3
    put_npy(store, "expected.npy", np.array([1, 5, 9], np.uint64))
    assert store.get_bytes("out.npy") == store.get_bytes("expected.npy")
