"""Flow-run heartbeats, so a run whose process died (``kill -9``, OOM killer, lost node) can be told from a slow one.

A process killed with SIGKILL cannot report its own end, so Prefect keeps its run ``Running`` forever. While a
flow body runs inside :func:`heartbeat`, a daemon thread writes ``(time, pid, host)`` every ``interval_s`` seconds
into the flow run's own labels (``pileworks.heartbeat.*``; Prefect merges label updates, and the labels are shown
on the run page), falling back to a JSON file under ``PREFECT_HOME`` when the API cannot be reached. The reaper
(:mod:`flows.runtime.reaper`) reads both and marks runs whose heartbeat stopped, or whose process is gone, ``Crashed``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

LABEL_PREFIX = "pileworks.heartbeat."
DEFAULT_INTERVAL_S = 10.0
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, kw_only=True)
class Beat:
    """One heartbeat: who (pid, host, the pid's start time to survive pid reuse) was alive when (unix time)."""

    flow_run_id: str
    at: float
    pid: int
    host: str
    pid_started: float | None
    interval_s: float

    def to_labels(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("flow_run_id")
        return {LABEL_PREFIX + k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_labels(cls, flow_run_id: str, labels: dict[str, Any] | None) -> Beat | None:
        """The heartbeat stored in a run's labels, or None when the run never wrote one (or it is garbled)."""
        found = {k[len(LABEL_PREFIX) :]: v for k, v in (labels or {}).items() if k.startswith(LABEL_PREFIX)}
        try:
            return cls(
                flow_run_id=flow_run_id,
                at=float(found["at"]),
                pid=int(found["pid"]),
                host=str(found["host"]),
                pid_started=float(found["pid_started"]) if "pid_started" in found else None,
                interval_s=float(found.get("interval_s", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            return None


def current_beat(flow_run_id: str, interval_s: float) -> Beat:
    return Beat(
        flow_run_id=flow_run_id,
        at=time.time(),
        pid=os.getpid(),
        host=socket.gethostname(),
        pid_started=_process_start_time(os.getpid()),
        interval_s=float(interval_s),
    )


def _process_start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


# ---------------------------------------------------------------- the file fallback


def heartbeat_dir() -> Path:
    from prefect.settings import get_current_settings

    return Path(get_current_settings().home).expanduser() / "pileworks" / "heartbeats"


def heartbeat_file(flow_run_id: str) -> Path:
    return heartbeat_dir() / f"{flow_run_id}.json"


def write_file_beat(beat: Beat) -> None:
    path = heartbeat_file(beat.flow_run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(beat)), encoding="utf-8")
    os.replace(tmp, path)  # atomic: the reaper never reads half a file


def read_file_beat(flow_run_id: str) -> Beat | None:
    try:
        return Beat(**json.loads(heartbeat_file(flow_run_id).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def remove_file_beat(flow_run_id: str) -> None:
    heartbeat_file(flow_run_id).unlink(missing_ok=True)


# ---------------------------------------------------------------- the beating thread


class _Beater(threading.Thread):
    def __init__(self, flow_run_id: str, interval_s: float) -> None:
        super().__init__(name=f"pileworks-heartbeat-{flow_run_id[:8]}", daemon=True)
        self.flow_run_id = flow_run_id
        self.interval_s = interval_s
        self.also: list[Callable[[], None]] = []  # called on every beat (a build's upload lease: beat_also)
        self.stopped = threading.Event()
        self.failures = 0
        # Prefect's settings (API URL, PREFECT_HOME) live in context variables, which a new thread does not inherit.
        self.context = contextvars.copy_context()

    def run(self) -> None:
        self.context.run(self._loop)

    def _loop(self) -> None:
        from prefect.client.orchestration import get_client

        client = None
        try:
            while not self.stopped.is_set():
                client = client or self._open(get_client)
                self._beat(client)
                self.stopped.wait(self.interval_s)
        finally:
            if client is not None:
                client.__exit__(None, None, None)

    def _open(self, get_client: Any) -> Any:
        try:
            return get_client(sync_client=True).__enter__()
        except Exception as exc:  # no API: the file fallback below still records the beat
            logger.debug("heartbeat: cannot open a Prefect client (%s)", exc)
            return None

    def _beat(self, client: Any) -> None:
        from uuid import UUID

        beat = current_beat(self.flow_run_id, self.interval_s)
        for refresh in list(self.also):
            try:
                refresh()
            except Exception as exc:  # the store is briefly unreachable: the next beat tries again
                logger.warning(
                    "heartbeat: could not refresh %s (%s)", getattr(refresh, "__name__", refresh), exc
                )
        try:
            if client is None:
                raise ConnectionError("no Prefect client")
            client.update_flow_run_labels(UUID(self.flow_run_id), beat.to_labels())
            if self.failures:
                logger.info("heartbeat of flow run %s reaches the Prefect API again", self.flow_run_id)
            self.failures = 0
            return
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:  # once per outage, not every beat
                logger.warning(
                    "heartbeat: Prefect API unreachable (%s); writing %s",
                    exc,
                    heartbeat_file(self.flow_run_id),
                )
        write_file_beat(beat)


@contextlib.contextmanager
def heartbeat(flow_run_id: str | None, interval_s: float = DEFAULT_INTERVAL_S) -> Iterator[None]:
    """Beat for ``flow_run_id`` every ``interval_s`` seconds while the block runs; a no-op when the id is None.

    The reaper's ``max_age_s`` must be several intervals long, so a loaded machine or a slow API is not taken for
    a dead process; a dead process on the reaper's own host is detected at once by its pid.
    """
    if not flow_run_id:
        yield
        return
    if interval_s <= 0:
        raise ValueError(f"heartbeat interval_s must be > 0, got {interval_s}")
    beater = _Beater(str(flow_run_id), interval_s)
    beater.start()
    token = _BEATER.set(beater)
    try:
        yield
    finally:
        _BEATER.reset(token)
        beater.stopped.set()
        beater.join(timeout=max(5.0, interval_s))
        remove_file_beat(str(flow_run_id))


_BEATER: contextvars.ContextVar[_Beater | None] = contextvars.ContextVar("pileworks_beater", default=None)


def beat_also(refresh: Callable[[], None]) -> bool:
    """Call ``refresh`` on every beat of the heartbeat this code runs under (a lease that must outlive no
    dead process); False when there is none (the caller keeps what ``refresh`` renews alive some other way)."""
    beater = _BEATER.get()
    if beater is None:
        return False
    beater.also.append(refresh)
    return True


def current_flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


def with_heartbeat(fn: F) -> F:
    """Decorate a flow function (under ``@flow``) so its whole body runs inside :func:`heartbeat`.

    ``functools.wraps`` keeps the signature, which Prefect reads for the flow's parameters.
    """

    @functools.wraps(fn)
    def beating(*args: Any, **kwargs: Any) -> Any:
        with heartbeat(current_flow_run_id()):
            return fn(*args, **kwargs)

    return beating  # type: ignore[return-value]
