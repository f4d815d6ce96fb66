"""Scale-out must not change the result: the local (thread) runner and a 2-worker Dask LocalCluster build the same
tiny corpus into the same dataset id, shard for shard, each into its own store (so no unit is reused)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


def build(spec: str, inputs: list[str], output: Path) -> dict[str, Any]:
    from flows.build import build_corpus
    from flows.runners import with_task_runner

    return with_task_runner(build_corpus, spec)(
        inputs=inputs, output=str(output), overrides=dict(TINY_OVERRIDES)
    )


def test_local_and_dask_runners_publish_the_same_dataset(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.runners import make_task_runner

    # The embedded cluster gets one worker per CPU: pin it to 2 workers whatever machine runs the test.
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    runner = make_task_runner("dask")
    assert runner.cluster_kwargs["n_workers"] == 2 and runner.cluster_kwargs["processes"] is True

    inputs = write_tiny_corpus(tmp_path / "raw")
    local = build("local", inputs, tmp_path / "store-local")
    dask = build("dask", inputs, tmp_path / "store-dask")

    assert local["dataset_id"] == dask["dataset_id"]
    assert local["shard_table"] == dask["shard_table"]  # same keys, token counts and sha256, shard by shard
    assert local["stages"] == dask["stages"]
    # Not a vacuous equality: the build did real work, including both dedup steps.
    assert local["exact_duplicates"] == 1 and local["near_duplicates"] == 1
    assert sum(local["tokens"].values()) > 1000 and local["shards"]["train"] >= 2
    assert local["manifest_uri"] != dask["manifest_uri"]  # two stores: nothing was shared between the builds
