"""The Prefect API every ``pileworks`` command talks to: the user's, or one local server kept in the background.

Prefect's own default (no ``PREFECT_API_URL``) starts a temporary server inside every command: 15-25 s before the
first line, and the runs vanish with it. Instead the first flow command starts ``prefect server start`` on
127.0.0.1 as a detached process (SQLite under ``PREFECT_HOME``, like any Prefect server) and records it in
``<PREFECT_HOME>/pileworks-server.json``; later commands find it there and start in about a second, runs persist,
and the UI stays one URL away. ``pileworks server start|stop|status`` manages it by hand.

A server a command started stops itself once nothing has used its API for ``PILEWORKS_SERVER_IDLE_MINUTES``
(default 30; 0 never): it idles at a few percent of a core and ~300 MB otherwise. ``pileworks server start``
keeps it up until ``pileworks server stop``. Any server of ours stops once its home folder is deleted (its
database went with it). A small watcher process started beside it does both (``flows/runtime/server_watch.py``):
the server itself is Prefect's own ``prefect server start``, unchanged.

A ``PREFECT_API_URL`` from the environment, a Prefect profile (the one Prefect bundles as ``local`` included), a
settings file or a test harness always wins, as Prefect itself resolves it (:func:`prefect_settings`); when it does
not answer, :func:`resolve_api` fails at once with one line, before any flow starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import PileworksError

STATE_FILE = "pileworks-server.json"
LOG_FILE = "pileworks-server.log"
PREFERRED_PORT = 4200
STARTUP_TIMEOUT_S = 180.0  # a fresh SQLite database migrates first: 20-70 s on a loaded 2-core machine
HEALTH_TIMEOUT_S = 3.0
IDLE_ENV = "PILEWORKS_SERVER_IDLE_MINUTES"  # a started server stops after this long without API use
DEFAULT_IDLE_MINUTES = 30.0
IDLE_POLL_S = 10.0  # how often the watcher looks for API connections (a flow's heartbeat comes every 10 s)


# Prefect's server polls its background-task queue (docket) every 250 ms and runs most housekeeping services
# every 5 s: about 8% of a core while idle on a 2-core machine (measured), which every build pays as
# orchestration. The local server is one user's: with these it idles at about 4%, and a run is marked late, a
# pause expires or a lease is revoked up to 30 s later than Prefect's defaults would. Settings the user exported
# win.
QUIET_SERVER_SETTINGS = {
    f"PREFECT_SERVER_SERVICES_{name}": "30"
    for name in (
        "LATE_RUNS_LOOP_SECONDS",
        "PAUSE_EXPIRATIONS_LOOP_SECONDS",
        "CLEANUP_RECONCILER_LOOP_SECONDS",
        "SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS",
        "REPOSSESSOR_LOOP_SECONDS",
        "FOREMAN_LOOP_SECONDS",
    )
}
WATCH_MODULE = "flows.runtime.server_watch"  # `python -m` this module watches a started server
# pileworks 0.x before the watcher ran Prefect's CLI inside this module: such a server is still found and stopped
LEGACY_SERVER_MODULE = "flows.runtime.local_server"


class PrefectApiUnavailable(PileworksError, RuntimeError):
    """The configured Prefect API does not answer, or the local server could not start."""


@dataclass(frozen=True)
class ServerState:
    pid: int
    port: int
    home: str
    started_at: float
    idle_stop_s: float = 0.0  # stops itself after this long without API use; 0: runs until stopped

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"


@dataclass(frozen=True)
class Api:
    url: str  # the API, ending in /api
    ui_url: str | None  # where a person looks at runs
    source: str  # "PREFECT_API_URL" | "local server" | "started local server"

    def run_url(self, flow_run_id: str | None) -> str | None:
        return f"{self.ui_url}/runs/flow-run/{flow_run_id}" if self.ui_url and flow_run_id else None


def healthy(api_url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """Whether ``api_url``'s health check answers 200. An opener of its own each time: ``urlopen``'s global one
    keeps the proxies of the environment it first saw, so a proxy set for a moment (and gone since) would take
    every later check to it."""
    try:
        opener = urllib.request.build_opener()  # its proxy handler reads the environment now
        with opener.open(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


def prefect_settings() -> Any:
    """Prefect's settings as Prefect resolves them for this process: a test harness's temporary settings, the
    environment, ``.env``, ``prefect.toml``, ``pyproject.toml``, the active profile, in Prefect's order.

    One gap is filled, with Prefect's own profile machinery: the API URL of the profile Prefect names as active
    (``PREFECT_PROFILE``) when nothing else sets one and Prefect's settings left that profile out, being one it
    bundles (its ``local`` names ``http://127.0.0.1:4200/api``) with no user profiles file that holds it. Prefect's
    settings then fall back to its default profile, while its context, ``prefect config view`` and ``prefect
    profile inspect`` name the other. It is applied as Prefect's CLI applies a ``--profile``; in Prefect's test
    mode (as Prefect parses it) no profile is read, so none is here.

    Imported here, not at the top: ``pileworks --help`` and the commands that need no Prefect do not pay for it
    (about 0.7 CPU-s)."""
    from prefect.context import get_settings_context, use_profile
    from prefect.settings import PREFECT_API_URL, get_current_settings

    settings = get_current_settings()
    profile = get_settings_context().profile
    if settings.api.url or settings.testing.test_mode or PREFECT_API_URL not in profile.settings:
        return settings
    if _in_user_profiles(profile.name):  # Prefect's settings read that file and left it out on purpose
        return settings
    with use_profile(profile):
        return get_current_settings()


def _in_user_profiles(name: str) -> bool:
    from prefect.settings import load_profiles

    return name in load_profiles(include_defaults=False).names


def prefect_home() -> Path:
    return Path(prefect_settings().home).expanduser()


def configured_api_url() -> str | None:
    """The API URL Prefect would use (environment, profile, settings files, or a test harness)."""
    url = prefect_settings().api.url
    return str(url) if url else None


def read_state(home: Path) -> ServerState | None:
    try:
        return ServerState(**json.loads((home / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _is_our_server(state: ServerState) -> bool:
    """The recorded pid still runs ``prefect server start`` (a pid may be reused by anything after a reboot)."""
    import psutil

    try:
        cmdline = " ".join(psutil.Process(state.pid).cmdline())
    except (psutil.Error, OSError):
        return False
    # `python -m prefect server start`, or LEGACY_SERVER_MODULE's (a server an earlier pileworks started)
    ours = "prefect" in cmdline or LEGACY_SERVER_MODULE in cmdline
    return ours and "server" in cmdline and str(state.port) in cmdline


def _free_port(preferred: int = PREFERRED_PORT) -> int:
    for port in (preferred, 0):
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            return int(sock.getsockname()[1])
    raise PrefectApiUnavailable("no free TCP port on 127.0.0.1 for the local Prefect server")


@contextlib.contextmanager
def locked(home: Path) -> Iterator[None]:
    """One command at a time decides whether to start the server (two commands at once must not start two)."""
    home.mkdir(parents=True, exist_ok=True)
    with (home / f"{STATE_FILE}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def server_status(home: Path | None = None) -> tuple[ServerState | None, bool]:
    """The recorded local server (or None) and whether it answers."""
    home = home or prefect_home()
    state = read_state(home)
    if state is None or not _is_our_server(state):
        return None, False
    return state, healthy(state.api_url)


def idle_stop_s() -> float:
    """How long a server a command starts waits without API use before it stops (``PILEWORKS_SERVER_IDLE_MINUTES``,
    default 30; 0 never)."""
    text = os.environ.get(IDLE_ENV, "").strip()
    try:
        minutes = float(text) if text else DEFAULT_IDLE_MINUTES
    except ValueError:
        raise PrefectApiUnavailable(
            f"{IDLE_ENV}={text!r} is not a number of minutes (0: never stop)"
        ) from None
    if minutes < 0:
        raise PrefectApiUnavailable(f"{IDLE_ENV}={text!r} must be >= 0 minutes (0: never stop)")
    return minutes * 60.0


def start_server(
    home: Path | None = None,
    on_wait: Callable[[str], None] | None = None,
    port: int = PREFERRED_PORT,
    idle_s: float | None = None,
) -> ServerState:
    """Start the local server detached (its own session, so it outlives this command); reuse a running one.

    ``port`` is tried first (4200, Prefect's usual), else any free port. ``idle_s``: stop after that long
    without API use (None: :func:`idle_stop_s`; 0: run until stopped, which a running server then does too)."""
    home = home or prefect_home()
    idle = idle_stop_s() if idle_s is None else idle_s
    with locked(home):
        state, ok = server_status(home)
        if state is not None:
            if not ok:
                _wait_healthy(state, on_wait)  # another command started it a moment ago
            if idle == 0 and state.idle_stop_s:  # `pileworks server start`: keep it up from now on
                state = dataclasses.replace(state, idle_stop_s=0.0)
                (home / STATE_FILE).write_text(json.dumps(asdict(state)))
            return state
        port = _free_port(port)
        proc = _launch_server(home, port)
        _launch_watcher(home, proc.pid, port, idle)
        state = ServerState(proc.pid, port, str(home), started_at=time.time(), idle_stop_s=idle)
        (home / STATE_FILE).write_text(json.dumps(asdict(state)))
        try:
            _wait_healthy(state, on_wait, proc)
        except BaseException:
            _stop(state)
            raise
        return state


def _launch_server(home: Path, port: int) -> subprocess.Popen:
    """Prefect's own ``prefect server start`` on 127.0.0.1:``port``, :data:`QUIET_SERVER_SETTINGS` under the
    user's own."""
    env = QUIET_SERVER_SETTINGS | {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # the UI asks the API here, which otherwise defaults to port 4200, not --port
        "PREFECT_SERVER_UI_API_URL": f"http://127.0.0.1:{port}/api",
    }
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    return _detached(cmd, env, home)


def _launch_watcher(home: Path, server_pid: int, port: int, idle_s: float) -> subprocess.Popen:
    """The watcher of the server ``server_pid`` (``flows/runtime/server_watch.py``), importing this same
    pileworks (the folder above ``flows/`` leads its path)."""
    code_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (code_root, os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", WATCH_MODULE, str(home), str(server_pid), str(port), str(idle_s)]
    return _detached(cmd, os.environ | {"PYTHONPATH": path}, home)


def _detached(cmd: list[str], env: dict[str, str], home: Path) -> subprocess.Popen:
    """``cmd`` in a session of its own (it outlives this command), working in ``home`` (no ``.env`` or
    ``prefect.toml`` of the user's working folder reaches it), its output appended to :data:`LOG_FILE`."""
    with (home / LOG_FILE).open("ab") as log:
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=home,
        )


def _wait_healthy(
    state: ServerState,
    on_wait: Callable[[str], None] | None,
    proc: subprocess.Popen | None = None,
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> None:
    if on_wait is not None:
        on_wait(f"starting the local Prefect server at {state.url} (first command only)")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if healthy(state.api_url, timeout_s=2.0):
            return
        if proc is not None and proc.poll() is not None:
            raise PrefectApiUnavailable(
                f"the local Prefect server exited with code {proc.returncode}; "
                f"see {Path(state.home) / LOG_FILE}"
            )
        time.sleep(0.5)
    raise PrefectApiUnavailable(
        f"the local Prefect server did not answer within {timeout_s:.0f} s; "
        f"see {Path(state.home) / LOG_FILE}, or run `pileworks server stop` and retry"
    )


def _stop(state: ServerState, grace_s: float = 20.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(state.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _is_our_server(state):
            time.sleep(0.2)
        if not _is_our_server(state):
            break
    _stop_watcher(state)
    with contextlib.suppress(FileNotFoundError):
        (Path(state.home) / STATE_FILE).unlink()


def watcher_of(state: ServerState) -> Any:
    """The watcher process (a ``psutil.Process``) of the recorded server, None when none runs. Found by its
    command line, so that the record keeps the fields every pileworks version reads."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or []
        if WATCH_MODULE in args and str(state.pid) in args and state.home in args:
            return proc
    return None


def _stop_watcher(state: ServerState) -> None:
    """The watcher would end by itself at its next look; a stopped server leaves no process behind now."""
    import psutil

    with contextlib.suppress(psutil.Error, OSError):
        watcher = watcher_of(state)
        if watcher is not None:
            watcher.terminate()
            watcher.wait(5.0)


def stop_server(home: Path | None = None) -> ServerState | None:
    """Stop the recorded local server; returns what was stopped (None when none ran)."""
    home = home or prefect_home()
    with locked(home):
        state, _ = server_status(home)
        if state is None:
            with contextlib.suppress(FileNotFoundError):
                (home / STATE_FILE).unlink()
            return None
        _stop(state)
        return state


def resolve_api(start: bool = True, on_wait: Callable[[str], None] | None = None) -> Api:
    """The API for this command: the configured one when it answers, else the local server (started if need be).

    Raises :class:`PrefectApiUnavailable` at once for a configured API that does not answer: a flow would only
    time out on it later.
    """
    url = configured_api_url()
    if url:
        check_answers(url)
        return Api(url=url, ui_url=_ui_url(url), source="PREFECT_API_URL")
    state, ok = server_status()
    if state is not None and ok:
        return Api(url=state.api_url, ui_url=state.url, source="local server")
    if not start:
        raise PrefectApiUnavailable("no Prefect server runs; start one with `pileworks server start`")
    state = start_server(on_wait=on_wait)
    return Api(url=state.api_url, ui_url=state.url, source="started local server")


BUSY_API_S = 20.0  # how long a configured API that takes connections may take to answer its health check


def check_answers(url: str) -> None:
    """Raise :class:`PrefectApiUnavailable` (one line, the fix) when the API at ``url`` does not answer (Prefect
    Cloud is left to its client, which checks its key). One that refuses connections (nothing listens) is said
    at once; one that takes them but is slow to answer (a busy machine) gets :data:`BUSY_API_S`."""
    if "api.prefect.cloud" in url:
        return
    deadline = time.monotonic() + BUSY_API_S
    while not healthy(url):
        if _refused(url) or time.monotonic() > deadline:
            raise PrefectApiUnavailable(
                f"the Prefect API at {url} does not answer; start that server, or unset PREFECT_API_URL "
                "(the environment's or the Prefect profile's) to use pileworks' local server"
            )
        time.sleep(0.5)


def _refused(url: str) -> bool:
    """Whether nothing takes TCP connections at ``url``'s host and port (or the name does not resolve)."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=HEALTH_TIMEOUT_S):
            return False
    except TimeoutError:
        return False  # no answer either way: the deadline decides
    except OSError:
        return True


def check_environment_api() -> None:
    """Before a command starts work ahead of Prefect (the build's head start): the ``PREFECT_API_URL`` of the
    environment, the setting that wins over every other source of Prefect's, answers. A URL from a profile or
    ``prefect.toml`` is checked by :func:`resolve_api`, through Prefect."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        check_answers(url)


def _ui_url(api_url: str) -> str | None:
    ui = prefect_settings().ui_url
    if ui:
        return str(ui).rstrip("/")
    return api_url[: -len("/api")] if api_url.rstrip("/").endswith("/api") else None


@contextlib.contextmanager
def using_api(api: Api) -> Iterator[Api]:
    """Run the enclosed flows against ``api``: in the environment, which subprocesses (Dask workers, the
    training ranks) read, and in this process's Prefect settings (read once, by :func:`resolve_api`: the
    environment is too late for them now; and a profile's URL :func:`prefect_settings` found is not in them)."""
    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api.url
    try:
        with _prefect_settings(api.url):
            yield api
    finally:
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before


@contextlib.contextmanager
def _prefect_settings(url: str) -> Iterator[None]:
    """Prefect's own settings point at ``url``."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield
