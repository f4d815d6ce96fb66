"""The ``pileworks`` command line.

Each command lives in its own module of ``flows/cli/`` exposing ``register(subparsers)``, listed in
:data:`COMMANDS`; the parser registers a ``func(args) -> int`` default, and optionally a ``precheck(args)`` that
fails fast (config, inputs, dataset) before Prefect is contacted. Commands import heavy libraries (torch,
prefect) inside their ``run`` functions so that ``pileworks --help`` stays fast.

How a command ends: expected failures (our errors, bad input, a missing file) are one line on stderr naming what
failed and the fix, exit 1 (2 for usage errors), the traceback only with ``-v``; anything else keeps its
traceback. Ctrl-C is one line and exit 130, SIGTERM one line and exit 143, a terminal that hung up (SIGHUP) exit
129, all within seconds: the work is stopped, not waited for (``flows/runtime/shutdown.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import logging
import os
import signal
import sys
import threading
import traceback

from flows.cli import (
    ablate,
    build,
    doctor,
    evaluate,
    export,
    inspect,
    janitor,
    quality,
    reap,
    run,
    sample,
    serve,
    server,
    trace,
    train,
    verify,
)
from flows.cli.precheck import UsageError
from flows.runtime import shutdown
from flows.runtime.local_server import resolve_api, using_api
from flows.ui.progress import display, interactive, open_display, setup_logging
from pipeline import __version__
from pipeline.errors import ConfigError, PileworksError

# Every command, in the order ``pileworks --help`` lists them.
COMMANDS = (
    ablate,
    build,
    doctor,
    evaluate,
    export,
    inspect,
    janitor,
    quality,
    reap,
    run,
    sample,
    serve,
    server,
    trace,
    train,
    verify,
)

EXIT_FAILED, EXIT_USAGE = 1, 2
EXIT_INTERRUPTED, EXIT_TERMINATED = shutdown.EXIT_CODES[signal.SIGINT], shutdown.EXIT_CODES[signal.SIGTERM]
EXIT_HUNG_UP = shutdown.EXIT_CODES[signal.SIGHUP]
INTERRUPTED = shutdown.STOPPING  # set by Ctrl-C (SIGINT), SIGTERM or SIGHUP during a command
# What stopped the command, in its one line (an interrupt: Ctrl-C, or nothing received)
STOPPED_BY = {signal.SIGTERM: "stopped by SIGTERM", signal.SIGHUP: "stopped by SIGHUP (its terminal hung up)"}


# Loggers whose shutdown noise follows a Ctrl-C (a Dask cluster torn down mid-pass: "Error in batched write",
# closed comms with their tracebacks): not the user's error, so silenced once the command is interrupted.
QUIET_AFTER_INTERRUPT = ("distributed", "tornado", "asyncio")


def _on_stop_signal(signum: int, frame: object) -> None:
    """Ctrl-C, SIGTERM or SIGHUP: kill the command's child processes now (their work stops, the flow's threads
    waiting for it return), quiet the loggers of the teardown, start the watchdog, then interrupt as Python
    does. A flow interrupted at the wrong moment can surface it as another error (Prefect's task engine: "Task
    run is not set"); the flag still reports a stop. A second signal only ends at once what the first gave time
    to stop (``shutdown.on_second_signal``: a training job's save), a hang-up's aside. A build's flow run takes
    SIGTERM back from Prefect (``shutdown.reclaim_signals``)."""
    if not shutdown.in_command():  # a fork of the command, before its own handlers: Ctrl-C is the command's
        if signum != signal.SIGINT:
            os._exit(shutdown.EXIT_CODES[signal.Signals(signum)])
        return
    # Our own interrupt raised again (``shutdown._lost_interrupt``) is not a second signal: a second one ends at
    # once what the first gave time to stop (a training job's save; measured: the ranks killed mid-save after a
    # hang-up, the interrupt lost and raised again 40 ms later).
    if not shutdown.interrupt_again() and not shutdown.request_stop(signum):
        return
    for logger_name in QUIET_AFTER_INTERRUPT:
        logging.getLogger(logger_name).setLevel(logging.CRITICAL + 1)
    signal.default_int_handler(signum, frame)  # type: ignore[arg-type]


# Commands that run flows or talk to the Prefect API: they get the configured API or the local background server.
PREFECT_COMMANDS = {"ablate", "build", "evaluate", "run", "train", "serve", "reap"}
STARTS_NO_SERVER = {"reap"}  # reaping a server nobody started would start one only to find nothing

# Besides our own failures (pipeline.errors), bad input the standard library reports: the message says it all.
USER_ERRORS = (ValueError, FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
# A wrong command line or config: exit 2, like argparse's own errors.
USAGE_ERRORS = (UsageError, ConfigError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pileworks",
        description="Raw text to a trained language model: build corpora, train, inspect.",
    )
    parser.add_argument("--version", action="version", version=f"pileworks {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, and the traceback of any failure"
    )
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", help="run `pileworks COMMAND -h` for its options"
    )
    for command in COMMANDS:
        command.register(sub)
    return parser


def expected(exc: BaseException) -> bool:
    """A failure whose message is the whole story (no traceback needed): ours, bad input/config/paths, or a full
    disk, a quota or a read-only folder (the message names the path; no retry helps)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return True
    return isinstance(exc, (PileworksError, *USER_ERRORS))


def one_line(exc: BaseException) -> str:
    """The failure as one line: the message's first line, the type only where it adds something."""
    text = " ".join(str(exc).split("\n", 1)[0].split()) or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename and str(exc.filename) not in text:
        text = f"{exc.filename}: {exc.strerror or text}"
    return text


def run_command(args: argparse.Namespace) -> int:
    """Precheck (fast, no Prefect), then the command against the resolved Prefect API when it needs one."""
    precheck = getattr(args, "precheck", None)
    if precheck is not None:
        precheck(args)
    try:
        return run_checked(args)
    except BaseException:
        abandon = getattr(args, "abandon", None)  # what a precheck started (the build's head start)
        if abandon is not None:
            abandon()
        raise


def run_checked(args: argparse.Namespace) -> int:
    """The command, its precheck passed: against the resolved Prefect API when it needs one."""
    if args.command not in PREFECT_COMMANDS:
        return int(args.func(args) or 0)
    display.stage("connecting to Prefect")
    start = args.command not in STARTS_NO_SERVER
    api = resolve_api(start=start, on_wait=logging.getLogger("pileworks").info)
    if api.source == "started local server":  # said once, by the command that started it
        logging.getLogger("pileworks").info(
            "a local Prefect server now runs in the background at %s; %s", api.ui_url, started_server_note()
        )
    with using_api(api) as api:
        args.api = api
        return int(args.func(args) or 0)


def started_server_note() -> str:
    from flows.cli.server import stops
    from flows.runtime.local_server import idle_stop_s

    return stops(idle_stop_s())


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors: argparse prints them and exits 2
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    console = setup_logging(args.verbose, live=interactive() and not getattr(args, "json", False))
    name = f"pileworks {args.command}"
    shutdown.begin_command(leave=functools.partial(_leave_now, name))
    levels = {n: logging.getLogger(n).level for n in QUIET_AFTER_INTERRUPT}
    main_thread = threading.current_thread() is threading.main_thread()
    previous = shutdown.install_handler(_on_stop_signal) if main_thread else {}
    try:
        with open_display(console):
            return run_command(args)
    except KeyboardInterrupt:
        return _stopped(name)
    except Exception as exc:
        if shutdown.STOPPING.is_set():
            return _stopped(name)
        if not expected(exc):
            raise
        if args.verbose:
            traceback.print_exc()
            detail = getattr(exc, "detail", "")
            if detail:
                print(detail, file=sys.stderr)
        print(f"{name}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, USAGE_ERRORS) else EXIT_FAILED
    except BaseException:  # Prefect's TerminationSignal, a SystemExit: a stop's, or not ours to judge
        if shutdown.STOPPING.is_set():
            return _stopped(name)
        raise
    finally:
        if main_thread:
            shutdown.restore_handlers(previous)
        for logger_name, level in levels.items():
            logging.getLogger(logger_name).setLevel(level)


def stop_line(name: str) -> str:
    """The one line of a stopped command: what stopped it and how to go on."""
    said = STOPPED_BY.get(signal.Signals(shutdown.stopped_by() or signal.SIGINT), "interrupted")
    go_on = shutdown.how_to_go_on() or "rerun the same command to resume from the completed units"
    return f"{name}: {said}; {go_on}"


def _stopped(name: str) -> int:
    """The command's own end of a stop: what is left killed, the lease released, one line; the exit code."""
    shutdown.finish_stop()
    shutdown.report_once(stop_line(name))
    return shutdown.exit_code()


def _leave_now(name: str) -> None:
    """The watchdog's end of a stop whose work would not end in time: the same, then leave the process."""
    shutdown.finish_stop()
    shutdown.report_once(stop_line(name))
    with contextlib.suppress(OSError, ValueError):  # a terminal that hung up
        sys.stdout.flush()
    os._exit(shutdown.exit_code())


def entry() -> None:
    """The console script: after Ctrl-C or SIGTERM, leave at once (threads of the stopped flow are not waited),
    with the command's code (130 or 143, or its own where it took the interrupt itself, as ``serve`` does).
    Otherwise it leaves as Python does, its objects frozen first (:func:`shutdown.freeze_for_the_command`): the
    interpreter's exit then spends no cyclic collection on the heap a build leaves. Every ``atexit`` handler and
    thread join still runs, and objects still go by their reference counts."""
    shutdown.ENDS_WITH_COMMAND = True
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a terminal that hung up: the exit code still says it
            stream.flush()
    # A command that took the interrupt itself and returned (Prefect's `serve` catches KeyboardInterrupt, as
    # `reap --watch` does) leaves the same way, with its own code: Ctrl-C 0.15-0.5 s into `pileworks serve`
    # left CPython holding the interrupt as unhandled, and after a normal exit it killed itself with SIGINT
    # (exit -2; strace: rt_sigaction(SIGINT, SIG_DFL), then kill(self, SIGINT)).
    if code in (EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_HUNG_UP) or shutdown.STOPPING.is_set():
        os._exit(code)
    shutdown.freeze_for_the_command()
    sys.exit(code)


if __name__ == "__main__":
    entry()
