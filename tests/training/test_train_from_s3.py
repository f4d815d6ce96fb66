"""End to end from S3: a dataset published to a moto server on 127.0.0.1, trained on by 2 gloo ranks that stream
its shards over HTTP into their node-local cache (the endpoint reaches the ranks through the training config's
s3: section; credentials through the standard chain)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.dataset.manifest import load_manifest
from pipeline.storage import open_store
from tests.fixtures.tiny_dataset import build_tiny_dataset
from training.launch import run_local
from training.metrics import read_metrics

pytestmark = [pytest.mark.s3, pytest.mark.distributed, pytest.mark.slow]


def test_two_ranks_train_on_a_dataset_streamed_from_s3(s3_bucket, tmp_path: Path) -> None:
    local_uri = build_tiny_dataset(tmp_path / "local", n_docs=120)
    manifest, local = load_manifest(local_uri, None)
    remote = open_store(f"{s3_bucket.uri}/datasets/tiny/{manifest.dataset_id}", s3=s3_bucket.options)
    for info in local.list():
        remote.put_bytes(info.key, local.get_bytes(info.key))
    s3_manifest = remote.uri_of("manifest.json")
    assert s3_manifest.startswith("s3://")

    lines: list[str] = []
    overrides = {
        "model": {"d_model": 64, "n_layer": 2},
        "seq_len": 32,
        "micro_batch_size": 2,
        "max_steps": 6,
        "warmup_steps": 1,
        "checkpoint_interval": 6,
        "eval_interval": 6,
        "eval_batches": 1,
        "log_interval": 1,
        "num_workers": 1,
        "tensorboard": False,
        "output_dir": str(tmp_path / "run"),
        "pg_timeout_s": 60,
        "s3.endpoint_url": s3_bucket.options.endpoint_url,
        "s3.region": "us-east-1",
    }
    code = run_local(
        s3_manifest,
        None,
        2,
        overrides=overrides,
        on_line=lines.append,
        timeout_s=240,
    )
    assert code == 0, "\n".join(lines[-30:])
    steps = read_metrics(tmp_path / "run", "train")
    assert [r["step"] for r in steps] == list(range(1, 7))
    cached = list((tmp_path / "run" / "shard-cache").rglob("*.bin"))
    assert cached, "the ranks must have fetched shards from S3 into the node-local cache"
    assert any(line.startswith("[Rank 1]") for line in lines)
