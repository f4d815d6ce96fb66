"""``--task-runner ray://host:port``: the tiny corpus built on a Ray head that the test starts on 127.0.0.1 (its
client server), through prefect-ray, publishes the dataset of a build on this machine's worker processes: same
dataset id, same shards, same stages; the tasks ran in the head's worker processes, not in the flow's.

prefect-ray pulls Ray (about 240 MB installed), so it is an extra of its own (``pileworks[ray]``), not in the test
extra: without it the test is skipped, except on CI (``CI`` set), where ``make test-ray`` installs it and runs it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
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
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}


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
    # Ray's client server starts a server process per client; on a loaded 2-core machine that process sometimes
    # dies before it serves (Ray's own start: 2 of 4 connections with both cores kept busy, none idle), and the
    # client is told only once the head has waited for its channel: 130 s at 120 s, about 40 s at Ray's default
    # 30 s, so the default stands, and the test connects again to the same head (below).
    from flows.runtime.runners import RAY_LOOPBACK_ENV

    env = (
        os.environ
        | {
            RAY_LOOPBACK_ENV: "0",
            "RAY_AUTH_MODE": "disabled",  # as the client: not by whether a token lies in ~/.ray (a local ray.init's)
            "PYTHONPATH": str(REPO),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
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
    stop_ray_head(head)
    raise RuntimeError("the Ray head's client server did not come up in 120 s")


def stop_ray_head(head: subprocess.Popen[bytes]) -> None:
    """``ray start --block`` stops its node on SIGTERM (its GCS still up, so the drain is quick; SIGTERM to the
    whole group at once leaves it waiting 30 s for a GCS already gone), then anything left in its session goes."""
    head.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGKILL)
    head.wait(timeout=30)


def listening_addresses(pid: int) -> set[str]:
    """The addresses on which a process and all it started (a Ray head, a local Ray instance's driver) accept
    connections."""
    import psutil  # Ray's own dependency

    found = set()
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            found |= {c.laddr.ip for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    return found


def ray_head_report(temp: str) -> str:
    """What to read when a Ray head did not serve its client: the tails of its own logs of errors (the client
    server's ``ray_client_server_*.err`` first of all), and the busiest processes on the machine."""
    lines = []
    for log in sorted(Path(temp).glob("session_*/logs/*")):
        if log.suffix == ".err" or log.name.startswith(("gcs_server", "raylet", "runtime_env_agent")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            if tail:
                lines += [f"--- {log.name}", *tail]
    ps = subprocess.run(
        ["ps", "-eo", "pid,ppid,pcpu,rss,etime,args", "--sort=-pcpu"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return "\n".join([*lines, "--- busiest processes", *ps.stdout.splitlines()[:12]])


def test_a_build_on_a_ray_head_publishes_the_dataset_of_a_local_build(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    inputs = write_tiny_corpus(tmp_path / "raw")
    local = build("local", 2, inputs, tmp_path / "store-local")
    # The head is Ray's, started here on a 2-core machine running the suite: on CI its server process for a client
    # died before serving it (Ray's own start, before any of our work reached it). Such a failure is reported and
    # the build connects again, to the same head, up to three times more (a failure costs about 40 s; with 1 in 3
    # connections failing on a busy machine, four in a row is about 1%); a build that fails any other way fails the
    # test at once.
    on_ray, reports = None, []
    client_port = free_port()
    temp = tempfile.mkdtemp(prefix="pw-ray-", dir="/tmp")  # Ray's socket paths must stay short
    head = start_ray_head(client_port, temp)
    try:
        listening = listening_addresses(head.pid)
        assert listening <= LOOPBACK, listening  # a test's head: 127.0.0.1 only
        for attempt in range(4):
            store = tmp_path / f"store-ray-{attempt}"
            try:
                on_ray = build(f"ray://127.0.0.1:{client_port}", None, inputs, store)
                break
            except ConnectionError as e:
                # ray.init's client: "Initialization failure from server", or no channel
                reports.append(f"attempt {attempt}: {e!r}\n{ray_head_report(temp)}")
                warnings.warn(f"the Ray head did not serve its client:\n{reports[-1]}", stacklevel=1)
    finally:
        stop_ray_head(head)
        shutil.rmtree(temp, ignore_errors=True)
    assert on_ray is not None, "\n\n".join(reports)
    assert on_ray["dataset_id"] == local["dataset_id"]
    assert on_ray["shard_table"] == local["shard_table"] and on_ray["stages"] == local["stages"]
    assert on_ray["exact_duplicates"] == 1 and on_ray["near_duplicates"] == 1
    # The stage work ran in the Ray head's worker processes: neither here nor in the local build's workers.
    ran = {int(p) for p in on_ray["profile"]["process_peak_rss_mb"]} - {os.getpid()}
    assert ran and not ran & {int(p) for p in local["profile"]["process_peak_rss_mb"]}
    assert on_ray["profile"]["workers"] == 2  # the head's CPUs, as Ray counts them


# Run in a process of its own: Ray reads its switch once, on its first import.
LOCAL_RAY = """
import json, os
from flows.runtime.runners import make_task_runner
from tests.flows.runtime.test_ray_runner import listening_addresses
with make_task_runner("ray", 1):
    print(json.dumps(sorted(listening_addresses(os.getpid()))))
"""


def test_a_local_ray_instance_listens_on_127_0_0_1_only(tmp_path: Path) -> None:
    """``--task-runner ray`` starts Ray on this machine: its GCS, raylet, driver and agents accept connections on
    127.0.0.1 only, not on the machine's network address (Ray's default, with no authentication)."""
    from flows.runtime.runners import RAY_LOOPBACK_ENV

    env = {k: v for k, v in os.environ.items() if k != RAY_LOOPBACK_ENV}
    # HOME: a local ray.init writes its authentication token to ~/.ray, here not the user's
    env |= {"PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", LOCAL_RAY], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert found and found <= LOOPBACK, found
    assert (tmp_path / ".ray" / "auth_token").is_file()  # and with Ray's token, as Ray starts one by default


def test_ray_runner_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_ray import RayTaskRunner

    from flows.runtime.runners import RAY_LOOPBACK_ENV, RAY_WORKER_ENV, make_task_runner

    monkeypatch.setenv(RAY_LOOPBACK_ENV, "1")  # the user's own setting stays
    make_task_runner("ray", 3)
    assert os.environ[RAY_LOOPBACK_ENV] == "1"
    monkeypatch.delenv(RAY_LOOPBACK_ENV)
    remote = make_task_runner("ray://10.0.0.5:10001")
    assert remote.address == "ray://10.0.0.5:10001" and "num_cpus" not in remote.init_kwargs
    assert RAY_LOOPBACK_ENV not in os.environ  # a client of a cluster elsewhere starts no Ray here
    local = make_task_runner("ray", 3)
    assert os.environ[RAY_LOOPBACK_ENV] == "0"
    assert isinstance(local, RayTaskRunner) and local.address is None
    assert local.init_kwargs["num_cpus"] == 3
    assert local.init_kwargs["runtime_env"] == {"env_vars": RAY_WORKER_ENV}
