"""Doctor checks that start processes: a 2-rank all-reduce with its bandwidth, and a DeepSpeed engine dry run.

Both run in spawned children with a deadline, so a backend that hangs (the usual failure of a bad NCCL/gloo setup)
becomes a FAIL after ``timeout_s`` instead of a stuck preflight, and the parent never holds a process group.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue as queue_mod
import socket
import time
from typing import Any

from pipeline.config import load_mapping
from training.preflight.base import CheckResult, DoctorConfig, Status

ALLREDUCE_ITERS = 10


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _allreduce_worker(
    rank: int, world: int, port: int, backend: str, numel: int, timeout_s: float, out: Any
) -> None:
    """One rank: all-reduce ``rank+1`` over a float32 buffer, check the sum, time ALLREDUCE_ITERS rounds."""
    try:
        import torch
        import torch.distributed as dist

        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        buf = torch.empty(numel, dtype=torch.float32, device=device)
        expected = world * (world + 1) / 2
        for _ in range(2):  # warm-up: connection setup and allocator
            buf.fill_(rank + 1)
            dist.all_reduce(buf)
        dist.barrier()
        elapsed = 0.0
        for _ in range(ALLREDUCE_ITERS):
            buf.fill_(rank + 1)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed += time.perf_counter() - t0
        ok = bool(torch.all(buf == expected).item())
        dist.destroy_process_group()
        out.put((rank, "ok" if ok else f"wrong sum: got {buf[0].item()}, expected {expected}", elapsed))
    except Exception as exc:  # reported to the parent, which turns it into a FAIL
        out.put((rank, f"{type(exc).__name__}: {exc}", 0.0))


def _pick_backend(cfg: DoctorConfig) -> str:
    if cfg.backend != "auto":
        return cfg.backend
    import torch

    # NCCL refuses two ranks on one GPU, so a single-GPU host checks gloo.
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "gloo"


def _gather(procs: list[Any], out: Any, n: int, timeout_s: float) -> tuple[list[tuple], list[int]]:
    deadline = time.monotonic() + timeout_s
    got: list[tuple] = []
    while len(got) < n and time.monotonic() < deadline:
        try:
            got.append(out.get(timeout=0.2))
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs) and out.empty():
                break
    for p in procs:
        p.join(timeout=max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
    return got, [p.exitcode for p in procs]


def check_allreduce(cfg: DoctorConfig, world: int = 2) -> list[CheckResult]:
    """Two local ranks all-reduce ``allreduce_mib`` MiB; bus bandwidth = size/time * 2(n-1)/n (nccl-tests)."""
    backend = _pick_backend(cfg)
    if backend == "nccl" and not _cuda():
        return [
            CheckResult(
                "allreduce",
                Status.FAIL,
                "backend nccl needs CUDA GPUs, and torch sees none",
                "use --backend gloo on CPU hosts (see the gpu check for why CUDA is unavailable)",
                {"backend": backend},
            )
        ]
    numel = int(cfg.allreduce_mib * 2**20) // 4
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_allreduce_worker, args=(r, world, port, backend, numel, cfg.timeout_s, out), daemon=True
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    got, codes = _gather(procs, out, world, cfg.timeout_s + 30)
    errors = [f"rank {r}: {msg}" for r, msg, _ in sorted(got) if msg != "ok"]
    if len(got) < world or errors:
        missing = sorted(set(range(world)) - {r for r, _, _ in got})
        detail = (
            "; ".join(errors)
            or f"ranks {missing} did not report within {cfg.timeout_s + 30:g} s (exit codes {codes})"
        )
        return [
            CheckResult(
                "allreduce",
                Status.FAIL,
                f"{world}-process {backend} all-reduce failed: {detail}",
                "run with NCCL_DEBUG=INFO; set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to a working "
                "interface; on GPU check that the driver matches torch (doctor gpu check)",
                {"backend": backend},
            )
        ]
    seconds = max(e for _, _, e in got) / ALLREDUCE_ITERS
    size = numel * 4
    algbw = size / seconds / 1e9
    busbw = algbw * 2 * (world - 1) / world
    data = {
        "backend": backend,
        "world": world,
        "bytes": size,
        "seconds_per_op": seconds,
        "algbw_gb_s": round(algbw, 3),
        "busbw_gb_s": round(busbw, 3),
    }
    return [
        CheckResult(
            "allreduce",
            Status.PASS,
            f"{world}-process {backend} all-reduce of {size / 2**20:g} MiB ok: "
            f"{seconds * 1e3:.1f} ms, bus bandwidth {busbw:.2f} GB/s (local ranks; the inter-node "
            "network is exercised by the master check and the first training step)",
            data=data,
        )
    ]


class _DataParallelOnly:
    """The minimum of an ``mpu`` DeepSpeedConfig asks for, so batch sizes are checked for the target world size."""

    def __init__(self, world: int) -> None:
        self.world = world

    def get_data_parallel_world_size(self) -> int:
        return self.world


def _dryrun_worker(config: dict[str, Any], world: int, port: int, out: Any) -> None:
    """Validate ``config`` for ``world`` ranks, then build a tiny engine on one rank and take one step."""
    try:
        on_cpu = not _cuda()
        os.environ.setdefault("DS_ACCELERATOR", "cpu" if on_cpu else "cuda")
        import deepspeed

        if (
            on_cpu
        ):  # the CPU comm layer would JIT-compile a shm all-reduce only inference uses (as the trainer)
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        import torch
        from deepspeed.runtime.config import DeepSpeedConfig

        # This child is a one-rank job of its own: the launcher's variables, on a loopback port.
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        deepspeed.init_distributed(
            "gloo", auto_mpi_discovery=False, verbose=False, timeout=datetime.timedelta(seconds=60)
        )
        DeepSpeedConfig(dict(config), mpu=_DataParallelOnly(world))
        one_rank = {k: v for k, v in config.items() if k != "train_batch_size"}
        if "train_micro_batch_size_per_gpu" not in one_rank and "train_batch_size" in config:
            one_rank["train_micro_batch_size_per_gpu"] = max(1, int(config["train_batch_size"]) // world)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
        optimizer = None if "optimizer" in config else torch.optim.AdamW(model.parameters(), lr=1e-3)
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=one_rank, model_parameters=model.parameters()
        )
        x = torch.randn(2, 16, device=engine.device, dtype=next(engine.module.parameters()).dtype)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        out.put(
            (
                "ok",
                f"ZeRO stage {engine.zero_optimization_stage()}, micro batch "
                f"{engine.train_micro_batch_size_per_gpu()}, loss {loss.item():.4f}",
            )
        )
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _trainer_config(cfg: DoctorConfig, world: int) -> dict[str, Any]:
    """The DeepSpeed dict the trainer would build (training.config owns the keys) from --train-config or defaults."""
    from training.config import load_train_config, to_deepspeed_config

    train_cfg = load_train_config(cfg.train_config)
    return to_deepspeed_config(train_cfg, world_size=world, on_cpu=not _cuda())


_BATCH_FIX = (
    "fix the config (https://www.deepspeed.ai/docs/config-json/); batch sizes must satisfy "
    "train_batch_size = micro_batch * grad_accum * world_size"
)


def _source(cfg: DoctorConfig) -> str:
    return cfg.deepspeed_config or f"the trainer's config ({cfg.train_config or 'defaults'})"


def _batch_mismatch(config: dict[str, Any], world: int) -> str | None:
    """DeepSpeed's batch identity, checked up front when all three numbers are given (not "auto")."""
    total = config.get("train_batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps")
    if (
        isinstance(total, int)
        and isinstance(micro, int)
        and isinstance(accum, int)
        and total != micro * accum * world
    ):
        return (
            f"train_batch_size {total} != train_micro_batch_size_per_gpu {micro} * "
            f"gradient_accumulation_steps {accum} * world size {world}"
        )
    return None


def check_deepspeed_config(cfg: DoctorConfig) -> list[CheckResult]:
    """Validate the DeepSpeed config for the target world size and run one step of a tiny engine with it."""
    world = cfg.world_size or 1
    try:
        # a user's file is read by the one loader training.config merges it with
        config = load_mapping(cfg.deepspeed_config) if cfg.deepspeed_config else _trainer_config(cfg, world)
    except (OSError, ValueError) as exc:
        return [
            CheckResult(
                "deepspeed",
                Status.FAIL,
                f"cannot build the DeepSpeed config: {exc}",
                "fix --train-config (a TrainConfig YAML) or --deepspeed-config (a DeepSpeed JSON/YAML)",
            )
        ]
    mismatch = _batch_mismatch(config, world)
    if mismatch:  # the arithmetic DeepSpeed would assert on, without starting a process
        return [CheckResult("deepspeed", Status.FAIL, f"{_source(cfg)}: {mismatch}", _BATCH_FIX)]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_dryrun_worker, args=(config, world, _free_port(), out), daemon=True)
    proc.start()
    got, codes = _gather([proc], out, 1, cfg.timeout_s)
    source = _source(cfg)
    if not got:
        return [
            CheckResult(
                "deepspeed",
                Status.FAIL,
                f"dry run of {source} did not finish within {cfg.timeout_s:g} s (exit code {codes[0]})",
                "an op may be compiling at start-up: run `ds_report`",
            )
        ]
    state, detail = got[0]
    if state != "ok":
        return [
            CheckResult(
                "deepspeed",
                Status.FAIL,
                f"{source} for world size {world}: {detail}",
                _BATCH_FIX,
            )
        ]
    return [
        CheckResult(
            "deepspeed",
            Status.PASS,
            f"{source} valid for world size {world}; tiny engine step ok ({detail})",
            data={"world_size": world},
        )
    ]
