"""The one typed training config, its YAML loader, and the only place that spells DeepSpeed config keys.

``TrainConfig`` is frozen and validated at construction (each error names the field and the fix); files and
``--set`` overrides are read by :mod:`pipeline.config`, the loader corpus configs use too.
``to_deepspeed_config`` turns it, plus the facts known only at launch (world size, CPU or GPU), into the dict
``deepspeed.initialize`` takes; a user's DeepSpeed JSON/YAML (``deepspeed_config``) is deep-merged over it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.config import build_config, config_to_dict, load_config, load_mapping
from pipeline.storage import S3Options
from training.model import PRESETS

logger = logging.getLogger(__name__)

Precision = Literal["bf16", "fp16", "fp32"]

# DeepSpeed's default ZeRO buckets (5e8 elements) make a tiny CPU model spend seconds per step packing and
# reducing; 1e5-element buckets run the same steps with identical losses in milliseconds.
CPU_ZERO_BUCKET = 100_000
GPU_ZERO_BUCKET = 200_000_000


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    micro_batch_size: int  # samples per rank per forward
    grad_accum_steps: int
    world_size: int

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.world_size


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    # model
    preset: str = "tiny"
    model: dict[str, Any] = field(
        default_factory=dict
    )  # ModelConfig field overrides, e.g. {tie_embeddings: false}
    seq_len: int = 256
    # Start from a Hugging Face GPTNeoXForCausalLM folder (local, s3://, gs://, az://), not random weights: its
    # config.json replaces preset and model overrides, and the dataset must use its tokenizer (training.hf_init).
    init_from: str | None = None
    # Recompute each block in backward instead of keeping its activations: less memory, about a third more compute.
    activation_checkpointing: bool = False
    # "document": no token attends across an EOS inside a packed window (positions restart per document).
    attention: Literal["causal", "document"] = "causal"
    # batch: give grad_accum_steps OR global_batch_size (neither: accumulation 1)
    micro_batch_size: int = 8
    grad_accum_steps: int | None = None
    global_batch_size: int | None = None
    # optimisation
    max_steps: int = 200
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.95)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    zero_stage: int = 1
    precision: Precision = "bf16"  # forced to fp32 on CPU
    zero_bucket_size: int | None = None  # None: 1e5 elements on CPU, 2e8 on GPU
    compile: bool = False  # torch.compile the model through DeepSpeed (GPU only; ignored on CPU)
    seed: int = 1234
    # output, checkpoints, evaluation, logging
    output_dir: str = "runs/train"
    checkpoint_interval: int = 100
    keep_last: int = 3
    # SIGTERM (a scheduler's stop, a preemption): every rank finishes its step, then one checkpoint of that step
    # is saved and the ranks exit 143 (training.preempt); false: the ranks die at once, as without a handler.
    checkpoint_on_sigterm: bool = True
    # How long ``pileworks train``/``run`` gives the ranks, once it is stopped (SIGTERM, Ctrl-C), to finish
    # their step and save before it kills them: under the 30 s Kubernetes and Slurm give before their SIGKILL.
    stop_grace_s: float = 20.0
    checkpoint_upload_uri: str | None = None
    # how to reach s3://, gs://, az:// (manifest, shards, checkpoint upload): the corpus config's s3: section
    s3: S3Options = field(default_factory=S3Options)
    eval_interval: int = 100
    eval_batches: int = 8
    log_interval: int = 10
    # audit: each rank appends the dataset indices of every step to <output_dir>/samples/rank-N.jsonl
    record_samples: bool = False
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "pileworks"
    wandb_mode: Literal["offline", "online"] = "offline"
    # data loading
    # Draw samples from the dataset's sources by the manifest's target shares (training.blend) when it has
    # two or more sources; false: one shuffled pass over the token stream, whatever its sources.
    blend: bool = True
    num_workers: int = 2
    cache_dir: str | None = None  # None: <output_dir>/shard-cache
    cache_max_bytes: int = 20 * 2**30
    # distributed
    pg_timeout_s: float = 120.0
    deepspeed_config: str | None = None  # a DeepSpeed JSON/YAML deep-merged over the generated config

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {self.preset!r}")
        _require(
            self.attention in ("causal", "document"),
            "attention",
            "must be causal or document",
            self.attention,
        )
        if self.init_from and self.model:
            raise ValueError(
                f"model overrides {sorted(self.model)} cannot change a model loaded from init_from "
                f"{self.init_from}: its config.json is the architecture; drop the model: section"
            )
        for name in (
            "seq_len",
            "micro_batch_size",
            "max_steps",
            "checkpoint_interval",
            "keep_last",
            "eval_interval",
            "log_interval",
        ):
            _require(getattr(self, name) >= 1, name, "must be >= 1", getattr(self, name))
        for name in ("grad_accum_steps", "global_batch_size", "zero_bucket_size"):
            value = getattr(self, name)
            _require(value is None or value >= 1, name, "must be >= 1 (or left out)", value)
        if self.grad_accum_steps is not None and self.global_batch_size is not None:
            raise ValueError(
                "give grad_accum_steps or global_batch_size, not both (one determines the other)"
            )
        _require(self.lr > 0, "lr", "must be > 0", self.lr)
        _require(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", "must be in [0, 1]", self.min_lr_ratio)
        _require(self.warmup_steps >= 0, "warmup_steps", "must be >= 0", self.warmup_steps)
        if self.warmup_steps >= self.max_steps:
            # A short run (a smoke test with max_steps=2) must not trip over the preset's warm-up.
            clipped = self.max_steps // 10
            logger.warning(
                "warmup_steps %d is not below max_steps %d: warming up over %d step(s) instead "
                "(set warmup_steps to silence this)",
                self.warmup_steps,
                self.max_steps,
                clipped,
            )
            object.__setattr__(self, "warmup_steps", clipped)
        _require(self.weight_decay >= 0, "weight_decay", "must be >= 0", self.weight_decay)
        _require(
            all(0 <= b < 1 for b in self.adam_betas) and len(self.adam_betas) == 2,
            "adam_betas",
            "must be two numbers in [0, 1)",
            self.adam_betas,
        )
        _require(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 disables clipping)", self.grad_clip)
        _require(self.zero_stage in (0, 1, 2, 3), "zero_stage", "must be 0, 1, 2 or 3", self.zero_stage)
        _require(
            self.eval_batches >= 0, "eval_batches", "must be >= 0 (0 disables evaluation)", self.eval_batches
        )
        _require(self.num_workers >= 0, "num_workers", "must be >= 0", self.num_workers)
        _require(
            0 <= self.stop_grace_s <= 3600,
            "stop_grace_s",
            "must be in [0, 3600] seconds (keep it under the scheduler's own grace, 30 s by default)",
            self.stop_grace_s,
        )
        _require(self.cache_max_bytes > 0, "cache_max_bytes", "must be > 0", self.cache_max_bytes)
        _require(
            10 <= self.pg_timeout_s <= 3600,
            "pg_timeout_s",
            "must be in [10, 3600] seconds (60-300 is sensible: a stuck rank should fail the job fast)",
            self.pg_timeout_s,
        )

    def plan_batch(self, world_size: int) -> BatchPlan:
        """Micro batch, accumulation and world size; refuses a global batch the ranks cannot split evenly."""
        if self.global_batch_size is None:
            accum = self.grad_accum_steps or 1
        else:
            per_step = self.micro_batch_size * world_size
            if self.global_batch_size % per_step:
                raise ValueError(
                    f"global_batch_size {self.global_batch_size} is not a multiple of micro_batch_size "
                    f"{self.micro_batch_size} x world size {world_size} = {per_step}; change one of them"
                )
            accum = self.global_batch_size // per_step
        return BatchPlan(
            micro_batch_size=self.micro_batch_size, grad_accum_steps=accum, world_size=world_size
        )

    def effective_precision(self, on_cpu: bool) -> Precision:
        return "fp32" if on_cpu else self.precision

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _require(ok: bool, name: str, what: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{name} {what}; got {value!r}")


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return config_to_dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def lr_multiplier(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup to 1 over ``warmup_steps``, then cosine decay to ``min_lr_ratio`` at ``max_steps``.

    ``step`` counts optimizer steps already taken, so the first update uses step 0 (LambdaLR's convention).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- DeepSpeed config: the one place
def to_deepspeed_config(cfg: TrainConfig, *, world_size: int, on_cpu: bool) -> dict[str, Any]:
    plan = cfg.plan_batch(world_size)
    precision = cfg.effective_precision(on_cpu)
    bucket = cfg.zero_bucket_size or (CPU_ZERO_BUCKET if on_cpu else GPU_ZERO_BUCKET)
    zero: dict[str, Any] = {
        "stage": cfg.zero_stage,
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
        "overlap_comm": not on_cpu,
        "contiguous_gradients": True,
    }
    if cfg.zero_stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=bucket, stage3_param_persistence_threshold=min(bucket, 10_000)
        )
    generated: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum_steps,
        "train_batch_size": plan.global_batch_size,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "steps_per_print": 10**9,  # we log ourselves, with rank prefixes and rank-averaged loss
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": False,  # torch AdamW is on ZeRO's tested list
    }
    if cfg.deepspeed_config:
        generated = deep_merge(generated, load_mapping(cfg.deepspeed_config))
    return generated


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# ---------------------------------------------------------------- loading (pipeline.config, the one loader)
def load_train_config(
    path: str | Path | None = None, overrides: Mapping[str, Any] | None = None, **fields: Any
) -> TrainConfig:
    """Read a YAML/JSON TrainConfig (``None``: defaults); dotted ``overrides`` and ``fields`` win over the file."""
    return load_config(TrainConfig, path, {**(overrides or {}), **fields})


def train_config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    return build_config(TrainConfig, data)


__all__ = [
    "BatchPlan",
    "Precision",
    "TrainConfig",
    "deep_merge",
    "load_train_config",
    "lr_multiplier",
    "to_deepspeed_config",
    "train_config_from_dict",
]
