"""``pileworks evaluate``: JSON on stdout (``--json``) or text, task scores with intervals, and the result as
table artifacts of an ``evaluate`` flow run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.dataset.manifest import load_manifest
from tests.fixtures.fake_checkpoint import write_fake_checkpoint
from tests.fixtures.prefect_artifacts import artifacts_with_keys
from tests.fixtures.tiny_dataset import build_tiny_dataset
from training.model import ModelConfig

pytestmark = [pytest.mark.slow]


def test_evaluate_command_prints_json_and_publishes_an_artifact(
    prefect_harness, tmp_path: Path, capsys
) -> None:
    from prefect.client.orchestration import get_client

    from flows.cli.main import main

    uri = build_tiny_dataset(tmp_path / "store", n_docs=60, vocab_size=300, seed=2)
    manifest, store = load_manifest(uri, None)
    cfg = ModelConfig(
        vocab_size=manifest.tokenizer.vocab_size, n_layer=1, n_head=2, d_model=32, max_seq_len=32
    )
    write_fake_checkpoint(tmp_path / "ckpt", manifest, store, uri, cfg, step=7, seq_len=32)
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"text": "A held-out sentence that the model never saw, twice over."}) + "\n")
    task = tmp_path / "pick.jsonl"
    task.write_text(json.dumps({"query": "The model", "choices": ["was", "rank"], "gold": 0}) + "\n")
    ckpt = str(tmp_path / "ckpt")
    assert main(["evaluate", "--checkpoint", ckpt, "--data", str(held), "--task", f"p={task}", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 7 and result["documents"] == 1 and result["loss"] > 0
    scores = result["tasks"]["p"]
    assert scores["items"] == 1 and scores["acc"] in (0.0, 1.0) and 0 < scores["prob"] < 1
    assert "per_item" not in scores and "acc_norm_interval" in scores
    assert main(["evaluate", "--checkpoint", ckpt, "--task", str(task)]) == 0
    text = capsys.readouterr().out
    assert "pick (multiple_choice, 1 items): acc" in text and "perplexity" in text
    assert main(["evaluate", "--checkpoint", ckpt, "--json"]) == 0
    valid = json.loads(capsys.readouterr().out)
    assert valid["split"] == "valid" and valid["dataset_id"] == manifest.dataset_id
    with get_client(sync_client=True) as client:
        artifacts = artifacts_with_keys(client, "evaluation")
    rows = [json.loads(a.data)[0] if isinstance(a.data, str) else a.data[0] for a in artifacts]
    assert {round(r["loss"], 9) for r in rows} >= {round(result["loss"], 9), round(valid["loss"], 9)}
