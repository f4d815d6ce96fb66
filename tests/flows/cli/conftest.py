"""Run ``pileworks`` as a user does: a subprocess, its exit code and its last line.

Commands that reach Prefect share one local background server per session, started by pileworks' own code
(``flows/runtime/local_server.py``) on 127.0.0.1 under a private PREFECT_HOME, and stopped at the end.
"""

from __future__ import annotations

import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str
    seconds: float

    @property
    def last_line(self) -> str:
        lines = [line for line in self.err.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def cli_env(prefect_home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AWS_"))}
    return env | {
        "PREFECT_HOME": str(prefect_home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DS_ACCELERATOR": "cpu",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        "PYTHONPATH": str(REPO),
        **extra,
    }


def start_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        env=env,
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


def run_cli(args: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 600) -> Done:
    started = time.monotonic()
    proc = start_cli(args, env, cwd)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"pileworks {' '.join(args)} ran past {timeout_s} s:\n{err[-3000:]}") from None
    return Done(proc.returncode, out, err, time.monotonic() - started)


# A terminal's job starts with SIGHUP's default action, whatever the tests' runner ignores (``nohup``): this
# sets it and becomes the next program (the same process, not a child).
DEFAULT_HANGUP = "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"


class Terminal:
    """``pileworks ARGS`` on a pseudo-terminal that is its controlling terminal, as a shell's window or an SSH
    session gives it, the terminal its stdin, stdout and stderr. :meth:`hang_up` closes the terminal's other
    end, as closing the window or a dropped connection does: the session's leader gets SIGHUP, and what the
    command writes afterwards fails (EIO)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, *, shell: bool = False) -> None:
        """``shell``: the command typed into an interactive bash that leads the session (``setsid --ctty``) and
        passes the hang-up on to its job, as a terminal window's shell does; else the command leads it."""
        self.master, terminal = pty.openpty()
        command = [sys.executable, "-m", "flows.cli", *args]
        leader = ["bash", "--norc", "--noprofile", "-i"] if shell else command
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DEFAULT_HANGUP, "setsid", "--ctty", *leader],
            env=env | {"TERM": "xterm", "COLUMNS": "150", "HISTFILE": "/dev/null", "PS1": "$ "},
            cwd=cwd,
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
        )
        os.close(terminal)
        self.shown: list[bytes] = []
        self.open = True
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if shell:
            os.write(self.master, shlex.join(command).encode() + b"\n")

    def _read(self) -> None:
        while self.open:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: every process of the terminal's side has closed it
                    return
                if not chunk:
                    return
                self.shown.append(chunk)

    def hang_up(self) -> None:
        """Close the terminal's end, the reader stopped first: a ``read`` blocked on it in another thread would
        hold the terminal open (Linux releases it, and hangs up, when the last use ends)."""
        if self.open:
            self.open = False
            self.reader.join(5)
            os.close(self.master)

    def finish(self, timeout_s: float = 120) -> int | None:
        """The exit code of the terminal's session leader (None: still running after ``timeout_s``, killed)."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.proc.kill()
            self.proc.wait(10)
            self.hang_up()

    def screen(self) -> str:
        """What the terminal showed until it hung up, rich's colours out."""
        import re

        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(self.shown).decode(errors="replace"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A private PREFECT_HOME with no server: for commands that must fail before reaching Prefect."""
    path = tmp_path / "prefect-home"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def server_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private PREFECT_HOME whose local server pileworks started (and this fixture stops)."""
    from flows.runtime.local_server import start_server, stop_server
    from tests.flows.prefect_server import free_port

    path = tmp_path_factory.mktemp("cli-prefect-home")
    start_server(path, port=free_port())
    try:
        yield path
    finally:
        stop_server(path)
