"""Host checks of the preflight: Python/torch/DeepSpeed versions, GPUs and their driver, free disk."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from training.preflight.base import CheckResult, DoctorConfig, Status

MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 4)
MIN_DEEPSPEED = (0, 15)


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
