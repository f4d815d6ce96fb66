"""A build across "machines" with no shared disk: a Dask scheduler and two workers, each in network and mount
namespaces of its own (``tests/fixtures/netns.py``: its own loopback, its own ``/tmp``, no view of the test's or
the other's files), the store and the inputs on the moto S3 server behind a proxy adding 20 ms to every request.
It publishes the dataset of a build in this process (same id, same shards, same stages); the workers did the work;
a worker that opens a path it did not create fails the build (``tests/fixtures/own_paths.py``) and its log says so.
"""

from __future__ import annotations

import contextlib
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

from tests.fixtures import netns
from tests.fixtures.fault_proxy import FaultProxy
from tests.fixtures.s3_corpus import upload_corpus
from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.s3,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not netns.usable(), reason="needs unshare -Urmn (user, mount, network namespaces) and ip"
    ),
]
ONE_THREAD = {"PILEWORKS_THREADS": "1", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [int(s.getsockname()[1]) for s in socks]
    for s in socks:
        s.close()
    return ports


def build(spec: str, inputs: str, output: str, endpoint: str) -> dict[str, Any]:
    from flows.build.flow import build_corpus
    from flows.runtime.runners import with_task_runner

    overrides = dict(TINY_OVERRIDES) | {"s3.endpoint_url": endpoint, "s3.region": "us-east-1"}
    return with_task_runner(build_corpus, spec, 2)(inputs=[inputs], output=output, overrides=overrides)


def test_a_build_on_workers_with_no_shared_disk_publishes_the_local_dataset(
    prefect_harness: None, s3_server: str, tmp_path: Path
) -> None:
    from prefect.settings import PREFECT_API_URL

    write_tiny_corpus(tmp_path / "raw")
    inputs = upload_corpus(tmp_path / "raw", s3_server, "pw-no-shared-disk")
    proxy = FaultProxy(s3_server, latency_s=0.02)
    api_port = int(str(PREFECT_API_URL.value()).rsplit(":", 1)[1].split("/")[0])
    proxy_port = int(proxy.url.rsplit(":", 1)[1])
    sched, wa, wb = free_ports(3)
    folder = Path(tempfile.mkdtemp(prefix="pw-relay-", dir="/tmp"))  # unix socket paths must stay short
    host = netns.HostRelay(folder, serve=[api_port, proxy_port], forward=[sched, wa, wb])
    dask = str(Path(sys.executable).with_name("dask"))
    env = dict(os.environ) | ONE_THREAD
    everyone = [sched, wa, wb, api_port, proxy_port]
    procs: list[subprocess.Popen[bytes]] = []
    logs = {name: tmp_path / f"{name}.log" for name in ("scheduler", "worker-a", "worker-b")}
    try:
        scheduler = [dask, "scheduler", "--host", "127.0.0.1", "--port", str(sched), "--no-dashboard"]
        procs.append(
            netns.spawn(folder, [sched], _others(everyone, sched), scheduler, env, logs["scheduler"])
        )
        for name, port in (("worker-a", wa), ("worker-b", wb)):
            worker = [dask, "worker", f"tcp://127.0.0.1:{sched}", "--nthreads", "1", "--no-nanny"]
            worker += [
                "--listen-address",
                f"tcp://127.0.0.1:{port}",
                "--contact-address",
                f"tcp://127.0.0.1:{port}",
            ]
            worker += ["--no-dashboard", "--preload", "tests.fixtures.own_paths", "--name", name]
            procs.append(netns.spawn(folder, [port], _others(everyone, port), worker, env, logs[name]))
        with _client(f"tcp://127.0.0.1:{sched}", procs) as client:
            client.wait_for_workers(2, timeout=180)
            worker_pids = set(client.run(os.getpid).values())
        apart = build(f"dask://127.0.0.1:{sched}", inputs, "s3://pw-no-shared-disk/apart", proxy.url)
    finally:
        for p in procs:
            with contextlib.suppress(
                ProcessLookupError
            ):  # one that died already: the assertion above says why
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        host.close()
        shutil.rmtree(folder, ignore_errors=True)
    proxy.close()
    # the reference build straight at the server: the 20 ms per request (about 1,400 requests, 24 s) is there
    # for the namespaced workers' sake, and where the store is does not enter the id
    here = build("threads", inputs, "s3://pw-no-shared-disk/here", s3_server)
    worker_logs = "\n".join(log.read_text(errors="replace") for log in logs.values())
    assert "FOREIGN PATH" not in worker_logs, worker_logs[-3000:]

    assert apart["dataset_id"] == here["dataset_id"]
    assert apart["shard_table"] == here["shard_table"] and apart["stages"] == here["stages"]
    assert apart["exact_duplicates"] == 1 and apart["near_duplicates"] == 1
    # Every stage and global step ran in the namespaced workers (tokenizer training in a child process of one):
    # the flow's process ran no step but its planning (listing the inputs), and the global steps report the
    # workers' pids.
    ran = {int(p) for p in apart["profile"]["process_peak_rss_mb"]}
    assert ran - {os.getpid()} <= worker_pids and len(ran & worker_pids) == 2
    on_worker = [p for p in apart["profile"]["passes"] if "pids" in p]
    assert on_worker and all(set(p["pids"]) <= worker_pids for p in on_worker)
    parts, flow_calls = apart["profile"]["parts"], apart["profile"]["flow_storage"].get("attempts", 0)
    print(
        f"\nno shared disk: {parts} parts, flow process made {flow_calls} S3 calls ({flow_calls / parts:.1f} per part)"
    )


def _others(ports: list[int], mine: int) -> list[int]:
    return [p for p in ports if p != mine]


def _client(address: str, procs: list[subprocess.Popen[bytes]]) -> Any:
    """A client of the namespaced scheduler, once it is up (until then the relay closes each connection)."""
    from distributed import Client

    deadline = time.monotonic() + 180
    while True:
        try:
            return Client(address, timeout=10)
        except OSError:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise
            time.sleep(1)
