"""Done-when of ``pileworks ablate`` on a tiny corpus: the base and a variant train the same tiny model for the
same steps with two seeds each and the base's tokenizer, every run is evaluated on the held-out file, the table
has each one's loss, spread and difference to the base, and a variant that fails to build is marked failed while
the others still report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(900)]  # 3 builds, 4 trainings

TRAIN = {
    "seq_len": 32,
    "micro_batch_size": 2,
    "eval_batches": 1,
    "num_workers": 0,
    "tensorboard": False,
}


def test_ablation_reports_every_variant_with_seeds_and_marks_a_failed_one(
    prefect_harness, tmp_path: Path
) -> None:
    from flows.cli.main import main
    from flows.train.ablate import ablate

    corpus = tmp_path / "corpus"
    write_tiny_corpus(corpus)
    held_out = write_tiny_corpus(tmp_path / "held_out", files=1, docs_per_file=4, seed=99)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(Path(held_out[0]).read_text())  # {"text": ...} lines the corpus does not hold
    task = tmp_path / "pick.jsonl"
    task.write_text(
        "".join(
            json.dumps(
                {"query": f"Item {i} is", "choices": ["the data", "a rank", "one seed"], "gold": i % 3}
            )
            + "\n"
            for i in range(6)
        )
    )
    result = ablate(
        eval_data=str(eval_file),
        tokens=256,  # 4 steps of 2 x 32 tokens
        variants=[
            "noquality=clean.quality.enabled=false",
            f"broken=clean.classifier.model={tmp_path / 'missing.bin'},clean.classifier.keep_fraction=0.5",
        ],
        base_overrides=dict(TINY_OVERRIDES),
        inputs=[str(corpus)],
        output=str(tmp_path / "store"),
        seeds=2,
        train_overrides=TRAIN,
        nproc=1,
        workdir=str(tmp_path / "runs"),
        tasks=[f"pick={task}"],
    )
    rows = {r["variant"]: r for r in result["rows"]}
    assert result["steps"] == 4 and result["seeds"] == [1234, 1235]
    for name in ("base", "noquality"):
        row = rows[name]
        assert row["status"] == "ok" and row["seeds"] == 2 and row["eval_loss"] > 0
        assert (
            row["loss_range"][0] <= row["eval_loss"] <= row["loss_range"][1] and row["loss_std"] is not None
        )
        assert row["docs"] > 0 and row["tokens"] > 0
        for seed in (1234, 1235):  # the same number of steps for every run
            metrics = Path(result["run_dir"]) / name / f"seed-{seed}"
            assert (metrics / "checkpoints").is_dir()
    assert result["budget"] == "tokens" and result["budget_line"].startswith(
        "equal tokens: every run trains 4"
    )
    for name in ("base", "noquality"):
        metrics, row = rows[name]["metrics"], rows[name]
        assert set(metrics) == {"eval_loss", "pick.acc", "pick.acc_norm", "pick.prob"}
        assert metrics["pick.acc"]["ci"] is not None and metrics["pick.acc"]["item_ci"] is not None
        assert row["tokens_seen"] == 256 and row["epochs"] == round(256 / row["tokens"], 3)
    paired = rows["noquality"]["metrics"]["eval_loss"]
    assert paired["delta_ci"] is not None and isinstance(paired["within_noise"], bool)
    assert "| noquality | pick.prob |" in result["markdown"]
    assert rows["base"]["delta_vs_base"] == 0.0
    assert rows["noquality"]["delta_vs_base"] == round(
        rows["noquality"]["eval_loss"] - rows["base"]["eval_loss"], 4
    )
    assert (
        rows["broken"]["status"].startswith("failed to build") and "missing.bin" in rows["broken"]["status"]
    )
    assert "| noquality |" in result["markdown"] and "data:image/svg+xml;base64," in result["markdown"]
    # both variants tokenized with the base's tokenizer: the same vocabulary file
    manifests = sorted((tmp_path / "store").rglob("manifest.json"))
    tokenizers = {json.loads(m.read_text())["tokenizer"]["sha256"] for m in manifests}
    assert len(manifests) == 2 and len(tokenizers) == 1
    # the command line refuses a missing evaluation file before any work, in one line
    assert (
        main(["ablate", "--eval", str(tmp_path / "nope.jsonl"), "--tokens", "10", "--variant", "a=x.y=1"])
        == 1
    )
