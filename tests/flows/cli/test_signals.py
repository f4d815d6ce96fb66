"""SIGTERM like Ctrl-C, and both prompt: one line, exit 143 (130), the work stopped rather than waited for.

In-process: the command's own handling. Slow (``test_stops_*``): real ``pileworks build`` subprocesses stopped at
three points (ingest, tokenizer training, tokenize), each a rerun of the one before, the last of which publishes
the dataset of an uninterrupted build; and a build on a pseudo-terminal killed with SIGKILL leaves no process.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest


def test_sigterm_is_one_line_and_exit_143(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli import janitor
    from flows.cli.main import EXIT_TERMINATED, main
    from flows.runtime import shutdown

    def terminated_run(args: object) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this at once
        raise AssertionError("no SIGTERM arrived")

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(janitor, "run", terminated_run)
    started = time.monotonic()
    assert main(["janitor", "--output", str(tmp_path)]) == EXIT_TERMINATED
    assert time.monotonic() - started < 4
    err = capsys.readouterr().err
    assert err == (
        "pileworks janitor: stopped by SIGTERM; rerun the same command to resume from the completed units\n"
    )
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is gone with it
    assert shutdown.STOPPING.is_set()  # until the next command begins
