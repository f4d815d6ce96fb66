"""The commands no other test of the lowest-versions job (tests/lowest_part.py) starts for real: `server` (start,
status, stop) and `serve` (its two deployments registered with Prefect, then Ctrl-C). With the rest of that part
they start every command of `pileworks --help`, so each one runs at the floors of pyproject (`make test-lowest`)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.flows.cli.conftest import cli_env, run_cli, start_cli

pytestmark = [pytest.mark.slow]


def test_server_starts_reports_and_stops(home: Path, tmp_path: Path) -> None:
    env = cli_env(home)
    started = run_cli(["server", "start", "--json"], env, tmp_path, timeout_s=300)
    assert started.code == 0, started.err[-3000:]
    state = json.loads(started.out)
    try:
        assert state["running"] and state["api_url"].startswith("http://127.0.0.1:"), state
        status = run_cli(["server", "status", "--json"], env, tmp_path)
        assert status.code == 0, status.err[-3000:]
        assert json.loads(status.out) | {"idle_stop_s": 0} == {
            "running": True,
            "ui_url": state["ui_url"],
            "pid": state["pid"],
            "idle_stop_s": 0,
        }
    finally:
        stopped = run_cli(["server", "stop", "--json"], env, tmp_path)
    assert stopped.code == 0, stopped.err[-3000:]
    assert json.loads(stopped.out)["stopped_pid"] == state["pid"]
    after = run_cli(["server", "status", "--json"], env, tmp_path)
    assert json.loads(after.out)["running"] is False


def served(api_url: str) -> set[str]:
    """Names of the deployments the Prefect server at ``api_url`` holds, read through Prefect's client."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        return {d.name for d in client.read_deployments()}


def test_serve_registers_both_deployments_and_ctrl_c_ends_it(server_home: Path, tmp_path: Path) -> None:
    from flows.runtime.local_server import read_state

    state = read_state(server_home)
    assert state is not None
    proc = start_cli(["serve", "--output", str(tmp_path / "store")], cli_env(server_home), tmp_path)
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            if {"scheduled-rebuild", "one-click"} <= served(state.api_url):
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert {"scheduled-rebuild", "one-click"} <= served(state.api_url)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
