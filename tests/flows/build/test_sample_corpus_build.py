"""The README's corpus job: build_corpus on the bundled sample corpus with the embedded defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.dataset.manifest import load_manifest
from pipeline.dataset.shards import IndexedShard

pytestmark = pytest.mark.slow


def test_build_sample_corpus_with_embedded_defaults(prefect_harness, tmp_path: Path) -> None:
    from flows.build.flow import build_corpus

    summary = build_corpus(output=str(tmp_path / "store"))
    manifest, store = load_manifest(summary["manifest_uri"], None)
    assert summary["docs_in"] > 300 and summary["quarantined"] == 0
    assert (
        summary["exact_duplicates"] > 0 and summary["near_duplicates"] > 0
    )  # natural duplicates in the sample
    assert manifest.splits["train"]["tokens"] > 1_000_000 and manifest.splits["valid"]["tokens"] > 0
    sizes = [s.tokens for s in manifest.split_shards("train")]
    assert max(sizes) - min(sizes) <= 1  # balanced shards
    first = manifest.split_shards("train")[0]
    local = tmp_path / "shard"
    store.get_file(first.key, f"{local}.bin")
    store.get_file(first.idx_key, f"{local}.idx")
    shard = IndexedShard(f"{local}.bin", f"{local}.idx")
    assert int(shard.sizes.sum()) == first.tokens
    report = summary["stages"]["near_dedup"]["extra"]["report"]
    assert report["clusters"] >= 1 and not any("0%" in w for w in report["warnings"])
