"""Lineage: step_samples recomputes exactly what the sampler + drop_last loader fed each step, across epochs."""

from __future__ import annotations

import numpy as np
import pytest

from training.lineage import DataShape, check_step_in_checkpoint, step_samples
from training.sampler import ResumableDistributedSampler


def consumed_by_trainer(
    n: int, world: int, micro: int, accum: int, seed: int, steps: int
) -> list[np.ndarray]:
    """What each optimizer step saw, by running the real sampler per rank like training.train.batch_stream."""
    per_rank_batches: list[list[list[int]]] = [[] for _ in range(world)]
    epoch = 0
    while min(len(b) for b in per_rank_batches) < steps * accum:
        for r in range(world):
            s = ResumableDistributedSampler(n, num_replicas=world, rank=r, seed=seed)
            s.set_epoch(epoch)
            idx = list(iter(s))
            full = len(idx) // micro
            per_rank_batches[r] += [idx[k * micro : (k + 1) * micro] for k in range(full)]
        epoch += 1
    out = []
    for step in range(steps):
        micro_batches = [
            np.array([per_rank_batches[r][step * accum + a] for r in range(world)]) for a in range(accum)
        ]
        out.append(np.stack(micro_batches))
    return out


@pytest.mark.parametrize(
    ("n", "world", "micro", "accum"), [(50, 2, 3, 2), (37, 3, 2, 1), (64, 4, 4, 2), (20, 1, 7, 3)]
)
def test_step_samples_match_the_sampler_across_epochs(n: int, world: int, micro: int, accum: int) -> None:
    shape = DataShape(n=n, world=world, micro_batch=micro, grad_accum=accum, seed=7)
    expected = consumed_by_trainer(n, world, micro, accum, seed=7, steps=12)
    for step in range(1, 13):
        got = np.stack([b["samples"] for b in step_samples(shape, step)])
        np.testing.assert_array_equal(got, expected[step - 1], err_msg=f"step {step}")


def test_walk_can_start_from_a_recorded_position() -> None:
    shape = DataShape(n=50, world=2, micro_batch=3, grad_accum=2, seed=1)
    # after step 3: 6 micro batches x 6 samples = 36 consumed in epoch 0
    from_start = step_samples(shape, 5)
    from_record = step_samples(shape, 5, start=(3, 0, 36))
    for a, b in zip(from_start, from_record, strict=True):
        np.testing.assert_array_equal(a["samples"], b["samples"])
    with pytest.raises(ValueError, match="not after"):
        step_samples(shape, 3, start=(3, 0, 36))


@pytest.mark.parametrize(("step", "ok"), [(1, True), (60, True), (61, False), (120, False), (0, False)])
def test_a_step_beyond_the_checkpoint_is_refused(step: int, ok: bool) -> None:
    if ok:
        check_step_in_checkpoint(step, 60, "runs/tiny/checkpoints/step-00000060")
        return
    with pytest.raises(ValueError, match=r"has trained steps 1\.\.60; trace a step in that range"):
        check_step_in_checkpoint(step, 60, "runs/tiny/checkpoints/step-00000060")
