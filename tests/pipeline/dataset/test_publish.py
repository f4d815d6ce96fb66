"""Shard windows: any cut of the shards into runs, each written by its own writer (a build's workers), gives the
same bytes as one writer over everything; the window units a build runs, and their reuse."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.dataset.publish import (
    Window,
    part_counts,
    plan_windows,
    run_window_unit,
    window_results,
    write_shards,
    write_windows,
)
from pipeline.dataset.shards import ShardConfig, ShardInfo
from pipeline.records import Record
from pipeline.sources import mixture_from_runs, mixture_of_shards
from pipeline.storage import FileStore
from pipeline.tokenize.stage import tokens_table, write_token_part
from pipeline.units.protocol import StageStats

DTYPE = np.dtype(np.uint16)


def _token_parts(store: FileStore, parts: int, docs_per_part: int, max_len: int) -> None:
    """Token parts of documents of 1..max_len tokens from two sources, interleaved in every part."""
    rng = np.random.default_rng(parts * 1000 + max_len)
    for part in range(parts):
        docs = [
            np.append(rng.integers(2, 500, int(n)), 0).astype(np.uint32)
            for n in rng.integers(0, max_len, docs_per_part)
        ]
        records = [
            Record(
                id=f"p{part}-{i}",
                text="",
                source="src",
                meta=json.dumps({"source_name": f"s{(i * 7 + part) % 3 % 2}", "language": "en"}),
            )
            for i in range(len(docs))
        ]
        write_token_part(store, "tokens", part, [tokens_table(records, docs)], StageStats(stage="tokenize"))


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("target", "max_len", "docs"), [(5, 40, 25), (40, 200, 40), (3000, 60, 300)])
def test_windows_write_the_same_bytes_as_one_writer_for_any_cut(
    tmp_path: Path, target: int, max_len: int, docs: int
) -> None:
    """Shards of 5 tokens hold pieces of documents split over many shards (a window may start at piece 3 of a
    document); 3000 tokens: a few shards, fewer than the tasks asked for."""
    store = FileStore(tmp_path / "store")
    _token_parts(store, parts=4, docs_per_part=docs, max_len=max_len)
    cfg = ShardConfig(target_bytes=2 * target, valid_fraction=0.1)
    reference = write_shards(store, "tokens", 4, tmp_path / "one", DTYPE, cfg)
    ref_files = _files(tmp_path / "one")
    assert {w.split for w in reference} == {"train", "valid"}
    pieces = [
        p for w in reference for p in pq.read_table(tmp_path / "one" / w.docs_key).column("piece").to_pylist()
    ]
    if target == 5:
        assert max(pieces) >= 3  # documents over four shards or more
    counts = part_counts(store, "tokens", 4, cfg)
    for tasks in (2, 3, 8, 1000):
        plan = plan_windows(counts, cfg.target_tokens(DTYPE), tasks)
        assert 0 < len(plan) <= tasks and all(plan)
        for split in ("train", "valid"):  # every shard in exactly one window; windows are runs in task order
            runs = [(w.first, w.stop) for ws in plan for w in ws if w.split == split]
            assert runs == sorted(runs) and all(a < b for a, b in runs)
            assert [k for a, b in runs for k in range(a, b)] == [
                w.index for w in reference if w.split == split
            ]
        written: list[ShardInfo] = []
        for windows in plan:
            rebuilt = [
                Window.from_json(json.loads(json.dumps(w.to_json()))) for w in windows
            ]  # as a task gets it
            written += write_windows(store, "tokens", rebuilt, tmp_path / f"t{tasks}", DTYPE, cfg)
        assert sorted(written, key=lambda w: (w.split, w.index)) == sorted(
            reference, key=lambda w: (w.split, w.index)
        )
        assert _files(tmp_path / f"t{tasks}") == ref_files


def test_a_window_reads_only_the_parts_it_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path / "store")
    _token_parts(store, parts=6, docs_per_part=200, max_len=30)
    cfg = ShardConfig(target_bytes=2 * 100, valid_fraction=0.0)
    plan = plan_windows(part_counts(store, "tokens", 6, cfg), cfg.target_tokens(DTYPE), 6)
    read: list[int] = []
    original = FileStore.get_bytes
    monkeypatch.setattr(FileStore, "get_bytes", lambda self, key: (read.append(key), original(self, key))[1])
    write_windows(store, "tokens", plan[0], tmp_path / "out", DTYPE, cfg)
    parts = {k for k in read if k.endswith(".parquet")}
    # one source's first part and, as the sources are streamed one after the other, nothing of the rest
    assert 0 < len(parts) <= 2 and {p.split("/")[-1] for p in parts} <= {
        "part-00000.parquet",
        "part-00001.parquet",
    }


def test_window_units_are_reused_and_give_the_manifest_its_mixture(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    _token_parts(store, parts=3, docs_per_part=200, max_len=50)
    cfg = ShardConfig(target_bytes=2 * 400, valid_fraction=0.1)
    reference = write_shards(store, "tokens", 3, tmp_path / "one", DTYPE, cfg)
    plan = plan_windows(part_counts(store, "tokens", 3, cfg), cfg.target_tokens(DTYPE), 4)
    units = [run_window_unit(store, "tokens", "work/shards", ws, DTYPE, cfg).to_json() for ws in plan]
    written, runs = window_results(list(reversed(units)))  # in any order
    assert written == sorted(reference, key=lambda w: (w.split == "valid", w.index))
    for w in written:  # the files in the store are the shards' bytes
        for key in (w.key, w.idx_key, w.docs_key):
            assert store.get_bytes(f"work/shards/{key}") == (tmp_path / "one" / key).read_bytes()
    assert mixture_from_runs(written, runs, ()) == mixture_of_shards(tmp_path / "one", reference, ())
    # a rerun finds the units done and reads no token part
    again = run_window_unit(store, "tokens", "work/shards", plan[1], DTYPE, cfg)
    assert again.to_json() == units[1]
    store.delete("tokens/part-00000.parquet")
    store.delete("tokens/part-00001.parquet")
    assert run_window_unit(store, "tokens", "work/shards", plan[0], DTYPE, cfg).to_json() == units[0]


def test_counts_that_no_longer_match_the_parts_fail_the_window(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    _token_parts(store, parts=2, docs_per_part=100, max_len=30)
    cfg = ShardConfig(target_bytes=2 * 200, valid_fraction=0.0)
    counts = part_counts(store, "tokens", 2, cfg)
    for per_split in counts[1].values():
        per_split["train"] += 1
    plan = plan_windows(counts, cfg.target_tokens(DTYPE), 1)
    with pytest.raises(ValueError, match="counts changed between planning and writing"):
        write_windows(store, "tokens", plan[0], tmp_path / "out", DTYPE, cfg)
