"""The first hour of a new user, through the real flows on the session's local Prefect server (slow).

`run --name` names the dataset, a short run clips the warm-up with a warning, the end prints the run's UI URL and
the exact next commands, `trace` refuses a step the run never trained, a corrupt shard ends the CLI with the
failing rank's own line, and Ctrl-C is one line and exit 130.
"""

from __future__ import annotations

import json
import shlex
import signal
import time
from pathlib import Path

import pytest

from tests.flows.cli.conftest import cli_env, run_cli, start_cli
from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

# Each test runs several real commands (a build, DeepSpeed ranks, torch imports): minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(900)]

TRAIN = {
    "seq_len": 32,
    "micro_batch_size": 2,
    "checkpoint_interval": 2,
    "eval_interval": 2,
    "eval_batches": 1,
    "log_interval": 1,
    "num_workers": 0,
    "tensorboard": False,
}


def corpus_args(raw: Path, store: Path) -> list[str]:
    sets = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]
    return ["--input", str(raw), "--output", str(store), *sets]


def train_args(**fields: object) -> list[str]:
    return [f"--train-set={k}={v}" for k, v in (TRAIN | fields).items()]


def next_command(out: str, verb: str) -> list[str]:
    """The ``next:`` line for ``verb`` as argv (after the program name)."""
    line = next(line for line in out.splitlines() if line.strip().split(" ")[1:2] == [verb])
    return shlex.split(line.split("   #", 1)[0])[1:]


def test_run_names_the_dataset_clips_warmup_and_ends_with_the_next_commands(
    server_home: Path, tmp_path: Path
) -> None:
    write_tiny_corpus(tmp_path / "raw", files=3)
    env = cli_env(server_home)
    done = run_cli(
        [
            "run",
            "--name",
            "foo",
            *corpus_args(tmp_path / "raw", tmp_path / "store"),
            "--nproc",
            "2",
            *train_args(max_steps=2, output_dir=tmp_path / "run"),
            "--prompt",
            "river",
        ],
        env,
        tmp_path,
    )
    assert done.code == 0, done.err[-4000:]
    assert (tmp_path / "store" / "datasets" / "foo" / "latest.json").is_file()
    assert "published dataset foo " in done.out
    assert "warmup_steps 20 is not below max_steps 2: warming up over 0 step(s)" in done.err
    assert "/runs/flow-run/" in done.out and "trained 2 steps" in done.out
    assert not any(w in done.err for w in ("FutureWarning", "compilers.C.base", "Traceback"))
    assert "Loading checkpoint shards" not in done.out + done.err
    lines = done.out.splitlines()
    assert lines[lines.index("next:") + 1 :], done.out  # the run ends with the commands to run next

    trace = next_command(done.out, "trace")
    assert trace[trace.index("--step") + 1] == "2"
    traced = run_cli([*trace, "--json"], env, tmp_path)
    assert traced.code == 0 and json.loads(traced.out)["step"] == 2, traced.err

    beyond = run_cli([*trace[: trace.index("--step")], "--step", "120"], env, tmp_path)
    assert beyond.code == 1
    assert beyond.last_line.startswith("pileworks trace: error: step 120 is not in checkpoint")
    assert "trained steps 1..2" in beyond.last_line and "Traceback" not in beyond.err


def test_train_json_and_a_corrupt_shard_ends_with_the_rank_s_own_line(
    server_home: Path, tmp_path: Path
) -> None:
    write_tiny_corpus(tmp_path / "raw", files=3)
    env = cli_env(server_home)
    built = run_cli(["build", "--json", *corpus_args(tmp_path / "raw", tmp_path / "store")], env, tmp_path)
    assert built.code == 0, built.err[-4000:]
    summary = json.loads(built.out)  # --json: one object on stdout, nothing else
    assert "/runs/flow-run/" in summary["flow_run_url"]
    assert any(cmd.split()[1] == "train" for cmd in summary["next"])
    manifest = summary["manifest_uri"]

    trained = run_cli(
        [
            "train",
            "--manifest",
            manifest,
            "--nproc",
            "1",
            "--json",
            *train_args(max_steps=2, warmup_steps=1, output_dir=tmp_path / "run"),
        ],
        env,
        tmp_path,
    )
    assert trained.code == 0, trained.err[-4000:]
    result = json.loads(trained.out)
    assert result["steps"] == 2 and "/runs/flow-run/" in result["flow_run_url"]
    assert any("sample --checkpoint" in cmd for cmd in result["next"])

    dataset = Path(manifest.removeprefix("file://")).parent
    # Every train shard: same size, wrong bytes, so whichever one the first batch reads fails the cache's sha256
    # check (which shards two steps touch depends on the split, and so on the document ids).
    shards = sorted((dataset / "train").glob("*.bin"))
    for shard in shards:
        shard.write_bytes(b"\0" * shard.stat().st_size)
    broken = run_cli(
        [
            "train",
            "--manifest",
            manifest,
            "--nproc",
            "2",
            *train_args(max_steps=2, warmup_steps=1, output_dir=tmp_path / "run2"),
        ],
        env,
        tmp_path,
    )
    assert broken.code == 1
    last = broken.last_line
    assert last.startswith("pileworks train: error: training failed on rank "), broken.err[-4000:]
    assert any(shard.name in last for shard in shards) and "corrupt" in last, last
    assert "Root Cause" not in broken.err and "ChildFailedError" not in broken.err


def test_ctrl_c_during_a_build_is_one_line_and_exit_130(server_home: Path, tmp_path: Path) -> None:
    write_tiny_corpus(tmp_path / "raw", files=3)
    proc = start_cli(
        ["build", *corpus_args(tmp_path / "raw", tmp_path / "store")], cli_env(server_home), tmp_path
    )
    deadline = time.monotonic() + 120
    work = tmp_path / "store" / "work"
    while time.monotonic() < deadline and not any(work.glob("*/ingest")) and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-4000:]
    assert err.strip().splitlines()[-1].startswith("pileworks build: interrupted; rerun the same command")
    assert "KeyboardInterrupt" not in err and "Traceback" not in err


def test_ctrl_c_to_the_whole_process_group_is_one_line_and_exit_130(
    server_home: Path, tmp_path: Path
) -> None:
    """A terminal's Ctrl-C reaches every process of its foreground group, the Dask worker processes too: they
    ignore it (the command shuts them down), so stderr holds the one line, not their tracebacks."""
    import os
    import re
    import subprocess
    import sys

    write_tiny_corpus(tmp_path / "raw", files=3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "build", *corpus_args(tmp_path / "raw", tmp_path / "store")],
        env=cli_env(server_home),
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    deadline = time.monotonic() + 120
    work = tmp_path / "store" / "work"
    while time.monotonic() < deadline and not any(work.glob("*/clean/part-*.done")) and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-4000:]
    # Off a terminal the build's INFO log goes to stderr too; besides it, one line: no worker's traceback.
    lines = [line for line in err.strip().splitlines() if not re.match(r"^\S+ \S+ INFO ", line)]
    assert len(lines) == 1, err[-4000:]
    assert lines[0].startswith("pileworks build: interrupted; rerun the same command"), lines
