"""The blended order: shares per block, determinism, ranges, and the sampler's resume guarantees."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from training.blend import (
    BlendedDistributedSampler,
    BlendedOrder,
    SourceSamples,
    apportion,
    source_samples,
)

SOURCES = [
    SourceSamples("pile", 0, 700, 0.5),  # natural share 0.7, asked 0.5: subsampled
    SourceSamples("web", 700, 200, 0.3),  # natural 0.2, asked 0.3: repeated
    SourceSamples("books", 900, 100, 0.2),  # natural 0.1, asked 0.2: repeated twice per epoch
]
N = 1000


def _source_of(index: np.ndarray) -> np.ndarray:
    return np.searchsorted([s.first + s.count for s in SOURCES], index, side="right")


@pytest.mark.parametrize("total", [0, 1, 7, 1000, 1001])
def test_apportion_sums_and_follows_shares(total: int) -> None:
    counts = apportion(total, [0.5, 0.3, 0.2])
    assert counts.sum() == total
    assert np.all(np.abs(counts - np.array([0.5, 0.3, 0.2]) * total) < 1)


def test_shares_over_10000_samples_are_within_a_point() -> None:
    positions = np.arange(10_000) % N
    epochs = np.arange(10_000) // N
    indices = np.concatenate(
        [BlendedOrder(SOURCES, N, seed=3, epoch=e)(positions[epochs == e]) for e in range(10)]
    )
    shares = np.bincount(_source_of(indices), minlength=3) / len(indices)
    assert np.all(np.abs(shares - [0.5, 0.3, 0.2]) < 0.01), shares
    # every sample stays in its source's range; the repeated sources cover all their samples
    for k, s in enumerate(SOURCES):
        mine = indices[_source_of(indices) == k]
        assert mine.min() >= s.first and mine.max() < s.first + s.count
    assert len(np.unique(indices[_source_of(indices) == 2])) == 100


def test_blocks_are_exact_and_the_order_is_seeded() -> None:
    order = BlendedOrder(SOURCES, N, seed=1, epoch=0, block=100)
    src, _ = order.sources_of(np.arange(N))
    for b in range(10):
        assert np.bincount(src[b * 100 : (b + 1) * 100], minlength=3).tolist() == [50, 30, 20]
    same = BlendedOrder(SOURCES, N, seed=1, epoch=0, block=100)(np.arange(N))
    assert np.array_equal(order(np.arange(N)), same)
    assert not np.array_equal(same, BlendedOrder(SOURCES, N, seed=2, epoch=0, block=100)(np.arange(N)))
    assert not np.array_equal(same, BlendedOrder(SOURCES, N, seed=1, epoch=1, block=100)(np.arange(N)))
    # draws of one source within one pass never repeat a sample
    idx = same[src == 0]
    assert len(np.unique(idx)) == len(idx)


@pytest.mark.parametrize(("start", "stop"), [(0, 0), (0, 1000), (17, 953), (250, 251), (99, 301)])
def test_drawn_per_source_matches_counting(start: int, stop: int) -> None:
    order = BlendedOrder(SOURCES, N, seed=5, epoch=0, block=100)
    src, _ = order.sources_of(np.arange(start, stop))
    want = np.bincount(src, minlength=3).tolist()
    assert list(order.drawn_per_source(start, stop).values()) == want


@pytest.mark.parametrize(("world", "start"), itertools.product([1, 2, 3, 8], [0, 1, 333, 998]))
def test_sampler_resumes_exactly_on_any_world_size(world: int, start: int) -> None:
    full = list(BlendedDistributedSampler(SOURCES, N, num_replicas=1, rank=0, seed=9))
    ranks = []
    for rank in range(world):
        sampler = BlendedDistributedSampler(SOURCES, N, num_replicas=world, rank=rank, seed=9)
        sampler.set_epoch(0)
        sampler.set_start(start)
        ranks.append(list(sampler))
    assert len({len(r) for r in ranks}) == 1  # equal per-rank counts
    per_rank = len(ranks[0])
    interleaved = [ranks[r][j] for j in range(per_rank) for r in range(world)]
    assert interleaved == full[start : start + per_rank * world]


def test_source_samples_from_ranges() -> None:
    mixture = {
        "sources": {"a": {"target_share": 0.6}, "b": {"target_share": 0.4}},
        "ranges": {
            "train": [
                {"source": "a", "token_start": 0, "tokens": 1000},
                {"source": "b", "token_start": 1000, "tokens": 501},
            ]
        },
    }
    a, b = source_samples(mixture, "train", 100)
    assert (a.first, a.count, a.share) == (0, 9, 0.6)  # windows of 101 tokens inside [0, 1000)
    assert (b.first, b.count) == (10, 5)  # samples 10..14: sample 14 is tokens [1400, 1501)
    with pytest.raises(ValueError, match="no source"):
        BlendedOrder([SourceSamples("x", 0, 0, 1.0)], 10, seed=0, epoch=0)


def test_source_tokens_and_lineage_use_the_blended_order() -> None:
    from training.blend import epoch_order, source_tokens
    from training.lineage import DataShape, step_samples
    from training.sampler import EpochPermutation

    order = epoch_order(SOURCES, N, seed=4, epoch=0)
    assert isinstance(order, BlendedOrder)
    tokens = source_tokens(order, 0, 1000, seq_len=16)
    assert tokens == {"pile": 500 * 16, "web": 300 * 16, "books": 200 * 16}
    assert isinstance(epoch_order([], N, seed=4, epoch=0), EpochPermutation)
    shape = DataShape(n=N, world=2, micro_batch=4, grad_accum=2, seed=4)
    batches = step_samples(shape, 3, sources=SOURCES)
    for b in batches:
        want = BlendedOrder(SOURCES, N, seed=4, epoch=b["epoch"])(b["positions"])
        assert np.array_equal(b["samples"], want)
