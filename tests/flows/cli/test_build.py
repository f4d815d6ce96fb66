"""``pileworks build``: the summary table of a real build of a tiny corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_cli_build_prints_the_summary(
    prefect_harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main
    from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

    write_tiny_corpus(tmp_path / "raw")
    sets = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]
    argv = [
        "build",
        "--input",
        str(tmp_path / "raw"),
        "--output",
        str(tmp_path / "store"),
        "--name",
        "tiny",
        *sets,
    ]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0
    for label in (
        "documents in",
        "exact duplicates removed",
        "near duplicates removed",
        "tokens",
        "published dataset tiny",
        "  manifest  file://",
        "next:",
    ):
        assert label in out
    assert "ingest" in out and "tokenize" in out
    manifest = next(line for line in out.splitlines() if line.startswith("  manifest  "))

    assert main(argv) == 0  # again, nothing changed: the same dataset, said so
    again = capsys.readouterr().out
    assert "nothing changed: dataset tiny" in again and manifest in again.splitlines()
