"""A real ``prefect server start`` on 127.0.0.1 for the UI and reaper tests, always torn down.

The server runs in its own session (process group) with its own ``PREFECT_HOME`` (SQLite database, settings),
so a test never touches the developer's Prefect, and killing the group stops uvicorn and its services together.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# A loaded 2-core CI machine needs 30-70 s to import and migrate a fresh server.
STARTUP_TIMEOUT_S = 180.0
PREFECT_BIN = Path(sys.executable).with_name("prefect")


@dataclass(frozen=True)
class PrefectServer:
    url: str  # the UI: http://127.0.0.1:<port>
    home: Path
    log: Path

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def client_env(self) -> dict[str, str]:
        """Environment for a process that should run flows against this server."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        return env | {
            "PREFECT_API_URL": self.api_url,
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.build_opener().open(f"{api_url}/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_healthy(server: PrefectServer, proc: subprocess.Popen, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"prefect server exited with {proc.returncode}:\n{server.log.read_text()[-3000:]}"
            )
        if _healthy(server.api_url):
            return
        time.sleep(1.0)
    raise TimeoutError(
        f"prefect server not healthy after {timeout_s:.0f} s:\n{server.log.read_text()[-3000:]}"
    )


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, wait up to 20 s, then SIGKILL whatever of the group is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=20.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers (services, uvicorn workers) of the same group
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10.0)


@contextlib.contextmanager
def prefect_server(root: Path, port: int | None = None) -> Iterator[PrefectServer]:
    """Start a fresh server under ``root`` on ``port`` (default: a free one) and yield it once ``/api/health``
    answers; kill it in all cases."""
    port = port or free_port()
    server = PrefectServer(
        url=f"http://127.0.0.1:{port}", home=root / "prefect-home", log=root / "prefect-server.log"
    )
    server.home.mkdir(parents=True, exist_ok=True)
    # The UI asks the API at PREFECT_SERVER_UI_API_URL, which otherwise defaults to port 4200, not --port.
    env = server.client_env() | {"PREFECT_SERVER_UI_API_URL": server.api_url}
    env.pop("PREFECT_API_URL")
    with server.log.open("wb") as log:
        proc = subprocess.Popen(
            [str(PREFECT_BIN), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        wait_healthy(server, proc)
        yield server
    finally:
        stop(proc)
