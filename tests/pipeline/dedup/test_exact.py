"""Exact dedup: the first copy by (part, position) is kept, whatever order the parts were hashed in; the
drop lists, stats and file layout are as documented; reruns skip done units."""

from __future__ import annotations

import io
import itertools
from collections import Counter

import numpy as np
import pytest

from pipeline.dedup.config import ExactDedupConfig
from pipeline.dedup.exact import (
    find_duplicates,
    finish_resolve,
    hash_range,
    hash_rows,
    resolve_exact_duplicates,
    resolve_hash_range,
    resolved,
    run_exact_filter_part,
    run_exact_hash_part,
    text_hashes,
    write_drop_lists,
)
from pipeline.records import Record, read_part, write_part
from pipeline.storage import FileStore
from pipeline.units.hashranges import read_table
from pipeline.units.protocol import StageStats, npy_bytes

# part -> texts; "A" appears in parts 0, 1, 2 (twice in 1), "B" in parts 0 (twice) and 2, "Ä" only once
PARTS = [
    ["A", "B", "c0", "B"],
    ["d1", "A", "A", "e1"],
    ["B", "f2", "A", "Ä"],
    [],
]
EXPECTED_KEPT = [["A", "B", "c0"], ["d1", "e1"], ["f2", "Ä"], []]


def write_inputs(store, parts=PARTS) -> None:
    for index, texts in enumerate(parts):
        records = [Record(f"p{index}-{pos}", text, "src") for pos, text in enumerate(texts)]
        write_part(store, "clean", index, records, StageStats(stage="clean"))


def run_all(store, hash_order) -> StageStats:
    for index in hash_order:
        run_exact_hash_part(store, "clean", "exact/hashes", index)
    stats = resolve_exact_duplicates(store, "exact/hashes", len(PARTS), "exact/drops")
    for index in reversed(range(len(PARTS))):
        run_exact_filter_part(store, "clean", "dedup", index, "exact/drops")
    return stats


def test_keeps_the_first_copy_in_part_then_position_order(store):
    write_inputs(store)
    stats = run_all(store, hash_order=[3, 2, 0, 1])
    kept = [[r.text for r in read_part(store, "dedup", i)] for i in range(len(PARTS))]
    assert kept == EXPECTED_KEPT
    assert stats.docs_in == 12 and stats.docs_out == 7
    assert stats.dropped == Counter({"exact_duplicate": 5})
    assert stats.extra["duplicate_groups"] == 2
    ids = [r.id for r in read_part(store, "dedup", 0)]
    assert ids == ["p0-0", "p0-1", "p0-2"]


def test_drop_lists_name_the_kept_copy(store):
    write_inputs(store)
    run_all(store, hash_order=range(len(PARTS)))
    rows = np.load(io.BytesIO(store.get_bytes("exact/drops/part-00001.npy")), allow_pickle=False)
    # (position, kept part, kept position): both "A"s of part 1 point at part 0 position 0
    assert rows.tolist() == [[1, 0, 0], [2, 0, 0]]
    rows = np.load(io.BytesIO(store.get_bytes("exact/drops/part-00002.npy")), allow_pickle=False)
    assert rows.tolist() == [[0, 0, 1], [2, 0, 0]]
    # A part's hashes: rows (high, low, position), sorted by hash, in a table read by ranges.
    table = read_table(store, "exact/hashes/part-00000.npy", hash_rows)
    assert table.shape == (4, 3) and table.dtype == np.uint64
    assert table[:, 0].tolist() == sorted(table[:, 0].tolist()) and sorted(table[:, 2].tolist()) == [
        0,
        1,
        2,
        3,
    ]
    hashes = text_hashes([Record("x", text, "src") for text in PARTS[0]])
    assert (table[:, :2] == hashes[table[:, 2].astype(np.int64)]).all()


def test_deterministic_across_part_orders(tmp_path):
    outputs = []
    for k, order in enumerate([[0, 1, 2, 3], [3, 1, 2, 0], [2, 3, 0, 1]]):
        store = FileStore(tmp_path / f"s{k}")
        write_inputs(store)
        run_all(store, order)
        outputs.append([store.get_bytes(f"exact/drops/part-{i:05d}.npy") for i in range(len(PARTS))])
    assert outputs[0] == outputs[1] == outputs[2]


def test_reruns_skip_done_units(tmp_path):
    store = FileStore(tmp_path)
    write_inputs(store)
    first = run_all(store, range(len(PARTS)))
    filtered = [store.get_bytes(f"dedup/part-{i:05d}.parquet") for i in range(len(PARTS))]
    for i in range(len(PARTS)):
        store.delete(f"clean/part-{i:05d}.parquet")  # no unit may read its input again
    again = run_all(store, range(len(PARTS)))
    assert again.to_json() == first.to_json()
    assert [store.get_bytes(f"dedup/part-{i:05d}.parquet") for i in range(len(PARTS))] == filtered


def test_resolve_refuses_missing_hash_parts(tmp_path):
    store = FileStore(tmp_path)
    write_inputs(store)
    run_exact_hash_part(store, "clean", "exact/hashes", 0)
    with pytest.raises(RuntimeError, match="part-00001"):
        resolve_exact_duplicates(store, "exact/hashes", len(PARTS), "exact/drops")


def test_find_duplicates_on_random_data_matches_a_dict():
    rng = np.random.default_rng(0)
    n = 5000
    values = rng.integers(0, 700, n)
    hashes = np.stack([values.astype(np.uint64), (values * 7).astype(np.uint64)], axis=1)
    parts = rng.integers(0, 5, n)
    positions = rng.permutation(n)
    dup, kept = find_duplicates(hashes, parts, positions)
    first: dict[int, int] = {}
    for i in sorted(range(n), key=lambda i: (parts[i], positions[i])):
        first.setdefault(int(values[i]), i)
    expected = {i: first[int(values[i])] for i in range(n) if first[int(values[i])] != i}
    assert dict(zip(dup.tolist(), kept.tolist(), strict=True)) == expected


def test_text_hashes_distinguish_texts_and_config_validates():
    hashes = text_hashes([Record("a", "x", "s"), Record("b", "x ", "s"), Record("c", "x", "s")])
    assert (hashes[0] == hashes[2]).all() and not (hashes[0] == hashes[1]).all()
    assert ExactDedupConfig().enabled
    with pytest.raises(ValueError, match="enabled"):
        ExactDedupConfig(enabled="yes")  # type: ignore[arg-type]


def test_a_checked_resolve_skips_the_markers_with_the_same_answer(store):
    """``checked`` (the flow got every hash unit back from its tasks): resolve does not look up the done markers,
    one call less per part on S3, and decides the same; unchecked, a missing unit is still refused."""
    from pipeline.storage.retry import STATS

    write_inputs(store)
    for index in range(len(PARTS)):
        run_exact_hash_part(store, "clean", "exact/hashes", index)
    calls, drops = {}, {}
    for checked in (False, True):
        before = STATS.snapshot()["attempts"]
        stats = resolve_exact_duplicates(store, "exact/hashes", len(PARTS), f"drops-{checked}", checked)
        calls[checked] = STATS.snapshot()["attempts"] - before
        drops[checked] = (
            stats.to_json(),
            [store.get_bytes(f"drops-{checked}/part-{i:05d}.npy") for i in range(4)],
        )
    assert drops[True] == drops[False]
    if not isinstance(store, FileStore):
        assert calls[True] <= calls[False] - len(PARTS), calls
    store.delete("exact/hashes/part-00001.done")
    with pytest.raises(RuntimeError, match="part-00001"):
        resolve_exact_duplicates(store, "exact/hashes", len(PARTS), "drops-again")


def spread_resolve(store, num_parts: int, ranges: int, out: str) -> StageStats:
    """The resolve as the flow spreads it: one task per hash range, drop lists by runs of parts, then the stats."""
    counts = [
        resolve_hash_range(store, "exact/hashes", num_parts, out, r, ranges, True) for r in range(ranges)
    ]
    for chunk in ([i for i in range(num_parts) if i % 2 == 0], [i for i in range(num_parts) if i % 2]):
        write_drop_lists(store, out, chunk, ranges)
    return finish_resolve(store, out, num_parts, counts)


@pytest.mark.parametrize("seed", range(4))
def test_a_resolve_spread_over_hash_ranges_writes_the_same_drop_lists(tmp_path, seed: int):
    """Split into 1, 2, 3 or 7 ranges of the hashes, the resolve writes byte for byte the drop lists and stats of
    the single-process resolve, on random parts full of repeats (and some empty parts)."""
    rng = np.random.default_rng(seed)
    store = FileStore(tmp_path)
    pool = [f"text {k}" for k in range(int(rng.integers(3, 40)))]
    parts = [
        [str(rng.choice(pool)) for _ in range(int(rng.integers(0, 30)))]
        for _ in range(int(rng.integers(1, 9)))
    ]
    parts[0] += [pool[0], pool[0]]  # at least one duplicate, whatever the draw
    write_inputs(store, parts)
    for index in range(len(parts)):
        run_exact_hash_part(store, "clean", "exact/hashes", index)
    whole = resolve_exact_duplicates(store, "exact/hashes", len(parts), "drops-whole", True)
    expected = [store.get_bytes(f"drops-whole/part-{i:05d}.npy") for i in range(len(parts))]
    for ranges in (1, 2, 3, 7):
        stats = spread_resolve(store, len(parts), ranges, f"drops-{ranges}")
        assert stats.to_json() == whole.to_json()
        assert [store.get_bytes(f"drops-{ranges}/part-{i:05d}.npy") for i in range(len(parts))] == expected
        assert resolved(store, f"drops-{ranges}") is not None
    assert whole.dropped["exact_duplicate"] > 0


def test_hash_ranges_cover_every_hash_once():
    for ranges in (1, 2, 3, 7, 64):
        bounds = [hash_range(r, ranges) for r in range(ranges)]
        assert bounds[0][0] == 0 and bounds[-1][1] == np.uint64(2**64 - 1)
        assert all(int(a[1]) + 1 == int(b[0]) for a, b in itertools.pairwise(bounds))


def test_hashes_written_by_an_older_version_resolve_to_the_same_drop_lists(tmp_path):
    """Parts hashed before the hash tables (their hashes alone, in part order: read whole) mixed with parts hashed
    now: the resolve, in one process or over 1, 2, 3 or 7 ranges, writes the drop lists all-new parts give."""
    rng = np.random.default_rng(7)
    pool = [f"text {k}" for k in range(25)]
    parts = [[str(rng.choice(pool)) for _ in range(int(rng.integers(5, 40)))] for _ in range(6)]
    new, old = FileStore(tmp_path / "new"), FileStore(tmp_path / "old")
    for store in (new, old):
        write_inputs(store, parts)
        for index in range(len(parts)):
            run_exact_hash_part(store, "clean", "exact/hashes", index)
    for index in (0, 3, 4):  # the layout of before, as its marker recorded no outputs
        records = [Record("x", text, "src") for text in parts[index]]
        old.put_bytes(f"exact/hashes/part-{index:05d}.npy", npy_bytes(text_hashes(records)))
        old.put_bytes(f"exact/hashes/part-{index:05d}.done", b"")
    whole = resolve_exact_duplicates(new, "exact/hashes", len(parts), "drops", True)
    expected = [new.get_bytes(f"drops/part-{i:05d}.npy") for i in range(len(parts))]
    assert (
        resolve_exact_duplicates(old, "exact/hashes", len(parts), "drops", True).to_json() == whole.to_json()
    )
    assert [old.get_bytes(f"drops/part-{i:05d}.npy") for i in range(len(parts))] == expected
    for ranges in (1, 2, 3, 7):
        assert spread_resolve(old, len(parts), ranges, f"drops-{ranges}").to_json() == whole.to_json()
        assert [old.get_bytes(f"drops-{ranges}/part-{i:05d}.npy") for i in range(len(parts))] == expected
    assert whole.dropped["exact_duplicate"] > 10
