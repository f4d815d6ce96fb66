"""Launcher commands and environment, process-group kill and timeout, and the [Rank N] log prefixes."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.launch import (
    EXIT_TIMEOUT,
    LaunchSpec,
    build_launch,
    kill_process_group,
    start_local,
    stream_output,
    train_args,
)
from training.ranklog import LOG_TIME_ENV, PrefixedStream, RankFormatter


def test_torchrun_command_and_env() -> None:
    spec = LaunchSpec(nproc_per_node=2, max_restarts=1, master_port=29512, cpu=True)
    args = train_args(
        "file:///d/manifest.json",
        "t.yaml",
        allow_dataset_change=True,
        allow_change=["seed,seq_len"],
        overrides={"output_dir": "123", "model": {"n_layer": 2}},
        stop_at_step=5,
    )
    cmd, env = build_launch(spec, args, base_env={"PATH": "/bin"})
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert {"--nproc-per-node=2", "--max-restarts=1", "--rdzv-endpoint=127.0.0.1:29512"} <= set(cmd)
    tail = cmd[cmd.index("training.train") + 1 :]
    assert tail == [
        "--manifest",
        "file:///d/manifest.json",
        "--config",
        "t.yaml",
        "--set",
        'output_dir="123"',
        "--set",
        'model={"n_layer": 2}',
        "--allow-dataset-change",
        "--allow-change",
        "seed,seq_len",
        "--stop-at-step",
        "5",
    ]
    assert (
        env["DS_ACCELERATOR"] == "cpu" and env["MASTER_PORT"] == "29512" and env["MASTER_ADDR"] == "127.0.0.1"
    )
    assert int(env["OMP_NUM_THREADS"]) >= 1 and env["PATH"] == "/bin"


def test_deepspeed_command_with_hostfile(tmp_path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=8\nnode2 slots=8\n")
    spec = LaunchSpec(
        launcher="deepspeed",
        nnodes=2,
        hostfile=str(hostfile),
        master_addr="10.0.0.1",
        master_port=29500,
        cpu=False,
    )
    cmd, env = build_launch(spec, ["--manifest", "s3://b/m.json"], base_env={})
    assert cmd[1:3] == ["-m", "deepspeed.launcher.runner"]
    assert {f"--hostfile={hostfile}", "--master_addr=10.0.0.1", "--master_port=29500", "--module"} <= set(cmd)
    assert "DS_ACCELERATOR" not in env


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"launcher": "mpirun"}, "launcher must be"),
        ({"nproc_per_node": 0}, "nproc_per_node must be >= 1"),
        ({"launcher": "deepspeed", "max_restarts": 1}, "max_restarts needs launcher='torchrun'"),
        ({"nnodes": 2}, "explicit master_port"),
        ({"hostfile": "/nonexistent/hosts"}, "does not exist"),
    ],
)
def test_spec_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LaunchSpec(**kwargs)


def test_timeout_kills_the_whole_process_group() -> None:
    # The launcher's child (a stand-in rank) must die with it: a flow's timeout may not leave ranks behind.
    script = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)"
    proc = start_local([sys.executable, "-c", script], dict(os.environ))
    lines: list[str] = []
    t0 = time.monotonic()
    code = stream_output(proc, lines.append, timeout_s=2.0)
    assert code == EXIT_TIMEOUT and time.monotonic() - t0 < 30
    grandchild = int(lines[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(grandchild):
        time.sleep(0.1)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as dead
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_stream_output_returns_the_exit_code_and_every_line() -> None:
    proc = start_local(
        [sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"], dict(os.environ)
    )
    lines: list[str] = []
    assert stream_output(proc, lines.append, timeout_s=60) == 3
    assert lines == ["a", "b"]
    t0 = time.monotonic()
    kill_process_group(proc, grace_s=30)  # already gone and reaped: returns at once, raises nothing
    assert time.monotonic() - t0 < 5 and proc.returncode == 3


def test_rank_prefix_on_every_line_of_records_and_prints() -> None:
    record = logging.LogRecord("DeepSpeed", logging.WARNING, __file__, 1, "first\nsecond", None, None)
    text = RankFormatter(3).format(record)
    assert all(line.startswith("[Rank 3] ") for line in text.splitlines()) and len(text.splitlines()) == 2
    sink = io.StringIO()
    stream = PrefixedStream(sink, "[Rank 1] ")
    stream.write("op built\npart")
    stream.write("ial line\n[Rank 1] already prefixed\n")
    assert sink.getvalue() == "[Rank 1] op built\n[Rank 1] partial line\n[Rank 1] already prefixed\n"


def test_rank_logging_is_quiet_and_has_one_timestamp_under_a_flow() -> None:
    """gcc probes (distutils' ``compilers`` logger) and DeepSpeed's torch deprecations are dropped; under a flow
    (LOG_TIME_ENV=0) a rank line carries no time of its own, as the flow's log line adds one."""
    code = (
        "import logging, warnings\n"
        "from training.ranklog import setup_rank_logging\n"
        "setup_rank_logging(1)\n"
        "logging.getLogger('compilers.C.base').info('gcc -c test.c -laio')\n"
        "warnings.warn('`torch.distributed.all_gather_into_tensor` is deprecated', FutureWarning)\n"
        "warnings.warn('our own deprecation', FutureWarning)\n"
        "logging.getLogger('training.train').info('step 1/2 loss 9.0')\n"
    )
    for log_time, timestamped in (("0", False), ("1", True)):
        env = {**os.environ, LOG_TIME_ENV: log_time, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
        assert not any("gcc" in line or "all_gather_into_tensor" in line for line in lines), lines
        assert any("our own deprecation" in line for line in lines), lines
        step = next(line for line in lines if "step 1/2" in line)
        assert step.startswith("[Rank 1] ")
        assert bool(re.match(r"\[Rank 1\] \d{4}-\d\d-\d\d ", step)) is timestamped, step
