"""A full build on ``gs://`` and on ``az://`` (inputs, work folder, dataset), each through a fault proxy that
throttles 30% of the answers, publishes the dataset id a local build of the same files publishes; 2 gloo ranks then
stream that dataset's shards from the cloud store and upload their checkpoint to it, whose record names the
id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.storage import open_store
from tests.fixtures.fault_proxy import FaultProxy
from tests.fixtures.s3_corpus import FAST_BUILD, THROTTLED_RETRIES, write_corpus
from training.launch import run_local
from training.metrics import read_metrics

pytestmark = [pytest.mark.gcs, pytest.mark.azure, pytest.mark.slow, pytest.mark.distributed]

BUILD = (
    FAST_BUILD
    | THROTTLED_RETRIES
    | {
        "ingest.target_part_bytes": 150_000,  # 2 parts: every stage fans out
    }
)


def _build(inputs: str, output: str, **overrides: Any) -> dict:
    from flows.build.flow import build_corpus

    return build_corpus(inputs=[inputs], output=output, overrides=BUILD | overrides)


def _upload(folder: Path, root: str, options: Any) -> str:
    store = open_store(root, options)
    for path in sorted(folder.iterdir()):
        store.put_file(f"raw/{path.name}", path)
    return f"{root}/raw/"


def _train(manifest_uri: str, run: Path, checkpoints: str, overrides: dict[str, Any]) -> None:
    lines: list[str] = []
    overrides = overrides | {
        "model": {"d_model": 64, "n_layer": 2},
        "seq_len": 32,
        "micro_batch_size": 2,
        "max_steps": 4,
        "warmup_steps": 1,
        "checkpoint_interval": 4,
        "eval_interval": 4,
        "eval_batches": 1,
        "log_interval": 1,
        "num_workers": 1,
        "tensorboard": False,
        "output_dir": str(run),
        "pg_timeout_s": 60,
        "checkpoint_upload_uri": checkpoints,
    }
    code = run_local(manifest_uri, None, 2, overrides=overrides, on_line=lines.append, timeout_s=240)
    assert code == 0, "\n".join(line for line in lines if "Rank 0" in line or "rror" in line)[-6000:]
    assert [r["step"] for r in read_metrics(run, "train")] == [1, 2, 3, 4]
    assert list((run / "shard-cache").rglob("*.bin")), "the ranks must have fetched shards from the store"


@pytest.mark.parametrize("kind", ["gcs", "azure"])
def test_a_cloud_build_at_30_percent_throttling_gives_the_local_id_and_trains(
    prefect_harness, request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    bucket = request.getfixturevalue("gcs_bucket" if kind == "gcs" else "azure_container")
    write_corpus(tmp_path / "raw", megabytes=0.3)
    root = bucket.uri.rsplit("/", 1)[0]
    inputs = _upload(tmp_path / "raw", root, bucket.options)
    # The same files built from a local folder into a local folder: ids by content, not by location
    local = _build(str(tmp_path / "raw"), str(tmp_path / "local"))
    server = bucket.server.split("/devstoreaccount1")[0]
    proxy = FaultProxy(server, seed=5, flavour=kind, throttle_status=429 if kind == "gcs" else 503)
    endpoint = {"gcs": "s3.gcs_endpoint_url", "azure": "s3.azure_endpoint_url"}[kind]
    url = proxy.url + ("/devstoreaccount1" if kind == "azure" else "")
    try:
        proxy.error_rate = 0.3
        cloud = _build(inputs, f"{root}/out", **{endpoint: url})
        counts = proxy.counts()
        assert cloud["dataset_id"] == local["dataset_id"]
        # the ranks stream the dataset the cloud build published, through the proxy, 30% throttled still
        _train(
            cloud["manifest_uri"],
            tmp_path / "run",
            f"{root}/checkpoints",
            {endpoint: url, "s3.retry_budget_s": 60},
        )
    finally:
        proxy.close()
    assert cloud["docs_out"] == local["docs_out"] > 300 and cloud["tokens"] == local["tokens"]
    assert local["tokens"]["train"] > 10_000 and local["tokens"]["valid"] > 0, local["tokens"]
    assert cloud["manifest_uri"].startswith(root + "/out/")
    assert counts["injected_503"] > 0.25 * counts["requests"] and counts["requests"] > 200, counts
    checkpoints = open_store(f"{root}/checkpoints", bucket.options)
    records = [i.key for i in checkpoints.list() if i.key.endswith("/COMPLETE.json")]
    assert len(records) == 1, "rank 0 uploads its checkpoint to the cloud store, its record last"
    record = json.loads(checkpoints.get_bytes(records[0]))
    assert record["step"] == 4 and record["manifest_uri"] == cloud["manifest_uri"]
    assert record["dataset_id"] == record["resume_state"]["dataset_id"] == local["dataset_id"]
