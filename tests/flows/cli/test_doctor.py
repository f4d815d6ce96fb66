"""``pileworks doctor``: JSON and text output, the exit status, and ``--during`` over a run's metrics."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from flows.cli.main import main as cli_main
from tests.training.test_monitor import write_metrics


def test_cli_json_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = str(server.getsockname()[1])
        code = cli_main(
            [
                "doctor",
                "--only",
                "versions,master,disk",
                "--json",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                "--min-free-gib",
                "0",
            ]
        )
    report = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in report["results"]}
    assert code == 1 and report["exit_code"] == 1
    assert by_name["master"]["status"] == "FAIL" and by_name["torch"]["status"] == "PASS"
    assert {"python", "torch", "deepspeed", "master", "disk:cache", "disk:checkpoints"} == set(by_name)
    code = cli_main(["doctor", "--only", "versions", "--skip", "versions"])
    assert code == 0 and "0 PASS" in capsys.readouterr().err


def test_cli_text_output_prints_fixes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert cli_main(["doctor", "--only", "master"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[WARN] master: MASTER_ADDR is not set") and "\n       fix: " in out


def test_cli_during(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_metrics(tmp_path / "run", [{"step_time_s": 0.2, "data_wait_s": 0.01, "comm_s": 0.02}] * 4, world=1)
    assert cli_main(["doctor", "--during", str(tmp_path / "run"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 4 and report["comm_share"] == pytest.approx(0.1)
    assert report["comm_source"] == "logged by the trainer"
    # A missing run folder is a missing input, like `build --input ./nope`: exit 1, one line.
    assert cli_main(["doctor", "--during", str(tmp_path / "nothing")]) == 1
    assert "is {} a training output_dir".format(tmp_path / "nothing") in capsys.readouterr().err
