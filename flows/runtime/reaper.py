"""The zombie-run reaper: mark ``Running`` flow runs whose process is gone ``Crashed``.

A run is a zombie when (checked in this order)
1. its last heartbeat (:mod:`flows.runtime.heartbeat`) came from a process on *this* host that no longer exists
   (or is a different process reusing the pid): detected at once, whatever ``max_age_s``;
2. its last heartbeat is older than ``max_age_s``;
3. it never wrote a heartbeat and started more than ``max_age_s`` ago.
The state is forced (``force=True``) because nobody else will move a dead run on, and the message says which rule
fired, so a person reading the run page knows why.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flows.runtime.heartbeat import Beat, read_file_beat, remove_file_beat

logger = logging.getLogger(__name__)
PAGE = 200


@dataclass(frozen=True, kw_only=True)
class RunningRun:
    """What the reaper knows of one Running flow run."""

    id: str
    name: str
    start_time: float | None
    beat: Beat | None


def pid_alive(pid: int, started: float | None) -> bool:
    """True when ``pid`` runs here and is the same process that beat (its start time matches, within a second)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        # Killed but not yet waited for by its parent: dead all the same.
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # e.g. AccessDenied: it exists
        return True


def zombie_reason(
    run: RunningRun,
    *,
    now: float,
    max_age_s: float,
    host: str,
    alive: Callable[[int, float | None], bool] = pid_alive,
) -> str | None:
    """Why ``run`` is a zombie, or None when it may still be working."""
    beat = run.beat
    if beat is not None:
        if beat.host == host and not alive(beat.pid, beat.pid_started):
            return f"its process (pid {beat.pid} on {beat.host}) is gone; last heartbeat {now - beat.at:.0f} s ago"
        if now - beat.at > max_age_s:
            return (
                f"no heartbeat for {now - beat.at:.0f} s (> {max_age_s:g} s); "
                f"last from pid {beat.pid} on {beat.host}"
            )
        return None
    if run.start_time is not None and now - run.start_time > max_age_s:
        return f"no heartbeat at all and running for {now - run.start_time:.0f} s (> {max_age_s:g} s)"
    return None


def _timestamp(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _newest(*beats: Beat | None) -> Beat | None:
    found = [b for b in beats if b is not None]
    return max(found, key=lambda b: b.at) if found else None


def running_runs(client: Any, flow_names: list[str] | None = None) -> list[RunningRun]:
    """Every flow run in state Running (of the named flows, if given), with its newest heartbeat (from its labels
    or the local file)."""
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    running = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])))
    flows = FlowFilter(name=FlowFilterName(any_=flow_names)) if flow_names else None
    runs: list[RunningRun] = []
    while True:
        page = client.read_flow_runs(flow_filter=flows, flow_run_filter=running, limit=PAGE, offset=len(runs))
        for r in page:
            rid = str(r.id)
            beat = _newest(Beat.from_labels(rid, r.labels), read_file_beat(rid))
            runs.append(RunningRun(id=rid, name=r.name, start_time=_timestamp(r.start_time), beat=beat))
        if len(page) < PAGE:
            return runs


def running_task_runs(client: Any, flow_run_id: str) -> list[Any]:
    """Ids of the flow run's task runs still in state Running (their process died with it)."""
    from uuid import UUID

    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    runs = client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
        task_run_filter=TaskRunFilter(
            state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING]))
        ),
    )
    return [r.id for r in runs]


def crash(client: Any, run: RunningRun, reason: str) -> None:
    from uuid import UUID

    from prefect.states import Crashed

    message = f"Marked Crashed by the pileworks reaper on {socket.gethostname()}: {reason}."
    client.set_flow_run_state(UUID(run.id), Crashed(message=message), force=True)
    for task_run_id in running_task_runs(client, run.id):  # else the UI shows them spinning forever
        client.set_task_run_state(
            task_run_id, Crashed(message=f"Its flow run was marked Crashed: {reason}."), force=True
        )
    remove_file_beat(run.id)
    logger.warning("flow run %s (%s): %s", run.name, run.id, message)


def reap(
    max_age_s: float,
    *,
    dry_run: bool = False,
    flow_names: list[str] | None = None,
    clock: Callable[[], float] = time.time,
) -> list[str]:
    """Mark zombie Running flow runs Crashed (see the module doc); returns their ids.

    ``flow_names`` limits the sweep to those flows: on a server shared with flows that never beat, rule 3 would
    otherwise crash their long runs too. ``clock``: the time the heartbeats' ages are measured at.
    """
    from prefect.client.orchestration import get_client

    if max_age_s <= 0:
        raise ValueError(f"reap max_age_s must be > 0, got {max_age_s}")
    host, reaped = socket.gethostname(), []
    with get_client(sync_client=True) as client:
        for run in running_runs(client, flow_names):
            reason = zombie_reason(run, now=clock(), max_age_s=max_age_s, host=host)
            if reason is None:
                continue
            if not dry_run:
                crash(client, run, reason)
            reaped.append(run.id)
    return reaped
