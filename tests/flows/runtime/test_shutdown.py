"""``flows/runtime/shutdown.py``: which processes a stop kills, which temp files it removes, what it releases, and
the fork server's end with its command. Real processes, no mocks; every wait is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from flows.runtime import shutdown

HOLD = "import sys, time; f = open(sys.argv[1], 'w') if len(sys.argv) > 1 else None; time.sleep(60)"


@pytest.fixture
def command() -> Iterator[None]:
    """This test as a command that began now; no stop left behind for the next test."""
    shutdown.begin_command()
    yield
    shutdown.begin_command()


def sleeper(*args: str, **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", HOLD, *args], **popen)  # type: ignore[call-overload]


def gone(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> bool:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def holds(child: subprocess.Popen[bytes], path: Path) -> bool:
    try:
        return str(path.resolve()) in {f.path for f in psutil.Process(child.pid).open_files()}
    except psutil.Error:
        return False


def test_kill_children_kills_the_command_s_children_only(command: None) -> None:
    """A child of the command goes; a child started before the command (a test's own helper) and one in a session
    of its own (the detached local Prefect server) stay."""
    before = sleeper()
    shutdown.begin_command()  # `before` predates the command
    own_session = sleeper(start_new_session=True)
    mine = sleeper()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and mine.pid not in {p.pid for p in shutdown.descendants()}:
            time.sleep(0.05)
        assert shutdown.kill_children() == 1
        assert gone(mine)  # reaped by the kill already
        assert before.poll() is None and own_session.poll() is None
    finally:
        for proc in (before, own_session, mine):
            proc.kill()
            proc.wait(5)


def test_a_killed_child_s_temp_files_go_and_nothing_else(command: None, tmp_path: Path) -> None:
    """The temp files of ours a killed child held open are removed: in the temp folder (a file, or the folder
    holding it) and a store's ``.pw-tmp-`` file; an input it read, even one named like ours, stays."""
    tmp = Path(tempfile.gettempdir())
    folder = Path(tempfile.mkdtemp(prefix="pileworks-shards-"))
    loose = Path(tempfile.mkstemp(prefix="pw-part-", suffix=".parquet")[1])
    store_tmp = tmp_path / f"{shutdown.TMP_PREFIX}123@host~x"
    user_input = tmp_path / "pw-input.jsonl"
    user_input.write_text("{}\n")
    held = [folder / "shard.bin", loose, store_tmp, user_input]
    children = [sleeper(str(path)) for path in held]
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            holds(c, p) for c, p in zip(children, held, strict=True)
        ):
            time.sleep(0.05)
        found = shutdown.temp_files_of([psutil.Process(c.pid) for c in children])
        assert found == {folder.resolve(), loose.resolve(), store_tmp} or found == {folder, loose, store_tmp}
        shutdown.kill_children()
        assert all(gone(c) for c in children)
        assert not folder.exists() and not loose.exists() and not store_tmp.exists()
        assert user_input.exists() and tmp.exists()
    finally:
        for child in children:
            child.kill()
            child.wait(5)


MAKE_AND_CLOSE = textwrap.dedent(
    """
    import os, tempfile, time
    from pipeline.storage import local_temp_prefix
    fd, path = tempfile.mkstemp(prefix=local_temp_prefix("pw-part-"), suffix=".parquet")
    os.close(fd)  # made, then not held open: where mkstemp and the parquet writer's open meet
    folder = tempfile.mkdtemp(prefix=local_temp_prefix("pileworks-shards-"))
    print(path, folder, flush=True)
    time.sleep(60)
    """
)


def test_a_killed_child_s_temp_files_go_even_when_not_held_open(command: None) -> None:
    """A temp file or folder a child made and does not hold open at the kill (CI: a SIGINT 0.02 s into ingest left
    a ``pw-part-*.parquet`` made by ``mkstemp`` and not yet opened by the parquet writer) goes by the child's pid
    in its name; another process's stays."""
    other = Path(tempfile.mkstemp(prefix="pw-part-1-", suffix=".parquet")[1])  # pid 1's, never ours
    child = subprocess.Popen(
        [sys.executable, "-c", MAKE_AND_CLOSE],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert child.stdout is not None
        path, folder = (Path(p) for p in child.stdout.readline().split())
        assert path.name.startswith(f"pw-part-{child.pid}-") and path.exists() and folder.is_dir()
        assert not holds(child, path)
        shutdown.kill_children()
        assert gone(child)
        assert not path.exists() and not folder.exists()
        assert other.exists()
    finally:
        child.kill()
        child.wait(5)
        other.unlink(missing_ok=True)


def test_a_stop_kills_once_and_releases_once(command: None) -> None:
    released: list[str] = []
    shutdown.at_stop("lease a", lambda: released.append("a"))
    shutdown.at_stop("lease a", lambda: released.append("a again"))  # one per key: the last
    child = sleeper()
    try:
        assert shutdown.request_stop(signal.SIGTERM) is True
        assert gone(child)
        assert shutdown.request_stop(signal.SIGINT) is False  # the stop is under way
        assert shutdown.STOPPING.is_set() and shutdown.exit_code() == 143
        assert shutdown.finish_stop() is True and shutdown.finish_stop() is False
        assert released == ["a again"]
    finally:
        child.kill()
        child.wait(5)


def test_the_watchdog_leaves_unless_the_stop_was_reported(command: None) -> None:
    left: list[bool] = []
    shutdown.start_watchdog(lambda: left.append(True), seconds=0.2).join(5)
    assert left == [True]
    shutdown.report_once("stopped")
    shutdown.start_watchdog(lambda: left.append(True), seconds=0.2).join(5)
    assert left == [True]  # reported: the command left by itself


def test_the_build_lease_is_released_at_a_stop_and_never_refreshed_after(
    command: None, tmp_path: Path
) -> None:
    from flows.build.context import refresh_lease, take_build_lease
    from pipeline.storage import open_store
    from pipeline.storage.uploads import lease_key

    store = open_store(str(tmp_path / "store"), None)
    run = take_build_lease(store, None, run="r1")
    assert store.exists(lease_key(run))
    shutdown.request_stop(signal.SIGINT)
    shutdown.finish_stop()
    assert not store.exists(lease_key(run))
    refresh_lease(store, run)  # the heartbeat, a moment late
    assert not store.exists(lease_key(run))


def test_reclaim_signals_changes_nothing_outside_a_command() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signal handlers are set from the main thread only")
    mine = signal.getsignal(signal.SIGTERM)
    shutdown.reclaim_signals()
    assert signal.getsignal(signal.SIGTERM) is mine
    previous = shutdown.install_handler(lambda signum, frame: None)
    try:
        handler = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a Prefect flow run's bridge replaces it
        shutdown.reclaim_signals()
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        shutdown.restore_handlers(previous)
    assert signal.getsignal(signal.SIGTERM) is mine


def test_a_helper_that_dies_with_its_command_ends_when_the_command_is_killed(tmp_path: Path) -> None:
    """The fork server's case: its command is SIGKILLed, it ends within a second (then its workers with it)."""
    script = textwrap.dedent(
        """
        import subprocess, sys
        helper = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
        print(helper.pid, flush=True)
        helper.wait()
        """
    )
    helper_code = (
        "from flows.runtime.shutdown import die_with_command; import time; die_with_command(); time.sleep(60)"
    )
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    cmd = subprocess.Popen(
        [sys.executable, "-c", script, helper_code], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert cmd.stdout is not None
        helper = psutil.Process(int(cmd.stdout.readline()))
        time.sleep(0.5)  # the helper's watch has started
        cmd.kill()
        cmd.wait(5)
        helper.wait(5)  # raises psutil.TimeoutExpired if it outlives its command
    finally:
        cmd.kill()
        cmd.wait(5)


def test_a_training_in_this_process_is_not_waited_for_once_the_command_stops(command: None) -> None:
    """``until_stopped`` (the tokenizer's training on the flow's one worker): the result when it ends; a stop
    raises at once, the long call left to die with the process."""
    from pipeline.errors import StageFailed

    assert shutdown.until_stopped(lambda: "sha", "train-tokenizer") == "sha"
    release = threading.Event()
    threading.Timer(0.3, shutdown.STOPPING.set).start()
    started = time.monotonic()
    with pytest.raises(StageFailed, match="the command is stopping"):
        shutdown.until_stopped(lambda: str(release.wait(30)), "train-tokenizer")
    assert time.monotonic() - started < 5
    release.set()


def test_an_interrupt_python_could_not_raise_is_raised_again(command: None) -> None:
    """Ctrl-C landing in an at-fork hook or a ``__del__`` (the head start forking a worker) is printed as
    "Exception ignored" and lost: the command's hook raises it again on the main thread, and prints nothing."""

    def handler(signum: int, frame: object) -> None:
        if shutdown.request_stop(signum) or shutdown.interrupt_again():
            raise KeyboardInterrupt

    class Swallowed:
        def __del__(self) -> None:
            raise KeyboardInterrupt  # as the handler's raise inside an at-fork hook

    previous = shutdown.install_handler(handler)
    try:
        shutdown.STOPPING.set()
        with pytest.raises(KeyboardInterrupt):
            Swallowed()
            for _ in range(50):  # the re-raised interrupt lands on one of these
                time.sleep(0.01)
    finally:
        shutdown.restore_handlers(previous)
    assert sys.unraisablehook is not shutdown._lost_interrupt  # the command's hook is gone with it


def test_only_a_process_that_ends_with_its_command_freezes_its_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gc.freeze`` in the console script (its objects last to its end); never in a process that goes on, such
    as this test's, which would keep its garbage frozen."""
    import gc

    from flows.runtime import shutdown

    before = gc.get_freeze_count()
    shutdown.freeze_for_the_command()
    assert gc.get_freeze_count() == before
    monkeypatch.setattr(shutdown, "ENDS_WITH_COMMAND", True)
    try:
        shutdown.freeze_for_the_command()
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


def test_what_a_stop_starts_runs_at_the_first_signal_and_a_hang_up_is_not_hurried(command: None) -> None:
    """``when_stopping``: called once, from the first signal (the training job's SIGTERM, sent before the
    interrupt reaches any code). ``on_second_signal``: a second SIGINT or SIGTERM ends it at once, but nothing
    after a hang-up does (the shell's SIGHUP and the kernel's come together by themselves)."""
    started: list[int] = []
    hurried: list[int] = []
    for first, then, hurries in [
        (signal.SIGHUP, [signal.SIGHUP, signal.SIGINT, signal.SIGTERM], False),
        (signal.SIGTERM, [signal.SIGHUP], False),
        (signal.SIGTERM, [signal.SIGINT], True),
        (signal.SIGINT, [signal.SIGINT], True),
    ]:
        shutdown.begin_command()
        started.clear()
        hurried.clear()
        shutdown.on_second_signal("job", lambda: hurried.append(1))
        with shutdown.when_stopping("job", lambda: started.append(1)):
            assert shutdown.request_stop(first) is True
            assert started == [1], first
            for signum in then:
                assert shutdown.request_stop(signum) is False
            assert started == [1] and hurried == ([1] if hurries else []), (first, then)
    shutdown.begin_command()
    with shutdown.when_stopping("job", lambda: started.append(2)):
        pass
    shutdown.request_stop(signal.SIGTERM)
    assert 2 not in started  # only while inside


def test_an_interrupt_raised_again_is_not_a_second_signal(command: None) -> None:
    """The stop's own interrupt, lost where Python could not raise it and raised again by the command's hook,
    runs the handler as a SIGINT would: it must not end at once what the first signal gave time to stop (the
    ranks' save). A real second Ctrl-C still does."""
    import logging

    from flows.cli.main import QUIET_AFTER_INTERRUPT, _on_stop_signal

    levels = {name: logging.getLogger(name).level for name in QUIET_AFTER_INTERRUPT}
    hurried: list[int] = []
    shutdown.on_second_signal("job", lambda: hurried.append(1))
    try:
        with pytest.raises(KeyboardInterrupt):
            _on_stop_signal(signal.SIGTERM, None)
        shutdown._interrupt_again.set()  # as _lost_interrupt sets it before raising it again
        with pytest.raises(KeyboardInterrupt):
            _on_stop_signal(signal.SIGINT, None)
        assert hurried == []
        _on_stop_signal(signal.SIGINT, None)  # a person's second Ctrl-C: the stop is under way, it hurries
        assert hurried == [1]
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
