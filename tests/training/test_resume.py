"""Resume by check: which checkpoint/run differences are refused, which are allowed, which keep the order."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from training.checkpoint import CheckpointError
from training.data import check_ranks_agree
from training.lineage import DataShape, step_samples
from training.resume import (
    DATASET_CHANGE,
    ResumeState,
    check_resume,
    layout_keeps_order,
    parse_allowed,
)

SAVED = ResumeState(
    dataset_id="d1",
    tokenizer_sha256="t1",
    seed=7,
    shuffle=True,
    seq_len=64,
    samples_per_epoch=161,
    world_size=2,
    micro_batch=4,
    grad_accum=2,
    epoch=0,
    consumed_in_epoch=144,
)


def now(**changes: object) -> ResumeState:
    return dataclasses.replace(SAVED, epoch=0, consumed_in_epoch=0, **changes)  # type: ignore[arg-type]


def test_the_same_run_continues_its_order() -> None:
    decision = check_resume(SAVED, now(), tag="step-9", allowed=())
    assert decision.continue_order and decision.changed == ()


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"seed": 8}, "seed 7 -> 8"),
        ({"seq_len": 32, "samples_per_epoch": 322}, "seq_len 64 -> 32, samples_per_epoch 161 -> 322"),
        ({"dataset_id": "d2"}, "dataset_id 'd1' -> 'd2'"),
        ({"tokenizer_sha256": "t2"}, "tokenizer_sha256 't1' -> 't2'"),
        ({"shuffle": False}, "shuffle True -> False"),
        ({"micro_batch": 8}, "micro_batch 4 -> 8"),
        ({"world_size": 4}, "world_size 2 -> 4"),
        ({"micro_batch": 2, "grad_accum": 4}, "micro_batch 4 -> 2, grad_accum 2 -> 4"),
    ],
)
def test_a_change_is_refused_in_one_line_naming_fields_and_override(changes: dict, named: str) -> None:
    with pytest.raises(CheckpointError) as info:
        check_resume(SAVED, now(**changes), tag="step-9", allowed=())
    message = str(info.value)
    assert "\n" not in message and named in message
    assert f"--allow-change {','.join(changes)}" in message


def test_an_allowed_order_change_restarts_the_data_at_epoch_0() -> None:
    decision = check_resume(SAVED, now(seed=8), tag="step-9", allowed={"seed"})
    assert not decision.continue_order and decision.changed == ("seed",)
    decision = check_resume(
        SAVED, now(dataset_id="d2", samples_per_epoch=99), tag="t", allowed=DATASET_CHANGE
    )
    assert not decision.continue_order
    with pytest.raises(CheckpointError, match="--allow-change seed"):
        check_resume(SAVED, now(seed=8, dataset_id="d2"), tag="t", allowed=DATASET_CHANGE)


@pytest.mark.parametrize(("world", "micro"), [(1, 8), (4, 2), (8, 1)])
def test_a_layout_change_keeping_world_times_micro_batch_continues(world: int, micro: int) -> None:
    decision = check_resume(SAVED, now(world_size=world, micro_batch=micro), tag="t", allowed=())
    assert decision.continue_order and set(decision.changed) <= {"world_size", "micro_batch"}


def test_allowed_layout_change_keeps_the_position() -> None:
    decision = check_resume(SAVED, now(micro_batch=8), tag="t", allowed={"micro_batch"})
    assert decision.continue_order


def test_unknown_override_fields_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        check_resume(SAVED, now(), tag="t", allowed={"sed"})
    assert parse_allowed(["seed,seq_len", "world_size"], allow_dataset_change=False) == {
        "seed",
        "seq_len",
        "world_size",
    }
    assert parse_allowed([], allow_dataset_change=True) == DATASET_CHANGE


def global_steps(shape: DataShape, steps: range, start: tuple[int, int, int] = (0, 0, 0)) -> list[list[int]]:
    """Per step, the sorted dataset indices all ranks trained on together."""
    out = []
    for step in steps:
        micro = step_samples(shape, step, start)
        out.append(sorted(int(i) for m in micro for i in np.asarray(m["samples"]).ravel()))
    return out


@pytest.mark.parametrize("n", [161, 165, 200, 97])
def test_layouts_the_check_lets_through_train_on_the_same_global_steps(n: int) -> None:
    """The lineage walk (the trainer's batch_stream arithmetic) over two epochs: equal world*micro and accum
    give equal global steps; a layout the check refuses gives other steps."""
    base = ResumeState(**{**SAVED.to_dict(), "samples_per_epoch": n})
    shapes = {
        (w, m, a): DataShape(n=n, world=w, micro_batch=m, grad_accum=a, seed=7)
        for (w, m, a) in [(2, 4, 2), (1, 8, 2), (4, 2, 2), (1, 4, 4), (2, 2, 4)]
    }
    steps = range(1, 2 * n // 16 + 2)
    reference = global_steps(shapes[(2, 4, 2)], steps)
    for (w, m, a), shape in shapes.items():
        keeps = layout_keeps_order(base, dataclasses.replace(base, world_size=w, micro_batch=m, grad_accum=a))
        same = global_steps(shape, steps) == reference
        assert keeps == (w * m == 8 and a == 2)
        if keeps:
            assert same, (w, m, a)
    # 1 rank x 4: its epoch drops a tail under 4 samples, not under 8: another order when n % 8 >= 4
    assert (global_steps(shapes[(1, 4, 4)], steps) != reference) == (n % 8 >= 4)


def test_ranks_reading_different_datasets_are_refused() -> None:
    check_ranks_agree([("d1", "t1"), ("d1", "t1")], what="dataset")
    with pytest.raises(
        ValueError, match=r"ranks disagree on the dataset: ranks \[0, 2\]: \('d1', 't1'\); ranks \[1\]"
    ):
        check_ranks_agree([("d1", "t1"), ("d2", "t1"), ("d1", "t1")], what="dataset")


def test_the_trainer_command_line_builds_the_allowed_set() -> None:
    from training.train import parse_args

    args = parse_args(["--manifest", "m", "--allow-change", "seed,seq_len", "--allow-change", "world_size"])
    assert parse_allowed(args.allow_change, allow_dataset_change=args.allow_dataset_change) == {
        "seed",
        "seq_len",
        "world_size",
    }
    args = parse_args(["--manifest", "m", "--allow-dataset-change"])
    assert parse_allowed(args.allow_change, allow_dataset_change=args.allow_dataset_change) == DATASET_CHANGE
