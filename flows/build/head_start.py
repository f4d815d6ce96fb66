"""The head start: a local build's first pass, started by ``pileworks build`` before it imports Prefect.

Importing Prefect and starting the flow run take about two seconds of one core, in which a build with work to do
would otherwise compute nothing. For a build on local workers, the command lists and plans the inputs (it does
so anyway, to find an unchanged rebuild), takes the build's lease, starts the worker pool and submits the ingest
chunks (``flows/runtime/pool.py``, no Prefect), exactly as the flow deals them (:func:`flows.build.plan.sizing`,
the same context and unit keys). The flow, in the same process, takes the lease (:func:`take`), and its ingest
task runs collect these calls' results (:func:`flows.runtime.pool.claim_early`) instead of submitting them
again: the same bodies with the same arguments, so the same units, profile records and log lines, reported in
the same task runs. A call the flow does not claim (its plan came out otherwise) is waited for before anything
else runs, and its units are then simply reused.

Nothing it imports imports Prefect (``tests/flows/cli/test_build.py`` checks the order in Python's import log).
Workers as many as the command's CPUs stay off one of them until the flow runs
(:func:`flows.runtime.pool.leave_a_core`): the command's Prefect import is the critical path then.

With two or more workers the flow's task runner adopts the pool. One worker is a thread of the flow's process,
which is busy importing Prefect meanwhile: its head start is one worker process, forked from the command, that
computes the ingest on the other core and exits once the flow has its result (a thread beside the imports
would only take turns with them on the GIL: tried, no faster). One worker gets it only where the command can
fork (it runs no other thread: starting a fork server instead would cost more than it gains) and has a second
core.

Nothing of it runs for other task runners, or when the dataset is already published.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from flows.build import steps, unchanged
from flows.build.context import take_build_lease
from flows.build.inputs import corpus_config, keep_listing, list_and_plan, pin_model, take_listing
from flows.build.prepare import Prepared, prepare
from flows.runtime import pool
from flows.ui.progress import display

log = logging.getLogger("pileworks")


@dataclass(frozen=True)
class HeadStart:
    """The build the command prepared and started before the flow: its resolved ``config`` (JSON, sorted keys),
    preparation, lease, task context and the first pass's calls, which the flow takes as they are."""

    config: str
    prepared: Prepared
    lease: str
    ctx: dict[str, Any]
    calls: list[tuple[dict[str, Any], list[Any], list[str]]]


_HEAD: HeadStart | None = None


def start(parameters: dict[str, Any], workers: int) -> HeadStart | None:
    """Start the first pass of the build of the flow's ``parameters`` on up to ``workers`` local worker
    processes, when it has work; returns it (kept for :func:`take`), else None. Any failure leaves everything
    to the flow, which reports it in its run."""
    global _HEAD
    close()
    try:
        _HEAD = _start(parameters, workers)
    except Exception as exc:  # the flow lists, plans and fails (or not) in its run, with its retries
        log.info("no head start before the flow (%s: %s)", type(exc).__name__, exc)
        close()
    return _HEAD


def _start(parameters: dict[str, Any], workers: int) -> HeadStart | None:
    cfg = pin_model(corpus_config(parameters))
    config = cfg.to_dict()
    planned = take_listing(config) or list_and_plan(config)
    keep_listing(config, planned)  # the flow's plan-inputs step starts from it, as without a head start
    prepared = prepare(cfg, planned, workers)
    if unchanged.published_record(prepared.store, prepared.work, cfg) is not None:
        return None  # the flow finds it published and starts nothing
    # the terminal's live row runs a thread, which would keep this process from forking its workers: it stops
    # while they fork (a few milliseconds) and carries on after
    with display.paused():
        if prepared.workers == 1 and not (pool.can_fork() and pool.cores() >= 2):
            # one worker: a fork server's start and imports (~0.6 CPU-s) would cost more than it gains; one core
            return None
        lease = take_build_lease(prepared.store, cfg.s3, run=uuid.uuid4().hex)
        ctx = prepared.context(lease)
        calls = prepared.ingest_calls(ctx)
        pool.start_early(prepared.workers, [(steps.ingest_chunk, args) for args in calls])
    log.info(
        "head start: %d ingest task(s) on %d worker(s) while Prefect starts", len(calls), prepared.workers
    )
    return HeadStart(json.dumps(config, sort_keys=True), prepared, lease, ctx, calls)


def take(config: dict[str, Any], work: str) -> HeadStart | None:
    """The head start of the build of ``config`` in ``work`` (the flow's), else None; a head start of another
    build is closed (its calls finish first: their units are reused like any others)."""
    head = _HEAD
    if head is None:
        return None
    if head.config != json.dumps(config, sort_keys=True) or head.prepared.work != work:
        close()
        return None
    return head


def close(wait: bool = True) -> None:
    """Forget the head start (the command ends); its pool, unless the flow's task runner adopted it, stops once
    its calls finish, or at once without ``wait`` (:func:`flows.runtime.pool.close_early`)."""
    global _HEAD
    _HEAD = None
    pool.close_early(wait)
