"""The unit protocol (``pipeline.units.protocol``): outputs, then stats, then the ``.done`` marker; reruns skip marked units.

Every step that writes units is run here on a store that records the order of its writes, so a step that writes
its marker before its stats (or skips the shared helpers and forgets one) fails.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.clean.boilerplate import merge_boilerplate, run_boilerplate_count_part
from pipeline.clean.config import CleanConfig, QualityConfig
from pipeline.clean.stage import run_clean_part
from pipeline.dedup.config import NearDedupConfig
from pipeline.dedup.exact import resolve_exact_duplicates, run_exact_hash_part
from pipeline.dedup.signatures import run_signatures_part
from pipeline.errors import PileworksError, UnitNotDone
from pipeline.records import Record, write_part
from pipeline.storage import FileStore
from pipeline.tokenize.stage import write_token_part
from pipeline.units.protocol import (
    StageStats,
    done_stats_or_fail,
    finish_folder,
    finish_unit,
    folder_stats,
    get_npy,
    get_npz,
    mark_stage_success,
    merged_stats,
    part_unit,
    put_npy,
    put_npz,
    require_done,
    require_success,
    unit_stats,
)


class RecordingStore(FileStore):
    """A real local store that remembers the order of its writes."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: list[str] = []

    def put_bytes(self, key: str, data: bytes) -> None:
        super().put_bytes(key, data)
        self.writes.append(key)

    def put_file(self, key: str, path: str | Path) -> None:
        super().put_file(key, path)
        self.writes.append(key)


def _docs(n: int, tag: str) -> list[Record]:
    line = "Every unit writes its outputs, then its stats, then its completion marker, last."
    return [
        Record(f"{tag}#{i}", f"{line}\n{tag} document number {i} " + "word " * (60 + i), "src")
        for i in range(n)
    ]


def assert_marker_last(writes: list[str], unit: str, step: str = "write_part") -> None:
    mine = [k for k in writes if k.startswith(unit + ".") or k.startswith(unit + "/")]
    assert mine[-2:] == [f"{unit}.stats.json", f"{unit}.done"], f"{step}: {mine}"
    assert len(mine) > 2, f"{step}: no output before the stats of {unit}"


def test_every_unit_writer_writes_outputs_then_stats_then_marker(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path / "s")
    write_part(store, "in", 0, _docs(12, "a"), StageStats(stage="ingest", docs_in=12, docs_out=12))
    write_part(store, "in", 1, _docs(12, "a"), StageStats(stage="ingest", docs_in=12, docs_out=12))
    cfg = CleanConfig(quality=QualityConfig(enabled=False))
    steps = [
        ("clean", lambda: run_clean_part(store, "in", "clean", 0, cfg), "clean/part-00000"),
        ("boilerplate count", lambda: run_boilerplate_count_part(store, "in", "bp", 0, cfg), "bp/part-00000"),
        ("exact hash", lambda: run_exact_hash_part(store, "in", "xh", 0), "xh/part-00000"),
        (
            "near signatures",
            lambda: run_signatures_part(store, "in", "sig", 0, NearDedupConfig()),
            "sig/part-00000",
        ),
        (
            "tokenize",
            lambda: write_token_part(store, "tok", 0, [], StageStats(stage="tokenize")),
            "tok/part-00000",
        ),
    ]
    assert_marker_last(store.writes, "in/part-00001")  # records.write_part
    for name, run, unit in steps:
        run()
        assert_marker_last(store.writes, unit, name)
    # a rerun of a marked unit writes nothing and returns the stored stats
    before = list(store.writes)
    again = run_exact_hash_part(store, "in", "xh", 0)
    assert store.writes == before and again.docs_in == 12


def test_global_steps_write_success_last(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path / "s")
    for i in range(2):
        write_part(store, "in", i, _docs(3, f"p{i}"), StageStats(stage="ingest", docs_in=3, docs_out=3))
        run_exact_hash_part(store, "in", "xh", i)
    resolve_exact_duplicates(store, "xh", 2, "xd")
    assert store.writes[-2:] == ["xd/resolve.stats.json", "xd/_SUCCESS"]
    mark_stage_success(store, "in", 2)
    assert store.writes[-1] == "in/_SUCCESS"
    assert merged_stats(store, "in", 2, "ingest").docs_in == 6


def test_unit_helpers_round_trip_and_refuse_unmarked_units(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    unit = part_unit("work/step", 3)
    assert unit == "work/step/part-00003" and part_unit("", 0) == "part-00000"
    assert unit_stats(store, unit) is None
    store.put_bytes(
        f"{unit}.stats.json", b'{"stage": "x", "docs_in": 1, "docs_out": 1, "bytes_in": 0, "bytes_out": 0}'
    )
    assert unit_stats(store, unit) is None  # stats without the marker: a crashed unit, redone by a rerun
    with pytest.raises(UnitNotDone, match=r"part-00003 has no \.done marker: run step A first") as err:
        require_done(store, unit, "step A")
    assert isinstance(err.value, FileNotFoundError) and isinstance(err.value, RuntimeError)
    assert isinstance(err.value, PileworksError)
    stats = StageStats(stage="x", docs_in=5, docs_out=4)
    stats.drop("too_short", 1)
    finish_unit(store, unit, stats)
    assert unit_stats(store, unit) == stats and done_stats_or_fail(store, unit) == stats


def test_folder_steps_and_success(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    assert folder_stats(store, "g") is None
    with pytest.raises(UnitNotDone, match="has no _SUCCESS: run the merge first"):
        require_success(store, "g", "the merge")
    finish_folder(store, "g", StageStats(stage="g", docs_in=2), stats_name="g.stats.json")
    assert folder_stats(store, "g", "g.stats.json") == StageStats(stage="g", docs_in=2)
    require_success(store, "g", "the merge")
    with pytest.raises(RuntimeError, match=r"parts \[1\] are not done"):
        write_part(store, "p", 0, [], StageStats(stage="p"))
        mark_stage_success(store, "p", 2)
    assert not store.exists("p/_SUCCESS")


def test_arrays_never_pickle(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    put_npy(store, "a.npy", np.arange(5, dtype=np.uint64))
    put_npz(store, "b.npz", u=np.arange(3), v=np.ones(2, dtype=np.float32))
    assert get_npy(store, "a.npy").tolist() == [0, 1, 2, 3, 4]
    assert {k: v.tolist() for k, v in get_npz(store, "b.npz").items()} == {"u": [0, 1, 2], "v": [1.0, 1.0]}
    with pytest.raises(ValueError, match="allow_pickle"):
        put_npy(store, "c.npy", np.array([{"x": 1}], dtype=object))
    np.save(tmp_path / "s" / "d.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        get_npy(store, "d.npy")
    # a merge over unmarked count units refuses, naming the unit and the step to run
    with pytest.raises(UnitNotDone, match="part-00000 is not done: run run_boilerplate_count_part first"):
        merge_boilerplate(store, "bp", 1, CleanConfig(), "bp/lines.npy")


def test_packed_ranges_keep_each_range_within_the_budget_and_cover_every_item() -> None:
    from pipeline.units.protocol import packed_ranges

    assert packed_ranges([3, 3, 3, 10, 1], 6) == [(0, 2), (2, 3), (3, 4), (4, 5)]  # 10 > budget: alone
    assert packed_ranges([1, 1, 1], 100) == [(0, 3)]
    assert packed_ranges([], 5) == [(0, 0)]
