"""``--task-runner ray://host:port``: the tiny corpus built on a Ray head that the test starts on 127.0.0.1 (its
client server), through prefect-ray, publishes the dataset of a build on this machine's worker processes: same
dataset id, same shards, same stages; the tasks ran in the head's worker processes, not in the flow's.

prefect-ray pulls Ray (about 240 MB installed), so it is an extra of its own (``pileworks[ray]``), not in the test
extra: without it the test is skipped, except on CI (``CI`` set), where ``make test-ray`` installs it and runs it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

HAS_RAY = importlib.util.find_spec("prefect_ray") is not None
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not HAS_RAY and not os.environ.get("CI"), reason="needs pip install pileworks[ray]"),
]
REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(spec: str, workers: int | None, inputs: list[str], output: Path) -> dict[str, Any]:
    from flows.build.flow import build_corpus
    from flows.runtime.runners import with_task_runner

    return with_task_runner(build_corpus, spec, workers)(
        inputs=inputs, output=str(output), overrides=dict(TINY_OVERRIDES)
    )


def start_ray_head(client_port: int, temp: str) -> subprocess.Popen[bytes]:
    """``ray start --head --block`` in a session of its own (stopped by its process group, nobody else's Ray),
    its workers importing this checkout, its files in ``temp``."""
    # The head starts a client server per connection and gives it 30 s by default: on a busy 2-core CI machine its
    # start (a Python process importing Ray) took longer once, so it gets 120 s.
    env = os.environ | {
        "PYTHONPATH": str(REPO),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "120",
    }
    cmd = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={free_port()}",
        f"--ray-client-server-port={client_port}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    head = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start exited {head.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", client_port)) == 0:
                return head
        time.sleep(0.5)
    os.killpg(head.pid, signal.SIGTERM)
    raise RuntimeError("the Ray head's client server did not come up in 120 s")


def test_a_build_on_a_ray_head_publishes_the_dataset_of_a_local_build(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    inputs = write_tiny_corpus(tmp_path / "raw")
    local = build("local", 2, inputs, tmp_path / "store-local")
    client_port = free_port()
    temp = tempfile.mkdtemp(prefix="pw-ray-", dir="/tmp")  # Ray's socket paths must stay short
    head = start_ray_head(client_port, temp)
    try:
        on_ray = build(f"ray://127.0.0.1:{client_port}", None, inputs, tmp_path / "store-ray")
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        shutil.rmtree(temp, ignore_errors=True)
    assert on_ray["dataset_id"] == local["dataset_id"]
    assert on_ray["shard_table"] == local["shard_table"] and on_ray["stages"] == local["stages"]
    assert on_ray["exact_duplicates"] == 1 and on_ray["near_duplicates"] == 1
    # The stage work ran in the Ray head's worker processes: neither here nor in the local build's workers.
    ran = {int(p) for p in on_ray["profile"]["process_peak_rss_mb"]} - {os.getpid()}
    assert ran and not ran & {int(p) for p in local["profile"]["process_peak_rss_mb"]}
    assert on_ray["profile"]["workers"] == 2  # the head's CPUs, as Ray counts them


def test_ray_runner_specs() -> None:
    from prefect_ray import RayTaskRunner

    from flows.runtime.runners import RAY_WORKER_ENV, make_task_runner

    local = make_task_runner("ray", 3)
    assert isinstance(local, RayTaskRunner) and local.address is None
    assert local.init_kwargs["num_cpus"] == 3
    assert local.init_kwargs["runtime_env"] == {"env_vars": RAY_WORKER_ENV}
    remote = make_task_runner("ray://10.0.0.5:10001")
    assert remote.address == "ray://10.0.0.5:10001" and "num_cpus" not in remote.init_kwargs
