"""The background Prefect server: started once, found again by later commands, stopped; a dead API fails fast."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

import pytest

from flows.runtime.local_server import (
    PrefectApiUnavailable,
    read_state,
    resolve_api,
    server_status,
    start_server,
    stop_server,
    watcher_of,
)
from tests.flows.prefect_server import free_port


@pytest.fixture
def private_home(tmp_path: Path):
    """A private PREFECT_HOME and no configured API, whatever the developer's profile says."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    home = tmp_path / "prefect-home"
    with temporary_settings(updates={PREFECT_HOME: str(home)}, restore_defaults={PREFECT_API_URL}):
        yield home
    stop_server(home)  # whatever a failed assertion left running


def test_a_dead_configured_api_fails_at_once_with_one_line() -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    dead = f"http://127.0.0.1:{free_port()}/api"
    started = time.monotonic()
    with temporary_settings(updates={PREFECT_API_URL: dead}), pytest.raises(PrefectApiUnavailable) as info:
        resolve_api()
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert dead in message and "unset PREFECT_API_URL" in message and "\n" not in message


def test_a_configured_api_slow_to_answer_is_waited_for_and_a_silent_one_is_not_for_ever() -> None:
    """A server that takes the connection but answers its health check after the first check's timeout (a busy
    machine) is used; one that never answers fails once the patience is spent."""
    import http.server
    import threading

    from flows.runtime import local_server

    class Slow(http.server.BaseHTTPRequestHandler):
        calls = 0
        answer = True

        def do_GET(self) -> None:
            Slow.calls += 1
            if Slow.calls == 1:
                time.sleep(local_server.HEALTH_TIMEOUT_S + 0.5)  # the first check times out
            self.send_response(200 if Slow.answer else 500)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api"
    try:
        local_server.check_answers(url)  # no raise: its second check answers
        assert Slow.calls >= 2
        Slow.answer, Slow.calls = False, 1
        patience, local_server.BUSY_API_S = local_server.BUSY_API_S, 1.0
        try:
            with pytest.raises(PrefectApiUnavailable, match="does not answer"):
                local_server.check_answers(url)
        finally:
            local_server.BUSY_API_S = patience
    finally:
        server.shutdown()
        server.server_close()


def test_a_proxy_set_for_a_moment_does_not_stay_in_the_health_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """``urlopen``'s global opener keeps the proxies of its first call: a test (or a user's step) that set a
    proxy for a moment sent every later check of this process to it (seen: the whole suite's servers
    'not answering' after tests/flows/build/test_s3_guard's dead proxy)."""
    import http.server
    import threading

    from flows.runtime import local_server

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api"
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        with monkeypatch.context() as m:
            for name in ("HTTP_PROXY", "http_proxy"):
                m.setenv(name, dead)
            for name in ("NO_PROXY", "no_proxy"):
                m.setenv(name, "127.0.0.1")
            assert local_server.healthy(url)  # NO_PROXY: straight there
            urllib.request.urlopen(f"{url}/health", timeout=3).close()  # the global opener, made now
        assert local_server.healthy(url)  # the proxy is gone from the environment, so from the check
    finally:
        server.shutdown()
        server.server_close()


def test_no_server_and_no_start_says_how_to_start_one(private_home: Path) -> None:
    with pytest.raises(PrefectApiUnavailable, match="pileworks server start"):
        resolve_api(start=False)


USER_SET = "PREFECT_SERVER_SERVICES_LATE_RUNS_LOOP_SECONDS"


@pytest.mark.slow
def test_the_local_server_is_started_once_reused_and_stopped(
    private_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(USER_SET, "7")
    port = free_port()
    waits: list[str] = []
    state = start_server(private_home, on_wait=waits.append, port=port)
    assert state.port == port and waits and state.url in waits[0]
    assert read_state(private_home) == state
    api = resolve_api()  # a later command: finds the recorded server, starts nothing
    assert (api.url, api.source) == (f"http://127.0.0.1:{port}/api", "local server")
    assert api.run_url("abc") == f"http://127.0.0.1:{port}/runs/flow-run/abc"
    assert start_server(private_home, port=free_port()) == state  # already running: reused
    from prefect.settings import PREFECT_API_URL

    from flows.runtime.runners import prefect_api

    with prefect_api() as url:  # a flow with no configured API: this local server, for it and its workers
        assert url == state.api_url == PREFECT_API_URL.value() and os.environ["PREFECT_API_URL"] == url
    assert read_state(private_home) == state  # no other server started
    import psutil

    from flows.runtime.local_server import QUIET_SERVER_SETTINGS, WATCH_MODULE

    server = psutil.Process(state.pid)
    assert server.cmdline()[1:4] == ["-m", "prefect", "server"]  # Prefect's own CLI, nothing of ours inside
    watcher = watcher_of(state)
    assert watcher is not None and WATCH_MODULE in watcher.cmdline() and str(state.pid) in watcher.cmdline()
    env = server.environ()
    assert all(env[k] == v for k, v in QUIET_SERVER_SETTINGS.items() if k != USER_SET)
    assert env[USER_SET] == "7"  # a setting the user exported wins
    assert stop_server(private_home) == state
    assert server_status(private_home) == (None, False)
    assert read_state(private_home) is None
    assert not watcher.is_running() or watcher.status() == psutil.STATUS_ZOMBIE  # no process left behind
    assert stop_server(private_home) is None  # nothing left to stop


def _ended(proc, timeout_s: float) -> bool:
    """``proc`` (a psutil.Process) exited within ``timeout_s`` (a zombie not yet reaped counts as exited)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_a_started_server_stops_itself_when_idle_unless_started_to_stay(private_home: Path) -> None:
    import psutil

    state = start_server(private_home, port=free_port(), idle_s=3)
    assert state.idle_stop_s == 3
    kept = start_server(private_home, idle_s=0)  # `pileworks server start` on the running server: keep it up
    assert (kept.pid, kept.idle_stop_s) == (state.pid, 0) and read_state(private_home) == kept
    time.sleep(
        15
    )  # the watcher looks every 10 s (0.75 s while the limit is 3 s): 3 s idle would have stopped it
    assert server_status(private_home) == (kept, True)
    (private_home / "pileworks-server.json").write_text(json.dumps(asdict(state)))  # idle stop back on
    server, watcher = psutil.Process(state.pid), watcher_of(state)
    assert _ended(server, 60), "the idle server kept running"
    assert _ended(watcher, 15), "the watcher outlived its server"
    assert read_state(private_home) is None and server_status(private_home) == (None, False)
    assert "no API use for 0.05 min" in (private_home / "pileworks-server.log").read_text()


@pytest.mark.slow
def test_a_started_server_whose_home_folder_is_deleted_stops_itself(
    private_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41, item 6: a server whose folder went was seen running 57 min later, past its idle stop. Here the
    idle limit is a minute, and the server with its watcher ends well within it once the folder is deleted (the
    watcher looks every 10 s), without making the folder again."""
    import shutil

    import psutil

    monkeypatch.setenv("PILEWORKS_SERVER_IDLE_MINUTES", "1")  # read as a command reads it
    state = start_server(private_home, port=free_port())
    assert state.idle_stop_s == 60
    server, watcher = psutil.Process(state.pid), watcher_of(state)
    deleted = time.monotonic()
    shutil.rmtree(private_home)
    assert _ended(server, 40), "the server kept running after its home folder was deleted"
    assert time.monotonic() - deleted < 45  # not the idle stop (60 s after the API first answered)
    assert _ended(watcher, 15), "the watcher outlived its server"
    assert not private_home.exists()  # stopping it did not make the folder again
