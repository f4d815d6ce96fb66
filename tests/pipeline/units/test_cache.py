"""The unit cache and the consumer's check of what it reads (``pipeline/units/cache.py``, ``pipeline/units/protocol.py``):
a unit is never copied onto itself, and bytes that no longer match their marker's digest are named once, dropped
with the cache entry they were restored by, and never served."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipeline.errors import UnitDamaged
from pipeline.records import Record, read_part, write_part
from pipeline.storage import FileStore
from pipeline.units import cache as unitcache
from pipeline.units.protocol import CACHE_ENTRY, StageStats, part_unit, unit_stats
from tests.fixtures.damage import flip16_keeping_mtime


class _Late(FileStore):
    """A store where another build finishes the unit right after this one looked for its marker: the first
    look answers "not done"; every copy is recorded."""

    def __init__(self, root: Path, marker: str) -> None:
        super().__init__(root)
        self.marker, self.looked, self.copies = marker, False, list[tuple[str, str]]()

    def exists(self, key: str) -> bool:
        if key == self.marker and not self.looked:
            self.looked = True
            return False
        return super().exists(key)

    def copy(self, src_key: str, dst_key: str, size: int | None = None) -> None:
        self.copies.append((src_key, dst_key))
        super().copy(src_key, dst_key, size)


def _part(store: FileStore, folder: str, index: int = 0) -> None:
    records = [Record(f"a.jsonl#B{i}", f"text number {i} " * 20, "a.jsonl") for i in range(50)]
    write_part(store, folder, index, records, StageStats(stage="clean", docs_in=50, docs_out=50))


def test_an_entry_naming_the_unit_itself_is_never_copied_onto_it(tmp_path: Path) -> None:
    folder = "work/k/clean"
    _part(FileStore(tmp_path), folder)
    unitcache.record(
        FileStore(tmp_path), "clean", "key1", folder, 0
    )  # the racing build recorded its own unit
    store = _Late(tmp_path, f"{part_unit(folder, 0)}.done")
    assert unitcache.restore(store, "clean", "key1", folder, 0) is False
    assert store.looked and store.copies == []
    assert unit_stats(store, part_unit(folder, 0)) is not None  # done, by the other build: used as it is


def test_a_restored_unit_is_copied_and_its_marker_names_its_entry(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    _part(store, "work/a/clean", 3)
    unitcache.record(store, "clean", "key1", "work/a/clean", 3)
    assert unitcache.restore(store, "clean", "key1", "work/b/clean", 0) is True
    assert read_part(store, "work/b/clean", 0) == read_part(store, "work/a/clean", 3)
    marker = (tmp_path / "work/b/clean/part-00000.done").read_text()
    assert CACHE_ENTRY in marker and "cache/units/clean/key1.json" in marker
    assert unitcache.restore(store, "clean", "key1", "work/b/clean", 0) is False  # here already


def test_bytes_flipped_behind_their_mtime_are_named_once_and_their_unit_recomputed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStore(tmp_path)
    _part(store, "work/a/clean", 0)
    unitcache.record(store, "clean", "key1", "work/a/clean", 0)
    assert unitcache.restore(store, "clean", "key1", "work/b/clean", 0)  # a hard link: the same bytes
    damaged = tmp_path / "work/b/clean/part-00000.parquet"
    flip16_keeping_mtime(damaged)
    # the listing check trusts it (same size and tag): only reading the bytes shows the damage
    assert unit_stats(store, part_unit("work/b/clean", 0)) is not None
    with (
        caplog.at_level(logging.WARNING, logger="pipeline.units.protocol"),
        pytest.raises(UnitDamaged) as err,
    ):
        read_part(store, "work/b/clean", 0)
    assert err.value.key == "work/b/clean/part-00000.parquet"
    named = [r.getMessage() for r in caplog.records if store.uri_of(err.value.key) in r.getMessage()]
    assert len(named) == 1 and "recomputing its unit" in named[0]
    assert not (tmp_path / "work/b/clean/part-00000.done").exists()  # no longer done: recomputed
    assert not (tmp_path / "cache/units/clean/key1.json").exists()  # and not restored from the same bytes
    assert unitcache.restore(store, "clean", "key1", "work/b/clean", 0) is False


def test_intact_bytes_are_served_and_a_damaged_array_is_refused(tmp_path: Path) -> None:
    import numpy as np

    from pipeline.units.protocol import finish_unit, get_npy, put_npy

    store = FileStore(tmp_path)
    _part(store, "work/a/clean", 0)
    assert len(read_part(store, "work/a/clean", 0)) == 50
    put_npy(store, "work/a/hash/part-00000.npy", np.arange(1000, dtype=np.uint64))
    finish_unit(store, "work/a/hash/part-00000", StageStats(stage="exact_hash"))
    assert get_npy(store, "work/a/hash/part-00000.npy").sum() == 499500
    flip16_keeping_mtime(tmp_path / "work/a/hash/part-00000.npy")
    with pytest.raises(UnitDamaged):
        get_npy(store, "work/a/hash/part-00000.npy")
