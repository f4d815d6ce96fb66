"""TrainConfig: validation naming the field, YAML loading, batch planning, the DeepSpeed dict, the LR schedule."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import pytest

from training.config import (
    CPU_ZERO_BUCKET,
    TrainConfig,
    load_train_config,
    lr_multiplier,
    to_deepspeed_config,
    train_config_from_dict,
)

CONFIGS = Path(__file__).resolve().parents[2] / "training" / "configs"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"preset": "7b"}, "preset must be one of"),
        ({"seq_len": 0}, "seq_len must be >= 1"),
        ({"zero_stage": 4}, "zero_stage must be 0, 1, 2 or 3"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"warmup_steps": -1}, "warmup_steps must be >= 0"),
        ({"grad_accum_steps": 2, "global_batch_size": 64}, "not both"),
        ({"pg_timeout_s": 1800.0 * 3}, "pg_timeout_s must be in"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio must be in"),
        ({"adam_betas": (0.9, 1.0)}, "adam_betas"),
    ],
)
def test_validation_names_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**fields)


@pytest.mark.parametrize(("max_steps", "warmup"), [(2, 0), (50, 5), (10, 1)])
def test_warmup_longer_than_the_run_is_clipped_with_a_warning(max_steps: int, warmup: int, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="training.config"):
        cfg = TrainConfig(max_steps=max_steps, warmup_steps=max_steps + 20)
    assert cfg.warmup_steps == warmup < cfg.max_steps
    assert f"warming up over {warmup} step(s)" in caplog.text
    caplog.clear()
    assert TrainConfig(max_steps=max_steps + 1, warmup_steps=max_steps).warmup_steps == max_steps
    assert not caplog.text


def test_loader_type_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="micro_batch_size must be an integer"):
        train_config_from_dict({"micro_batch_size": "eight"})
    with pytest.raises(ValueError, match="precision must be one of 'bf16', 'fp16', 'fp32'"):
        train_config_from_dict({"precision": "fp8"})
    with pytest.raises(ValueError, match=r"unknown TrainConfig field.*lerning_rate"):
        train_config_from_dict({"lerning_rate": 1e-3})
    with pytest.raises(ValueError, match="tensorboard must be true or false"):
        train_config_from_dict({"tensorboard": "yes"})


def test_yaml_loading_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    # PyYAML reads 1e-3 (no dot) as a string: the loader still takes it as a number.
    path.write_text("preset: tiny\nlr: 1e-3\nadam_betas: [0.9, 0.99]\nmodel: {tie_embeddings: false}\n")
    cfg = load_train_config(path, max_steps=77)
    assert cfg.lr == 0.001 and cfg.adam_betas == (0.9, 0.99) and cfg.max_steps == 77
    assert cfg.model == {"tie_embeddings": False}
    assert json.loads(json.dumps(cfg.to_dict()))["adam_betas"] == [0.9, 0.99]
    with pytest.raises(FileNotFoundError):
        load_train_config(tmp_path / "missing.yaml")


def test_bundled_tiny_config_loads() -> None:
    cfg = load_train_config(CONFIGS / "tiny.yaml")
    assert cfg.preset == "tiny" and cfg.max_steps > cfg.warmup_steps


def test_batch_plan_from_global_batch() -> None:
    cfg = TrainConfig(micro_batch_size=4, global_batch_size=32)
    plan = cfg.plan_batch(world_size=2)
    assert (plan.grad_accum_steps, plan.global_batch_size) == (4, 32)
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size 4 x world size 3"):
        cfg.plan_batch(world_size=3)
    assert TrainConfig(micro_batch_size=4).plan_batch(2).grad_accum_steps == 1


def test_deepspeed_config_on_cpu_forces_fp32_and_small_buckets() -> None:
    cfg = TrainConfig(precision="bf16", zero_stage=2, micro_batch_size=4, grad_accum_steps=3)
    ds = to_deepspeed_config(cfg, world_size=2, on_cpu=True)
    assert ds["bf16"]["enabled"] is False and ds["fp16"]["enabled"] is False
    assert ds["zero_optimization"]["stage"] == 2
    assert ds["zero_optimization"]["reduce_bucket_size"] == CPU_ZERO_BUCKET
    assert ds["train_batch_size"] == 4 * 3 * 2
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 3
    gpu = to_deepspeed_config(cfg, world_size=8, on_cpu=False)
    assert gpu["bf16"]["enabled"] is True and gpu["zero_optimization"]["reduce_bucket_size"] > CPU_ZERO_BUCKET


def test_zero3_gets_its_bucket_keys() -> None:
    ds = to_deepspeed_config(TrainConfig(zero_stage=3), world_size=2, on_cpu=True)
    assert ds["zero_optimization"]["stage3_prefetch_bucket_size"] == CPU_ZERO_BUCKET


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_user_deepspeed_file_is_deep_merged(tmp_path: Path, suffix: str) -> None:
    override = {"zero_optimization": {"reduce_bucket_size": 12345}, "wall_clock_breakdown": True}
    path = tmp_path / f"ds{suffix}"
    path.write_text(json.dumps(override))  # JSON is valid YAML
    ds = to_deepspeed_config(TrainConfig(zero_stage=1, deepspeed_config=str(path)), world_size=2, on_cpu=True)
    assert ds["zero_optimization"]["reduce_bucket_size"] == 12345
    assert ds["zero_optimization"]["stage"] == 1  # untouched keys of the nested dict survive
    assert ds["wall_clock_breakdown"] is True


def test_lr_schedule_warmup_then_cosine() -> None:
    kw = dict(warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    warm = [lr_multiplier(s, **kw) for s in range(10)]
    assert warm == sorted(warm) and warm[0] == pytest.approx(0.1) and warm[-1] == pytest.approx(1.0)
    decay = [lr_multiplier(s, **kw) for s in range(10, 111)]
    assert decay[0] == pytest.approx(1.0) and decay[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(decay))
    assert lr_multiplier(60, **kw) == pytest.approx(0.55)  # halfway: the mean of peak and floor
    assert lr_multiplier(500, **kw) == pytest.approx(0.1)  # past the end: stays at the floor


def test_init_from_attention_and_checkpointing_fields() -> None:
    from training.config import TrainConfig

    cfg = TrainConfig(init_from="models/pythia-160m", attention="document", activation_checkpointing=True)
    assert cfg.to_dict()["init_from"] == "models/pythia-160m" and cfg.to_dict()["attention"] == "document"
    with pytest.raises(ValueError, match="attention must be causal or document"):
        TrainConfig(attention="sliding")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"model overrides \['d_model'\] cannot change a model loaded from"):
        TrainConfig(init_from="models/pythia-160m", model={"d_model": 64})
