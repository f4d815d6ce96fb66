"""The worker count honours a cgroup's CPU quota: the reader over made-up cgroup trees (v1 and v2, nested
limits, unlimited), and a real child process put in a cgroup limited to one CPU where this machine lets us make
one (root on a cgroup v1 ``cpu`` hierarchy, as here and in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flows.runtime.cores import cgroup_cpu_quota, cores


def v2_tree(tmp_path: Path, limits: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup v2 tree: ``limits`` maps a cgroup path to its ``cpu.max``; this process is in the deepest."""
    root = tmp_path / "cgroup"
    for path, cpu_max in limits.items():
        folder = root / path.lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{max(limits, key=len)}\n")
    return root, proc


def test_a_v2_quota_caps_the_cores_and_the_smallest_limit_up_the_tree_wins(tmp_path: Path) -> None:
    root, proc = v2_tree(
        tmp_path, {"/": "max 100000", "/kubepods": "200000 100000", "/kubepods/pod1": "max 100000"}
    )
    assert cgroup_cpu_quota(root, proc) == 2.0
    assert cores(root, proc) == min(2, len(os.sched_getaffinity(0)))
    root, proc = v2_tree(
        tmp_path / "b", {"/pod": "150000 100000"}
    )  # 1.5 CPUs: two workers, each throttled less
    assert cgroup_cpu_quota(root, proc) == 1.5 and cores(root, proc) == min(2, len(os.sched_getaffinity(0)))
    root, proc = v2_tree(tmp_path / "c", {"/pod": "50000 100000"})
    assert cores(root, proc) == 1


def test_no_quota_or_no_cgroup_leaves_the_affinity(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, {"/pod": "max 100000"})
    assert cgroup_cpu_quota(root, proc) is None and cores(root, proc) == len(os.sched_getaffinity(0))
    assert cgroup_cpu_quota(tmp_path / "none", tmp_path / "no-such-file") is None


def test_a_v1_quota_is_read_where_the_cpu_controller_is_mounted(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    inside = root / "cpu,cpuacct" / "docker" / "abc"
    inside.mkdir(parents=True)
    (inside / "cpu.cfs_quota_us").write_text("100000\n")
    (inside / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_cpu_quota(root, proc) == 1.0 and cores(root, proc) == 1
    (inside / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert cgroup_cpu_quota(root, proc) is None


CPU_V1 = Path("/sys/fs/cgroup/cpu")


def can_make_cgroup() -> bool:
    probe = CPU_V1 / f"pileworks-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        probe.rmdir()
        return (CPU_V1 / "cpu.cfs_quota_us").exists()
    except OSError:
        return False


CHILD = """
import sys
from flows.runtime.runners import make_task_runner
sys.stdin.readline()  # the test has put this process in its cgroup
print(make_task_runner("local").workers)
"""


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or not can_make_cgroup(),
    reason="needs 2+ cores and a writable cgroup v1 cpu hierarchy (root)",
)
def test_a_process_in_a_cgroup_of_one_cpu_runs_one_local_worker() -> None:
    group = CPU_V1 / f"pileworks-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")  # one CPU's worth of time
        env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        (group / "cgroup.procs").write_text(str(child.pid))
        out, _ = child.communicate("go\n", timeout=120)
        assert child.returncode == 0 and out.split() == ["1"]
    finally:
        group.rmdir()
