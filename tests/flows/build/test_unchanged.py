"""The published-build record: found for the same work folder and config files, not once anything it read
changed or its dataset is gone."""

from __future__ import annotations

from pathlib import Path

from flows.build.unchanged import files_digest, published_record, record_published, unchanged_summary
from pipeline.corpus_config import load_corpus_config
from pipeline.dataset.manifest import MANIFEST_KEY, dataset_prefix
from pipeline.storage import open_store

WORK = "work/0123456789abcdef"


def _summary() -> dict:
    return {
        "name": "tiny",
        "dataset_id": "abc123",
        "manifest_uri": "file:///x/manifest.json",
        "reused_units": {"ingest": [1, 4], "clean": [0, 4]},
        "lineage": {"prefect_flow_run_id": "run-1", "build_key": "0123456789abcdef"},
        "seconds": 31.0,
    }


def _config(tmp_path: Path, **overrides):
    return load_corpus_config(
        inputs=[str(tmp_path)], output=str(tmp_path / "store"), name="tiny", overrides=overrides
    )


def test_the_record_is_found_until_a_named_file_changes_or_the_dataset_goes(tmp_path: Path) -> None:
    blocklist = tmp_path / "blocked.txt"
    blocklist.write_text("spam.example\n")
    cfg = _config(tmp_path, **{"clean.url.blocklist": [str(blocklist)]})
    store = open_store(str(tmp_path / "store"), None)
    assert published_record(store, WORK, cfg) is None  # never published
    record_published(store, WORK, cfg, _summary())
    assert published_record(store, WORK, cfg) is None  # the record, but no manifest under the dataset
    store.put_bytes(f"{dataset_prefix('tiny', 'abc123')}/{MANIFEST_KEY}", b"{}")
    assert published_record(store, WORK, cfg)["summary"] == _summary()
    blocklist.write_text("spam.example\nham.example\n")  # same config, other list: the full build decides
    assert published_record(store, WORK, cfg) is None


def test_configs_reading_unfingerprinted_data_never_take_the_shortcut(tmp_path: Path) -> None:
    assert files_digest(_config(tmp_path)) is not None
    assert files_digest(_config(tmp_path, **{"dedup.near.index_uri": str(tmp_path / "index")})) is None
    cfg = _config(tmp_path, **{"dedup.near.index_uri": str(tmp_path / "index")})
    store = open_store(str(tmp_path / "store"), None)
    record_published(store, WORK, cfg, _summary())
    assert not store.exists(f"{WORK}/published.json")


def test_the_unchanged_summary_reuses_every_unit_and_names_the_publishing_run() -> None:
    out = unchanged_summary({"summary": _summary()}, "run-2", "0123456789abcdef", 0.4)
    assert out["reused_units"] == {"ingest": [4, 4], "clean": [4, 4]}
    assert out["nothing_changed"] == {"published_by": "run-1"}
    assert out["lineage"] == {"prefect_flow_run_id": "run-2", "build_key": "0123456789abcdef"}
    assert (out["seconds"], out["dataset_id"]) == (0.4, "abc123")


def test_before_the_flow_a_store_with_nothing_published_is_not_even_listed(tmp_path: Path) -> None:
    from flows.build.unchanged import find_published
    from flows.runtime.profile import BuildProfile

    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("some text\n")
    parameters = {"config_path": None, "inputs": [str(tmp_path / "raw")], "output": str(tmp_path / "store")}
    profile = BuildProfile()
    assert find_published(parameters | {"name": "tiny", "overrides": {}}, profile) is None
    assert profile.passes == []  # a cold build lists its inputs once, in the flow
