"""infra/ shell scripts: syntax, shellcheck, setup_env.sh's plan on CPU and GPU machines, env.sh, launch commands.

setup_env.sh runs in ``--dry-run`` mode with a hermetic PATH (only the tools it needs, plus a fake ``nvidia-smi``
where a GPU is simulated) and a hermetic pip configuration, so the CPU and GPU branches are both exercised here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
SCRIPTS = [
    INFRA / "setup_env.sh",
    INFRA / "launch" / "env.sh",
    INFRA / "launch" / "deepspeed_multinode.sh",
    INFRA / "launch" / "torchrun_node.sh",
]
TOOLS = [
    "bash",
    "sed",
    "awk",
    "grep",
    "head",
    "cut",
    "cat",
    "sha256sum",
    "env",
    "dirname",
    "ip",
    "getent",
    "printf",
    "python3",
    "python3.11",
]


@pytest.fixture
def hermetic(tmp_path: Path) -> dict[str, str]:
    """Env whose PATH holds only the needed tools (no real nvidia-smi, conda or pip config)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    for name in ("python3", "python3.11"):  # version shims (pyenv) need their own PATH: use this interpreter
        (bin_dir / name).unlink(missing_ok=True)
        (bin_dir / name).symlink_to(sys.executable)
    links = tmp_path / "wheels"
    links.mkdir()
    return {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_FIND_LINKS": str(links),
    }


def _fake(env: dict[str, str], name: str, body: str) -> None:
    path = Path(env["PATH"].split(":")[0]) / name
    path.unlink(missing_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _setup(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(INFRA / "setup_env.sh"), "--dry-run", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
    )


def _smi(env: dict[str, str], cuda: str) -> None:
    _fake(
        env,
        "nvidia-smi",
        f'echo "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: {cuda} |"\n',
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_clean() -> None:
    proc = subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout


def test_cpu_plan_for_a_new_environment(hermetic: dict[str, str], tmp_path: Path) -> None:
    env_dir = tmp_path / "newenv"
    proc = _setup(hermetic, "--env-dir", str(env_dir), "--venv")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "no nvidia-smi: CPU machine, torch 2.13.0 CPU wheel" in out
    plans = [line for line in out.splitlines() if line.startswith("plan: ")]
    assert plans[0].endswith(f"-m venv {env_dir}")
    assert (
        plans[1] == f"plan: {env_dir}/bin/python -m pip install torch==2.13.0+cpu --index-url "
        "https://download.pytorch.org/whl/cpu"
    )
    assert plans[2] == f"plan: env DS_BUILD_OPS=0 {env_dir}/bin/python -m pip install deepspeed>=0.15"
    assert plans[3] == f"plan: {env_dir}/bin/python -m pip install -e {ROOT}[dev]"
    assert not env_dir.exists(), "--dry-run must not create anything"


def test_cpu_plan_uses_a_local_cpu_wheel_mirror(hermetic: dict[str, str], tmp_path: Path) -> None:
    (Path(hermetic["PIP_FIND_LINKS"]) / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    proc = _setup(hermetic, "--env-dir", str(tmp_path / "e"), "--extras", "")
    assert proc.returncode == 0, proc.stderr
    assert f"plan: {tmp_path}/e/bin/python -m pip install torch==2.13.0+cpu\n" in proc.stdout
    assert f"-m pip install -e {ROOT}\n" in proc.stdout


@pytest.mark.parametrize(
    ("cuda", "tag"), [("12.4", "cu124"), ("12.5", "cu124"), ("13.0", "cu130"), ("12.8", "cu128")]
)
def test_gpu_plan_matches_the_driver(hermetic: dict[str, str], tmp_path: Path, cuda: str, tag: str) -> None:
    _smi(hermetic, cuda)
    proc = _setup(hermetic, "--env-dir", str(tmp_path / "e"))
    assert proc.returncode == 0, proc.stderr
    assert f"GPU driver 550.54.15 supports CUDA {cuda}: torch 2.13.0 built for {tag}" in proc.stdout
    assert (
        f"pip install torch==2.13.0+{tag} --index-url https://download.pytorch.org/whl/{tag}\n" in proc.stdout
    )


def test_gpu_plan_refuses_a_driver_too_old(hermetic: dict[str, str], tmp_path: Path) -> None:
    _smi(hermetic, "11.4")
    proc = _setup(hermetic, "--env-dir", str(tmp_path / "e"))
    assert proc.returncode == 1
    assert (
        "supports CUDA 11.4, older than every build" in proc.stderr
        and "upgrade the NVIDIA driver" in proc.stderr
    )


def test_broken_nvidia_smi_is_an_error(hermetic: dict[str, str], tmp_path: Path) -> None:
    _fake(
        hermetic,
        "nvidia-smi",
        'echo "NVIDIA-SMI has failed because it could not communicate with the driver"\nexit 9\n',
    )
    proc = _setup(hermetic, "--env-dir", str(tmp_path / "e"))
    assert proc.returncode == 1 and "nvidia-smi is installed but fails: NVIDIA-SMI has failed" in proc.stderr


@pytest.mark.skipif(
    not __import__("torch").__version__.endswith("+cpu"), reason="needs a +cpu torch in this env"
)
def test_second_run_on_a_ready_environment_skips_installs(hermetic: dict[str, str]) -> None:
    import deepspeed  # noqa: F401  (installed: the plan must skip it)
    import torch

    version = torch.__version__.split("+")[0]
    proc = _setup(hermetic, "--env-dir", sys.prefix, "--torch-version", version)
    assert proc.returncode == 0, proc.stderr
    assert f"environment {sys.prefix} exists: reusing it" in proc.stdout
    assert f"torch {torch.__version__} already installed: skipping" in proc.stdout
    assert "deepspeed" in proc.stdout and "already installed: skipping" in proc.stdout
    assert "-m venv" not in proc.stdout and "pip install torch" not in proc.stdout


# ---------------------------------------------------------------- env.sh
def _source_env(env: dict[str, str]) -> subprocess.CompletedProcess:
    script = (
        f"set -u; source {INFRA / 'launch' / 'env.sh'}; rc=$?; "
        'echo "rc=$rc $MASTER_ADDR $MASTER_PORT ${NCCL_SOCKET_IFNAME:-} ${GLOO_SOCKET_IFNAME:-} $NCCL_IB_DISABLE"'
    )
    return subprocess.run(["bash", "-c", script], env=env, text=True, capture_output=True, timeout=30)


def test_env_sh_defaults_and_checks(hermetic: dict[str, str]) -> None:
    proc = _source_env(hermetic)
    assert proc.stdout.split()[:3] == ["rc=0", "127.0.0.1", "29500"]
    bad_port = _source_env({**hermetic, "MASTER_PORT": "70000"})
    assert bad_port.stdout.startswith("rc=1") and "MASTER_PORT=70000 is not a port number" in bad_port.stderr
    bad_if = _source_env({**hermetic, "GLOO_SOCKET_IFNAME": "nosuch0"})
    assert bad_if.stdout.startswith("rc=1") and "GLOO_SOCKET_IFNAME names nosuch0" in bad_if.stderr


def test_env_sh_picks_the_interface_routing_to_the_master(hermetic: dict[str, str]) -> None:
    # Stand-ins for DNS and the routing table: nothing is sent anywhere.
    _fake(hermetic, "getent", 'case "$2" in master-1) echo "10.9.9.9 STREAM master-1";; *) exit 2;; esac\n')
    _fake(hermetic, "ip", 'echo "10.9.9.9 via 10.0.0.254 dev lo src 10.0.0.5 uid 0"\n')
    proc = _source_env({**hermetic, "MASTER_ADDR": "master-1"})
    assert proc.stdout.split()[:5] == ["rc=0", "master-1", "29500", "lo", "lo"], proc.stderr
    proc = _source_env({**hermetic, "MASTER_ADDR": "master-typo"})
    assert proc.stdout.startswith("rc=1") and "cannot resolve MASTER_ADDR=master-typo" in proc.stderr


# ---------------------------------------------------------------- launch scripts
def _launch(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(INFRA / "launch" / script), *args],
        env={**env, "PILEWORKS_DRY_RUN": "1"},
        text=True,
        capture_output=True,
        timeout=30,
    )


def test_deepspeed_launch_command(hermetic: dict[str, str], tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# nodes\n127.0.0.1 slots=2\n")
    proc = _launch(
        "deepspeed_multinode.sh", hermetic, str(hostfile), "s3://b/m.json", "--", "--set", "max_steps=5"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "deepspeed",
        "--hostfile",
        str(hostfile),
        "--launcher",
        "pdsh",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        "29500",
        "--module",
        "training.train",
        "--manifest",
        "s3://b/m.json",
        "--config",
        str(ROOT / "training/configs/tiny.yaml"),
        "--set",
        "max_steps=5",
    ]


def test_torchrun_launch_commands(hermetic: dict[str, str]) -> None:
    env = {**hermetic, "NNODES": "2", "MASTER_ADDR": "127.0.0.1", "NPROC_PER_NODE": "4"}
    missing = _launch("torchrun_node.sh", env, "file:///m.json")
    assert missing.returncode == 2 and "set NODE_RANK" in missing.stderr
    static = _launch("torchrun_node.sh", {**env, "NODE_RANK": "1"}, "file:///m.json", "my.yaml")
    assert static.returncode == 0, static.stderr
    assert static.stdout.split() == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "3",
        "--node-rank",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29500",
        "-m",
        "training.train",
        "--manifest",
        "file:///m.json",
        "--config",
        "my.yaml",
    ]
    elastic = _launch(
        "torchrun_node.sh", {**env, "RDZV_BACKEND": "c10d", "MASTER_PORT": "29400"}, "file:///m.json"
    )
    assert "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --rdzv-id pileworks" in elastic.stdout
    no_master = _launch("torchrun_node.sh", {**hermetic, "NNODES": "2", "NODE_RANK": "0"}, "file:///m.json")
    assert no_master.returncode == 2 and "set MASTER_ADDR" in no_master.stderr
