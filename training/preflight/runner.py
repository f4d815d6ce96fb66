"""Preflight for a training host: each check says PASS, WARN or FAIL and, when not PASS, the fix.

The checks answer the two questions that open every distributed-training FAQ ("rank N cannot connect to the
master", "the job hangs at init") before a job is launched: versions, GPUs and their driver, the rendezvous
address and port, the hostfile's nodes, a real 2-process all-reduce, the object store, free disk and the DeepSpeed
config. Network probes are bounded by timeouts so a wrong address fails in seconds, not at gloo's 30 minutes.
The checks live in :mod:`training.preflight.host`, ``net``, ``dist`` and ``store`` over the types and the name
registry of :mod:`training.preflight.base`; this module maps the names to the checks and runs them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from training.preflight import dist, host, net, store
from training.preflight.base import CHECK_NAMES, CheckResult, DoctorConfig, Status

logger = logging.getLogger(__name__)

CHECKS: dict[str, Callable[[DoctorConfig], list[CheckResult]]] = {
    "versions": host.check_versions,
    "gpu": host.check_gpu,
    "network": net.check_interfaces,
    "master": net.check_master,
    "hostfile": net.check_hostfile,
    "allreduce": dist.check_allreduce,
    "store": store.check_store,
    "disk": host.check_disk,
    "deepspeed": dist.check_deepspeed_config,
}
if tuple(CHECKS) != CHECK_NAMES:
    raise RuntimeError(f"preflight checks {tuple(CHECKS)} do not match the registry {CHECK_NAMES}")


def selected_checks(cfg: DoctorConfig) -> list[str]:
    """The names ``cfg.only`` / ``cfg.skip`` select, in the registry's order."""
    return [name for name in CHECK_NAMES if not (cfg.only and name not in cfg.only) and name not in cfg.skip]


def run_check(cfg: DoctorConfig, name: str) -> list[CheckResult]:
    """One check. A check that crashes is reported as a FAIL naming the crash (a finding, not an error)."""
    t0 = time.perf_counter()
    try:
        found = CHECKS[name](cfg)
    except Exception as exc:
        logger.exception("doctor check %s crashed", name)
        found = [
            CheckResult(
                name,
                Status.FAIL,
                f"check crashed: {type(exc).__name__}: {exc}",
                "report this with the output of `pileworks doctor --json`",
            )
        ]
    logger.debug("check %s took %.2fs", name, time.perf_counter() - t0)
    return found


def run_doctor(
    cfg: DoctorConfig, on_result: Callable[[CheckResult], None] | None = None
) -> list[CheckResult]:
    """Run the selected checks in order (see :func:`run_check`)."""
    results: list[CheckResult] = []
    for name in selected_checks(cfg):
        for result in run_check(cfg, name):
            results.append(result)
            if on_result:
                on_result(result)
    return results


def format_result(result: CheckResult) -> str:
    line = f"[{result.status.value}] {result.name}: {result.message}"
    if result.fix and result.status is not Status.PASS:
        line += f"\n       fix: {result.fix}"
    return line


def summary(results: list[CheckResult]) -> str:
    counts = {s: sum(r.status is s for r in results) for s in Status}
    return ", ".join(f"{counts[s]} {s.value}" for s in Status)


def exit_code(results: list[CheckResult]) -> int:
    """1 when any check failed, else 0 (warnings do not fail a preflight)."""
    return 1 if any(r.status is Status.FAIL for r in results) else 0


def to_json(results: list[CheckResult]) -> str:
    return json.dumps(
        {
            "results": [r.to_json() for r in results],
            "summary": summary(results),
            "exit_code": exit_code(results),
        },
        indent=2,
    )
