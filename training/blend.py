"""Blending sources by weight, as Megatron's ``BlendedDataset`` does, without building an index in memory.

The shard writer lays every source out as one contiguous token range of the split (``manifest.mixture``'s
``ranges``), so the samples of a source are a contiguous range of :class:`training.data.ShardDataset` indices
(those whose ``seq_len + 1`` tokens lie wholly inside the range). :class:`BlendedOrder` maps an epoch's positions
to dataset indices:

* Positions come in blocks of ``block`` samples. Every block holds the same number of samples of each source,
  ``counts`` (the target shares apportioned to ``block`` by largest remainders), so over any whole number of
  blocks the shares are exact, and within ``1 / block`` of the target at any point.
* Inside block ``b`` the order of the sources is a permutation of that multiset seeded by ``(seed, epoch, b)``.
* The ``k``-th draw of source ``s`` in the epoch (``b * counts[s]`` + its rank inside the block) is sample
  ``k mod n_s`` of the source's pass ``k // n_s`` under a seeded bijection (the sampler's
  :class:`~training.sampler.EpochPermutation`), so a source asked for more than its natural share repeats,
  reshuffled each pass, and one asked for less is subsampled.

Everything is a pure function of the position: any start offset, any world size, exact resume, O(block)
memory. :class:`BlendedDistributedSampler` is the resumable sampler with this order in place of the plain
permutation, so its guarantees (equal per-rank counts, global start offset) are unchanged.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from training.sampler import EpochPermutation, ResumableDistributedSampler

DEFAULT_BLOCK = 1000


@dataclass(frozen=True)
class SourceSamples:
    """A source's samples: dataset indices ``[first, first + count)``, and its target share."""

    name: str
    first: int
    count: int
    share: float


def source_samples(mixture: Mapping[str, Any], split: str, seq_len: int) -> list[SourceSamples]:
    """Each source's sample range for windows of ``seq_len + 1`` tokens (sample i starts at token i*L)."""
    shares = {n: float(v.get("target_share", 0.0)) for n, v in mixture.get("sources", {}).items()}
    out = []
    for r in mixture.get("ranges", {}).get(split, []):
        start, end = int(r["token_start"]), int(r["token_start"]) + int(r["tokens"])
        first = -(-start // seq_len)
        last = (end - seq_len - 1) // seq_len  # the last sample whose window ends inside the range
        out.append(SourceSamples(r["source"], first, max(0, last - first + 1), shares.get(r["source"], 0.0)))
    return out


def apportion(total: int, shares: list[float]) -> np.ndarray:
    """Integers summing to ``total`` proportional to ``shares`` (largest remainders; ties: lower index)."""
    weights = np.asarray(shares, dtype=np.float64)
    if total < 0 or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"cannot apportion {total} by shares {shares}")
    exact = weights / weights.sum() * total
    counts = np.floor(exact).astype(np.int64)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - int(counts.sum())]:
        counts[i] += 1
    return counts


def _key(*parts: object) -> int:
    return int.from_bytes(
        hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest(), "little"
    )


class BlendedOrder:
    """Epoch positions ``[0, n)`` -> dataset indices, sources drawn by share (see the module docstring)."""

    def __init__(
        self, sources: list[SourceSamples], n: int, *, seed: int, epoch: int, block: int = DEFAULT_BLOCK
    ):
        drawn = [s for s in sources if s.count > 0 and s.share > 0]
        if not drawn:
            raise ValueError("no source has both samples and a share > 0 to draw from")
        self.sources, self.n, self.seed, self.epoch, self.block = drawn, n, seed, epoch, block
        self.counts = apportion(block, [s.share for s in drawn])
        self._firsts = np.array([s.first for s in drawn], dtype=np.int64)

    @functools.lru_cache(maxsize=8)  # noqa: B019 (a few blocks of the current epoch; the order is small)
    def block_layout(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(source of each slot, rank of the slot among its source's slots) of block ``b``."""
        rng = np.random.Generator(np.random.PCG64(_key("pileworks-blend", self.seed, self.epoch, b)))
        slots = rng.permutation(np.repeat(np.arange(len(self.sources)), self.counts))
        ranks = np.empty(self.block, dtype=np.int64)
        for s in range(len(self.sources)):
            where = np.flatnonzero(slots == s)
            ranks[where] = np.arange(len(where))
        return slots, ranks

    def sources_of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, draw number k of that source in the epoch) of each position."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise IndexError(f"positions must lie in [0, {self.n})")
        src = np.empty(pos.size, dtype=np.int64)
        draw = np.empty(pos.size, dtype=np.int64)
        blocks = pos // self.block
        for b in np.unique(blocks).tolist():
            sel = np.flatnonzero(blocks == b)
            slots, ranks = self.block_layout(int(b))
            offs = pos[sel] - b * self.block
            src[sel] = slots[offs]
            draw[sel] = b * self.counts[slots[offs]] + ranks[offs]
        return src, draw

    def __call__(self, positions: np.ndarray | int) -> np.ndarray:
        shape = np.shape(positions)
        src, draw = self.sources_of(np.asarray(positions))
        out = np.empty(src.size, dtype=np.int64)
        for s in np.unique(src).tolist():
            sel = np.flatnonzero(src == s)
            count = self.sources[s].count
            passes, within = np.divmod(draw[sel], count)
            for p in np.unique(passes).tolist():
                part = sel[passes == p]
                perm = EpochPermutation(
                    count, seed=_key(self.seed, self.sources[s].name, self.epoch), epoch=p
                )
                out[part] = self._firsts[s] + perm(within[passes == p])
        return out.reshape(shape)

    def drawn_per_source(self, start: int, stop: int) -> dict[str, int]:
        """How many of the positions ``[start, stop)`` each source supplies (whole blocks in closed form)."""
        out = np.zeros(len(self.sources), dtype=np.int64)
        if stop > start:
            b0, b1 = start // self.block, (stop - 1) // self.block
            if b0 == b1:
                out += self._partial(b0, start, stop)
            else:
                out += self._partial(b0, start, (b0 + 1) * self.block)
                out += (b1 - b0 - 1) * self.counts
                out += self._partial(b1, b1 * self.block, stop)
        return {s.name: int(c) for s, c in zip(self.sources, out.tolist(), strict=True)}

    def _partial(self, b: int, start: int, stop: int) -> np.ndarray:
        slots, _ = self.block_layout(b)
        chunk = slots[start - b * self.block : stop - b * self.block]
        return np.bincount(chunk, minlength=len(self.sources))


class BlendedDistributedSampler(ResumableDistributedSampler):
    """:class:`ResumableDistributedSampler` over ``n`` positions per epoch, in :class:`BlendedOrder`."""

    def __init__(self, sources: list[SourceSamples], n: int, *, block: int = DEFAULT_BLOCK, **kwargs: Any):
        super().__init__(n, **kwargs)
        self.sources, self.block = sources, block

    def permutation(self) -> BlendedOrder:  # type: ignore[override]
        return BlendedOrder(self.sources, self.n, seed=self.seed, epoch=self.epoch, block=self.block)

    def state_dict(self) -> dict[str, int | bool]:
        state = super().state_dict()
        state["blend_block"] = self.block
        return state


def blend_sources(mixture: Mapping[str, Any], seq_len: int, enabled: bool = True) -> list[SourceSamples]:
    """The train split's sources to blend, or ``[]`` when blending is off or there is one source only."""
    sources = [s for s in source_samples(mixture, "train", seq_len) if s.count > 0 and s.share > 0]
    return sources if enabled and len(sources) > 1 else []


def epoch_order(
    sources: list[SourceSamples], n: int, *, seed: int, epoch: int
) -> BlendedOrder | EpochPermutation:
    """The order the trainer's sampler uses for ``epoch``: blended when there are sources to blend."""
    if sources:
        return BlendedOrder(sources, n, seed=seed, epoch=epoch)
    return EpochPermutation(n, seed=seed, epoch=epoch)


def source_tokens(
    order: BlendedOrder | EpochPermutation, start: int, stop: int, seq_len: int
) -> dict[str, int]:
    """Tokens per source trained on at positions ``[start, stop)`` of an epoch (``seq_len`` per sample)."""
    if not isinstance(order, BlendedOrder):
        return {}
    return {name: n * seq_len for name, n in order.drawn_per_source(start, stop).items()}
