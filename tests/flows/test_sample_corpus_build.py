"""The README's corpus job: build_corpus on the bundled sample corpus with the embedded defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.manifest import load_manifest
from pipeline.shards import IndexedShard

pytestmark = pytest.mark.slow


def test_build_sample_corpus_with_embedded_defaults(prefect_harness, tmp_path: Path) -> None:
    from flows.build import build_corpus

    summary = build_corpus(output=str(tmp_path / "store"))
    manifest, store = load_manifest(summary["manifest_uri"])
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


def test_cli_build_prints_the_summary(
    prefect_harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main
    from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

    write_tiny_corpus(tmp_path / "raw")
    sets = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]
    code = main(
        [
            "build",
            "--input",
            str(tmp_path / "raw"),
            "--output",
            str(tmp_path / "store"),
            "--name",
            "tiny",
            *sets,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    for label in (
        "documents in",
        "exact duplicates removed",
        "near duplicates removed",
        "tokens",
        "dataset id",
        "manifest",
    ):
        assert label in out
    assert "ingest" in out and "tokenize" in out


def test_cli_reports_a_config_error_with_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("clean:\n  normalisation: NFC\n")
    assert main(["build", "--config", str(bad), "--output", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "clean.normalisation" in err and "known fields of clean" in err


def test_version_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli.main import main
    from pipeline import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"pileworks {__version__}"


def test_cli_reports_our_own_failures_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli.main import main

    (tmp_path / "checkpoints").mkdir()
    assert main(["trace", "--checkpoint", str(tmp_path / "checkpoints"), "--step", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pileworks trace: CheckpointError:") and "no complete checkpoint" in err
    assert "Traceback" not in err
