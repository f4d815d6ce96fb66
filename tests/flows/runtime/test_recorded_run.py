"""A flow run recorded through Prefect's client without the flow engine, read back through the same client from
a real server."""

from __future__ import annotations

import pytest

from flows.runtime.recorded_run import RunNotRecorded, completed_run
from tests.flows.prefect_server import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _api_url() -> str:
    from prefect.settings import get_current_settings

    return str(get_current_settings().api.url)


def _read(run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        flow = client.read_flow(run.flow_id)
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        states = client.read_flow_run_states(run_id)
    return run, flow, artifacts, logs, [s.type.value for s in states]


def test_a_recorded_run_is_completed_with_its_parameters_artifacts_and_log() -> None:
    params = {
        "config_path": None,
        "inputs": ["/data/raw"],
        "output": "/data/store",
        "name": "tiny",
        "overrides": {},
    }
    with completed_run(_api_url(), "recorded-test-flow", "build tiny 0123abcd (unchanged)", params) as run:
        run.artifact("nothing-changed", "markdown", "Nothing changed", "## Nothing changed")
        run.artifact("stage-stats", "table", "per stage", [{"stage": "ingest", "docs in": "3"}])
        run.log("nothing changed: dataset 0123abcd")
    found, flow, artifacts, logs, states = _read(run.id)
    assert found.state is not None and found.state.is_completed()
    assert states == [
        "PENDING",
        "RUNNING",
        "COMPLETED",
    ]  # through the orchestration rules, as the engine goes
    assert (found.name, flow.name, found.parameters) == (
        "build tiny 0123abcd (unchanged)",
        "recorded-test-flow",
        params,
    )
    assert found.start_time is not None and found.end_time is not None and found.end_time >= found.start_time
    by_key = {a.key: a for a in artifacts}
    assert (
        by_key["nothing-changed"].type == "markdown"
        and by_key["nothing-changed"].data == "## Nothing changed"
    )
    assert by_key["stage-stats"].type == "table" and '"docs in": "3"' in str(by_key["stage-stats"].data)
    assert [(log.name, log.message) for log in logs] == [
        ("prefect.flow_runs", "nothing changed: dataset 0123abcd")
    ]


def test_a_failure_inside_the_block_leaves_the_run_failed_not_running() -> None:
    with pytest.raises(KeyError), completed_run(_api_url(), "recorded-test-flow", "doomed", {}) as run:
        raise KeyError("summary")
    found, *_ = _read(run.id)
    assert found.state is not None and found.state.is_failed() and "KeyError" in (found.state.message or "")


def test_an_interrupt_inside_the_block_leaves_the_run_crashed() -> None:
    with (
        pytest.raises(KeyboardInterrupt),
        completed_run(_api_url(), "recorded-test-flow", "ctrl-c", {}) as run,
    ):
        raise KeyboardInterrupt
    found, *_ = _read(run.id)
    assert found.state is not None and found.state.is_crashed() and found.state.message == "interrupted"


def test_an_api_that_does_not_answer_raises_before_anything_is_recorded() -> None:
    dead = f"http://127.0.0.1:{free_port()}/api"
    with (
        pytest.raises(RunNotRecorded, match="creating the flow run"),
        completed_run(dead, "recorded-test-flow", "never", {}),
    ):
        pytest.fail("the block runs only once the run exists")


def test_an_artifact_of_an_unknown_type_is_refused_and_fails_the_run() -> None:
    with (
        pytest.raises(ValueError, match="type"),
        completed_run(_api_url(), "recorded-test-flow", "bad", {}) as run,
    ):
        run.artifact("k", "image", "d", "x")
    found, *_ = _read(run.id)
    assert found.state is not None and found.state.is_failed()
