"""The cores this process may use: its CPU affinity, capped by its cgroup's CPU quota.

A container limited to 2 CPUs on a 64-core host sees 64 cores in ``os.cpu_count()`` and in its affinity mask
(Kubernetes and Docker limit CPU time with a CFS quota, not with cpusets): a build that started 64 workers there
would run them in 2 CPUs' worth of time slices, each throttled, with 64 processes' memory. The quota is read
from cgroup v2 (``cpu.max`` of this process's cgroup and every parent up to the root, the smallest wins) or
cgroup v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), and rounded up: 1.5 CPUs give 2 workers.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def cores(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """The cores this process may use: the affinity mask (Linux; else the CPU count), at most the cgroup's CPU
    quota rounded up."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        count = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPUs' worth of time this process's cgroup may use (``quota / period``), None when unlimited or when
    no cgroup file can be read (not Linux, no cgroup filesystem)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: "0::/path"
            limits += _v2_limits(root, path)
        elif "cpu" in controllers.split(","):  # cgroup v1: "4:cpu,cpuacct:/path"
            limits += _v1_limits(root / controllers, path)
    return min(limits) if limits else None


def _v2_limits(root: Path, path: str) -> list[float]:
    """``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") of the cgroup at ``path`` and of each of its parents."""
    limits = []
    folder = root / path.lstrip("/")
    while True:
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            quota = "max"
            period = "1"
        if quota != "max" and float(period) > 0:
            limits.append(float(quota) / float(period))
        if folder == root or root not in folder.parents:
            return limits
        folder = folder.parent


def _v1_limits(mount: Path, path: str) -> list[float]:
    """``cpu.cfs_quota_us / cpu.cfs_period_us`` (a quota of -1: unlimited), read where the controller is
    mounted: the cgroup's own folder when it is visible, else the mount's root (inside a container)."""
    for folder in (mount / path.lstrip("/"), mount):
        try:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return [quota / period] if quota > 0 and period > 0 else []
    return []
