"""A finished flow run recorded through Prefect's REST API, for a command that decides its outcome before it
imports Prefect (about 1.2 CPU-s of imports, 2 with the flow engine): a rebuild that finds its dataset
published.

The run is what the flow engine would have left: the flow (created or found by name), a run with its name and
parameters taken Pending -> Running -> Completed (so its start, end and run time are real), its artifacts and log
lines. Plain JSON over ``urllib`` against the shapes of Prefect's server API (``prefect/server/api/``:
``POST /flows/``, ``POST /flow_runs/``, ``POST /flow_runs/{id}/set_state``, ``POST /artifacts/``,
``POST /logs/``). A failure of the API raises :class:`RestRunFailed`; a run already created is then marked
Crashed, so that the caller can run the flow instead without leaving a run that looks alive.
"""

from __future__ import annotations

import contextlib
import json
import logging
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

TIMEOUT_S = 10.0


class RestRunFailed(RuntimeError):
    """The Prefect API refused or did not answer; nothing that looks alive was left behind."""


class RunRecorder:
    """The flow run being recorded: its id, and its artifacts and log lines as the flow would make them."""

    def __init__(self, api_url: str, run_id: str) -> None:
        self.api_url, self.id = api_url, run_id
        self.logs: list[dict[str, Any]] = []

    def artifact(self, key: str, type: str, description: str, data: Any) -> None:
        """``type``: markdown (``data`` its text), table (a list of rows) or link (a URL), as Prefect's
        ``create_*_artifact`` store them."""
        if type not in ("markdown", "table", "link"):
            raise ValueError(f"type: {type!r} is not markdown, table or link")
        text = json.dumps(data) if type == "table" else data
        body = {"key": key, "type": type, "description": description, "data": text, "flow_run_id": self.id}
        _post(self.api_url, "/artifacts/", body)

    def log(self, message: str, level: int = logging.INFO) -> None:
        """A line of the run's log (sent when the run completes), under the flow run logger's name."""
        self.logs.append(
            {
                "name": "prefect.flow_runs",
                "level": level,
                "message": message,
                "timestamp": datetime.now(timezone.utc).isoformat(),
                "flow_run_id": self.id,
            }
        )


@contextlib.contextmanager
def completed_run(
    api_url: str, flow_name: str, name: str, parameters: dict[str, Any]
) -> Iterator[RunRecorder]:
    """A flow run of ``flow_name`` (created if need be) named ``name``, Running for the block and Completed
    after it. A failure of the API or an interrupt marks it Crashed, an error of the block Failed (with the
    error); either is raised."""
    flow = _post(api_url, "/flows/", {"name": flow_name})
    body = {
        "flow_id": flow["id"],
        "name": name,
        "parameters": parameters,
        "context": {},
        "tags": [],
        "state": {"type": "PENDING", "name": "Pending"},
    }
    run = RunRecorder(api_url, str(_post(api_url, "/flow_runs/", body)["id"]))
    try:
        _set_state(api_url, run.id, "RUNNING", "Running")
        yield run
        if run.logs:
            _post(api_url, "/logs/", run.logs)
        _set_state(api_url, run.id, "COMPLETED", "Completed")
    except RestRunFailed as exc:
        _end(api_url, run.id, "CRASHED", f"recorded without the flow engine: {exc}")
        raise
    except Exception as exc:
        _end(api_url, run.id, "FAILED", f"{type(exc).__name__}: {exc}")
        raise
    except BaseException:  # Ctrl-C, exit: as the flow engine marks an interrupted run
        _end(api_url, run.id, "CRASHED", "interrupted")
        raise


def _set_state(api_url: str, run_id: str, type_: str, name: str) -> None:
    """Through Prefect's orchestration rules, as the engine sets it (``force`` only to end a broken run)."""
    answer = _post(api_url, f"/flow_runs/{run_id}/set_state", {"state": {"type": type_, "name": name}})
    if answer.get("status") != "ACCEPT":
        raise RestRunFailed(f"Prefect did not accept {name} for flow run {run_id}: {answer.get('details')}")


def _end(api_url: str, run_id: str, type_: str, message: str) -> None:
    """Best effort: the caller reports the first failure, not a second one."""
    state = {"type": type_, "name": type_.capitalize(), "message": message}
    with contextlib.suppress(RestRunFailed):
        _post(api_url, f"/flow_runs/{run_id}/set_state", {"state": state, "force": True})


def _post(api_url: str, path: str, body: Any) -> Any:
    request = urllib.request.Request(
        api_url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
            text = resp.read()
    except (OSError, ValueError) as exc:  # URLError/HTTPError are OSErrors
        raise RestRunFailed(f"POST {path}: {exc}") from exc
    return json.loads(text) if text else None
