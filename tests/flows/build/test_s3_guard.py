"""The guard: a whole job against S3 on 127.0.0.1 with the endpoint given only by the config/flags.

``AWS_ENDPOINT_URL`` is unset, so any path that opened a store without the resolved s3 settings would talk to
AWS; the trap (``tests/fixtures/aws_trap.py``) catches such a request in this process (a botocore ``before-send``
hook) and in every child process (a dead proxy in ``HTTPS_PROXY``), and the test fails naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from flows.cli.main import main as cli

pytestmark = [pytest.mark.s3]

TRAIN = [
    "seq_len=32",
    "micro_batch_size=2",
    "warmup_steps=1",
    "checkpoint_interval=2",
    "eval_interval=2",
    "eval_batches=1",
    "log_interval=1",
    "num_workers=0",
    "tensorboard=false",
    "pg_timeout_s=60",
    'model={"d_model": 64, "n_layer": 2}',
]


def test_the_trap_catches_a_child_process_talking_to_aws(s3_server, aws_trap) -> None:
    """The net must be able to fail: a child with boto3's defaults (AWS) is caught at the dead proxy."""
    code = (
        "import boto3, botocore.config as c\n"
        "s3 = boto3.client('s3', region_name='us-east-1', config=c.Config(retries={'total_max_attempts': 1}))\n"
        "try:\n    s3.head_bucket(Bucket='pw-trap-probe')\nexcept Exception as e:\n    print(type(e).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "ProxyConnectionError" in out.stdout or "ClientError" in out.stdout, out.stdout + out.stderr
    assert any("pw-trap-probe.s3.amazonaws.com" in r or "s3.amazonaws.com" in r for r in aws_trap.leaks)


def _flags(endpoint: str) -> list[str]:
    return ["--s3-endpoint-url", endpoint, "--s3-region", "us-east-1", "--s3-set", "retry_budget_s=20"]


@pytest.mark.slow
@pytest.mark.distributed
def test_whole_job_on_s3_talks_only_to_the_configured_endpoint(
    prefect_harness, aws_trap, s3_server: str, tiny_corpus: Path, tmp_path: Path, capsys
) -> None:
    from tests.flows.tiny_corpus import TINY_OVERRIDES

    bucket = "pw-guard"
    admin = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    admin.create_bucket(Bucket=bucket)
    for path in sorted(tiny_corpus.iterdir()):
        admin.upload_file(str(path), bucket, f"raw/{path.name}")
    flags = _flags(s3_server)
    store, run = f"s3://{bucket}/store", tmp_path / "run"
    sets = [x for k, v in TINY_OVERRIDES.items() for x in ("--set", f"{k}={json.dumps(v)}")]

    # build: inputs and output on S3; near dedup saves its index (the path that used to go to AWS)
    assert cli(["build", "--input", f"s3://{bucket}/raw/", "--output", store, *sets, *flags, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["manifest_uri"].startswith(f"{store}/datasets/tiny/")
    assert summary["dedup_index_uri"].startswith(f"{store}/indexes/tiny/")
    dataset = f"{store}/datasets/tiny"

    # train from S3 with checkpoints uploaded to S3, then resume
    train = ["train", "--manifest", dataset, "--nproc", "2", "--timeout", "400", *flags]
    train += [x for s in TRAIN for x in ("--train-set", s)]
    train += ["--train-set", f"output_dir={run}", "--train-set", f"checkpoint_upload_uri=s3://{bucket}/ckpt"]
    assert cli([*train, "--train-set", "max_steps=2"]) == 0
    assert cli([*train, "--train-set", "max_steps=4"]) == 0
    capsys.readouterr()
    uploaded = {
        o["Key"].split("/")[1] for o in admin.list_objects_v2(Bucket=bucket, Prefix="ckpt/")["Contents"]
    }
    assert len(uploaded) >= 2, uploaded  # the first run's tag and the resumed run's tag
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if m["kind"] == "train"] == [1, 2, 3, 4]

    assert cli(["inspect", "dedup", dataset, *flags]) == 0
    assert "documents in" in capsys.readouterr().out
    assert cli(["trace", "--checkpoint", str(run / "checkpoints"), "--step", "3", "--json", *flags]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert traced["shards"] and traced["documents"]
    sample = [
        "sample",
        "--checkpoint",
        str(run / "checkpoints"),
        "--manifest",
        dataset,
        "--max-new-tokens",
        "4",
    ]
    assert cli([*sample, *flags]) == 0
    assert capsys.readouterr().out.strip()
    assert cli(["janitor", "--output", store, *flags]) == 0
    assert "aborted" in capsys.readouterr().out
    assert cli(["doctor", "--store", f"s3://{bucket}/doctor", "--only", "store", *flags]) == 0

    assert aws_trap.hosts_seen, "the in-process hook must have seen the S3 requests"
    assert set(aws_trap.hosts_seen) == {"127.0.0.1"}
    assert not aws_trap.leaks, f"S3 requests left 127.0.0.1: {aws_trap.leaks}"
