"""``pileworks quality train``: jsonl and txt examples in, a model and its held-out metrics out; a one-class
training set is one line naming the empty side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.quality_texts import documentation_texts, license_texts


def _jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_quality_train_writes_a_model_and_its_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main

    pos = _jsonl(tmp_path / "docs.jsonl", documentation_texts(250))
    neg = tmp_path / "licenses.txt"
    neg.write_text("\n\n".join(license_texts(400)) + "\n")  # paragraphs: one example each
    out = tmp_path / "m" / "quality.bin"
    flags = ["--negative-sample", "250", "--holdout-fraction", "0.2"]
    code = main(
        ["quality", "train", "--positive", str(pos), "--negative", str(neg), "--out", str(out), *flags]
    )
    assert code == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["auc"] > 0.9 and metrics["train_negative"] + metrics["heldout_negative"] == 250
    assert out.is_file() and json.loads(Path(f"{out}.metrics.json").read_text()) == metrics


def test_quality_train_refuses_one_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli.main import main

    pos = _jsonl(tmp_path / "docs.jsonl", documentation_texts(20))
    neg = _jsonl(tmp_path / "empty.jsonl", [])
    assert main(["quality", "train", "--positive", str(pos), "--negative", str(neg), "--out", "m.bin"]) == 1
    err = capsys.readouterr().err
    assert "negative examples hold no text" in err and "Traceback" not in err
