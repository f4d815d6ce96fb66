"""Heartbeats and the zombie-run reaper, against a real ``prefect server start`` and real flow processes.

The rules of :func:`flows.runtime.reaper.zombie_reason` are checked as a pure function first; then two flow processes
beat against the server: one is killed with SIGKILL (its run stays Running: nobody is left to say otherwise) and
``reap`` must mark exactly that one Crashed; the live one is left alone until it stops beating (SIGSTOP).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.runtime.heartbeat import Beat, heartbeat, heartbeat_file, read_file_beat
from flows.runtime.reaper import RunningRun, pid_alive, zombie_reason
from tests.flows.prefect_server import PrefectServer, free_port, prefect_server

REPO = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()
NOW = 1_000_000.0

PROBE_FLOW = """
import sys, time
from prefect import flow, task
from prefect.runtime import flow_run
from flows.runtime.heartbeat import heartbeat

@task(name="nap")
def nap(seconds: float) -> None:
    time.sleep(seconds)

@flow(name="reaper-probe")
def probe(seconds: float) -> None:
    with heartbeat(str(flow_run.id), interval_s=1.0):
        nap(seconds)

probe(float(sys.argv[1]))
"""


def _beat(*, at: float, host: str = HOST, pid: int = 4242) -> Beat:
    return Beat(flow_run_id="r", at=at, pid=pid, host=host, pid_started=123.0, interval_s=10.0)


def _run(beat: Beat | None, start_time: float | None = NOW - 5) -> RunningRun:
    return RunningRun(id="r", name="probe", start_time=start_time, beat=beat)


@pytest.mark.parametrize(
    ("run", "alive", "expected"),
    [
        (_run(_beat(at=NOW - 5)), True, None),  # fresh beat, process alive
        (_run(_beat(at=NOW - 5)), False, "is gone"),  # process dead here: at once, whatever the age
        (_run(_beat(at=NOW - 500)), True, "no heartbeat for 500 s"),  # alive but stuck (e.g. SIGSTOP)
        (_run(_beat(at=NOW - 5, host="elsewhere")), False, None),  # another host's pid means nothing here
        (_run(_beat(at=NOW - 500, host="elsewhere")), False, "no heartbeat for 500 s"),
        (_run(None, start_time=NOW - 30), True, None),  # never beat, but young
        (_run(None, start_time=NOW - 900), True, "no heartbeat at all and running for 900 s"),
        (_run(None, start_time=None), True, None),  # no start time: nothing to measure
    ],
)
def test_zombie_rules(run: RunningRun, alive: bool, expected: str | None) -> None:
    reason = zombie_reason(run, now=NOW, max_age_s=120, host=HOST, alive=lambda pid, started: alive)
    assert reason == expected if expected is None else expected in (reason or ""), reason


def test_beat_round_trips_through_labels_and_ignores_garbage() -> None:
    beat = _beat(at=NOW)
    labels = {"other": "x"} | beat.to_labels()
    assert Beat.from_labels("r", labels) == beat
    assert Beat.from_labels("r", {"other": "x"}) is None
    assert Beat.from_labels("r", labels | {"pileworks.heartbeat.at": "soon"}) is None


def test_pid_alive_tells_this_process_from_a_dead_or_reused_pid() -> None:
    import psutil

    me = psutil.Process()
    assert pid_alive(me.pid, me.create_time())
    assert not pid_alive(me.pid, me.create_time() - 3600)  # same pid, another process: pid reuse
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    assert not pid_alive(int(done.stdout), None)


@contextlib.contextmanager
def prefect_settings(api_url: str, home: Path, extra: dict | None = None) -> Iterator[None]:
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_HOME: str(home), **(extra or {})}):
        yield


def test_heartbeat_falls_back_to_a_file_without_the_api(tmp_path: Path) -> None:
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    run_id = str(uuid.uuid4())
    with prefect_settings(f"http://127.0.0.1:{free_port()}/api", tmp_path, {PREFECT_CLIENT_MAX_RETRIES: 0}):
        with heartbeat(run_id, interval_s=0.2):
            deadline = time.monotonic() + 30
            while read_file_beat(run_id) is None and time.monotonic() < deadline:
                time.sleep(0.1)
            beat = read_file_beat(run_id)
            assert beat is not None and beat.pid == os.getpid() and beat.host == HOST
            assert heartbeat_file(run_id).is_relative_to(tmp_path)
        assert read_file_beat(run_id) is None  # a run that ended cleanly leaves nothing behind
    with pytest.raises(ValueError, match="interval_s"), heartbeat(run_id, interval_s=0):
        pass


# ---------------------------------------------------------------- against a real server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    with prefect_server(tmp_path_factory.mktemp("prefect")) as srv:
        yield srv


def start_probe(server: PrefectServer, script: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), "600"],
        env=server.client_env(),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )


def wait_for_beats(procs: list[subprocess.Popen], timeout_s: float = 150.0) -> dict[int, str]:
    """pid -> flow run id, once every probe's run is Running, has written a heartbeat label and its task runs."""
    from prefect.client.orchestration import get_client

    from flows.runtime.reaper import running_runs

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"probe flow {proc.pid} exited early with {proc.returncode}")
        with get_client(sync_client=True) as client:
            found = {r.beat.pid: r.id for r in running_runs(client) if r.beat is not None}
        if all(p.pid in found and task_states(found[p.pid]) == ["RUNNING"] for p in procs):
            return found
        time.sleep(1.0)
    raise TimeoutError(f"no heartbeats from the probe flows within {timeout_s:.0f} s")


def read_state(run_id: str) -> tuple[str, str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(uuid.UUID(run_id)).state
    return state.type.value, state.message or ""


def task_states(flow_run_id: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(flow_run_id)]))
        )
    return [r.state.type.value for r in runs]


def test_reap_cli_rejects_a_bad_watch_interval(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli.main import main

    assert main(["reap", "--watch", "0"]) == 2
    assert "--watch must be > 0" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_reap_crashes_a_killed_run_and_leaves_a_live_one(server: PrefectServer, tmp_path: Path) -> None:
    from flows.cli.main import main
    from flows.runtime.reaper import reap

    script = tmp_path / "probe.py"
    script.write_text(PROBE_FLOW)
    victim, survivor = start_probe(server, script), start_probe(server, script)
    try:
        with prefect_settings(server.api_url, server.home):
            runs = wait_for_beats([victim, survivor])
            victim.send_signal(signal.SIGKILL)  # not waited for yet: a zombie process must count as dead too
            assert reap(max_age_s=600, flow_names=["build_corpus"]) == []  # not a flow we were asked about
            assert reap(max_age_s=600, dry_run=True) == [runs[victim.pid]]
            assert read_state(runs[victim.pid])[0] == "RUNNING"  # a dry run changes nothing
            assert reap(max_age_s=600, flow_names=["reaper-probe"]) == [runs[victim.pid]]
            state, message = read_state(runs[victim.pid])
            assert state == "CRASHED" and f"pid {victim.pid}" in message and "pileworks reaper" in message, (
                message
            )
            assert task_states(runs[victim.pid]) == ["CRASHED"]  # its task no longer spins in the UI
            assert read_state(runs[survivor.pid])[0] == "RUNNING"
            assert task_states(runs[survivor.pid]) == ["RUNNING"]
            assert main(["reap", "--max-age", "600"]) == 0  # the CLI finds nothing left to reap
            assert read_state(runs[survivor.pid])[0] == "RUNNING"

            survivor.send_signal(signal.SIGSTOP)  # alive, but its heartbeat stops: the age rule must catch it
            later = lambda: time.time() + 60.0  # noqa: E731  (a minute on: its last beat is older than 3 s)
            assert reap(max_age_s=3, clock=later) == [runs[survivor.pid]]
            state, message = read_state(runs[survivor.pid])
            assert state == "CRASHED" and "no heartbeat for" in message, message
            assert task_states(runs[survivor.pid]) == ["CRASHED"]
            assert reap(max_age_s=3) == []  # Crashed runs are not Running any more
    finally:
        for proc in (victim, survivor):
            proc.kill()
            proc.wait(timeout=30)
