"""The local workers start at the first task, never for a flow that submits none, and no more than its chunks;
a task's body runs in a worker process, its logs reach the task run, and a dead worker fails the task."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import time
from pathlib import Path

import psutil
import pytest

from flows.runtime.pool import ONE_THREAD, WorkerDied, ready
from flows.runtime.runners import make_task_runner
from flows.runtime.workers import LocalWorkers, hand_over

log = logging.getLogger(__name__)
log.setLevel(logging.INFO)  # as flows/build/steps.py's: a worker process configures no logging


def test_the_pool_is_sized_by_the_work_and_keeps_its_settings_across_copies() -> None:
    runner = make_task_runner("local", 4)
    assert isinstance(runner, LocalWorkers) and runner.size == 4
    assert runner.fit(2) == 2 and runner.size == 2  # two chunks: two workers, not four
    assert runner.fit(9) == 4  # never more than asked for
    assert runner.env == ONE_THREAD and runner.env["PILEWORKS_THREADS"] == "1"
    copy = runner.duplicate()  # what Prefect enters for each flow run
    assert (copy.workers, copy.env) == (4, runner.env)
    shipped = pickle.loads(pickle.dumps(runner))  # a task's context holds it
    assert (shipped.size, shipped.started_workers, shipped.pool, shipped.processes) == (4, 0, None, None)
    with pytest.raises(ValueError, match="--workers"):
        make_task_runner("local", 0)


def test_a_flow_that_submits_nothing_starts_no_process() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    runner = make_task_runner("local", 2).duplicate()
    with runner:
        pass
    assert runner.started_workers == 0 and runner.pool is None and runner.processes is None
    assert {p.pid for p in me.children(recursive=True)} <= before


def test_one_worker_is_a_thread_of_this_process_with_the_workers_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of one starts no process: its tasks run on a thread here, with the workers' one-thread env while
    it runs (a name the user set is kept), gone after."""
    monkeypatch.delenv("PILEWORKS_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    runner = make_task_runner("local", 4).duplicate()
    runner.fit(1)
    with runner:
        pool = runner.runner()
        assert (runner.in_process, runner.started_workers, runner.processes) == (1, 0, None)
        assert type(pool).__name__ == "ThreadPoolTaskRunner"
        assert os.environ["PILEWORKS_THREADS"] == "1" and os.environ["OMP_NUM_THREADS"] == "3"
        assert runner.call(ready, (), "here") == os.getpid()
        assert {p.pid for p in me.children(recursive=True)} <= before
    assert "PILEWORKS_THREADS" not in os.environ and os.environ["OMP_NUM_THREADS"] == "3"
    assert runner.pool is None


def worker_env() -> tuple[int, dict[str, str | None], object]:
    return os.getpid(), {k: os.environ.get(k) for k in ONE_THREAD}, signal.getsignal(signal.SIGINT)


def workers_of(me: psutil.Process, before: set[int]) -> set[int]:
    """New processes under this one that are not its children: forked by the fork server."""
    return {p.pid for p in me.children(recursive=True) if p.pid not in before and p.ppid() != me.pid}


def test_the_pool_starts_its_size_in_processes_when_work_comes_and_runs_bodies_there() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    runner = make_task_runner("local", 2).duplicate()
    with runner:
        time.sleep(0.5)
        assert workers_of(me, before) == set() and runner.started_workers == 0  # nothing asked for yet
        runner.start_soon()  # the flow has work: both start in the background
        deadline = time.monotonic() + 60
        while len(workers_of(me, before)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = workers_of(me, before)
        assert len(workers) == 2 and runner.started_workers == 2
        seen = [runner.call(worker_env, (), "test") for _ in range(8)]
        assert {pid for pid, _, _ in seen} <= workers
        # one thread each, and Ctrl-C is the flow's business (the flow's process shuts them down)
        assert all(env == ONE_THREAD and sigint == signal.SIG_IGN for _, env, sigint in seen)
    deadline = time.monotonic() + 30
    while workers & {p.pid for p in me.children(recursive=True)} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not workers & {p.pid for p in me.children(recursive=True)}  # gone with the flow


def kill_myself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_myself_once(marker: str) -> str:
    """Dies (SIGKILL) the first time, as a worker the OOM killer picks; returns on the next try."""
    if not os.path.exists(marker):
        Path(marker).touch()
        kill_myself()
    return "survived"


def say_hello(name: str) -> str:
    log.info("hello %s from process %d", name, os.getpid())
    logging.getLogger("pipeline.ingest.stage").warning("ingest: empty_input %s holds no document", name)
    return name


def test_a_body_logs_to_its_task_run_and_a_dead_worker_costs_a_fresh_pool(
    prefect_harness: None, tmp_path: Path
) -> None:
    """Every record a body logs in a worker process, its own module's and a ``pipeline.*`` module's, is a record
    of its task run. A worker killed under a task: the task runs again on a fresh pool and completes, with one
    warning naming the task and the signal; a task that kills its worker every time fails by name, promptly."""
    from prefect import flow, task

    @task(name="hello", task_run_name="hello part 3")
    def hello() -> str:
        return hand_over(say_hello, "world")

    @task(name="crash", task_run_name="crash part 7")
    def crash(marker: str) -> str:
        return hand_over(kill_myself_once, marker)

    @task(name="doomed", task_run_name="doomed part 9")
    def doomed() -> None:
        hand_over(kill_myself)

    @flow(task_runner=make_task_runner("local", 2))
    def greet() -> str:
        return hello.submit().result()

    @flow(task_runner=make_task_runner("local", 2))
    def survive(marker: str) -> str:
        return crash.submit(marker).result()

    @flow(task_runner=make_task_runner("local", 2))
    def die() -> None:
        doomed.submit().result()

    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    runs_log = logging.getLogger("prefect.task_runs")
    runs_log.addHandler(handler)
    try:
        assert greet() == "world"
        said = [r for r in seen if r.getMessage().startswith("hello world from process")]
        assert len(said) == 1 and getattr(said[0], "task_run_name", None) == "hello part 3"
        assert f"process {os.getpid()}" not in said[0].getMessage()  # said in a worker process
        warned = [r for r in seen if "empty_input world" in r.getMessage()]
        assert [(r.name, r.levelno, getattr(r, "task_run_name", None)) for r in warned] == [
            ("pipeline.ingest.stage", logging.WARNING, "hello part 3")
        ]
        seen.clear()
        started = time.monotonic()
        assert survive(str(tmp_path / "died-once")) == "survived"
        assert time.monotonic() - started < 60  # a fresh pool, not Prefect's retry waits
    finally:
        runs_log.removeHandler(handler)
    died = [r.getMessage() for r in seen if "died" in r.getMessage()]
    assert len(died) == 1 and "SIGKILL" in died[0] and "'crash part 7'" in died[0], died

    started = time.monotonic()
    with pytest.raises(
        WorkerDied, match=r"'doomed part 9' failed: the worker process running it died .*SIGKILL"
    ):
        die()
    assert time.monotonic() - started < 90  # failed after its fresh pools, not hung


def test_a_worker_killed_between_tasks_is_said_when_the_pool_stops(caplog: pytest.LogCaptureFixture) -> None:
    """A worker that dies after its last call (nothing cut short, no call left to renew the pool) is still said
    once, by pid and signal, when the runner stops: an OOM kill never goes unseen."""
    runner = make_task_runner("local", 2).duplicate()
    with caplog.at_level(logging.WARNING, logger="flows.runtime.workers"), runner:
        runner.start_soon()
        pids = {runner.call(echo_pid, (n,), "test")[1] for n in range(6)}
        victim = sorted(pids)[0]
        os.kill(victim, signal.SIGKILL)  # between calls: none cut short, none left to renew the pool
        with contextlib.suppress(psutil.NoSuchProcess):  # dead before the flow ends (a zombie, or reaped)
            deadline = time.monotonic() + 10
            while psutil.Process(victim).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
                time.sleep(0.01)
    said = [r.getMessage() for r in caplog.records if "died" in r.getMessage()]
    expected = f"worker process {victim} (SIGKILL) died after its last task; nothing was cut short"
    assert said == [expected], said


def test_a_pool_that_stops_undisturbed_says_no_death(caplog: pytest.LogCaptureFixture) -> None:
    runner = make_task_runner("local", 2).duplicate()
    with caplog.at_level(logging.WARNING, logger="flows.runtime.workers"), runner:
        runner.start_soon()
        assert runner.call(echo_pid, (1,), "test")[0] == 1
    assert not [r for r in caplog.records if "died" in r.getMessage()]


def echo_pid(value: int) -> tuple[int, int]:
    return value, os.getpid()


def test_calls_started_before_the_runner_are_claimed_once_and_others_wait_for_them() -> None:
    """The head start's pool: the runner adopts it and a task's call takes the future already running; a call
    the head start did not make waits for the unclaimed ones (their units are done, never computed twice)."""
    from flows.runtime import pool

    early = pool.start_early(2, [(echo_pid, (1,)), (echo_pid, (2,)), (echo_pid, (3,))])
    try:
        runner = make_task_runner("local", 2).duplicate()
        with runner:
            runner.start_soon()
            runner.runner()
            assert runner.processes is early.pool and early.adopted  # the same worker processes
            first = pool.claim_early(echo_pid, (1,))
            assert first is not None and first.future.result()["result"][0] == 1
            assert runner.call(echo_pid, (2,), "test")[0] == 2  # through the runner: claimed
            assert pool.early_summary() == {
                "start": early.started,
                "calls": 3,
                "claimed": 2,
                "forked": early.forked,
            }
            unclaimed = early.calls[pool.call_key(echo_pid, (3,))].future
            assert runner.call(echo_pid, (4,), "test")[0] == 4  # not started early: submitted
            assert unclaimed.done() and not early.calls  # after the early call it waited for
            assert pool.early_summary()["calls"] == 3  # type: ignore[index]  # waited for, still counted
            assert pool.claim_early(echo_pid, (1,)) is None  # claimed once only
    finally:
        pool.close_early()
    assert pool.early_summary() is None


def stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited, not yet waited for
    except psutil.NoSuchProcess:
        return True


def test_one_worker_takes_the_early_calls_from_their_process_which_then_stops() -> None:
    """One worker is a thread of the flow's process: nothing adopts the head start's pool of one process, yet its
    calls are claimed from it, a call it did not make waits for the others and runs here, and the pool stops."""
    from flows.runtime import pool

    early = pool.start_early(1, [(echo_pid, (1,)), (echo_pid, (2,))])
    try:
        runner = make_task_runner("local", 1).duplicate()
        with runner:
            runner.runner()
            assert runner.processes is None and runner.in_process == 1
            value, worker = runner.call(echo_pid, (1,), "test")
            assert value == 1 and worker != os.getpid()  # claimed: computed by the head start's process
            waited = early.calls[pool.call_key(echo_pid, (2,))].future
            assert runner.call(echo_pid, (3,), "test") == (3, os.getpid())  # not started early: here
            assert waited.done() and not early.calls and not early.adopted
            assert pool.early_summary() == {
                "start": early.started,
                "calls": 2,
                "claimed": 1,
                "forked": early.forked,
            }
            deadline = time.monotonic() + 30
            while not stopped(worker):
                assert time.monotonic() < deadline, "the head start's worker process did not stop"
                time.sleep(0.05)
    finally:
        pool.close_early()
    assert pool.early_summary() is None


def cpus_of_this_process(_call: int = 0) -> list[int]:
    return sorted(os.sched_getaffinity(0))


def test_an_early_pool_as_wide_as_the_cpus_leaves_one_to_the_command_until_the_flow_runs() -> None:
    """While the command imports Prefect, head-start workers as many as its CPUs stay off one of them (the
    command's); the flow's first claim gives them every CPU back. Fewer workers than CPUs are never narrowed."""
    from flows.runtime import pool

    cpus = cpus_of_this_process()
    early = pool.start_early(len(cpus), [(cpus_of_this_process, (k,)) for k in range(len(cpus))])
    try:
        seen = [c.future.result(timeout=60)["result"] for c in early.calls.values()]
        if len(cpus) >= 2:
            assert seen == [cpus[1:]] * len(cpus) and early.narrowed == set(cpus)
        else:  # one CPU: nothing to leave
            assert seen == [cpus] and early.narrowed is None
        assert pool.claim_early(cpus_of_this_process, (0,)) is not None and early.narrowed is None
        again = [early.pool.submit(cpus_of_this_process, ()) for _ in cpus]
        assert [f.result(timeout=60)["result"] for f in again] == [cpus] * len(cpus)
    finally:
        pool.close_early()
    if len(cpus) >= 2:  # one worker fewer than the CPUs: the command has its own already
        early = pool.start_early(len(cpus) - 1, [(cpus_of_this_process, ())])
        try:
            assert early.narrowed is None
            assert next(iter(early.calls.values())).future.result(timeout=60)["result"] == cpus
        finally:
            pool.close_early()


def test_an_early_pool_of_another_size_is_closed_not_adopted() -> None:
    from flows.runtime import pool

    early = pool.start_early(2, [(echo_pid, (7,))])
    future = early.calls[pool.call_key(echo_pid, (7,))].future
    assert pool.adopt_early(3) is None  # the flow sized its runner otherwise
    assert future.done() and future.result()["result"][0] == 7  # finished before it was closed
    assert pool.early_summary() is None


def test_an_interrupted_command_does_not_wait_for_the_early_calls_queued() -> None:
    """Ctrl-C before the flow adopted the head start's pool: the queued calls are dropped, not waited for."""
    from flows.runtime import pool

    early = pool.start_early(2, [(time.sleep, (1.5,)) for _ in range(8)])
    futures = [c.future for c in early.calls.values()]
    started = time.monotonic()
    pool.close_early(wait=False)
    assert time.monotonic() - started < 1.0  # did not wait for eight calls of 1.5 s on two workers
    deadline = time.monotonic() + 30
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(f.cancelled() for f in futures)  # the calls still queued never ran
    assert pool.early_summary() is None


def env_value(name: str) -> str | None:
    return os.environ.get(name)


def test_workers_have_the_env_of_the_process_when_their_pool_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork server keeps the environment it started with; a later pool's workers get this process's as it
    is when the pool starts (credentials set after an earlier build, say), then the one-thread settings."""
    from flows.runtime import pool

    first = pool.start_pool(1)
    try:
        assert first.submit(env_value, ("PILEWORKS_SET_LATER",)).result(timeout=60)["result"] is None
    finally:
        first.shutdown()  # the fork server runs on, with the environment it started with
    monkeypatch.setenv("PILEWORKS_SET_LATER", "yes")
    monkeypatch.delenv("PILEWORKS_THREADS", raising=False)
    second = pool.start_pool(1)
    try:
        assert second.submit(env_value, ("PILEWORKS_SET_LATER",)).result(timeout=60)["result"] == "yes"
        assert second.submit(env_value, ("PILEWORKS_THREADS",)).result(timeout=60)["result"] == "1"
    finally:
        second.shutdown()


FORK_CHECK = """
import json, logging, os, sys
from flows.runtime import pool

def loaded():
    return sorted(name for name in pool.PRELOAD[2:] if name not in sys.modules)

def inherited():
    return any(isinstance(h, logging.StreamHandler) for h in logging.getLogger().handlers)

logging.getLogger().addHandler(logging.StreamHandler())
early = pool.start_early(2, [(pool.ready, ()), (inherited, ()), (loaded, ())])
pid, handlers, missing = (c.future.result()["result"] for c in early.calls.values())
print(json.dumps([early.forked, pid != os.getpid(), handlers, missing]))
pool.close_early()
"""


def test_early_workers_are_forks_of_a_one_thread_process_else_come_from_the_fork_server() -> None:
    """Forking a process whose other threads may hold locks is unsafe: with a second thread running, the early
    pool falls back to the fork server. A process of one thread (the command before Prefect; a fresh Python
    here) forks its workers, which drop the logging they inherited (their lines go back to the task run, not to
    the command's handlers as well) and find the stage modules loaded, as the fork server's do."""
    import subprocess
    import sys
    import threading

    from flows.runtime import pool

    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    out = subprocess.run(
        [sys.executable, "-c", FORK_CHECK], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # forked; in another process; no inherited handler; the stage modules loaded before the fork, once
    assert json.loads(out.stdout) == [True, True, False, []]
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, args=(30,), daemon=True)
    other.start()
    try:
        early = pool.start_early(2, [(pool.ready, ())])
        assert (
            not early.forked
            and early.calls[pool.call_key(pool.ready, ())].future.result()["result"] != os.getpid()
        )
    finally:
        stop.set()
        pool.close_early()


ABANDON = """
import os, sys, time
from flows.runtime import pool

forked = pool.start_pool(1, fork=True)
print(forked.submit(os.getpid, ()).result(timeout=60)["result"], flush=True)
forked.submit(time.sleep, (600,))  # a call at work, then one waiting: the worker is busy, then blocked on its queue
forked.submit(time.sleep, (600,))
os._exit(0)  # as the command leaves after Ctrl-C: no shutdown of the pool
"""


def test_a_worker_ends_with_the_process_that_forked_it() -> None:
    """A command that leaves at once (``os._exit`` after Ctrl-C, or killed) takes its forked workers with it: one
    left waiting would hold the command's stdout and stderr open (and a terminal's caller waiting on them)."""
    import subprocess
    import sys

    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    out = subprocess.run(
        [sys.executable, "-c", ABANDON], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    worker = int(out.stdout.split()[0])
    deadline = time.monotonic() + 30
    while not stopped(worker):
        assert time.monotonic() < deadline, "the worker outlived the process that forked it"
        time.sleep(0.05)
