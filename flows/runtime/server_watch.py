"""The watcher of a local Prefect server a command started (``flows/runtime/local_server.py``): a small process
beside it that stops it (SIGTERM to its process group, which uvicorn handles as a clean shutdown) when

- no API client (a flow's client, the UI in a browser) has been connected for the recorded idle limit
  (``idle_stop_s`` of ``pileworks-server.json``, re-read at every look: ``pileworks server start`` sets it to 0
  on a running server to keep it up; the limit it was started with when that record is gone), or
- its home folder (``PREFECT_HOME``, with the server's database and record) has been deleted: nothing can find
  or stop that server any more, and what it records is lost. The watcher reads the folder's identity (device and
  inode), so a new folder made under the same name is not the server's.

The server itself stays Prefect's own ``prefect server start``: the watcher reads only what the operating system
tells (the server's TCP connections, the folder), never Prefect's internals, and ends when the server ends.

    python -m flows.runtime.server_watch HOME SERVER_PID PORT IDLE_S
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import psutil

from flows.runtime.local_server import IDLE_ENV, IDLE_POLL_S, STATE_FILE, healthy, locked, read_state

STOP_GRACE_S = 20.0  # SIGTERM, then SIGKILL for what of the server's group is left


def folder_identity(home: Path) -> tuple[int, int] | None:
    """(device, inode) of ``home``; None once it is gone."""
    try:
        st = os.stat(home)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def alive(server: psutil.Process) -> bool:
    """Still running (a server that exited but is not yet reaped by the command that started it is not)."""
    try:
        return server.is_running() and server.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def api_connections(server: psutil.Process, port: int) -> int:
    """Client connections open to the server's API on ``port``, over the server and its child processes."""
    count = 0
    with contextlib.suppress(psutil.Error):
        for proc in (server, *server.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                conns = proc.net_connections(kind="tcp")
                count += sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port for c in conns)
    return count


def recorded_limit(home: Path, pid: int, started_limit_s: float) -> float:
    """The idle limit the record of ``home`` gives this server; ``started_limit_s`` when no record names it."""
    state = read_state(home)
    return state.idle_stop_s if state is not None and state.pid == pid else started_limit_s


def stop(server: psutil.Process, why: str) -> str:
    """SIGTERM the server's process group (its own session), SIGKILL after :data:`STOP_GRACE_S`."""
    print(f"pileworks server watcher: {why}: stopping the Prefect server (pid {server.pid})", flush=True)
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, sig)
        deadline = time.monotonic() + wait_s
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not alive(server):
            break
    return why


def stop_if_idle(home: Path, server: psutil.Process, port: int, limit_s: float) -> str | None:
    """Stop the server unless a client connected meanwhile; under the lock the commands take to decide whether
    to reuse it, so none picks it while it goes (a folder deleted meanwhile is not made again)."""
    if folder_identity(home) is None:
        return stop(server, f"its home folder {home} was deleted")
    with locked(home):
        if api_connections(server, port):
            return None
        state = read_state(home)
        if state is not None and state.pid == server.pid:
            with contextlib.suppress(FileNotFoundError):
                (home / STATE_FILE).unlink()
    return stop(server, f"no API use for {limit_s / 60:g} min ({IDLE_ENV})")


def watch(
    home: Path, server: psutil.Process, port: int, started_limit_s: float, poll_s: float = IDLE_POLL_S
) -> str | None:
    """Look every ``poll_s`` (a quarter of a shorter idle limit) until the server ends or is stopped; returns
    why it was stopped (None: it ended by itself). Idle time counts from when the API first answers."""
    identity = folder_identity(home)
    while alive(server) and not healthy(f"http://127.0.0.1:{port}/api", timeout_s=2.0):
        if folder_identity(home) != identity:
            return stop(server, f"its home folder {home} was deleted")
        time.sleep(1.0)
    last, limit = time.monotonic(), recorded_limit(home, server.pid, started_limit_s)
    while alive(server):
        time.sleep(min(poll_s, limit / 4) if limit else poll_s)  # a short limit (tests) is met closely
        if identity is None or folder_identity(home) != identity:
            return stop(server, f"its home folder {home} was deleted")
        limit = recorded_limit(home, server.pid, started_limit_s)
        if api_connections(server, port):
            last = time.monotonic()
        elif limit and time.monotonic() - last >= limit:
            why = stop_if_idle(home, server, port, limit)
            if why is not None:
                return why
            last = time.monotonic()
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m flows.runtime.server_watch HOME SERVER_PID PORT IDLE_S", file=sys.stderr)
        return 2
    home, pid, port, limit_s = Path(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    try:
        server = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    watch(home, server, port, limit_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
