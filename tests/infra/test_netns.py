"""Two nodes simulated for real: two network namespaces joined by a veth pair, one training rank in each.

Addresses exist only inside the two namespaces (10.77.0.1/24 and 10.77.0.2/24); nothing is sent anywhere else.
Rank 1 reaches the rendezvous on rank 0's namespace address exactly as a second server would, and
``pileworks doctor`` run in the second namespace must name a wrong ``MASTER_ADDR`` and a closed port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADDR_A, ADDR_B = "10.77.0.1", "10.77.0.2"


def _netns_usable() -> bool:
    """Root, iproute2, and the kernel lets us create a namespace (some containers forbid it): try it."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("ip"):
        return False
    probe = f"pwprobe{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made


pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(
        not _netns_usable(), reason="needs root, iproute2 and permission to create network namespaces"
    ),
]


@dataclass(frozen=True)
class TwoNodes:
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str

    def run(self, ns: str, args: list[str], env: dict[str, str], timeout: float, **kw) -> subprocess.Popen:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *args],
            env=full_env,
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **kw,
        )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_nodes() -> Iterator[TwoNodes]:
    tag = uuid.uuid4().hex[:6]
    nodes = TwoNodes(ns_a=f"pwA{tag}", ns_b=f"pwB{tag}", if_a=f"pwa{tag}", if_b=f"pwb{tag}")
    try:
        _ip("netns", "add", nodes.ns_a)
        _ip("netns", "add", nodes.ns_b)
        _ip(
            "link",
            "add",
            nodes.if_a,
            "netns",
            nodes.ns_a,
            "type",
            "veth",
            "peer",
            "name",
            nodes.if_b,
            "netns",
            nodes.ns_b,
        )
        for ns, ifname, addr in ((nodes.ns_a, nodes.if_a, ADDR_A), (nodes.ns_b, nodes.if_b, ADDR_B)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", ifname, "up")
        yield nodes
    finally:
        for ns in (nodes.ns_a, nodes.ns_b):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:  # only processes this test started inside its own namespaces
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # also removes the veth pair
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert nodes.ns_a not in left and nodes.ns_b not in left


DDP_JOB = textwrap.dedent("""
    import datetime, json, os, sys
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data, as a DistributedSampler gives
    true_w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    losses = []
    for step in range(30):
        x = torch.randn(32, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        losses.append(avg.item() / 2)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(gathered[0], g) for g in gathered)
    print(json.dumps({"rank": rank, "losses": losses, "params_equal": same,
                      "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}), flush=True)
    dist.barrier()  # neither rank tears down (rank 0 hosts the store) while the other still talks to it
    dist.destroy_process_group()
    # Skip C++ static destructors at interpreter exit: gloo's can abort ("terminate called without an active
    # exception") after the job has finished, which says nothing about the network under test.
    os._exit(0)
""")


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_gloo_job_spans_two_namespaces(two_nodes: TwoNodes, tmp_path: Path) -> None:
    script = tmp_path / "ddp_job.py"
    script.write_text(DDP_JOB)
    # Each "node" sources infra/launch/env.sh, which must pick the veth as the gloo interface on both sides
    # (on rank 0's node the master address is local, so the route says "lo": the wrong answer for gloo).
    launch = f"source {ROOT / 'infra/launch/env.sh'} && exec {sys.executable} {script}"
    common = {"MASTER_ADDR": ADDR_A, "MASTER_PORT": "29511", "WORLD_SIZE": "2"}
    procs = [
        two_nodes.run(ns, ["bash", "-c", launch], {**common, "RANK": str(rank)}, 120)
        for rank, ns in enumerate((two_nodes.ns_a, two_nodes.ns_b))
    ]
    results = []
    for proc in procs:
        code, out, err = _finish(proc, 120)
        assert code == 0, f"rank exited {code}: {err[-2000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["gloo_ifname"] for r in results] == [two_nodes.if_a, two_nodes.if_b]
    assert all(r["params_equal"] for r in results), "DDP replicas diverged: gradients were not all-reduced"
    assert results[0]["losses"] == results[1]["losses"]  # the rank-averaged loss is one number on both nodes
    losses = results[0]["losses"]
    assert losses[-1] < 0.2 * losses[0], f"loss did not fall: {losses[0]:.4f} -> {losses[-1]:.4f}"


TRAIN_SETTINGS = {
    "preset": "tiny",
    "seq_len": 32,
    "micro_batch_size": 4,
    "max_steps": 6,
    "warmup_steps": 1,
    "num_workers": 0,
    "eval_batches": 0,
    "log_interval": 1,
    "tensorboard": "false",
    "checkpoint_interval": 100,
}


@pytest.mark.slow
def test_trainer_ranks_in_two_namespaces_complete(two_nodes: TwoNodes, tmp_path: Path) -> None:
    """Our real trainer, one rank per "node": the run completes and its metrics say 2 ranks trained 6 steps."""
    from tests.fixtures.tiny_dataset import build_tiny_dataset
    from training.metrics import read_metrics
    from training.monitor import summarize_run

    manifest = build_tiny_dataset(tmp_path / "store")
    run_dir = tmp_path / "run"  # one shared folder, as NFS would give two real nodes
    sets = [arg for k, v in TRAIN_SETTINGS.items() for arg in ("--set", f"{k}={v}")]
    procs = []
    for rank, (ns, ifname) in enumerate(((two_nodes.ns_a, two_nodes.if_a), (two_nodes.ns_b, two_nodes.if_b))):
        args = [
            sys.executable,
            "-m",
            "training.train",
            "--manifest",
            manifest,
            *sets,
            "--set",
            f"output_dir={run_dir}",
            "--set",
            f"cache_dir={tmp_path / f'cache{rank}'}",
        ]
        env = {
            "MASTER_ADDR": ADDR_A,
            "MASTER_PORT": "29515",
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "GLOO_SOCKET_IFNAME": ifname,
            "DS_ACCELERATOR": "cpu",
        }
        procs.append(two_nodes.run(ns, args, env, 240))
    for rank, proc in enumerate(procs):
        code, _, err = _finish(proc, 240)
        assert code == 0, f"rank {rank} exited {code}: {err[-3000:]}"
    start = read_metrics(run_dir, "start")[-1]
    steps = read_metrics(run_dir, "train")
    assert start["world_size"] == 2
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert read_metrics(run_dir, "end")[-1]["step"] == 6
    report = summarize_run(run_dir)  # doctor --during reads the same file
    assert report.steps == 6 and report.last_step == 6
    assert report.data_wait_share is not None and 0 <= report.data_wait_share < 1


def _doctor(nodes: TwoNodes, ns: str, addr: str, port: int, *extra: str) -> tuple[int, dict]:
    proc = nodes.run(
        ns,
        [
            sys.executable,
            "-m",
            "flows.cli",
            "doctor",
            "--only",
            "master",
            "--json",
            "--master-addr",
            addr,
            "--master-port",
            str(port),
            "--connect-timeout",
            "2",
            *extra,
        ],
        {},
        60,
    )
    code, out, err = _finish(proc, 60)
    assert out.strip(), f"doctor printed nothing (exit {code}): {err[-2000:]}"
    return code, json.loads(out)["results"][0]


def test_doctor_in_second_namespace_names_wrong_master_and_closed_port(two_nodes: TwoNodes) -> None:
    # A typo'd name: resolution fails (the namespace has no route to any DNS server, so nothing leaves it).
    code, res = _doctor(two_nodes, two_nodes.ns_b, "pileworks-master-typo.invalid", 29512)
    assert code == 1 and res["status"] == "FAIL"
    assert "cannot resolve MASTER_ADDR 'pileworks-master-typo.invalid'" in res["message"]
    assert "/etc/hosts" in res["fix"]

    # An address on the subnet that no node holds: not on this host and unreachable.
    t0 = time.monotonic()
    code, res = _doctor(two_nodes, two_nodes.ns_b, "10.77.0.3", 29512)
    assert code == 1 and res["status"] == "FAIL"
    assert "10.77.0.3 is not an address of this host and is unreachable" in res["message"]
    assert time.monotonic() - t0 < 30, "an unreachable master must be reported in seconds"

    # The right node, but nothing listens on the port: a warning before launch, a failure when expected up.
    code, res = _doctor(two_nodes, two_nodes.ns_b, ADDR_A, 29512)
    assert code == 0 and res["status"] == "WARN"
    assert f"MASTER_ADDR {ADDR_A} answers but port 29512 is closed (connection refused)" in res["message"]
    code, res = _doctor(two_nodes, two_nodes.ns_b, ADDR_A, 29512, "--expect-master")
    assert code == 1 and res["status"] == "FAIL" and "port 29512 is closed" in res["message"]


def test_doctor_passes_when_rendezvous_listens(two_nodes: TwoNodes) -> None:
    listener = two_nodes.run(
        two_nodes.ns_a,
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import socket, sys, time
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("{ADDR_A}", 29513)); s.listen(); print("up", flush=True); time.sleep(60)
    """),
        ],
        {},
        60,
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "up"
        code, res = _doctor(two_nodes, two_nodes.ns_b, ADDR_A, 29513, "--expect-master")
        assert code == 0 and res["status"] == "PASS", res
        assert "reachable and port 29513 is open" in res["message"]
        # On the master's own node the same address is local and its port is taken by the server.
        code, res = _doctor(two_nodes, two_nodes.ns_a, ADDR_A, 29513, "--expect-master")
        assert code == 0 and res["status"] == "PASS" and "is this host" in res["message"], res
        code, res = _doctor(two_nodes, two_nodes.ns_a, ADDR_A, 29514)
        assert code == 0 and res["status"] == "PASS" and "port 29514 is free" in res["message"], res
    finally:
        listener.kill()
        listener.communicate()
