"""Tamper-safe loading: a planted pickle payload with a rewritten, verifying COMPLETE record never runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.training.tamper import plant_payload
from training.checkpoint import tag_for_step, verify_tag, write_complete_record
from training.generate import fp32_state_dict, load_model
from training.safe_load import (
    UnsafeCheckpointError,
    allowed_globals,
    build_safe_checkpoint_engine,
    safe_load,
    safe_zero_to_fp32,
)


def tampered_tag(root: Path, marker: Path, *, zero_stage: int) -> Path:
    tag_dir = root / tag_for_step(3)
    tag_dir.mkdir(parents=True)
    write_complete_record(tag_dir, step=3, meta={"dataset_id": "d", "zero_stage": zero_stage})
    plant_payload(tag_dir, "mp_rank_00_model_states.pt", marker, base={"module": {}})
    if zero_stage:  # DeepSpeed 0.17's zero_to_fp32 lists the optimizer files before it loads the model's
        plant_payload(tag_dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    verify_tag(tag_dir)  # the rewritten record vouches for the planted file
    return tag_dir


def test_the_planted_payload_is_live(tmp_path: Path) -> None:
    """Control: an unrestricted load of the planted file does run the payload."""
    marker = tmp_path / "pwned"
    tag_dir = tampered_tag(tmp_path / "ckpt", marker, zero_stage=0)
    torch.load(tag_dir / "mp_rank_00_model_states.pt", weights_only=False)
    assert marker.read_text() == "payload ran"


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_our_loader_refuses_the_payload(tmp_path: Path, zero_stage: int) -> None:
    marker = tmp_path / "pwned"
    tag_dir = tampered_tag(tmp_path / "ckpt", marker, zero_stage=zero_stage)
    # torch 2.4 names the global "builtins.exec", 2.5 and later "exec"
    with pytest.raises(
        UnsafeCheckpointError, match=r"weights-only loader \(Unsupported global: GLOBAL (builtins\.)?exec\)"
    ):
        load_model(tag_dir)  # zero 0: our own torch.load; zero 2: DeepSpeed's zero_to_fp32, restricted
    with pytest.raises(UnsafeCheckpointError):
        fp32_state_dict(tag_dir)
    assert not marker.exists()


def test_deepspeeds_checkpoint_engine_refuses_the_payload(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    tag_dir = tampered_tag(tmp_path / "ckpt", marker, zero_stage=2)
    engine = build_safe_checkpoint_engine()
    with pytest.raises(UnsafeCheckpointError):
        engine.load(str(tag_dir / "mp_rank_00_model_states.pt"), map_location="cpu")
    assert not marker.exists()


def test_the_zero_to_fp32_patch_is_scoped(tmp_path: Path) -> None:
    from deepspeed.utils import zero_to_fp32

    with safe_zero_to_fp32() as module:
        assert module.torch.load is safe_load and module.torch.float32 is torch.float32
    assert zero_to_fp32.torch is torch


def test_the_allow_list_loads_deepspeed_optimizer_state(tmp_path: Path) -> None:
    """The plain DeepSpeed types a ZeRO optimizer file names round-trip through the restricted loader."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    assert {t.__name__ for t in allowed_globals()} == {
        "ZeroStageEnum",
        "LossScaler",
        "fragment_address",
        "set",
    }
    state = {
        "optimizer_state_dict": {
            "zero_stage": ZeroStageEnum.gradients,
            "loss_scaler": LossScaler(1.0),
            "param_slice_mappings": [{"w": fragment_address(numel=4, start=0)}],
            "single_partition_of_fp32_groups": [torch.arange(4.0)],
        },
        "frozen_param_names": {"w"},  # DeepSpeed 0.17 saves sets; torch 2.4 refused them by itself
    }
    torch.save(state, tmp_path / "optim.pt")
    whole = safe_load(tmp_path / "optim.pt")
    loaded = whole["optimizer_state_dict"]
    assert loaded["zero_stage"] is ZeroStageEnum.gradients
    assert loaded["loss_scaler"].cur_scale == 1.0
    assert loaded["param_slice_mappings"][0]["w"] == fragment_address(numel=4, start=0)
    assert whole["frozen_param_names"] == {"w"}
