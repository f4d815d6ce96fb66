"""``pileworks doctor``: each check's PASS/WARN/FAIL on real sockets, processes and stores, and the CLI around it.

Network probes here touch 127.0.0.0/8 only; the two-node behaviour is in test_netns.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from pathlib import Path

import pytest
import torch

from training.preflight import host, net, runner
from training.preflight import store as store_check
from training.preflight.base import CheckResult, DoctorConfig, Status
from training.preflight.dist import check_allreduce, check_deepspeed_config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _fake_exe(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"master_port": 0}, "master_port"),
        ({"backend": "mpi"}, "backend"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"only": ("versions", "nosuch")}, "nosuch"),
        ({"world_size": 0}, "world_size"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DoctorConfig(**kwargs)


def test_config_from_env_reads_launch_variables() -> None:
    cfg = DoctorConfig.from_env(
        {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29600", "NCCL_DEBUG": "INFO", "HOME": "/root"},
        hostfile="hf",
    )
    assert (cfg.master_addr, cfg.master_port, cfg.hostfile) == ("10.1.2.3", 29600, "hf")
    assert cfg.env == {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29600", "NCCL_DEBUG": "INFO"}
    with pytest.raises(ValueError, match="MASTER_PORT must be a port number"):
        DoctorConfig.from_env({"MASTER_PORT": "http"})


# ---------------------------------------------------------------- master address and port
def test_master_unset_warns() -> None:
    [res] = net.check_master(DoctorConfig())
    assert res.status is Status.WARN and "MASTER_ADDR is not set" in res.message


def test_master_unresolvable_fails_with_hosts_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_name(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(net.socket, "getaddrinfo", no_such_name)
    [res] = net.check_master(DoctorConfig(master_addr="gpu-node-01x"))
    assert res.status is Status.FAIL
    assert res.message == "cannot resolve MASTER_ADDR 'gpu-node-01x': Name or service not known"
    assert "/etc/hosts" in res.fix


def test_master_on_this_host_free_port_passes() -> None:
    port = _free_port()
    [res] = net.check_master(DoctorConfig(master_addr="127.0.0.1", master_port=port))
    assert res.status is Status.PASS and f"port {port} is free" in res.message
    [res] = net.check_master(DoctorConfig(master_addr="127.0.0.1", master_port=port, expect_master=True))
    assert res.status is Status.FAIL and "nothing listens" in res.message


def test_master_port_in_use_fails_unless_the_server_is_expected() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        [res] = net.check_master(DoctorConfig(master_addr="127.0.0.1", master_port=port))
        assert res.status is Status.FAIL and f"port {port} is already in use" in res.message
        assert "MASTER_PORT" in res.fix
        [res] = net.check_master(DoctorConfig(master_addr="localhost", master_port=port, expect_master=True))
        assert res.status is Status.PASS and "listening" in res.message


def test_loopback_master_with_multi_node_hostfile_fails(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=8\nnode-b slots=8\n")
    [res] = net.check_master(
        DoctorConfig(master_addr="127.0.0.1", master_port=_free_port(), hostfile=str(hostfile))
    )
    assert res.status is Status.FAIL and "loopback address but the hostfile lists 2 nodes" in res.message


def test_tcp_probe_tells_refused_from_open() -> None:
    assert net.tcp_probe("127.0.0.1", _free_port(), 2)[0] == "refused"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert net.tcp_probe("127.0.0.1", server.getsockname()[1], 2) == ("open", "")


# ---------------------------------------------------------------- hostfile and ssh
def test_parse_hostfile() -> None:
    text = "# cluster\nworker-1 slots=8  # first\n\nworker-2 slots=4\n"
    assert net.parse_hostfile(text) == [
        net.HostSlots("worker-1", 8),
        net.HostSlots("worker-2", 4),
    ]
    for bad, why in (
        ("worker-1 8\n", "line 1"),
        ("a slots=1\na slots=2\n", "listed twice"),
        ("# x\n", "no hosts"),
    ):
        with pytest.raises(ValueError, match=why):
            net.parse_hostfile(bad)


def test_hostfile_nodes_resolve_and_need_batch_mode_ssh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "ssh.log"
    # A stand-in ssh: logs its arguments; 127.0.0.1 accepts the key, localhost refuses it.
    _fake_exe(
        tmp_path / "bin",
        "ssh",
        f'echo "$@" >> {log}\n'
        'for a in "$@"; do host_prev="$host"; host="$a"; done\n'
        'if [ "$host_prev" = "127.0.0.1" ]; then exit 0; fi\n'
        'echo "$host_prev: Permission denied (publickey)." >&2; exit 255\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=2\nlocalhost slots=2\n")
    results = {r.name: r for r in net.check_hostfile(DoctorConfig(hostfile=str(hostfile)))}
    assert results["hostfile:127.0.0.1"].status is Status.PASS
    bad = results["hostfile:localhost"]
    assert bad.status is Status.FAIL and "passwordless ssh failed" in bad.message
    assert "Permission denied (publickey)" in bad.message and "ssh-copy-id localhost" in bad.fix
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all(
        "BatchMode=yes" in c and "ConnectTimeout=3" in c and c.endswith(" true") for c in calls
    )


def test_bad_hostfile_line_fails(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=eight\n")
    [res] = net.check_hostfile(DoctorConfig(hostfile=str(hostfile)))
    assert res.status is Status.FAIL and "expected 'HOSTNAME slots=N'" in res.message


# ---------------------------------------------------------------- interfaces, GPU, disk
def test_socket_ifname_must_match_an_interface() -> None:
    ok = net.check_interfaces(DoctorConfig(env={"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}))
    assert [r.status for r in ok] == [Status.PASS, Status.PASS]
    [bad] = net.check_interfaces(DoctorConfig(env={"NCCL_SOCKET_IFNAME": "=ib9"}))
    assert bad.status is Status.FAIL and "NCCL_SOCKET_IFNAME==ib9 matches no interface" in bad.message
    # gloo takes exact names: a prefix that NCCL would accept is not an interface for gloo
    [bad] = net.check_interfaces(DoctorConfig(env={"GLOO_SOCKET_IFNAME": "l"}))
    assert bad.status is Status.FAIL


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU branches need a host without a usable GPU")
def test_gpu_check_cpu_mode_and_cpu_wheel_on_gpu_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    [res] = host.check_gpu(DoctorConfig())
    assert res.status is Status.WARN and res.message.startswith("no GPU: CPU/gloo mode")
    if torch.version.cuda is None:
        _fake_exe(
            tmp_path / "bin",
            "nvidia-smi",
            'case "$1" in --query-gpu*) echo "550.54.15, NVIDIA H100";; '
            '*) echo "| NVIDIA-SMI 550.54.15  Driver Version: 550.54.15  CUDA Version: 12.4 |";; esac\n',
        )
        monkeypatch.setenv("PATH", str(tmp_path / "bin"))
        [res] = host.check_gpu(DoctorConfig())
        assert (
            res.status is Status.FAIL
            and "is a CPU build but nvidia-smi sees 1 GPU(s) (driver 550.54.15)" in res.message
        )
        assert "infra/setup_env.sh" in res.fix and res.data["driver_cuda"] == "12.4"


def test_disk_thresholds(tmp_path: Path) -> None:
    deep = str(tmp_path / "not" / "yet" / "made")
    passed = host.check_disk(DoctorConfig(cache_dir=deep, checkpoint_dir=str(tmp_path), min_free_gib=0))
    assert [r.status for r in passed] == [Status.PASS, Status.PASS]
    assert passed[0].data["filesystem_of"] == str(tmp_path)
    failed = host.check_disk(DoctorConfig(cache_dir=deep, checkpoint_dir=deep, min_free_gib=1e9))
    assert all(r.status is Status.FAIL for r in failed) and "GiB free for cache" in failed[0].message


# ---------------------------------------------------------------- processes: all-reduce, DeepSpeed dry run
@pytest.mark.distributed
def test_allreduce_two_processes_measures_bandwidth() -> None:
    [res] = check_allreduce(DoctorConfig(backend="gloo", allreduce_mib=1, timeout_s=60))
    assert res.status is Status.PASS, res.message
    assert res.data["backend"] == "gloo" and res.data["bytes"] == 2**20
    assert res.data["busbw_gb_s"] > 0 and res.data["busbw_gb_s"] == pytest.approx(res.data["algbw_gb_s"])


@pytest.mark.distributed
def test_allreduce_on_a_wrong_interface_fails_with_the_ranks_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "pwnosuch0")  # the children inherit it, as ranks of a job would
    [res] = check_allreduce(DoctorConfig(backend="gloo", allreduce_mib=1, timeout_s=30))
    assert res.status is Status.FAIL and re.search(
        r"2-process gloo all-reduce failed: rank [01]: ", res.message
    )
    assert "pwnosuch0" in res.message and "GLOO_SOCKET_IFNAME" in res.fix


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host where CUDA is unavailable")
def test_allreduce_nccl_without_gpus_fails_fast() -> None:
    [res] = check_allreduce(DoctorConfig(backend="nccl"))
    assert res.status is Status.FAIL and res.message == "backend nccl needs CUDA GPUs, and torch sees none"


@pytest.mark.distributed
def test_deepspeed_dry_run_catches_batch_mismatch_for_world_size(tmp_path: Path) -> None:
    good = tmp_path / "ds.json"
    good.write_text(
        json.dumps(
            {
                "train_batch_size": 16,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 2,
                "zero_optimization": {"stage": 1},
            }
        )
    )
    [res] = check_deepspeed_config(DoctorConfig(deepspeed_config=str(good), world_size=2))
    assert (
        res.status is Status.PASS
        and "valid for world size 2" in res.message
        and "ZeRO stage 1" in res.message
    )
    [res] = check_deepspeed_config(DoctorConfig(deepspeed_config=str(good), world_size=3))
    assert res.status is Status.FAIL
    assert (
        "train_batch_size 16 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2 * world "
        "size 3" in res.message
    )


def test_unreadable_deepspeed_config_fails(tmp_path: Path) -> None:
    bad = tmp_path / "ds.yaml"
    bad.write_text("- just\n- a list\n")
    [res] = check_deepspeed_config(DoctorConfig(deepspeed_config=str(bad)))
    assert res.status is Status.FAIL and "must hold a mapping" in res.message


# ---------------------------------------------------------------- object store
def test_store_probe_on_local_folder(tmp_path: Path) -> None:
    [res] = store_check.check_store(DoctorConfig(store=str(tmp_path / "store"), store_probe_mib=1))
    assert res.status is Status.PASS and res.data["write_mib_s"] > 0 and res.data["read_mib_s"] > 0
    assert not list((tmp_path / "store").rglob("*.bin")), "the probe object must be deleted"


@pytest.mark.s3
def test_store_probe_on_s3_and_missing_bucket(s3_bucket) -> None:
    [res] = store_check.check_store(
        DoctorConfig(store=s3_bucket.uri, s3=s3_bucket.options, store_probe_mib=1)
    )
    assert res.status is Status.PASS, res.message
    assert "write/read/delete ok" in res.message
    [res] = store_check.check_store(
        DoctorConfig(store="s3://pw-no-such-bucket-x/p", s3=s3_bucket.options, store_probe_mib=1)
    )
    assert res.status is Status.FAIL and "does not exist" in res.message and "create the bucket" in res.fix


# ---------------------------------------------------------------- runner and CLI
def test_runner_reports_a_crashing_check(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(cfg: DoctorConfig) -> list[CheckResult]:
        raise RuntimeError("probe exploded")

    monkeypatch.setitem(runner.CHECKS, "disk", boom)
    results = runner.run_doctor(DoctorConfig(only=("disk",)))
    assert [(r.status, r.message) for r in results] == [
        (Status.FAIL, "check crashed: RuntimeError: probe exploded")
    ]
    assert runner.exit_code(results) == 1
    assert "fix: report this" in runner.format_result(results[0])


# ---------------------------------------------------------------- the Prefect flow
@pytest.mark.slow  # a Prefect test server takes 10-40 s to start on 2 cores
def test_doctor_flow_reports_artifact_and_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.testing.utilities import prefect_test_harness

    from flows.train.doctor import doctor_flow

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with prefect_test_harness(server_startup_timeout=120):
        found = doctor_flow(only=["versions", "master"])
        assert [d["name"] for d in found] == ["python", "torch", "deepspeed", "master"]
        assert found[-1]["status"] == "WARN"
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            state = doctor_flow(
                master_addr="127.0.0.1",
                master_port=server.getsockname()[1],
                only=["master"],
                return_state=True,
            )
        assert state.is_failed() and "already in use" in str(state.message)
        from prefect.client.orchestration import get_client

        async def artifact_rows():
            async with get_client() as client:
                art = await client.read_latest_artifacts()
                return [a for a in art if a.key == "doctor-report"]

        import asyncio

        [art] = asyncio.run(artifact_rows())
        assert "FAIL" in str(art.data) and "0 PASS, 0 WARN, 1 FAIL" in (art.description or "")
