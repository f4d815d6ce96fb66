"""``pileworks train`` stopped as schedulers and people stop it: SIGTERM to the command (Kubernetes, Slurm, systemd),
Ctrl-C on a terminal (SIGINT to the command's process group; the ranks run in a session of their own), a terminal
that hangs up (SIGHUP to the command), a ``--timeout``, and the UI's Cancel on a run of ``pileworks serve`` (Prefect's runner sends the flow SIGTERM).

The ranks save the step they reached (``training.preempt``) within ``stop_grace_s``; ranks that do not answer
(frozen here, as a hung collective leaves them) are killed when it runs out, and a second Ctrl-C kills them at
once. Either way the command ends with one line naming what was saved, and no process of the job outlives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.fixtures.tiny_dataset import build_tiny_dataset
from training.checkpoint import list_tags, step_of_tag, tag_for_step, verify_tag

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(600)]

CONFIG = {
    "preset": "tiny",
    "model": {"d_model": 64, "n_layer": 2},
    "seq_len": 64,
    "micro_batch_size": 4,
    "max_steps": 400,
    "warmup_steps": 3,
    "checkpoint_interval": 1000,  # no periodic checkpoint: what is saved, the stop saved
    "eval_interval": 1000,
    "eval_batches": 1,
    "log_interval": 1,
    "num_workers": 1,
    "tensorboard": False,
    "pg_timeout_s": 60,
}
STEP = re.compile(r"\[Rank 0\] .*\bstep (\d+)/\d+ loss")
RANK_PID = re.compile(r"\[Rank \d\] .*\bpid (\d+), rank \d of 2")
REACH_S = 240  # the ranks' start: DeepSpeed's import and the process group
GONE_S = 5.0


@pytest.fixture(scope="module")
def manifest_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_dataset(tmp_path_factory.mktemp("train-stop-store"))


def train_args(manifest_uri: str, out: Path, *args: str, **sets: object) -> list[str]:
    """``train`` on the tiny dataset, its config written beside ``out`` (the run's folder)."""
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "output_dir": str(out), **sets}))
    return ["train", "--manifest", manifest_uri, "--config", str(config), *args]


class Job:
    """A running ``pileworks train`` in a session of its own (a terminal's foreground job): its stderr lines as
    they come, the ranks' pids, and every process of it seen."""

    def __init__(self, manifest_uri: str, out: Path, env: dict[str, str], *args: str, **sets: object) -> None:
        command = train_args(manifest_uri, out, *args, **sets)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *command],
            env=env,
            cwd=out.parent,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.rank_pids: set[int] = set()
        self.step = 0
        self.seen: dict[int, psutil.Process] = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if m := RANK_PID.search(line):
                self.rank_pids.add(int(m[1]))
            if m := STEP.search(line):
                self.step = int(m[1])

    def reach_step(self, step: int) -> None:
        deadline = time.monotonic() + REACH_S
        while self.step < step and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.02)
        assert self.step >= step, "\n".join(self.lines[-40:])
        self.poll()

    def poll(self) -> None:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)

    def freeze_ranks(self) -> None:
        """SIGSTOP the ranks (and their DataLoader workers): they hear nothing until killed, as a hung rank."""
        assert len(self.rank_pids) == 2, self.lines[-40:]
        for pid in self.rank_pids:
            rank = psutil.Process(pid)
            for process in [rank, *rank.children(recursive=True)]:
                process.suspend()

    def finish(self, timeout_s: float = 120) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout_s)
        finally:
            self.proc.kill()
        self.reader.join(10)
        return code, "\n".join(self.lines)

    def alive(self) -> list[str]:
        return left_running(list(self.seen.values()))


def left_running(processes: list[psutil.Process], within_s: float = GONE_S) -> list[str]:
    """Those of ``processes`` still running after up to ``within_s`` (a zombie has ended)."""
    deadline = time.monotonic() + within_s
    while True:
        left = [p for p in processes if running(p)]
        if not left or time.monotonic() > deadline:
            return [label(p) for p in left]
        time.sleep(0.1)


def ends(processes: list[psutil.Process], within_s: float) -> dict[int, float | None]:
    """When each of ``processes`` ended, in seconds from now (None: still running after ``within_s``)."""
    started, ended = time.monotonic(), dict.fromkeys((p.pid for p in processes), None)
    while None in ended.values() and time.monotonic() - started < within_s:
        for process in processes:  # the same process may be listed twice
            if ended[process.pid] is None and not running(process):
                ended[process.pid] = time.monotonic() - started
        time.sleep(0.02)
    return ended


def label(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"{process.pid} {' '.join(process.cmdline())[:80]}"
    return f"{process.pid} (ended)"


def running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def env_for(server_home: Path) -> dict[str, str]:
    from tests.flows.cli.conftest import cli_env

    return cli_env(server_home)


def the_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("pileworks train:")]
    assert len(lines) == 1 and text.strip().splitlines()[-1] == lines[0], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return lines[0]


def stop_records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["kind"] == "stop"]


def test_sigterm_saves_the_step_reached_and_the_rerun_resumes_from_it(
    manifest_uri: str, server_home: Path, tmp_path: Path
) -> None:
    """SIGTERM to the command at step 5 of 400, no periodic checkpoint due: exit 143 with one line naming the
    step saved, its checkpoint complete, no process left; the same command resumes from that step."""
    out, env = tmp_path / "run", env_for(server_home)
    job = Job(manifest_uri, out, env)
    job.reach_step(5)
    sent = time.monotonic()
    job.proc.send_signal(signal.SIGTERM)
    code, text = job.finish()
    took = time.monotonic() - sent
    print(f"SIGTERM to exit: {took:.2f} s")  # the figure, with -s
    assert code == 143, text[-3000:]
    [stop] = stop_records(out)
    saved = stop["step"]
    assert the_line(text) == (
        f"pileworks train: stopped by SIGTERM; the ranks saved a checkpoint at step {saved}; "
        "rerun the same command to resume from it"
    )
    assert 5 <= saved < 400 and took < 20
    assert [step_of_tag(t) for t in list_tags(out / "checkpoints")] == [saved]
    verify_tag(out / "checkpoints" / tag_for_step(saved))
    assert job.alive() == []
    job = Job(manifest_uri, out, env, max_steps=saved + 2)
    code, text = job.finish(300)
    assert code == 0, text[-3000:]
    assert re.search(rf"\[Rank 1\] .*resumed from .*{tag_for_step(saved)}", text), text[-3000:]
    assert re.search(rf"\[Rank 0\] .*\bstep {saved + 1}/{saved + 2} loss", text), text[-3000:]


@pytest.mark.parametrize("leader", ["command", "shell"])
def test_a_terminal_that_hangs_up_stops_the_job_as_sigterm_does(
    leader: str, manifest_uri: str, server_home: Path, tmp_path: Path
) -> None:
    """The command on a terminal that closes at step 5 (a window closed, an SSH connection dropped): it gets
    SIGHUP, from the kernel where it leads the terminal's session, or from the interactive bash it was typed
    into, which passes it on to its job (the kernel's own may follow in the same millisecond, and a SIGINT),
    stops the job as SIGTERM does and exits 129, its writes to the gone terminal failing (EIO) on the way. The
    ranks' save is not cut short by the signals that follow a hang-up. Before, SIGHUP ended the command at
    once, and the ranks, in sessions of their own, trained on without it."""
    from tests.flows.cli.conftest import Terminal

    out = tmp_path / "run"
    args, env = train_args(manifest_uri, out), env_for(server_home)
    terminal = Terminal(args, env, tmp_path, shell=leader == "shell")
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + REACH_S
    while time.monotonic() < deadline and terminal.proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(terminal.proc.pid).children(recursive=True):
                seen.setdefault(child.pid, child)
        metrics = out / "metrics.jsonl"
        if metrics.exists() and metrics.read_text().count('"kind": "train"') >= 5 and len(seen) >= 5:
            break
        time.sleep(0.1)
    try:
        assert terminal.proc.poll() is None and len(seen) >= 5, terminal.screen()[-3000:]  # torchrun, ranks…
        command = [p for p in seen.values() if "flows.cli" in label(p)] or [psutil.Process(terminal.proc.pid)]
        [launcher] = [p for p in seen.values() if "torch.distributed.run" in label(p)]
        ranks = [p for p in seen.values() if running(p) and p.ppid() == launcher.pid]
        assert len(command) == 1 and len(ranks) == 2, [label(p) for p in seen.values()]
        terminal.hang_up()
        ended = ends([*command, *ranks, *seen.values()], within_s=60)  # the command's stop bounds itself
        code = terminal.finish()  # the shell's: it leaves at the hang-up, the command's exit is unseen
        took = ended[command[0].pid]
        print(f"hang-up ({leader}) to the command's exit: {took:.2f} s")  # the figure, with -s
        assert code == 129 or leader == "shell", terminal.screen()[-3000:]
        assert None not in ended.values(), ended  # every process of the job has ended
        assert took >= max(ended[r.pid] for r in ranks) - 0.1, ended  # the command waited for the ranks
        [stop] = stop_records(out)
        assert [step_of_tag(t) for t in list_tags(out / "checkpoints")] == [stop["step"]] and took < 20
        verify_tag(out / "checkpoints" / tag_for_step(stop["step"]))
    finally:  # what a failure left training (none where it passed)
        terminal.finish(10)
        for process in seen.values():
            with contextlib.suppress(psutil.Error):
                process.kill()


def test_a_sigterm_to_the_launcher_alone_fails_the_command_naming_the_step_saved(
    manifest_uri: str, server_home: Path, tmp_path: Path
) -> None:
    """SIGTERM to torchrun only (by hand, or a scheduler that signals the job's processes but not the command):
    the ranks save, and the command fails with one line that says the job was stopped and where to resume."""
    out = tmp_path / "run"
    job = Job(manifest_uri, out, env_for(server_home))
    job.reach_step(3)
    [launcher] = [p for p in job.seen.values() if "torch.distributed.run" in " ".join(p.cmdline())]
    launcher.send_signal(signal.SIGTERM)
    code, text = job.finish()
    assert code == 1, text[-3000:]
    [stop] = stop_records(out)
    assert the_line(text) == (
        "pileworks train: error: training was stopped by a SIGTERM to its job: the ranks saved a checkpoint at "
        f"step {stop['step']}; rerun the same command to resume from it"
    )
    verify_tag(out / "checkpoints" / tag_for_step(stop["step"]))
    assert job.alive() == []


# (how the command is stopped, stop_grace_s, its exit code and word, the seconds the exit takes)
FROZEN = {
    "SIGTERM": ("SIGTERM", 3, 143, "stopped by SIGTERM", (3, 15)),
    "Ctrl-C twice": ("Ctrl-C twice", 60, 130, "interrupted", (1, 10)),
}


@pytest.mark.parametrize("case", list(FROZEN))
def test_ranks_that_do_not_answer_are_killed_after_the_grace_or_a_second_ctrl_c(
    case: str, manifest_uri: str, server_home: Path, tmp_path: Path
) -> None:
    """Frozen ranks cannot save. SIGTERM: the command waits ``stop_grace_s`` (3 s) for them, then kills every
    process of the job (the ranks too, in their own sessions) and exits 143. Ctrl-C (SIGINT to the terminal's
    foreground group: the command, not the ranks' sessions) gives them a minute, and a second Ctrl-C a second
    later ends the job at once: exit 130. Either way one line says nothing was saved."""
    how, grace, exit_code, said, (least, most) = FROZEN[case]
    out = tmp_path / "run"
    job = Job(manifest_uri, out, env_for(server_home), stop_grace_s=grace)
    job.reach_step(3)
    job.freeze_ranks()
    sent = time.monotonic()
    if how == "SIGTERM":
        job.proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(job.proc.pid, signal.SIGINT)
        time.sleep(1.0)
        assert job.proc.poll() is None, "the first Ctrl-C did not wait for the ranks"
        os.killpg(job.proc.pid, signal.SIGINT)
    code, text = job.finish()
    took = time.monotonic() - sent
    print(f"{case}, ranks frozen, grace {grace} s: exit after {took:.2f} s")  # the figure, with -s
    assert code == exit_code, text[-3000:]
    assert the_line(text) == (
        f"pileworks train: {said}; the ranks did not save in time; "
        "rerun the same command to resume from their last checkpoint"
    )
    assert least <= took < most
    assert job.alive() == []
    assert stop_records(out) == [] and list_tags(out / "checkpoints") == []


def test_a_timeout_stops_the_job_as_sigterm_does(
    manifest_uri: str, server_home: Path, tmp_path: Path
) -> None:
    """``--timeout``: the job gets SIGTERM, its ranks save the step they reached, and the failure says so."""
    out = tmp_path / "run"
    job = Job(manifest_uri, out, env_for(server_home), "--timeout", "30", max_steps=100_000)
    code, text = job.finish(180)
    assert code == 1, text[-3000:]
    [stop] = stop_records(out)
    assert the_line(text) == (
        f"pileworks train: error: training timed out after 30 s and was stopped (the ranks saved step "
        f"{stop['step']} first); raise --timeout and rerun to resume"
    )
    verify_tag(out / "checkpoints" / tag_for_step(stop["step"]))


def test_cancelling_a_served_one_click_run_saves_the_step_reached(server_home: Path, tmp_path: Path) -> None:
    """The one-click deployment of ``pileworks serve`` (the bundled sample built, then trained), cancelled as the
    UI's Cancel button does (the run set ``Cancelling``): Prefect's runner sends the flow's process SIGTERM, the
    ranks save the step they reached, the run ends ``Cancelled``, and no process of it is left."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelling

    from flows.runtime.local_server import read_state
    from tests.flows.cli.conftest import start_cli

    state = read_state(server_home)
    assert state is not None
    out = tmp_path / "run"
    sets = {"max_steps": 100_000, "checkpoint_interval": 1000, "eval_interval": 1000, "log_interval": 1}
    args = ["serve", "--output", str(tmp_path / "store"), f"--set=train.output_dir={out}"]
    serve = start_cli(
        args + [f"--set=train.{k}={v}" for k, v in sets.items()], env_for(server_home), tmp_path
    )
    seen: dict[int, psutil.Process] = {}
    try:
        with (
            temporary_settings(updates={PREFECT_API_URL: state.api_url}),
            get_client(sync_client=True) as client,
        ):
            deadline = time.monotonic() + REACH_S
            deployment = None
            while deployment is None and time.monotonic() < deadline and serve.poll() is None:
                with contextlib.suppress(Exception):  # not registered yet
                    found = client.read_deployment_by_name("prepare_and_train/one-click")
                    # this serve's, not one an earlier serve left under the same name
                    if found.parameters["train_overrides"].get("output_dir") == str(out):
                        deployment = found
                time.sleep(0.5)
            assert deployment is not None, "serve did not register its one-click deployment"
            run = client.create_flow_run_from_deployment(deployment.id)
            while time.monotonic() < deadline and serve.poll() is None:
                if (out / "metrics.jsonl").exists() and '"train"' in (out / "metrics.jsonl").read_text():
                    break
                time.sleep(0.2)
            for child in psutil.Process(serve.pid).children(recursive=True):
                seen.setdefault(child.pid, child)
            assert any("training.train" in " ".join(p.cmdline()) for p in seen.values())
            sent = time.monotonic()
            client.set_flow_run_state(run.id, Cancelling())
            while time.monotonic() - sent < 90 and not client.read_flow_run(run.id).state.is_final():
                time.sleep(0.5)
            final = client.read_flow_run(run.id).state
            took = time.monotonic() - sent
        print(f"Cancel of a served training run to its final state: {took:.2f} s")
        assert final.is_cancelled(), final
        [stop] = stop_records(out)
        verify_tag(out / "checkpoints" / tag_for_step(stop["step"]))
        assert [step_of_tag(t) for t in list_tags(out / "checkpoints")] == [stop["step"]]
        assert left_running(list(seen.values())) == []
    finally:
        serve.send_signal(signal.SIGINT)
        serve.communicate(timeout=120)
