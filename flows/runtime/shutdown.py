"""The command is stopping: what Ctrl-C (SIGINT), SIGTERM and a hang-up (SIGHUP) share, and how the command
leaves at once.

Kubernetes, Slurm and systemd send SIGTERM and wait about 30 s before SIGKILL; a person at a terminal presses
Ctrl-C and waits for the prompt, or closes the terminal (or loses its SSH connection), which sends SIGHUP. Either
way a build stops its work instead of waiting for it: :func:`request_stop` sets :data:`STOPPING` (a worker pool
that lost a worker does not retry on a fresh one then) and kills the command's child processes at once
(:func:`kill_children`: the local workers, the multiprocessing fork server and resource tracker, a tokenizer's
training child), so the threads of the flow that waited for them return. The command then releases what it holds
(:func:`at_stop`: the build's lease), removes the temp files its killed children held open, prints one line
(where the terminal is still there) and exits 130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP). A watchdog
(:func:`start_watchdog`) does the same after :data:`WATCHDOG_S` whatever still runs (a step computing in a thread
of the command).

The detached local Prefect server runs in a session of its own (``flows/runtime/local_server.py``) and is never
killed here: only this process's descendants in its own session, started since the command began.
"""

from __future__ import annotations

import _thread
import contextlib
import contextvars
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import psutil

from pipeline.errors import StageFailed
from pipeline.storage.base import TMP_PREFIX, local_temp_prefix

R = TypeVar("R")

log = logging.getLogger(__name__)

STOPPING = threading.Event()  # set by SIGINT, SIGTERM or SIGHUP: the command is stopping, nothing new starts
# 128 + the signal, as a shell reports it. SIGHUP: the terminal closed (a window, a dropped SSH connection), which
# killed the command at once and left a training job it had started running on, orphaned in its own sessions.
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
# Left as they are where the command started with them ignored: ``nohup pileworks ...`` goes on after a hang-up.
KEPT_IF_IGNORED = (signal.SIGHUP,)
WATCHDOG_S = 6.0  # the command leaves by then, whatever still runs (Kubernetes and Slurm give 30 s)
KILL_WAIT_S = 2.0  # how long the killed children get to be gone (SIGKILL: milliseconds)
# What our code names its temp files and folders (``pipeline/records.py``, ``pipeline/dataset/publish.py``,
# ``pipeline/clean/classifier.py``) and multiprocessing its own (``pymp-``, the fork server's socket): only those
# are removed, where a killed process held them open (the command leaves with ``os._exit``, which skips
# multiprocessing's clean-up at exit).
TEMP_PREFIXES = ("pw-part-", "pw-fasttext-", "pileworks-shards-", "pileworks-tokenizer-", "pymp-")

_state: dict[str, int] = {"signal": 0, "pid": 0}  # the stop's signal, the command's process
_before: set[tuple[int, float]] = set()  # the descendants this process had when the command began
_at_stop: dict[str, Callable[[], None]] = {}
_hurry: dict[str, Callable[[], None]] = {}  # what a second signal ends at once (:func:`on_second_signal`)
_starting: dict[str, Callable[[], None]] = {}  # what the first signal starts at once (:func:`when_stopping`)
_extra_s: dict[str, float] = {}  # more time the watchdog gives a stop, by holder (:func:`more_time`)
_hint: list[
    str
] = []  # how to go on, where the work knows better than the default line (:func:`say_how_to_go_on`)
# how the watchdog leaves the process (the command's, see begin_command)
_leave: list[Callable[[], None]] = []
_handler: list[Callable[[int, object], None]] = []  # the command's signal handler, while it runs
_taken: list[int] = []  # the signals it took (:func:`install_handler`)
_lock = threading.RLock()  # re-entered by a second signal landing while the first one holds it
_finished = threading.Event()  # the stop was finished (children killed, holdings released) once
_reported = threading.Event()  # the stop's one line was printed
_interrupt_again = threading.Event()  # the main thread's interrupt was swallowed: raise it again
_unraisable = [sys.unraisablehook]  # the hook the command's replaced (:func:`install_handler`)


# True in the ``pileworks`` console script (``flows/cli/main.py:entry``), whose process ends with its one command;
# False where a process that goes on runs commands (tests, another program).
ENDS_WITH_COMMAND = False


def freeze_for_the_command() -> None:
    """In a process that ends with its command: the objects made so far (Prefect's, pydantic's, the stages'
    modules), which it keeps to its end, frozen out of the cyclic collector's reach (``gc.freeze``), so its
    collections scan only what the command makes from now on. A process that goes on would keep any garbage
    frozen with them: nothing is done there. Measured on 2026-12-04, 39 MB build, 1 and 2 workers: collections
    took 0.29-0.30 s of the flow's process (0.22 s in the oldest generation), 0.13-0.15 s frozen before the
    flow; at the exit, 0.60-0.61 s went from the last pass to the exit, 0.20-0.28 s frozen."""
    if ENDS_WITH_COMMAND:
        gc.freeze()


def begin_command(leave: Callable[[], None] | None = None) -> None:
    """A command starts in this process: nothing is stopping, nothing is held, and only processes started from
    now on are the command's (a test runs several commands in one process, beside its own children).
    ``leave``: what the watchdog calls when a stop runs past :data:`WATCHDOG_S` (it reports and exits)."""
    STOPPING.clear()
    for event in (_finished, _reported):
        event.clear()
    with _lock:
        _at_stop.clear()
        _hurry.clear()
        _starting.clear()
        _extra_s.clear()
        _hint.clear()
        _leave[:] = [leave] if leave is not None else []
        _state.update(signal=0, pid=os.getpid())
        _before.clear()
        _before.update(_processes(psutil.Process().children(recursive=True)))


def request_stop(signum: int) -> bool:
    """The command was sent ``signum``: mark it stopping, kill its child processes now and start the watchdog.
    True the first time; a second signal ends at once what was given time to stop (:func:`on_second_signal`: a
    training job saving its checkpoint), the stop being under way already, unless a hang-up is in it."""
    with _lock:
        first = not STOPPING.is_set()
        if first:
            _state["signal"] = signum
            STOPPING.set()
        leave = list(_leave)
        starts = list(_starting.values()) if first else []
        # Nothing hurries a hang-up's stop: no person is at a terminal that is gone, and its signals come in
        # bursts by themselves (measured: SIGHUP from the shell passing it on to its job and SIGHUP from the
        # kernel in the same millisecond, in 3 of 6 closes of a terminal running `pileworks train` in an
        # interactive bash; the second killed the ranks mid-save).
        hurry = [] if first or signal.SIGHUP in (signum, _state["signal"]) else list(_hurry.values())
    if first:
        for start in starts:
            with contextlib.suppress(Exception):
                start()
        kill_children()
        for call in leave:
            start_watchdog(call)
    for end in hurry:
        with contextlib.suppress(Exception):
            end()
    return first


@contextlib.contextmanager
def when_stopping(key: str, start: Callable[[], None]) -> Iterator[None]:
    """While inside: the first signal calls ``start`` at once, from its handler (it only starts something: a
    thread stopping a training job in a session of its own, which :func:`kill_children` does not reach). The
    stop then does not wait for the interrupt to reach the code that would stop it: the interrupt can land
    where Python does not raise it (:func:`_lost_interrupt`), and come back only when the main thread next runs
    Python code (measured: 4 s, and once not within 30 s, when the watchdog left with the job still training)."""
    with _lock:
        _starting[key] = start
    try:
        yield
    finally:
        with _lock:
            _starting.pop(key, None)


def on_second_signal(key: str, end: Callable[[], None]) -> None:
    """Call ``end`` (once per ``key``) if a second SIGINT or SIGTERM comes while the command stops: a person
    pressing Ctrl-C again does not wait for what the first one gave time to finish."""
    with _lock:
        _hurry[key] = end


@contextlib.contextmanager
def more_time(key: str, seconds: float) -> Iterator[None]:
    """While inside: a stop may take ``seconds`` more than :data:`WATCHDOG_S` before the watchdog ends it (the
    training ranks saving their checkpoint, ``training.preempt``)."""
    with _lock:
        _extra_s[key] = seconds
    try:
        yield
    finally:
        with _lock:
            _extra_s.pop(key, None)


def extra_time() -> float:
    with _lock:
        return max(_extra_s.values(), default=0.0)


def say_how_to_go_on(text: str) -> None:
    """The stop's line ends with ``text`` instead of the build's "rerun the same command to resume from the
    completed units" (the train flow: which checkpoint the ranks saved)."""
    with _lock:
        _hint[:] = [text]


def how_to_go_on() -> str | None:
    with _lock:
        return _hint[0] if _hint else None


def in_command() -> bool:
    """Whether this is the command's process, not a fork of it that has not set its own signal handlers yet
    (a worker forked from the command gets SIGTERM from its pool as a stop kills its siblings)."""
    return _state["pid"] == os.getpid()


def exit_code() -> int:
    """The exit code of the stop: 128 + the signal (130 when nothing was received: an interrupt)."""
    return EXIT_CODES.get(signal.Signals(_state["signal"] or signal.SIGINT), 130)


def stopped_by() -> int:
    """The signal that stopped the command (0: none)."""
    return _state["signal"]


def at_stop(key: str, release: Callable[[], None]) -> None:
    """Call ``release`` when the command stops (once per ``key``): what a killed process cannot give back."""
    with _lock:
        _at_stop[key] = release


def descendants() -> list[psutil.Process]:
    """This process's descendants in its session that it did not have when the command began."""
    session = os.getsid(0)
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(child.pid) == session and (child.pid, child.create_time()) not in _before:
                found.append(child)
    return found


def _processes(children: list[psutil.Process]) -> set[tuple[int, float]]:
    """Each process as (pid, start time): a pid reused later is another process."""
    found = set()
    for child in children:
        with contextlib.suppress(psutil.Error):
            found.add((child.pid, child.create_time()))
    return found


def kill_children() -> int:
    """SIGKILL the command's child processes (:func:`descendants`): their units are written whole or not at all,
    so a kill loses nothing a rerun needs. The temp files they held open go too. Returns how many were killed."""
    killed: set[int] = set()
    for _ in range(3):  # again for a child forked while the others were stopped (a pool starting its workers)
        children = [c for c in descendants() if c.pid not in killed]
        if not children:
            break
        for child in children:  # frozen first: what they hold open is read before they open more
            with contextlib.suppress(psutil.Error):
                child.suspend()
        held = temp_files_of(children)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        killed.update(c.pid for c in children)
        alive = wait_gone(children, KILL_WAIT_S)
        if alive:
            log.warning(
                "%d child process(es) still alive after SIGKILL: %s", len(alive), [p.pid for p in alive]
            )
        remove_temp_files(held)
    return len(killed)


def wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for ``processes`` to end (this process's own children reaped); those left. A
    zombie has ended: a grandchild's exit status waits for whoever reaps it, not for this command."""
    deadline = time.monotonic() + timeout_s
    left = processes
    while left and time.monotonic() < deadline:
        _, left = psutil.wait_procs(left, timeout=0.05)
        left = [p for p in left if not _ended(p)]
    return left


def _ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def temp_files_of(processes: list[psutil.Process]) -> set[Path]:
    """The temp files and folders of ours (:data:`TEMP_PREFIXES`) that ``processes`` hold open: a file in the
    temp folder, the temp folder's entry holding it (a ``TemporaryDirectory``), or a store's temp file."""
    tmp = Path(tempfile.gettempdir()).resolve()
    found: set[Path] = set()
    for process in processes:
        # named by its pid (local_temp_prefix): held open or not at the freeze
        for kind in TEMP_PREFIXES:
            with contextlib.suppress(OSError):
                found.update(tmp.glob(f"{local_temp_prefix(kind, process.pid)}*"))
        with contextlib.suppress(psutil.Error, OSError):
            held = [f.path for f in process.open_files()]
            held += [str(c.laddr) for c in process.net_connections(kind="unix") if c.laddr]
            for name in held:
                path = Path(name)
                if path.name.startswith(TMP_PREFIX):  # a store's temp file, never the inputs or outputs
                    found.add(path)
                elif path.is_relative_to(tmp):  # the temp folder's entry: the file, or the folder holding it
                    top = tmp / path.relative_to(tmp).parts[0]
                    if top.name.startswith(TEMP_PREFIXES):
                        found.add(top)
    return found


def remove_temp_files(paths: set[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def finish_stop() -> bool:
    """Once per stop: kill what is left (a pool started meanwhile), then release what :func:`at_stop` holds.
    False when it ran already (the watchdog and the command's own path race to it)."""
    with _lock:
        if _finished.is_set():
            return False
        _finished.set()
        releases = list(_at_stop.values())
        _at_stop.clear()
    kill_children()
    for release in releases:
        try:
            release()
        except Exception as exc:  # a lease left behind expires by itself (LEASE_TTL_S); say so, go on
            log.warning(
                "could not release what the command held (%s: %s); it expires by itself",
                type(exc).__name__,
                exc,
            )
    return True


def report_once(line: str) -> None:
    """Print the stop's one line on stderr, once (the command's own path and the watchdog race to it). A terminal
    that hung up (EIO), or a pipe whose reader is gone (EPIPE), does not take it: the stop goes on to its exit."""
    with _lock:
        if _reported.is_set():
            return
        _reported.set()
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def start_watchdog(leave: Callable[[], None], seconds: float = WATCHDOG_S) -> threading.Thread:
    """After ``seconds``, call ``leave`` (it finishes the stop, reports it and exits the process) unless the
    command reported its stop by then: the bound on a stop whose work would not end (a thread computing)."""

    def watch() -> None:
        if not _reported.wait(seconds + extra_time()):
            leave()

    thread = threading.Thread(target=watch, name="pileworks-stop-watchdog", daemon=True)
    thread.start()
    return thread


def until_stopped(work: Callable[[], R], step: str, poll_s: float = 0.1) -> R:
    """``work()`` on a daemon thread, waited for until the command stops: a call that cannot be interrupted (a
    Rust call, a step computing on the flow's one worker thread) is not waited for by a stopping command; the
    thread dies with the process, which leaves at once. Its result, or its exception, otherwise. (A task's log
    records are captured on the thread that runs its body: ``records_to`` in ``flows/runtime/pool.py``, entered
    inside ``work``.)"""
    out: dict[str, Any] = {}
    context = contextvars.copy_context()  # the caller's (a Prefect task run's), in the thread too

    def run() -> None:
        try:
            out["result"] = context.run(work)
        except BaseException as exc:  # handed to the waiting thread, which raises it
            out["error"] = exc

    thread = threading.Thread(target=run, name=f"pileworks-{step}", daemon=True)
    thread.start()
    while thread.is_alive():
        if STOPPING.is_set():
            raise StageFailed(f"stage {step!r} stopped: the command is stopping")
        thread.join(poll_s)
    if "error" in out:
        raise out["error"]
    return cast(R, out["result"])


def install_handler(handler: Callable[[int, object], None]) -> dict[int, Any]:
    """From the main thread: ``handler`` takes SIGINT, SIGTERM and SIGHUP for the command (SIGHUP not where it
    was ignored: ``nohup``), and an interrupt that Python could not raise comes back (:func:`_lost_interrupt`);
    returns what it replaced (for :func:`restore_handlers`)."""
    taken = [s for s in EXIT_CODES if not (s in KEPT_IF_IGNORED and signal.getsignal(s) == signal.SIG_IGN)]
    previous: dict[int, Any] = {s: signal.signal(s, handler) for s in taken}
    previous[0] = _unraisable[0] = sys.unraisablehook
    sys.unraisablehook = _lost_interrupt
    _handler[:] = [handler]
    _taken[:] = taken
    return previous


def restore_handlers(previous: dict[int, Any]) -> None:
    _handler.clear()
    _taken.clear()
    sys.unraisablehook = previous.pop(0, sys.__unraisablehook__)
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _lost_interrupt(unraisable: Any) -> None:
    """The stop's interrupt landed where Python cannot raise it and prints it instead (an at-fork hook as the
    head start forks a worker, a ``__del__``): not printed, it is raised again on the main thread, where the
    command's handler takes it (once more if it lands in such a place again: the watchdog bounds it)."""
    if STOPPING.is_set() and isinstance(unraisable.exc_value, KeyboardInterrupt):
        _interrupt_again.set()
        # from another thread: the handler would run (and raise) inside this hook otherwise
        threading.Timer(0.01, _thread.interrupt_main, args=(signal.SIGINT,)).start()
        return
    _unraisable[0](unraisable)


def interrupt_again() -> bool:
    """Whether the main thread's interrupt was lost (:func:`_lost_interrupt`): the handler raises it again."""
    lost = _interrupt_again.is_set()
    _interrupt_again.clear()
    return lost


def reclaim_signals() -> None:
    """Put the command's handler back on SIGTERM where a Prefect flow run took it (called on the flow's main
    thread as it starts). Prefect turns SIGTERM into an exception that unwinds the flow, which waits for its
    task threads (so for the work) before the command hears of it (``prefect.utilities.engine.capture_sigterm``:
    39.6 s during tokenizer training); the command's handler kills the work first. The flow run is still
    marked crashed (an interrupt). Nothing changes outside a command (a flow that Prefect's runner started)."""
    if _handler and threading.current_thread() is threading.main_thread():
        for signum in _taken:
            if signal.getsignal(signum) is not _handler[0]:
                signal.signal(signum, _handler[0])


def die_with_command() -> None:
    """In a helper process the command started (the workers' fork server): exit when the command is gone,
    killed included. Polled from a thread (every 0.2 s): Linux's parent-death signal fires when the *thread*
    that started the process ends, and the fork server may be started by a short-lived thread of the command.
    The workers it forked die with it (``flows/runtime/pool.py`` ``die_with_parent``)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="pileworks-die-with-command", daemon=True).start()
