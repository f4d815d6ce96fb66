"""``PREFECT_PROFILE=local`` with no user profiles file: ``pileworks build`` uses the server that profile (one
Prefect bundles) names, ``http://127.0.0.1:4200/api``, and starts no server of its own (issue 41)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LOCAL_PROFILE_PORT = 4200  # what Prefect's bundled `local` profile names


def _port_taken(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


PORT_WAIT_S = 240.0  # CI runs the lowest-versions job beside make test: its local servers try 4200 first too


def _wait_for_the_port() -> None:
    """Wait (bounded) until 4200 is free: another suite's local server may hold it for one of its tests. Skipped
    when it stays taken on a developer's machine (a Prefect server of theirs); under CI that fails instead."""
    import os
    import time

    deadline = time.monotonic() + PORT_WAIT_S
    while _port_taken(LOCAL_PROFILE_PORT):
        if time.monotonic() > deadline:
            why = f"127.0.0.1:{LOCAL_PROFILE_PORT} stayed taken for {PORT_WAIT_S:.0f} s (another Prefect server?)"
            if os.environ.get("CI"):
                pytest.fail(why)
            pytest.skip(why + ": the `local` profile names that port, so this test needs it free")
        time.sleep(0.5)


def test_prefect_profile_local_makes_the_build_use_the_server_it_names(tmp_path: Path) -> None:
    import psutil
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.runtime.local_server import WATCH_MODULE, read_state
    from tests.flows.cli.conftest import cli_env, run_cli
    from tests.flows.prefect_server import prefect_server
    from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

    write_tiny_corpus(tmp_path / "raw")
    sets = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]
    argv = ["build", "--input", str(tmp_path / "raw"), "--output", str(tmp_path / "store"), "--name", "tiny"]
    home = tmp_path / "fresh-prefect-home"  # empty: no profiles.toml, no server record
    home.mkdir()
    env = cli_env(home, PREFECT_PROFILE="local")  # and no PREFECT_API_URL (cli_env drops every PREFECT_*)
    assert "PREFECT_API_URL" not in env
    _wait_for_the_port()
    with prefect_server(tmp_path / "server", port=LOCAL_PROFILE_PORT) as server:
        done = run_cli([*argv, *sets, "--json", "--workers", "1"], env, tmp_path, timeout_s=300)
        assert done.code == 0, done.err[-3000:]
        summary = json.loads(done.out)
        run_id = summary["lineage"]["prefect_flow_run_id"]
        assert summary["flow_run_url"] == f"{server.url}/runs/flow-run/{run_id}"
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}), get_client(sync_client=True) as c:
            run = c.read_flow_run(run_id)
        assert run.state is not None and run.state.is_completed() and run.parameters["name"] == "tiny"
    assert read_state(home) is None and not (home / "pileworks-server.log").exists()  # started no server
    watchers = [
        p for p in psutil.process_iter(["cmdline"]) if WATCH_MODULE in " ".join(p.info["cmdline"] or [])
    ]
    assert not [p for p in watchers if str(home) in " ".join(p.info["cmdline"])]
