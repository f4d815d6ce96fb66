"""prepare_and_train end to end: corpus -> 2-rank DeepSpeed job under Prefect -> artifacts, lineage, trace, sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.prefect_artifacts import artifacts_with_keys

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

# what prepare_and_train's build and training runs publish
RUN_ARTIFACTS = (
    "training-curve",
    "training-final",
    "training-progress",
    "stage-stats",
    "build-charts",
    "manifest",
    "build-progress",
)

TRAIN = {
    "max_steps": 6,
    "warmup_steps": 2,
    "seq_len": 32,
    "micro_batch_size": 2,
    "checkpoint_interval": 3,
    "eval_interval": 3,
    "eval_batches": 1,
    "log_interval": 1,
    "num_workers": 0,
    "tensorboard": False,
}


def test_prepare_and_train_records_lineage_and_traces_steps(
    prefect_harness, tiny_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect.client.orchestration import get_client

    from flows.cli.main import main
    from flows.train.flow import prepare_and_train
    from tests.flows.tiny_corpus import TINY_OVERRIDES
    from training.checkpoint import read_record, select_resume_tag
    from training.generate import generate
    from training.lineage import trace_step

    out = prepare_and_train(
        inputs=[str(tiny_corpus)],
        output=str(tmp_path / "store"),
        nproc=2,
        train_overrides=TRAIN | {"output_dir": str(tmp_path / "run")},
        corpus_overrides=TINY_OVERRIDES,
        timeout_s=600,
    )
    training = out["training"]
    assert training["steps"] == 6 and training["final_loss"] < training["first_loss"]
    ckpts = tmp_path / "run" / "checkpoints"
    record = read_record(ckpts / select_resume_tag(ckpts))
    assert record["dataset_id"] == out["corpus"]["dataset_id"]
    train_run_id = record["lineage"]["prefect_flow_run_id"]
    assert train_run_id and record["lineage"]["dataset"]["prefect_flow_run_id"]

    traced = trace_step(ckpts, 4, s3=None)
    assert traced["prefect_flow_run_id"] == train_run_id
    assert len(traced["samples"]) == 2 * 2  # world x micro batch
    assert traced["shards"] and traced["documents"]
    # ids name the input under its root (the same wherever the corpus lies); trace leads back to the file
    docs = traced["documents"]
    assert all(not d["doc_id"].startswith("file://") and d["location"] for d in docs)
    assert all(
        d["uri"].startswith("file://") and Path(d["uri"].removeprefix("file://")).exists() for d in docs
    )
    # the corpus moved since: `pileworks trace --input-root` names each document's input where it lies now
    moved = tmp_path / "moved" / "corpus"
    moved.parent.mkdir()
    tiny_corpus.rename(moved)
    capsys.readouterr()
    argv = ["trace", "--checkpoint", str(ckpts), "--step", "4", "--input-root", str(moved), "--json"]
    assert main(argv) == 0
    relocated = json.loads(capsys.readouterr().out)["documents"]
    assert [d["doc_id"] for d in relocated] == [d["doc_id"] for d in docs]
    for d in relocated:
        path = Path(d["uri"].removeprefix("file://"))
        assert path.is_relative_to(moved) and path.relative_to(moved).as_posix() == d["source"]
        assert path.exists()

    with get_client(sync_client=True) as client:
        artifacts = artifacts_with_keys(client, *RUN_ARTIFACTS)
    keys = {a.key for a in artifacts}
    assert set(RUN_ARTIFACTS) <= keys
    curve = next(a for a in artifacts if a.key == "training-curve")
    assert "loss" in str(curve.data)
    text = generate(ckpts, "the", max_new_tokens=5, seed=1)
    assert text.startswith("the") and len(text) > len("the")  # the prompt, then sampled tokens
    assert generate(ckpts, "the", max_new_tokens=5, seed=1) == text  # seeded: the same sample again
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(m["kind"] == "train" and "consumed_in_epoch" in m for m in metrics)


def test_a_failing_training_job_fails_the_flow_with_its_exit_code(prefect_harness, tmp_path: Path) -> None:
    from flows.train.flow import train

    state = train(
        str(tmp_path / "no-such-dataset"),
        None,
        1,
        {"output_dir": str(tmp_path / "run")},
        300,
        return_state=True,
    )
    assert state.is_failed()
    assert "training failed on rank 0: no dataset at" in state.message
