"""A build outlives a dead worker, logs what its workers log in their task runs, and gets its head start on a
terminal too.

``pileworks build`` runs as a user runs it (a subprocess; on a pseudo-terminal for the last test). A local worker
killed with SIGKILL (as the OOM killer or a stray ``kill`` would) during the head start or in a later pass costs
a fresh pool, not the build: the command completes with the dataset id of an undisturbed build, says once which
worker died of what, and Prefect retries none of its task runs (each ran once). A warning a ``pipeline.*`` module logs inside a worker is a
record of its task run, read back through Prefect's own client.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.fixtures.prefect_runs import settled_task_runs
from tests.flows.cli.conftest import Done, cli_env, start_cli
from tests.flows.tiny_corpus import TINY_OVERRIDES, write_tiny_corpus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MIN_TASK = {"PILEWORKS_MIN_TASK_BYTES": "1"}  # the tiny corpus in several tasks per pass
SETS = [f"--set={k}={v}" for k, v in TINY_OVERRIDES.items() if k != "name"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny corpus, with an empty file among its inputs (the ingest warns of it, and quarantines nothing)."""
    root = tmp_path_factory.mktemp("dead-worker")
    write_tiny_corpus(root / "raw")
    (root / "raw" / "empty.jsonl").write_text("")
    return root


def build_argv(corpus: Path, store: str, workers: int, as_json: bool = True) -> list[str]:
    argv = ["build", "--input", str(corpus / "raw"), "--output", str(corpus / store), "--name", "tiny", *SETS]
    return [*argv, *(["--json"] if as_json else []), "--workers", str(workers)]


def forked_workers(command: psutil.Process) -> list[psutil.Process]:
    """The command's worker processes forked from itself (the head start's: same command line, unlike the
    resource tracker and the fork server, which start a fresh interpreter)."""
    try:
        line = command.cmdline()
        return [c for c in command.children() if c.cmdline() == line]
    except psutil.Error:
        return []


def busy(process: psutil.Process, window_s: float = 0.05) -> bool:
    """Whether the process used CPU over a short window (a worker computing a task, not waiting for one)."""
    try:
        before = sum(process.cpu_times()[:2])
        time.sleep(window_s)
        return sum(process.cpu_times()[:2]) > before
    except psutil.Error:
        return False


def run_killing(
    argv: list[str], env: dict[str, str], cwd: Path, when: str, late: list[bool] | None = None
) -> tuple[Done, list[int]]:
    """Run the command; kill one of its forked workers with SIGKILL as soon as one exists (``"head start"``), or
    once the clean pass has written its first unit (``"mid-pass"``). Returns the outcome and the pids killed;
    ``late`` gets whether the dataset was published already when the kill came (a killer thread starved on a
    loaded machine may come once the workers are stopping, which no build can say)."""
    started, killed = time.monotonic(), []
    proc = start_cli(argv, env, cwd)
    command = psutil.Process(proc.pid)
    store = Path(cwd, argv[argv.index("--output") + 1])
    clean_units = store / "work"

    def kill_one() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            ready = when == "head start" or any(clean_units.glob("*/clean/part-*"))
            workers = forked_workers(command) if ready else []
            if when != "head start":  # one at work on a task this moment, so its task is cut short
                workers = [w for w in workers if busy(w)]
            if workers:
                workers[0].send_signal(signal.SIGKILL)
                killed.append(workers[0].pid)
                if late is not None:
                    late.append(any(store.glob("datasets/*/*/manifest.json")))
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    out, err = proc.communicate(timeout=600)
    killer.join(5)
    return Done(proc.returncode, out, err, time.monotonic() - started), killed


def test_a_worker_killed_during_the_head_start_or_mid_pass_costs_a_fresh_pool_not_the_build(
    server_home: Path, corpus: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.runtime.local_server import read_state
    from tests.flows.cli.conftest import run_cli

    env = cli_env(server_home, **MIN_TASK)
    calm = run_cli(build_argv(corpus, "store-calm", 2), env, corpus)
    assert calm.code == 0, calm.err[-3000:]
    baseline = json.loads(calm.out)
    assert baseline["profile"]["head_start"]["forked"] is True  # its workers are forks of the command

    # what a pipeline module logged inside a worker is in that task run's log, through Prefect's client
    state = read_state(server_home)
    assert state is not None
    with temporary_settings({PREFECT_API_URL: state.api_url}), get_client(sync_client=True) as client:
        run_id = baseline["lineage"]["prefect_flow_run_id"]
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    empty = [log for log in logs if "empty_input" in log.message and "empty.jsonl" in log.message]
    assert len(empty) == 1, [log.message for log in logs]
    assert (
        empty[0].task_run_id is not None and empty[0].level == 30 and empty[0].name == "pipeline.ingest.stage"
    )

    for when, workers in [("head start", 2), ("mid-pass", 2), ("head start", 1)]:
        for attempt in range(3):  # a kill that came after the publish is not mid-pass: run it again
            store = f"store-{when.replace(' ', '-')}-{workers}-{attempt}"
            late: list[bool] = []
            done, killed = run_killing(build_argv(corpus, store, workers), env, corpus, when, late)
            if not any(late):
                break
        assert not any(late), (when, workers, "every kill came after the dataset was published")
        assert done.code == 0, (when, workers, done.err[-3000:])
        assert len(killed) == 1, (when, workers)
        summary = json.loads(done.out)
        assert summary["dataset_id"] == baseline["dataset_id"], (when, workers)
        # said once, whether the kill cut a task short (its pool renewed) or came between tasks or after the
        # last (said when the pool stops); one worker's head start is one short call whose process then stops:
        # the kill may come once it is done
        said = [line for line in done.err.splitlines() if f"worker process {killed[0]} (" in line]
        expected = (0, 1) if workers == 1 else (1,)
        assert len(said) in expected and all("SIGKILL" in line for line in said), (
            when,
            workers,
            done.err[-3000:],
        )
        # the task whose worker died ran again on a fresh pool inside its own task run: Prefect retried nothing
        # (no retry delay of 2 + 10 + 30 s on a pool that cannot recover), read back through Prefect's client
        with temporary_settings({PREFECT_API_URL: state.api_url}), get_client(sync_client=True) as client:
            run_id = summary["lineage"]["prefect_flow_run_id"]
            runs = settled_task_runs(client, run_id, summary["profile"]["task_runs"])
        assert len(runs) == summary["profile"]["task_runs"] > 0, (when, workers)
        retried = {r.name: r.run_count for r in runs if r.run_count != 1}
        assert not retried and all(r.state and r.state.is_completed() for r in runs), (when, workers, retried)


def test_a_build_on_a_terminal_gets_its_head_start(server_home: Path, corpus: Path) -> None:
    """Under a pseudo-terminal the live row runs a thread; the command stops it while it forks its workers, so
    one worker and two get the same head start as with ``--json``."""
    for workers in (1, 2):
        argv = [
            sys.executable,
            "-m",
            "flows.cli",
            *build_argv(corpus, f"store-tty-{workers}", workers, False),
        ]
        done = subprocess.run(
            ["script", "-qec", shlex.join(argv), "/dev/null"],
            env=cli_env(server_home, **MIN_TASK) | {"TERM": "xterm", "COLUMNS": "150"},
            cwd=corpus,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=600,
        )
        screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", done.stdout + done.stderr)  # rich's colours out
        assert done.returncode == 0, screen[-3000:]
        assert f"on {workers} worker(s) while Prefect starts" in screen, screen[-3000:]
        assert "published dataset tiny" in screen
