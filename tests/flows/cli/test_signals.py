"""SIGTERM and SIGHUP like Ctrl-C, and all prompt: one line, exit 143 (129, 130), the work stopped rather than
waited for; under ``nohup`` SIGHUP stays ignored.

In-process: the command's own handling. Slow (``test_stops_*``): real ``pileworks build`` subprocesses stopped at
three points (ingest, tokenizer training, tokenize), each a rerun of the one before, the last of which publishes
the dataset of an uninterrupted build; a build on a pseudo-terminal that hangs up stops as SIGTERM stops it; and
one killed with SIGKILL leaves no process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest


@pytest.mark.parametrize(
    ("sig", "said"),
    [(signal.SIGTERM, "stopped by SIGTERM"), (signal.SIGHUP, "stopped by SIGHUP (its terminal hung up)")],
    ids=["SIGTERM", "SIGHUP"],
)
def test_sigterm_and_sighup_are_one_line_and_exit_128_plus_the_signal(
    sig: signal.Signals,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flows.cli import janitor
    from flows.cli.main import main
    from flows.runtime import shutdown

    def terminated_run(args: object) -> int:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler interrupts this at once
        raise AssertionError(f"no {sig.name} arrived")

    def not_the_command(signum: int, frame: object) -> None:  # a signal the command did not take lands here
        pass

    before = signal.signal(
        sig, not_the_command
    )  # SIGHUP not ignored, as on a terminal (whatever the runner's)
    monkeypatch.setattr(janitor, "run", terminated_run)
    started = time.monotonic()
    try:
        assert main(["janitor", "--output", str(tmp_path)]) == 128 + sig
        assert time.monotonic() - started < 4
        err = capsys.readouterr().err
        assert (
            err == f"pileworks janitor: {said}; rerun the same command to resume from the completed units\n"
        )
        assert signal.getsignal(sig) is not_the_command  # the command's handler is gone with it
        assert shutdown.STOPPING.is_set()  # until the next command begins
    finally:
        signal.signal(sig, before)


def test_a_command_under_nohup_leaves_sighup_ignored() -> None:
    """``nohup pileworks ...`` starts with SIGHUP ignored: the command does not take it, nor the ranks, so the
    run goes on after its terminal closes. SIGINT and SIGTERM are the command's all the same."""
    from flows.cli.main import _on_stop_signal
    from flows.runtime import shutdown
    from training.preempt import StopFlag

    before = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        shutdown.begin_command()
        previous = shutdown.install_handler(_on_stop_signal)
        try:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is signal.getsignal(signal.SIGINT) is _on_stop_signal
            shutdown.reclaim_signals()
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        finally:
            shutdown.restore_handlers(previous)
        flag = StopFlag().install()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing noted
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert flag.received and flag.said() == "SIGTERM"
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


# A command that takes Ctrl-C itself and returns (as `reap --watch` does, and Prefect's `serve`, inside which
# CPython was once left holding the interrupt as unhandled): a KeyboardInterrupt that ends PyRun_SimpleString's
# code sets the same flag, after which a normal exit of `python -m` kills the process with SIGINT.
SWALLOWED_INTERRUPT = """
import ctypes, os, signal, sys, time
from flows.cli import janitor
from flows.cli.main import entry

def swallowing_run(args):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        ctypes.pythonapi.PyRun_SimpleString(b"raise KeyboardInterrupt")
        return 0
    return 3

janitor.run = swallowing_run
sys.argv = ["pileworks", "janitor", "--output", sys.argv[1]]
entry()
"""


def test_a_command_that_takes_ctrl_c_itself_exits_with_its_own_code_not_by_the_signal(tmp_path: Path) -> None:
    """Run as the console script runs (``python -m``: ``python -c`` leaves through another door, which does
    not look at the flag)."""
    import sys

    (tmp_path / "swallowing.py").write_text(SWALLOWED_INTERRUPT)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[3])])}
    done = subprocess.run(
        [sys.executable, "-m", "swallowing", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


def test_a_fork_of_the_command_is_not_the_command() -> None:
    """A worker forked from the command has the command's handler until it sets its own: SIGTERM from its pool
    (as a stop kills its siblings) ends it quietly, without stopping, killing or reporting anything."""
    from flows.cli.main import EXIT_TERMINATED, _on_stop_signal
    from flows.runtime import shutdown

    shutdown.begin_command()
    previous = shutdown.install_handler(_on_stop_signal)
    try:
        child = os.fork()
        if child == 0:  # the fork: its SIGTERM arrives before it set handlers of its own
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(0)
        _, status = os.waitpid(child, 0)
    finally:
        shutdown.restore_handlers(previous)
    assert os.waitstatus_to_exitcode(status) == EXIT_TERMINATED
    assert not shutdown.STOPPING.is_set()


# ---------------------------------------------------------------- real builds, stopped (slow)

# A corpus whose steps last long enough to be caught in the act on a loaded 2-core machine: 1 MiB parts make
# ingest a dozen units; a 30k vocabulary makes the tokenizer's training last seconds. The ``hf`` trainer: the
# one that trains in a child process of a worker (the default ``counts`` trains on a worker's thread, under a
# second here, and stops with the workers as ingest and tokenize do), so a stop must end that child too.
CORPUS_MB = 12
SETS = {"ingest.target_part_bytes": 1 << 20, "tokenize.vocab_size": 30000, "tokenize.trainer": "hf"}
REACH_S = 180  # the longest a build may take to reach a point
STOP_S = 10  # a stopped build exits by then
GONE_S = 5  # and every process of it is gone by then
# Temp files and folders of ours, and multiprocessing's (the fork server's socket)
OUR_TEMP = ("pw-part-", "pw-fasttext-", "pileworks-shards-", "pileworks-tokenizer-", "pymp-", ".pw-tmp-")


def write_corpus(folder: Path, mb: int, files: int = 4, seed: int = 3) -> None:
    """JSONL files of English-like documents over 20k made-up words (BPE has merges to learn): every
    document passes the quality rules, none is a duplicate."""
    import json
    import random

    rng = random.Random(seed)
    letters = "abcdefghijklmnoprstuvwy"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(20000)]
    stop_words = ["the", "be", "to", "of", "and", "that", "have", "with"]
    folder.mkdir(parents=True)
    for f in range(files):
        lines: list[str] = []
        size = 0
        while size < mb * 1_000_000 // files:
            sentences = []
            for _ in range(rng.randint(8, 20)):
                words = [rng.choice(vocab) for _ in range(rng.randint(6, 14))]
                words.insert(rng.randrange(len(words)), rng.choice(stop_words))
                sentences.append("The " + " ".join(words) + ".")
            lines.append(json.dumps({"text": "\n".join(sentences), "meta": {"file": f}}) + "\n")
            size += len(lines[-1])
        (folder / f"part-{f}.jsonl").write_text("".join(lines), encoding="utf-8")


def build_args(corpus: Path, store: Path) -> list[str]:
    return ["build", "--input", str(corpus), "--output", str(store), "--json"] + [
        f"--set={k}={v}" for k, v in SETS.items()
    ]


def private_env(server_home: Path, tmp: Path) -> dict[str, str]:
    """The CLI's environment with a temp folder of its own: what the build leaves there is seen."""
    from tests.flows.cli.conftest import cli_env

    tmp.mkdir(exist_ok=True)
    return cli_env(server_home, TMPDIR=str(tmp))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("signals") / "raw"
    write_corpus(folder, CORPUS_MB)
    return folder


@pytest.fixture(scope="module")
def baseline(corpus: Path, server_home: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The dataset id of an uninterrupted build of the corpus."""
    import json

    from tests.flows.cli.conftest import run_cli

    tmp = tmp_path_factory.mktemp("baseline")
    done = run_cli(build_args(corpus, tmp / "store"), private_env(server_home, tmp / "tmp"), tmp)
    assert done.code == 0, done.err[-3000:]
    return str(json.loads(done.out)["dataset_id"])


class Watch:
    """A running ``pileworks build``: its processes as seen so far (every poll adds the new ones), and where
    its build is (the work folder's markers)."""

    def __init__(self, proc: subprocess.Popen[Any], store: Path) -> None:
        self.proc, self.store = proc, store
        self.command = psutil.Process(proc.pid)
        self.seen: dict[int, psutil.Process] = {}
        self.before_training: set[int] | None = None  # the processes while dedup ran (at_training)

    def poll(self) -> list[psutil.Process]:
        try:
            children = self.command.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for child in children:
            self.seen.setdefault(child.pid, child)
        return children

    def has(self, marker: str) -> bool:
        return any(p.name != "leases" and (p / marker).exists() for p in (self.store / "work").glob("*"))

    def alive(self) -> list[str]:
        """The processes seen that still run (a zombie has ended: only its exit status is left)."""
        running = []
        for process in self.seen.values():
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    running.append(f"{process.pid} {' '.join(process.cmdline())[:80]}")
        return running

    def wait_until_gone(self, seconds: float) -> list[str]:
        deadline = time.monotonic() + seconds
        while (left := self.alive()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left


def at_ingest(watch: Watch, children: list[psutil.Process]) -> bool:
    """The head start's workers run ingest units, and not all are done."""
    return bool(children) and not watch.has("ingest/_SUCCESS")


def at_training(watch: Watch, children: list[psutil.Process]) -> bool:
    """Dedup is done and a process started since, which a worker forked (the tokenizer's training child). The
    processes before it are the last poll's while dedup still ran (its children listed before the marker was
    looked for): a first snapshot taken only once dedup was done held the child itself when the flow forked it
    within the poll's gap, as it did once on a loaded machine."""
    if not watch.has("dedup/_SUCCESS"):
        watch.before_training = {c.pid for c in children}
        return False
    if watch.has("tokenizer.json"):
        return False
    if watch.before_training is None:  # dedup was done at the first poll (a resumed build)
        watch.before_training = {c.pid for c in children}
        return False
    return any(c.pid not in watch.before_training and c.ppid() != watch.proc.pid for c in children)


def at_tokenize(watch: Watch, children: list[psutil.Process]) -> bool:
    """The tokenizer is trained: the tokenize pass runs."""
    return watch.has("tokenizer.json")


# Each point, and the marker a stop there leaves missing (it stopped before that step ended).
POINTS = [(at_ingest, "ingest/_SUCCESS"), (at_training, "tokenizer.json"), (at_tokenize, "tokens/_SUCCESS")]


def start_build(args: list[str], env: dict[str, str], cwd: Path, **streams: Any) -> subprocess.Popen[Any]:
    """``pileworks build`` in a process group (a session) of its own, as a terminal's foreground job."""
    import sys

    streams = streams or {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    command = [sys.executable, "-m", "flows.cli", *args]
    return subprocess.Popen(
        command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True, **streams
    )


def reach(watch: Watch, point: Callable[[Watch, list[psutil.Process]], bool]) -> None:
    deadline = time.monotonic() + REACH_S
    while time.monotonic() < deadline:
        children = watch.poll()
        with contextlib.suppress(psutil.Error):
            if point(watch, children):
                watch.poll()
                return
        if watch.proc.poll() is not None:
            raise AssertionError(f"the build ended (exit {watch.proc.returncode}) before {point.__name__}")
        time.sleep(0.02)
    raise AssertionError(f"the build did not reach {point.__name__} in {REACH_S} s")


def our_temp_files(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(OUR_TEMP))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_stops_at_three_points_then_resumes_to_the_same_dataset(
    sig: signal.Signals, corpus: Path, baseline: str, server_home: Path, tmp_path: Path
) -> None:
    """Stopped during ingest, tokenizer training and tokenize (each run resuming the one before): each exits 143
    (SIGTERM, as Kubernetes or Slurm send it to the command) or 130 (Ctrl-C: SIGINT to the whole process group,
    as a terminal sends it) within 10 s with one line, no process of it outlives it by 5 s, its lease is
    released and its temp files are gone. The next run publishes the uninterrupted build's dataset."""
    import json

    from tests.flows.cli.conftest import run_cli

    store, tmp = tmp_path / "store", tmp_path / "tmp"
    env, args = private_env(server_home, tmp), build_args(corpus, store)
    code, said = (143, "stopped by SIGTERM") if sig == signal.SIGTERM else (130, "interrupted")
    for point, unfinished in POINTS:
        watch = Watch(start_build(args, env, tmp_path), store)
        try:
            reach(watch, point)
            sent = time.monotonic()
            os.killpg(watch.proc.pid, sig) if sig == signal.SIGINT else watch.proc.send_signal(sig)
            _, err = watch.proc.communicate(timeout=60)
            took = time.monotonic() - sent
        finally:
            watch.proc.kill()
            watch.proc.wait(10)
        where = f"{sig.name} at {point.__name__} ({took:.2f} s)"
        print(where)  # the figures, with -s
        assert watch.proc.returncode == code, f"{where}: {err[-3000:]}"
        assert took < STOP_S, where
        lines = [line for line in err.splitlines() if line.startswith("pileworks build:")]
        assert lines == [
            f"pileworks build: {said}; rerun the same command to resume from the completed units"
        ]
        assert err.strip().splitlines()[-1] == lines[0] and "Traceback" not in err, err[-3000:]
        assert not watch.has(unfinished), f"{where}: the stop came after the step it was meant to stop"
        assert watch.wait_until_gone(GONE_S) == [], f"{where}: processes of the build outlived it"
        assert list((store / "work" / "leases").glob("*")) == [], f"{where}: its lease was not released"
        assert our_temp_files(tmp) == [], where
    done = run_cli(args, env, tmp_path)
    assert done.code == 0, done.err[-3000:]
    assert json.loads(done.out)["dataset_id"] == baseline


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_terminal_that_hangs_up_stops_the_build_as_sigterm_does(
    corpus: Path, server_home: Path, tmp_path: Path
) -> None:
    """On a pseudo-terminal that closes during tokenizer training (the window closed, the SSH connection
    dropped): the kernel sends the command SIGHUP, and the build stops as SIGTERM stops it: exit 129 within
    10 s, no process of it left, its lease released, its temp files gone, though every line it writes to the gone
    terminal fails (EIO)."""
    from tests.flows.cli.conftest import Terminal

    store, tmp = tmp_path / "store", tmp_path / "tmp"
    args = [a for a in build_args(corpus, store) if a != "--json"]
    terminal = Terminal(args, private_env(server_home, tmp), tmp_path)
    watch = Watch(terminal.proc, store)
    try:
        reach(watch, at_training)
        sent = time.monotonic()
        terminal.hang_up()
        code = terminal.finish(60)
        took = time.monotonic() - sent
    finally:
        terminal.finish(10)
    print(f"hang-up during tokenizer training to exit: {took:.2f} s")  # the figure, with -s
    assert code == 129 and took < STOP_S, (code, took, terminal.screen()[-3000:])
    assert not watch.has("tokenizer.json")
    assert watch.wait_until_gone(GONE_S) == [], "processes of the build outlived it"
    assert list((store / "work" / "leases").glob("*")) == [], "its lease was not released"
    assert our_temp_files(tmp) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killed_on_a_terminal_during_training_leaves_no_process(
    corpus: Path, server_home: Path, tmp_path: Path
) -> None:
    """On a pseudo-terminal (the live display's thread stops while the head start forks the workers from the
    command), the command SIGKILLed during tokenizer training (nothing of it runs to clean up): the workers, the
    training child and any fork server or resource tracker are gone within 5 s all the same."""
    import pty
    import threading

    master, terminal = pty.openpty()
    env = private_env(server_home, tmp_path / "tmp") | {"TERM": "xterm"}
    args = [a for a in build_args(corpus, tmp_path / "store") if a != "--json"]
    proc = start_build(args, env, tmp_path, stdout=terminal, stderr=terminal)
    os.close(terminal)
    shown: list[bytes] = []

    def read_terminal() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                shown.append(chunk)

    threading.Thread(target=read_terminal, daemon=True).start()
    watch = Watch(proc, tmp_path / "store")
    try:
        reach(watch, at_training)
        proc.kill()
        proc.wait(10)
        assert len(watch.seen) >= 3, watch.seen  # 2 workers, the training child (a fork server, the tracker)
        left = watch.wait_until_gone(GONE_S)
        assert left == [], f"still running {GONE_S} s after the command was killed: {left}"
    finally:
        proc.kill()
        proc.wait(10)
        for process in watch.seen.values():  # none, unless the test failed
            with contextlib.suppress(psutil.Error):
                process.kill()
        os.close(master)
