"""The doctor as a Prefect flow, so a preflight shows in the UI next to the runs it guards.

One task per check (its PASS/WARN/FAIL lines go to the task's log), a table artifact with every finding and its
fix, and a failed flow run when any check fails, so a deployment can gate training on it.
"""

from __future__ import annotations

import os

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from pipeline.storage.options import resolve_s3_options
from training.preflight import runner
from training.preflight.base import CheckResult, DoctorConfig, Status


@task(cache_policy=NO_CACHE, task_run_name="doctor-{name}")
def run_check(cfg: DoctorConfig, name: str) -> list[dict]:
    """One check; never raises for a finding (a FAIL is data), only the flow decides the run's state."""
    logger = get_run_logger()
    results = runner.run_check(cfg, name)
    for r in results:
        log = (
            logger.error
            if r.status is Status.FAIL
            else logger.warning
            if r.status is Status.WARN
            else logger.info
        )
        log("[%s] %s: %s%s", r.status.value, r.name, r.message, f" | fix: {r.fix}" if r.fix else "")
    return [r.to_json() for r in results]


@flow(name="doctor", log_prints=True)
def doctor_flow(
    master_addr: str | None = None,
    master_port: int | None = None,
    hostfile: str | None = None,
    store: str | None = None,
    s3: dict | None = None,
    train_config: str | None = None,
    deepspeed_config: str | None = None,
    world_size: int | None = None,
    only: list[str] | None = None,
    skip: list[str] | None = None,
    fail_on_fail: bool = True,
) -> list[dict]:
    """Preflight of the worker that runs this flow; fails the run when a check fails (unless fail_on_fail=False)."""
    cfg = DoctorConfig.from_env(
        os.environ,
        master_addr=master_addr,
        master_port=master_port,
        hostfile=hostfile,
        store=store,
        s3=resolve_s3_options(s3),  # the s3: section's fields as a plain dict (a flow parameter)
        train_config=train_config,
        deepspeed_config=deepspeed_config,
        world_size=world_size,
        only=tuple(only or ()),
        skip=tuple(skip or ()),
    )
    found: list[dict] = []
    for name in runner.selected_checks(cfg):
        found.extend(run_check(cfg, name))
    results = [CheckResult(d["name"], Status(d["status"]), d["message"], d["fix"], d["data"]) for d in found]
    create_table_artifact(
        key="doctor-report",
        table=[{k: d[k] for k in ("status", "name", "message", "fix")} for d in found],
        description=f"pileworks doctor: {runner.summary(results)}",
    )
    if fail_on_fail and runner.exit_code(results):
        failed = "; ".join(f"{r.name}: {r.message}" for r in results if r.status is Status.FAIL)
        raise RuntimeError(f"doctor found failures: {failed}")
    return found
