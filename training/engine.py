"""The DeepSpeed side of training: process group, engine, one optimizer step, evaluation, rank averaging.

The process group is built here, explicitly, before DeepSpeed sees it, for two reasons:

* **An explicit timeout** (``TrainConfig.pg_timeout_s``), so a stuck or short rank fails the job in minutes with
  a clear message instead of gloo's 30-minute default.
* **Restarts under torchrun.** torchrun's agent keeps one TCPStore across restart attempts; a new attempt that
  rendezvouses on the same keys can read the dead attempt's stale entries, and gloo then fails with
  ``connectFullMesh ... Connect timeout``. Building the group on a ``PrefixStore`` named after
  ``TORCHELASTIC_RESTART_COUNT`` gives every attempt a clean namespace.

``deepspeed.init_distributed`` then finds the group initialised and only wraps it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from training.config import TrainConfig, lr_multiplier, to_deepspeed_config
from training.metrics import StepClock
from training.safe_load import install_safe_checkpoint_engine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    on_cpu: bool
    device: torch.device


def running_on_cpu() -> bool:
    return os.environ.get("DS_ACCELERATOR") == "cpu" or not torch.cuda.is_available()


def _default_single_process_env() -> None:
    """Let ``python -m training.train`` run as one rank without a launcher (debugging, notebooks)."""
    if "RANK" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def _build_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        addr,
        port,
        world_size,
        is_master=(rank == 0 and not agent_store),
        timeout=timeout,
        multi_tenant=not agent_store,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"pileworks/attempt-{attempt}", store)


def init_distributed(timeout_s: float) -> DistInfo:
    """Initialise torch.distributed (gloo on CPU, nccl on GPU) and DeepSpeed's comm layer over it."""
    _default_single_process_env()
    on_cpu = running_on_cpu()
    if on_cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read by deepspeed's accelerator detection
    import deepspeed

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = timedelta(seconds=timeout_s)
    if on_cpu:
        device = torch.device("cpu")
        # DeepSpeed's CPU comm layer JIT-compiles a shared-memory all-reduce (about a minute of g++) that only
        # its inference path uses; training all-reduces go through torch.distributed. Skip the build.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    else:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    backend = "gloo" if on_cpu else "nccl"
    if not dist.is_initialized():
        store = _build_store(rank, world_size, timeout)
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=None if on_cpu else device,
        )
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout, verbose=False)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, on_cpu=on_cpu, device=device)


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, on_gpu: bool = False) -> torch.optim.Optimizer:
    """torch AdamW (no DeepSpeed C++ op to build); no weight decay on biases, norms and embeddings' 1-D params."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused CUDA kernel does the whole update in a few launches; on CPU the default (foreach) path.
    fused = on_gpu or None
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps, fused=fused)


def build_engine(model: torch.nn.Module, cfg: TrainConfig, info: DistInfo) -> tuple[Any, dict[str, Any]]:
    """``deepspeed.initialize`` with our optimizer and warmup+cosine LambdaLR; returns (engine, ds_config)."""
    import deepspeed

    ds_config = to_deepspeed_config(cfg, world_size=info.world_size, on_cpu=info.on_cpu)
    if info.on_cpu and cfg.precision != "fp32":
        logger.info("precision %s requested, running fp32: the CPU path trains in fp32", cfg.precision)
    optimizer = build_optimizer(model.to(info.device), cfg, on_gpu=not info.on_cpu)
    schedule = partial(
        lr_multiplier, warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps, min_lr_ratio=cfg.min_lr_ratio
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config, dist_init_required=False
    )
    install_safe_checkpoint_engine(engine)  # every DeepSpeed load: weights_only=True (training.safe_load)
    if cfg.compile and not info.on_cpu:
        engine.compile()  # compiles the module in place: state-dict keys, hence checkpoints, stay the same
    elif cfg.compile:
        logger.info("compile requested, running eager: compilation is only used on GPU")
    return engine, ds_config


def average_across_ranks(value: torch.Tensor) -> float:
    """All-reduce SUM / world size, in float64 on CPU so the logged figure does not depend on the device."""
    return reduce_step(value, stopping=False)[0]


def reduce_step(value: torch.Tensor, *, stopping: bool) -> tuple[float, bool]:
    """The step's loss averaged across ranks, and whether any rank is stopping (``training.preempt``): one
    all-reduce of both (SUM, in float64 on CPU so the logged figure does not depend on the device)."""
    loss = float(value.detach().to(device="cpu", dtype=torch.float64))
    buf = torch.tensor([loss, float(stopping)], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_backend() == "nccl":
            buf = buf.cuda()
            dist.all_reduce(buf)
            buf = buf.cpu()
        else:
            dist.all_reduce(buf)
        buf[0] /= dist.get_world_size()
    return float(buf[0].item()), bool(buf[1].item() > 0)


def train_step(
    engine: Any,
    batches: Iterator[dict[str, torch.Tensor]],
    *,
    grad_accum: int,
    device: torch.device,
    clock: StepClock,
    seen: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """One optimizer step of ``grad_accum`` micro batches; returns this rank's mean micro-batch loss.

    ``seen``, when given, receives each micro batch's sample ids (``batch["index"]``)."""
    losses = []
    for _ in range(grad_accum):
        t0 = time.perf_counter()
        batch = next(batches)
        clock.add_data_wait(time.perf_counter() - t0)
        if seen is not None:
            seen.append(batch["index"])
        inputs = batch["input_ids"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        loss = engine(inputs, labels)
        engine.backward(loss)  # DeepSpeed divides by grad_accum itself
        engine.step()  # applies the update (and the LR schedule) only at the accumulation boundary
        losses.append(loss.detach())
    return torch.stack(losses).mean()


@torch.no_grad()
def evaluate(engine: Any, loader: Any, *, max_batches: int, device: torch.device) -> tuple[float, int]:
    """Mean loss over the first ``max_batches`` batches of ``loader`` on every rank, averaged across ranks."""
    engine.eval()
    total = torch.zeros((), dtype=torch.float64)
    count = 0
    for batch in loader:
        if count >= max_batches:
            break
        loss = engine(batch["input_ids"].to(device), batch["labels"].to(device))
        total += loss.detach().double().cpu()
        count += 1
    engine.train()
    mean = total / max(count, 1)
    return average_across_ranks(mean), count
