"""A finished flow run recorded through Prefect's client, for a command that knows its outcome before it would
start the flow engine: a rebuild that finds its dataset published (``flows/build/unchanged.py``).

The run is what the flow engine would have left: the flow (created or found by name), a run with its name and
parameters taken Pending -> Running -> Completed through Prefect's orchestration rules (so its start, end and
run time are real), its artifacts and log lines. Only Prefect's client and its public schemas are used; the flow
engine (its imports and set-up, about a CPU-second) is not. A failure of the API raises :class:`RunNotRecorded`;
a run already created is then marked Crashed, so that the caller can run the flow instead without leaving a run
that looks alive.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
from prefect.artifacts import MarkdownArtifact, TableArtifact
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import ArtifactCreate, LogCreate
from prefect.exceptions import PrefectException
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Completed, Crashed, Failed, Running, State

# What Prefect's client raises when the API refuses or does not answer (its methods document httpx's errors).
API_ERRORS = (httpx.HTTPError, PrefectException)
ARTIFACT_TYPES = ("markdown", "table")


class RunNotRecorded(RuntimeError):
    """The Prefect API refused or did not answer; nothing that looks alive was left behind."""


class RunRecorder:
    """The flow run being recorded: its id, and its artifacts and log lines as the flow would make them."""

    def __init__(self, client: SyncPrefectClient, run_id: str) -> None:
        self.client, self.id = client, run_id
        self.logs: list[LogCreate] = []

    def artifact(self, key: str, type: str, description: str, data: Any) -> None:
        """``type``: markdown (``data`` its text) or table (a list of rows), stored as Prefect's
        ``create_markdown_artifact`` and ``create_table_artifact`` store them."""
        if type not in ARTIFACT_TYPES:
            raise ValueError(f"type: {type!r} is not one of {', '.join(ARTIFACT_TYPES)}")
        made = TableArtifact(table=data) if type == "table" else MarkdownArtifact(markdown=data)
        fields = {"key": key, "type": type, "description": description, "data": made.format()}
        request = ArtifactCreate.model_validate(fields | {"flow_run_id": self.id})
        _api("creating an artifact", self.client.create_artifact, request)

    def log(self, message: str, level: int = logging.INFO) -> None:
        """A line of the run's log (sent when the run completes), under the flow run logger's name."""
        line = {"name": "prefect.flow_runs", "level": level, "message": message, "flow_run_id": self.id}
        line["timestamp"] = datetime.now(UTC)
        self.logs.append(LogCreate.model_validate(line))


@contextlib.contextmanager
def completed_run(
    api_url: str, flow_name: str, name: str, parameters: dict[str, Any]
) -> Iterator[RunRecorder]:
    """A flow run of ``flow_name`` (created if need be) on the API at ``api_url``, named ``name``, Running for
    the block and Completed after it. A failure of the API or an interrupt marks it Crashed, an error of the
    block Failed (with the error); either is raised."""
    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        run = _api("creating the flow run", client.create_flow_run, _flow(flow_name), name, parameters)
        recorder = RunRecorder(client, str(run.id))
        try:
            _set_state(client, recorder.id, Running())
            yield recorder
            if recorder.logs:
                _api("sending the run's log", client.create_logs, recorder.logs)
            _set_state(client, recorder.id, Completed())
        except RunNotRecorded as exc:
            _end(client, recorder.id, Crashed(message=f"recorded without the flow engine: {exc}"))
            raise
        except Exception as exc:
            _end(client, recorder.id, Failed(message=f"{type(exc).__name__}: {exc}"))
            raise
        except BaseException:  # Ctrl-C, exit: as the flow engine marks an interrupted run
            _end(client, recorder.id, Crashed(message="interrupted"))
            raise


def _flow(flow_name: str) -> Any:
    """A flow object that carries the name of the flow whose run is recorded (Prefect's client creates runs
    of flow objects); it never runs."""
    from prefect.flows import Flow

    def recorded(**parameters: Any) -> None:
        """Not run: the run of the flow named ``flow_name`` is recorded through the client."""

    return Flow(recorded, name=flow_name)


def _set_state(client: SyncPrefectClient, run_id: str, state: State) -> None:
    """Through Prefect's orchestration rules, as the engine sets it (``force`` only to end a broken run)."""
    result = _api(f"setting {state.name}", client.set_flow_run_state, run_id, state)
    if result.status.value != "ACCEPT":
        raise RunNotRecorded(f"Prefect did not accept {state.name} for flow run {run_id}: {result.details}")


def _end(client: SyncPrefectClient, run_id: str, state: State) -> None:
    """Best effort: the caller reports the first failure, not a second one."""
    with contextlib.suppress(RunNotRecorded):
        _api(f"setting {state.name}", client.set_flow_run_state, run_id, state, force=True)


def _api(doing: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call`` of Prefect's client; its API errors raised as :class:`RunNotRecorded` naming what failed."""
    try:
        return call(*args, **kwargs)
    except API_ERRORS as exc:
        raise RunNotRecorded(f"{doing}: {type(exc).__name__}: {exc}") from exc
