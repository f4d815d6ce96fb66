"""ResumableDistributedSampler over grids of sizes: disjoint, equal, complete, deterministic, resumable."""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest
from torch.utils.data import DataLoader

from training.data import preflight_steps
from training.sampler import (
    EpochPermutation,
    ResumableDistributedSampler,
    global_index_of,
    samples_of_step,
    samples_per_rank,
)

SIZES = [1, 2, 3, 7, 16, 97, 1000, 4099]
WORLDS = [1, 2, 3, 8]


def rank_indices(
    n: int, world: int, *, seed: int = 0, epoch: int = 0, start: int = 0, drop_last: bool = True
):
    out = []
    for rank in range(world):
        s = ResumableDistributedSampler(n, num_replicas=world, rank=rank, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        s.set_start(start)
        out.append(list(s))
    return out


@pytest.mark.parametrize("n", [*range(0, 70), 255, 256, 257, 1023, 1025, 65535, 65537, 100_003])
def test_permutation_is_a_bijection(n: int) -> None:
    for seed, epoch in [(0, 0), (1, 0), (0, 5)]:
        perm = EpochPermutation(n, seed=seed, epoch=epoch)(np.arange(n))
        assert np.array_equal(np.sort(perm), np.arange(n))


def test_permutation_depends_on_seed_and_epoch_and_is_not_identity() -> None:
    n = 10_000
    base = EpochPermutation(n, seed=3, epoch=0)[:]
    assert np.array_equal(base, EpochPermutation(n, seed=3, epoch=0)[:])
    for other in (EpochPermutation(n, seed=4, epoch=0)[:], EpochPermutation(n, seed=3, epoch=1)[:]):
        assert np.mean(other == base) < 0.01
    assert np.mean(base == np.arange(n)) < 0.01
    # A shuffle, not a rotation: neighbours land far apart and the order looks uniform.
    assert abs(np.corrcoef(np.arange(n), base)[0, 1]) < 0.05
    assert np.median(np.abs(np.diff(base))) > n / 10


def test_permutation_scalar_and_slice_access_agree() -> None:
    perm = EpochPermutation(1000, seed=1, epoch=2)
    full = perm[:]
    assert [perm[i] for i in (0, 17, 999, -1)] == [full[0], full[17], full[999], full[-1]]
    assert np.array_equal(perm[10:20], full[10:20])
    with pytest.raises(IndexError):
        perm(np.array([1000]))


@pytest.mark.parametrize(("n", "world"), list(itertools.product(SIZES, WORLDS)))
@pytest.mark.parametrize("start_frac", [0.0, 0.3, 0.99, 1.0])
def test_ranks_are_disjoint_equal_and_cover_the_permutation(n: int, world: int, start_frac: float) -> None:
    start = int(n * start_frac)
    per_rank = rank_indices(n, world, seed=7, epoch=1, start=start)
    counts = {len(x) for x in per_rank}
    assert counts == {(n - start) // world} == {samples_per_rank(n, world, start)}
    flat = [i for r in per_rank for i in r]
    assert len(flat) == len(set(flat))
    perm = EpochPermutation(n, seed=7, epoch=1)[:].tolist()
    usable_end = start + (n - start) // world * world
    assert sorted(flat) == sorted(perm[start:usable_end])
    # the documented layout: rank r takes remaining[r::world]
    for r, got in enumerate(per_rank):
        assert got == perm[start:usable_end][r::world]


@pytest.mark.parametrize(("n", "world"), [(10, 3), (7, 4), (5, 8), (97, 8)])
def test_without_drop_last_every_rank_gets_the_same_padded_count(n: int, world: int) -> None:
    per_rank = rank_indices(n, world, drop_last=False, start=1)
    assert {len(x) for x in per_rank} == {-(-(n - 1) // world)}
    assert set().union(*map(set, per_rank)) == set(EpochPermutation(n, seed=0, epoch=0)[1:].tolist())


def test_deterministic_across_instances_and_different_per_epoch() -> None:
    a = rank_indices(1000, 4, seed=11, epoch=3)
    assert a == rank_indices(1000, 4, seed=11, epoch=3)
    b = rank_indices(1000, 4, seed=11, epoch=4)
    assert a != b
    flat = [i for rank in a for i in rank]
    assert sorted(flat) != flat  # shuffled


@pytest.mark.parametrize(
    ("n", "world_a", "world_b", "batch"), [(1000, 4, 3, 2), (997, 2, 8, 5), (64, 8, 1, 1)]
)
def test_resume_with_another_world_size_covers_exactly_the_remaining(n, world_a, world_b, batch) -> None:
    """Run world_a for k steps, stop, resume on world_b from the global consumed count: no loss, no repeat."""
    steps = 3
    first = []
    for rank in range(world_a):
        s = ResumableDistributedSampler(n, num_replicas=world_a, rank=rank, seed=5)
        s.set_epoch(2)
        first.extend(list(s)[: steps * batch])
    consumed = steps * batch * world_a
    second = [i for r in rank_indices(n, world_b, seed=5, epoch=2, start=consumed) for i in r]
    perm = EpochPermutation(n, seed=5, epoch=2)[:].tolist()
    assert sorted(first) == sorted(perm[:consumed])  # consumed samples are a prefix of the permutation
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(perm[: consumed + (n - consumed) // world_b * world_b])


def test_set_epoch_resets_the_start_and_len_follows_it() -> None:
    s = ResumableDistributedSampler(100, num_replicas=3, rank=1, seed=0)
    s.set_epoch(1)
    s.set_start(40)
    assert len(s) == len(list(s)) == 20
    s.set_epoch(1)  # same epoch: keep the start
    assert len(s) == 20
    s.set_epoch(2)
    assert len(s) == len(list(s)) == 33
    with pytest.raises(ValueError, match="start"):
        s.set_start(101)
    with pytest.raises(ValueError, match="rank"):
        ResumableDistributedSampler(10, num_replicas=2, rank=2, seed=0)


def test_accepts_a_sized_dataset_and_works_in_a_dataloader() -> None:
    data = list(range(50))
    s = ResumableDistributedSampler(data, num_replicas=2, rank=0, seed=1)
    loader = DataLoader(data, batch_size=4, sampler=s, drop_last=True)
    batches = [b.tolist() for b in loader]
    assert len(batches) == len(loader) == 25 // 4
    assert [i for b in batches for i in b] == list(s)[:24]


@pytest.mark.parametrize(("world", "micro", "accum"), [(1, 1, 1), (2, 3, 2), (4, 2, 3)])
def test_samples_of_step_match_what_each_rank_iterates(world: int, micro: int, accum: int) -> None:
    n, seed, epoch, start = 500, 9, 1, 24 * world
    per_rank = rank_indices(n, world, seed=seed, epoch=epoch, start=start)
    step_size = micro * accum
    for step in range(3):
        got = samples_of_step(
            start + step * step_size * world,
            n=n,
            world=world,
            micro_batch=micro,
            grad_accum=accum,
            seed=seed,
            epoch=epoch,
        )
        assert got.shape == (world, accum, micro)
        for r in range(world):
            assert got[r].reshape(-1).tolist() == per_rank[r][step * step_size : (step + 1) * step_size]
            for j in range(step_size):
                pos = global_index_of(r, step * step_size + j, world=world, start=start)
                assert EpochPermutation(n, seed=seed, epoch=epoch)[pos] == got[r].reshape(-1)[j]


@pytest.mark.parametrize(
    ("n", "world", "micro", "accum", "start"),
    [(1000, 4, 2, 3, 0), (1000, 3, 4, 1, 500), (10**12, 1024, 4, 8, 123_456_789)],
)
def test_preflight_counts_steps(n, world, micro, accum, start) -> None:
    steps = preflight_steps(n, world, micro, accum, start)
    assert steps == samples_per_rank(n, world, start) // (micro * accum)
    assert preflight_steps(
        n, world, micro, accum, start, rank_samples=[samples_per_rank(n, world, start)] * world
    )


def test_preflight_refuses_disagreeing_ranks_and_too_little_data() -> None:
    with pytest.raises(ValueError, match="disagree"):
        preflight_steps(1000, 2, 4, 1, rank_samples=[500, 499])
    with pytest.raises(ValueError, match="no optimizer step"):
        preflight_steps(15, 2, 4, 2)
    with pytest.raises(ValueError, match="micro_batch"):
        preflight_steps(100, 2, 0, 1)


def test_memory_is_bounded_at_a_billion_samples() -> None:
    s = ResumableDistributedSampler(10**9, num_replicas=8, rank=5, seed=0)
    s.set_epoch(3)
    s.set_start(10**8 + 3)
    tracemalloc.start()
    it = iter(s)
    first = [next(it) for _ in range(200_000)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(s) == (10**9 - 10**8 - 3) // 8
    assert peak < 16 * 2**20, peak  # a randperm would be 8 GB
    assert first[0] == EpochPermutation(10**9, seed=0, epoch=3)[10**8 + 3 + 5]
    assert all(0 <= i < 10**9 for i in first)
