"""The markdown of the build and training artifacts: rounded numbers, charts, the manifest link, a dedup cluster."""

from __future__ import annotations

import base64
import re
import urllib.parse

import pytest

from flows.ui import build_artifacts, train_artifacts
from pipeline.storage import S3Options

RAW_FLOAT = re.compile(r"\d\.\d{5,}")


def summary() -> dict:
    stages = {
        "ingest": {
            "docs_in": 1234,
            "docs_out": 1200,
            "bytes_in": 4_567_890,
            "bytes_out": 4_400_000,
            "dropped": {"empty": 34},
        },
        "near_dedup": {
            "docs_in": 1200,
            "docs_out": 743,
            "bytes_in": 4_400_000,
            "bytes_out": 2_700_000,
            "dropped": {"near_duplicate": 457},
        },
    }
    return {
        "name": "sample",
        "dataset_id": "46dab3b9" * 8,
        "stages": stages,
        "dropped": {"ingest:empty": 34, "near_dedup:near_duplicate": 457},
    }


def test_stage_rows_are_rounded_with_units_and_shares() -> None:
    rows = build_artifacts.stage_rows(summary())
    assert rows[0] == {
        "stage": "ingest",
        "docs in": "1,234",
        "docs out": "1,200",
        "kept": "97.2%",
        "size in": "4.57 MB",
        "size out": "4.4 MB",
        "dropped": "empty=34",
    }
    assert rows[1]["kept"] == "61.9%"


def test_build_charts_have_one_chart_per_view() -> None:
    md = build_artifacts.build_charts_markdown(summary())
    alts = re.findall(r"!\[([^\]]+)\]\(data:image/svg\+xml;base64,", md)
    assert alts == ["documents per stage chart", "bytes per stage chart", "drops by reason chart"]


def test_dedup_audit_rounds_the_rate_and_shows_the_cluster_side_by_side() -> None:
    docs = [
        {
            "id": "file:///d/a.jsonl#0",
            "source": "a.jsonl",
            "nbytes": 812,
            "keep": True,
            "text": "one | two\nthree",
        },
        {
            "id": "file:///d/b.jsonl#4",
            "source": "b.jsonl",
            "nbytes": 820,
            "keep": False,
            "text": "one | two\nthree zeppelin",
        },
    ]
    cluster = build_artifacts.cluster_markdown(0, 2, docs)
    md = build_artifacts.dedup_markdown(
        {"docs_in": 21, "removed_exact": 1, "removed_near": 8, "removal_rate_near": 0.380952, "clusters": 3},
        cluster,
    )
    assert "(38.1%)" in md and not RAW_FLOAT.search(md)
    table = md[md.index("| **kept**") :].splitlines()
    assert table[0] == "| **kept** `a.jsonl#0` | dropped `b.jsonl#4` |"
    assert table[2] == "| 812 B | 820 B |"
    assert table[3] == r"| one \| two | one \| two |" and table[4] == "| three | three zeppelin |"
    assert table[-2:] == ["- kept: `file:///d/a.jsonl#0`", "- dropped: `file:///d/b.jsonl#4`"]
    assert build_artifacts.cluster_markdown(0, 0, []) == "No near-duplicate cluster in this build."


def test_manifest_link_local_path_as_text_and_s3_presigned_or_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (
        build_artifacts.manifest_link("file:///data/store/m.json", S3Options(), "none")
        == "`/data/store/m.json`"
    )
    assert build_artifacts.manifest_link("s3://b/d/m.json", S3Options(), "none") == "`s3://b/d/m.json`"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    s3 = S3Options(endpoint_url="http://127.0.0.1:9", region="us-east-1")  # signed locally: nothing is sent
    link = build_artifacts.manifest_link("s3://bucket/datasets/x/manifest.json", s3, "presigned")
    url = urllib.parse.urlparse(re.search(r"\]\((.+)\)$", link)[1])  # type: ignore[index]
    query = urllib.parse.parse_qs(url.query)
    assert url.netloc == "127.0.0.1:9" and url.path == "/bucket/datasets/x/manifest.json"
    assert {"Signature", "Expires"} <= set(query) or {"X-Amz-Signature", "X-Amz-Expires"} <= set(query), query
    assert "(presigned, valid 7 days)" in link
    console = build_artifacts.manifest_link(
        "s3://bucket/datasets/x/manifest.json", S3Options(region="eu-west-1"), "console"
    )
    assert (
        "s3.console.aws.amazon.com/s3/object/bucket?region=eu-west-1&prefix=datasets/x/manifest.json"
        in console
    )


def test_training_markdown_has_the_four_charts_and_where_the_logs_are(tmp_path) -> None:  # type: ignore[no-untyped-def]
    history = [
        {
            "step": s,
            "loss": 7.109127759933472 - s / 10,
            "lr": 3e-3 * s / 20,
            "tokens_per_s": 1234.5678 + s,
            "data_wait_share": 0.00745123,
        }
        for s in range(1, 21)
    ]
    (tmp_path / "tensorboard").mkdir()
    result = {
        "output_dir": str(tmp_path),
        "steps": 20,
        "first_loss": history[0]["loss"],
        "final_loss": history[-1]["loss"],
        "final_valid_loss": 5.2345678,
        "tokens_per_s": 1244.56789,
        "data_wait_share": 0.00745123,
        "history": history,
        "restarts": [{"attempt": 1, "resumed_from": 8}],
        "eval": [{"step": 10, "loss": 6.01234567}],
        "logs": train_artifacts.log_locations(str(tmp_path)),
    }
    md = train_artifacts.training_markdown(result)
    alts = re.findall(r"!\[([^\]]+)\]\(data:image/svg\+xml;base64,", md)
    assert [a.split(" chart")[0] for a in alts] == ["loss", "throughput", "data wait", "learning rate"]
    text = re.sub(r"\(data:[^)]+\)", "", md)
    assert not RAW_FLOAT.search(text), RAW_FLOAT.search(text)
    assert "**loss** 7.009 → 5.109 over 20 steps; valid loss 5.235" in text and "1.24k tokens/s" in text
    assert "data wait 0.7% of step time" in text and "- **TensorBoard**: `" in text and "wandb" not in text
    assert "- **restart 1**: from the checkpoint of step 8" in text
    loss_svg = base64.b64decode(re.search(r"base64,([^)]+)\)", md)[1]).decode()  # type: ignore[index]
    assert 'class="mark">restart 1</text>' in loss_svg
    row = train_artifacts.final_row(result)
    assert row["tokens/s"] == "1.24k" and row["data wait"] == "0.7%" and row["final loss"] == "5.109"


def test_training_result_reads_restarts_from_every_start_record(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    lines = [
        {"kind": "start", "attempt": 0, "resumed_from": None},
        *({"kind": "train", "step": s, "loss": 6.0 - s / 10, "attempt": 0} for s in range(1, 5)),
        {"kind": "checkpoint", "step": 2, "tag": "step-00000002", "attempt": 0},
        {"kind": "start", "attempt": 1, "resumed_from": 2},
        *({"kind": "train", "step": s, "loss": 5.0 - s / 10, "attempt": 1} for s in range(3, 7)),
        {"kind": "eval", "step": 6, "loss": 4.2, "attempt": 1},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    result = train_artifacts.training_result(str(tmp_path))
    assert result["restarts"] == [{"attempt": 1, "resumed_from": 2}]
    assert [h["step"] for h in result["history"]] == [1, 2, 3, 4, 5, 6]  # redone steps: the restart's values
    assert result["history"][3]["loss"] == 4.6 and result["final_valid_loss"] == 4.2
    assert train_artifacts.final_row(result)["restarts"] == "1"
