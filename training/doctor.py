"""Preflight for a training host: each check says PASS, WARN or FAIL and, when not PASS, the fix.

The checks answer the two questions that open every distributed-training FAQ ("rank N cannot connect to the
master", "the job hangs at init") before a job is launched: versions, GPUs and their driver, the rendezvous
address and port, the hostfile's nodes, a real 2-process all-reduce, the object store, free disk and the DeepSpeed
config. Network probes are bounded by timeouts so a wrong address fails in seconds, not at gloo's 30 minutes.
The network checks live in :mod:`training.doctor_net`, the process checks in :mod:`training.doctor_dist`, the
object-store probe in :mod:`training.doctor_store`; this module holds the config, the runner and the rest.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from pipeline.storage import S3Options

logger = logging.getLogger(__name__)

MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 4)
MIN_DEEPSPEED = (0, 15)


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class CheckResult:
    """One finding. ``fix`` tells the user what to do; ``data`` holds the measured figures for --json."""

    name: str
    status: Status
    message: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "message": self.message,
            "fix": self.fix,
            "data": self.data,
        }


@dataclass(frozen=True, kw_only=True)
class DoctorConfig:
    """What to check. ``env`` is the launch-relevant environment captured by the caller (MASTER_*, NCCL_*,
    GLOO_*), passed in rather than read deep inside the checks."""

    master_addr: str | None = None
    master_port: int = 29500
    expect_master: bool = False
    hostfile: str | None = None
    backend: str = "auto"
    allreduce_mib: float = 4.0
    timeout_s: float = 60.0
    connect_timeout_s: float = 3.0
    store: str | None = None
    s3: S3Options | None = None  # the resolved s3: settings (required to probe an s3:// store)
    store_probe_mib: float = 8.0
    cache_dir: str = "runs/train/shard-cache"
    checkpoint_dir: str = "runs/train"
    min_free_gib: float = 10.0
    deepspeed_config: str | None = None
    train_config: str | None = None
    world_size: int | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {self.master_port}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend must be auto, gloo or nccl, got {self.backend!r}")
        for name in ("allreduce_mib", "timeout_s", "connect_timeout_s", "store_probe_mib"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.min_free_gib < 0:
            raise ValueError(f"min_free_gib must be >= 0, got {self.min_free_gib}")
        unknown = sorted((set(self.only) | set(self.skip)) - set(CHECK_NAMES))
        if unknown:
            raise ValueError(f"only/skip name unknown checks {unknown}; known: {', '.join(CHECK_NAMES)}")
        if self.world_size is not None and self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> DoctorConfig:
        """Defaults from the launch environment (MASTER_ADDR, MASTER_PORT, NCCL_*/GLOO_*); overrides win."""
        env = {k: v for k, v in environ.items() if k.startswith(("MASTER_", "NCCL_", "GLOO_", "AWS_"))}
        kwargs: dict[str, Any] = {"env": env, "master_addr": environ.get("MASTER_ADDR") or None}
        if environ.get("MASTER_PORT"):
            try:
                kwargs["master_port"] = int(environ["MASTER_PORT"])
            except ValueError:
                raise ValueError(
                    f"MASTER_PORT must be a port number, got {environ['MASTER_PORT']!r}"
                ) from None
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kwargs)


def _version_tuple(text: str) -> tuple[int, ...]:
    nums = []
    for part in text.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        nums.append(int(digits))
    return tuple(nums)


def check_versions(cfg: DoctorConfig) -> list[CheckResult]:
    """Python, torch and DeepSpeed are importable and new enough."""
    py = ".".join(map(str, sys.version_info[:3]))
    results = [
        CheckResult("python", Status.PASS, f"Python {py} ({sys.executable})")
        if sys.version_info[:2] >= MIN_PYTHON
        else CheckResult(
            "python",
            Status.FAIL,
            f"Python {py} is older than 3.10",
            "install Python >= 3.10 and rerun infra/setup_env.sh",
        )
    ]
    for module, minimum in (("torch", MIN_TORCH), ("deepspeed", MIN_DEEPSPEED)):
        try:
            mod = __import__(module)
        except Exception as exc:  # an import can fail with anything (missing .so, bad CUDA libs)
            results.append(
                CheckResult(
                    module,
                    Status.FAIL,
                    f"cannot import {module}: {type(exc).__name__}: {exc}",
                    "run infra/setup_env.sh (it installs torch for this machine, then DeepSpeed)",
                )
            )
            continue
        version = str(mod.__version__)
        need = ".".join(map(str, minimum))
        ok = _version_tuple(version) >= minimum
        results.append(
            CheckResult(
                module,
                Status.PASS if ok else Status.FAIL,
                f"{module} {version}",
                "" if ok else f"upgrade to {module} >= {need} (infra/setup_env.sh)",
                {"version": version},
            )
        )
    return results


def _nvidia_smi() -> dict[str, Any] | None:
    """Driver version, GPU names and the newest CUDA the driver supports, from nvidia-smi (None: not there)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        query = subprocess.run(
            [exe, "--query-gpu=driver_version,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        header = subprocess.run([exe], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"nvidia-smi failed: {exc}"}
    rows = [[c.strip() for c in line.split(",", 1)] for line in query.splitlines() if line.strip()]
    cuda = ""
    if "CUDA Version:" in header:
        cuda = header.split("CUDA Version:", 1)[1].split()[0].strip("|")
    return {"driver": rows[0][0] if rows else "", "gpus": [r[-1] for r in rows], "driver_cuda": cuda}


def check_gpu(cfg: DoctorConfig) -> list[CheckResult]:
    """CUDA build of torch vs the driver, GPU count, NCCL version; CPU-only is a WARN (gloo mode), not a FAIL."""
    import torch

    smi = _nvidia_smi()
    built = torch.version.cuda
    if smi is None and not torch.cuda.is_available():
        return [
            CheckResult(
                "gpu",
                Status.WARN,
                "no GPU: CPU/gloo mode (no nvidia-smi, torch.cuda unavailable)",
                "fine for tests and the tiny preset; on a GPU server install the NVIDIA driver, "
                "then rerun infra/setup_env.sh",
                {"gpus": 0, "torch_cuda": built},
            )
        ]
    if smi is not None and "error" in smi:
        return [
            CheckResult(
                "gpu", Status.FAIL, smi["error"], "check the NVIDIA driver install (nvidia-smi must run)"
            )
        ]
    if built is None and smi is not None:
        return [
            CheckResult(
                "gpu",
                Status.FAIL,
                f"torch {torch.__version__} is a CPU build but nvidia-smi sees {len(smi['gpus'])} GPU(s) "
                f"(driver {smi['driver']})",
                "rerun infra/setup_env.sh: it installs the CUDA wheel matching the driver",
                smi,
            )
        ]
    data = {"torch_cuda": built, "gpus": torch.cuda.device_count(), **(smi or {})}
    driver_cuda = (smi or {}).get("driver_cuda", "")
    if driver_cuda and built and _version_tuple(built)[:2] > _version_tuple(driver_cuda)[:2]:
        return [
            CheckResult(
                "gpu",
                Status.FAIL,
                f"torch is built for CUDA {built} but the driver supports only CUDA {driver_cuda}",
                "upgrade the NVIDIA driver, or rerun infra/setup_env.sh to get a torch wheel for this driver",
                data,
            )
        ]
    if not torch.cuda.is_available():
        return [
            CheckResult(
                "gpu",
                Status.FAIL,
                f"torch (CUDA {built}) cannot use the GPUs",
                "check CUDA_VISIBLE_DEVICES and that the driver is loaded (nvidia-smi)",
                data,
            )
        ]
    try:
        data["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # torch built without NCCL
        return [
            CheckResult(
                "gpu",
                Status.FAIL,
                f"NCCL unavailable in torch: {exc}",
                "install a CUDA torch wheel (they bundle NCCL) via infra/setup_env.sh",
                data,
            )
        ]
    names = ", ".join(sorted(set((smi or {}).get("gpus", [])))) or "?"
    return [
        CheckResult(
            "gpu",
            Status.PASS,
            f"{data['gpus']} GPU(s) [{names}], driver {data.get('driver', '?')}, "
            f"CUDA {built}, NCCL {data['nccl']}",
            data=data,
        )
    ]


def _free_gib(path: str) -> tuple[Path, float]:
    """Free space of the filesystem that will hold ``path`` (its nearest existing ancestor)."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p, shutil.disk_usage(p).free / 2**30


def check_disk(cfg: DoctorConfig) -> list[CheckResult]:
    """Free disk for the shard cache and checkpoints: FAIL below min_free_gib, WARN below twice that."""
    results = []
    for label, path in (("cache", cfg.cache_dir), ("checkpoints", cfg.checkpoint_dir)):
        where, free = _free_gib(path)
        data = {"path": str(path), "filesystem_of": str(where), "free_gib": round(free, 2)}
        msg = f"{free:.1f} GiB free for {label} at {path} (filesystem of {where})"
        fix = f"free space, or point the {label} at a larger disk (need >= {cfg.min_free_gib:g} GiB)"
        if free < cfg.min_free_gib:
            results.append(CheckResult(f"disk:{label}", Status.FAIL, msg, fix, data))
        elif free < 2 * cfg.min_free_gib:
            results.append(CheckResult(f"disk:{label}", Status.WARN, msg, fix, data))
        else:
            results.append(CheckResult(f"disk:{label}", Status.PASS, msg, data=data))
    return results


def _run_network(name: str) -> Callable[[DoctorConfig], list[CheckResult]]:
    def run(cfg: DoctorConfig) -> list[CheckResult]:
        from training import doctor_net

        return list(getattr(doctor_net, name)(cfg))

    return run


def _run_store(cfg: DoctorConfig) -> list[CheckResult]:
    from training import doctor_store

    return doctor_store.check_store(cfg)


def _run_dryrun(cfg: DoctorConfig) -> list[CheckResult]:
    from training import doctor_dist

    return doctor_dist.check_deepspeed_config(cfg)


def _run_allreduce(cfg: DoctorConfig) -> list[CheckResult]:
    from training import doctor_dist

    return doctor_dist.check_allreduce(cfg)


CHECKS: dict[str, Callable[[DoctorConfig], list[CheckResult]]] = {
    "versions": check_versions,
    "gpu": check_gpu,
    "network": _run_network("check_interfaces"),
    "master": _run_network("check_master"),
    "hostfile": _run_network("check_hostfile"),
    "allreduce": _run_allreduce,
    "store": _run_store,
    "disk": check_disk,
    "deepspeed": _run_dryrun,
}
CHECK_NAMES = tuple(CHECKS)


def run_doctor(
    cfg: DoctorConfig, on_result: Callable[[CheckResult], None] | None = None
) -> list[CheckResult]:
    """Run the selected checks in order. A check that crashes is reported as a FAIL naming the crash."""
    results: list[CheckResult] = []
    for name, check in CHECKS.items():
        if (cfg.only and name not in cfg.only) or name in cfg.skip:
            continue
        t0 = time.perf_counter()
        try:
            found = check(cfg)
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
        for result in found:
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
