"""``pileworks doctor --during RUN``: where a running job's step time goes, and the FAQ's advice when GPUs idle.

Reads the trainer's ``metrics.jsonl`` (:mod:`training.metrics`) and splits the recent steps into data wait,
communication and the rest. The trainer measures data wait per step; communication is taken from ``comm_s`` when
the trainer logs it, else estimated from the gradient bytes each step all-reduces and a bus bandwidth you measured
(``pileworks doctor --only allreduce`` prints it), and marked as an estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from training.metrics import metrics_path, read_metrics

DATA_WAIT_HIGH = 0.10  # share of step time spent waiting for the next batch
COMM_HIGH = 0.30  # share of step time in gradient communication
GPU_UTIL_LOW = 70.0  # percent


@dataclass(frozen=True, kw_only=True)
class RunReport:
    run_dir: str
    steps: int
    last_step: int | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    data_wait_share: float | None = None
    comm_share: float | None = None
    comm_source: str = "not measured"
    gpu_util: float | None = None
    mfu: float | None = None
    advice: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [
        float(r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    ]
    return fmean(values) if values else None


def grad_bytes_per_step(start: dict[str, Any], *, on_gpu: bool) -> float | None:
    """Bytes each rank sends per optimizer step for gradient reduction (ring all-reduce volume, 2(n-1)/n)."""
    params, world = start.get("params"), start.get("world_size")
    if not params or not world or world < 2:
        return None
    config = start.get("config") or {}
    width = 2 if on_gpu and config.get("precision") in ("bf16", "fp16") else 4  # CPU runs are fp32
    stage_factor = 1.5 if config.get("zero_stage") == 3 else 1.0  # ZeRO-3 also all-gathers parameters
    return params * width * 2 * (world - 1) / world * stage_factor


def _comm_share(
    train: list[dict[str, Any]], start: dict[str, Any], busbw_gb_s: float | None, step_time: float | None
) -> tuple[float | None, str]:
    logged = _mean(train, "comm_s")
    if logged is not None and step_time:
        return logged / step_time, "logged by the trainer"
    volume = grad_bytes_per_step(start, on_gpu=_mean(train, "mfu") is not None)
    if volume is None:
        return (
            (0.0, "single rank: no gradient communication")
            if start.get("world_size") == 1
            else (None, "not measured")
        )
    if not busbw_gb_s or not step_time:
        return None, "not measured: pass --busbw GB/s (from `pileworks doctor --only allreduce`)"
    return min(
        1.0, volume / (busbw_gb_s * 1e9) / step_time
    ), f"estimated at {busbw_gb_s:g} GB/s bus bandwidth"


def advise(report: RunReport, config: dict[str, Any]) -> list[str]:
    """The FAQ's answers to "GPU utilisation is low", picked by where the step time goes."""
    tips = []
    if report.data_wait_share is not None and report.data_wait_share > DATA_WAIT_HIGH:
        tips.append(
            f"data wait is {report.data_wait_share:.0%} of each step: raise num_workers (now "
            f"{config.get('num_workers', '?')}), keep the shard cache on local NVMe, and check the store's "
            "throughput (`pileworks doctor --store ...`)"
        )
    if report.comm_share is not None and report.comm_share > COMM_HIGH:
        tips.append(
            f"communication is about {report.comm_share:.0%} of each step: raise micro_batch_size or "
            "grad_accum_steps so each all-reduce covers more compute; use ZeRO stage 1/2 rather than 3 "
            f"when memory allows (now {config.get('zero_stage', '?')}); on multi-node make NCCL use "
            "InfiniBand (NCCL_DEBUG=INFO shows NET/IB) or set NCCL_SOCKET_IFNAME to the fast NIC"
        )
    if report.gpu_util is not None and report.gpu_util < GPU_UTIL_LOW and not tips:
        tips.append(
            f"GPU utilisation is {report.gpu_util:.0f}% with little data wait or communication: raise "
            f"micro_batch_size (now {config.get('micro_batch_size', '?')}) while memory allows, use bf16, "
            "and raise ZeRO stage only if memory forces it"
        )
    if report.gpu_util is None and report.mfu is None:
        tips.append("no GPU metrics: CPU/gloo run, or NVML missing (pip install 'pileworks[monitoring]')")
    return tips


def summarize_run(run_dir: str | Path, *, last: int = 50, busbw_gb_s: float | None = None) -> RunReport:
    """Summarise the last ``last`` train steps of the run whose metrics live under ``run_dir``."""
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    if not metrics_path(run_dir).exists():
        raise FileNotFoundError(f"no {metrics_path(run_dir)}: is {run_dir} a training output_dir?")
    train = read_metrics(run_dir, "train")[-last:]
    starts = read_metrics(run_dir, "start")
    start = starts[-1] if starts else {}
    config = start.get("config") or {}
    step_time = _mean(train, "step_time_s")
    wait = _mean(train, "data_wait_s")
    comm, source = _comm_share(train, start, busbw_gb_s, step_time)
    report = RunReport(
        run_dir=str(run_dir),
        steps=len(train),
        last_step=train[-1].get("step") if train else None,
        step_time_s=step_time,
        tokens_per_s=_mean(train, "tokens_per_s"),
        data_wait_share=(wait / step_time)
        if wait is not None and step_time
        else _mean(train, "data_wait_share"),
        comm_share=comm,
        comm_source=source,
        gpu_util=_mean(train, "gpu_util"),
        mfu=_mean(train, "mfu"),
    )
    return RunReport(**{**report.__dict__, "advice": advise(report, config) if train else []})


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def format_report(report: RunReport) -> str:
    if not report.steps:
        return f"{report.run_dir}: no train steps logged yet"
    lines = [
        f"{report.run_dir}: last {report.steps} steps (up to step {report.last_step})",
        f"  step time      {report.step_time_s:.3f} s, {report.tokens_per_s or 0:,.0f} tokens/s",
        f"  data wait      {_pct(report.data_wait_share)} of step time",
        f"  communication  {_pct(report.comm_share)} ({report.comm_source})",
        f"  GPU util       {'n/a' if report.gpu_util is None else f'{report.gpu_util:.0f}%'}, MFU {_pct(report.mfu)}",
    ]
    lines += [f"  advice: {tip}" for tip in report.advice] or [
        "  advice: none, the step time is spent computing"
    ]
    return "\n".join(lines)
