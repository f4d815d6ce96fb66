"""Training metrics: JSONL (the contract flows/ reads), TensorBoard, optional wandb; throughput, MFU, GPU use.

Only rank 0 writes. ``<output_dir>/metrics.jsonl`` holds one JSON object per line with a ``kind``:

* ``start``: ``world_size``, ``params``, ``flops_per_token``, ``global_batch_size``, ``seq_len``, ``resumed_from``
  (step or null), ``attempt`` (torchrun restart count), ``config`` (the resolved TrainConfig).
* ``train``: ``step``, ``loss`` (averaged over ranks), ``lr``, ``tokens_per_s``, ``samples_per_s``,
  ``step_time_s``, ``data_wait_s``, ``data_wait_share``, ``mfu`` (null on CPU), ``gpu_mem_gb``, ``gpu_util``.
* ``eval``: ``step``, ``loss`` (valid split, averaged over ranks), ``batches``.
* ``checkpoint``: ``step``, ``tag``, ``seconds``.   * ``end``: ``step``, ``seconds``.

Every line also has ``time`` (unix seconds) and ``attempt``. After a restart the steps after the checkpoint are
logged again by the new attempt: a reader keeps the last line per (kind, step).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Literal

import torch

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"

# Dense peak FLOP/s per GPU for 16-bit matmuls (no sparsity), from the vendors' data sheets.
PEAK_FLOPS_16BIT = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 125e12,
    "L4": 121e12,
    "V100": 125e12,
}


def metrics_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / METRICS_FILE


def read_metrics(output_dir: str | Path, kind: str = "train") -> list[dict[str, Any]]:
    """The records of one kind, the last one per step (a restarted attempt overwrites the steps it redid)."""
    path = metrics_path(output_dir)
    if not path.exists():
        return []
    by_step: dict[Any, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("kind") == kind:
                by_step[record.get("step")] = record
    return [by_step[k] for k in sorted(by_step, key=lambda s: -1 if s is None else s)]


def read_records(output_dir: str | Path, kind: str) -> list[dict[str, Any]]:
    """Every record of one kind in file order, nothing merged (``start``: one per attempt and resume)."""
    path = metrics_path(output_dir)
    if not path.exists():
        return []
    records = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return [r for r in records if r.get("kind") == kind]


def peak_flops(device_name: str) -> float | None:
    for key, value in PEAK_FLOPS_16BIT.items():
        if key in device_name:
            return value
    return None


class GpuMonitor:
    """GPU memory from torch and utilisation from NVML (``nvidia-ml-py``) when both exist; else nothing."""

    def __init__(self) -> None:
        self._handle = None
        if not torch.cuda.is_available():
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self._nvml = pynvml
        except Exception as exc:  # optional dependency or driver missing: report once, carry on
            logger.info("NVML unavailable (%s); GPU utilisation will not be logged", exc)

    def sample(self) -> dict[str, float | None]:
        if not torch.cuda.is_available():
            return {"gpu_mem_gb": None, "gpu_util": None}
        util = None
        if self._handle is not None:
            util = float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        return {"gpu_mem_gb": torch.cuda.max_memory_allocated() / 2**30, "gpu_util": util}


class MetricsWriter:
    """Writes metric records on rank 0 (``enabled``); other ranks get a writer that does nothing."""

    def __init__(
        self,
        output_dir: str | Path,
        *,
        enabled: bool,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "pileworks",
        wandb_mode: str = "offline",
        run_config: dict[str, Any] | None = None,
    ) -> None:
        self.enabled = enabled
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self._file = None
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        self._file = metrics_path(out).open("a", encoding="utf-8")
        if tensorboard:
            self._tb = _open_tensorboard(out / "tensorboard")
        if wandb:
            self._wandb = _open_wandb(out, wandb_project, wandb_mode, run_config or {})

    def log(self, kind: str, **fields: Any) -> None:
        if not self.enabled or self._file is None:
            return
        record = {"kind": kind, **fields, "time": time.time(), "attempt": self.attempt}
        self._file.write(json.dumps(record, sort_keys=False) + "\n")
        self._file.flush()
        step = fields.get("step")
        scalars = {k: v for k, v in fields.items() if isinstance(v, (int, float)) and k != "step"}
        if step is not None and kind in ("train", "eval"):
            if self._tb is not None:
                for key, value in scalars.items():
                    self._tb.add_scalar(f"{kind}/{key}", value, step)
            if self._wandb is not None:
                self._wandb.log({f"{kind}/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _open_tensorboard(path: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.warning("tensorboard is not installed (pip install 'pileworks[monitoring]'); JSONL only")
        return None
    return SummaryWriter(log_dir=str(path))


def _open_wandb(out: Path, project: str, mode: str, config: dict[str, Any]) -> Any:
    try:
        import wandb
    except ImportError:
        logger.warning(
            "wandb is enabled but not installed (pip install 'pileworks[monitoring]'); skipping it"
        )
        return None
    if mode not in ("offline", "online"):
        raise ValueError(f"wandb_mode must be 'offline' or 'online', got {mode!r}")
    run_mode: Literal["offline", "online"] = "offline" if mode == "offline" else "online"
    return wandb.init(project=project, mode=run_mode, dir=str(out), config=config, resume="allow")


class StepClock:
    """Splits each optimizer step's wall time into data wait and compute, and turns them into rates."""

    def __init__(
        self,
        *,
        tokens_per_step: int,
        samples_per_step: int,
        flops_per_token: float,
        world_size: int,
        peak_flops_per_device: float | None,
    ) -> None:
        self.tokens_per_step = tokens_per_step
        self.samples_per_step = samples_per_step
        self.flops_per_token = flops_per_token
        self.world_size = world_size
        self.peak = peak_flops_per_device
        self.data_wait = 0.0
        self._start = time.perf_counter()

    def start_step(self) -> None:
        self.data_wait = 0.0
        self._start = time.perf_counter()

    def add_data_wait(self, seconds: float) -> None:
        self.data_wait += seconds

    def finish_step(self) -> dict[str, float | None]:
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        tokens_per_s = self.tokens_per_step / elapsed
        mfu = None
        if self.peak:
            mfu = tokens_per_s * self.flops_per_token / (self.peak * self.world_size)
        return {
            "tokens_per_s": tokens_per_s,
            "samples_per_s": self.samples_per_step / elapsed,
            "step_time_s": elapsed,
            "data_wait_s": self.data_wait,
            "data_wait_share": self.data_wait / elapsed,
            "mfu": mfu,
        }
