"""A resumable DistributedSampler whose memory does not grow with the dataset.

torch's ``DistributedSampler`` materialises ``torch.randperm(N)`` on every rank: 8 bytes per sample, 8 GB at a
billion samples. Here the epoch's permutation is a seeded bijection computed on the fly (a Feistel network over
the next power of two with cycle walking, keyed by ``(seed, epoch, N)``), evaluated in numpy blocks, so a rank
holds one block of indices at a time whatever N is.

Layout (the contract that makes resume exact, also across world sizes):

* ``perm`` is the epoch's permutation of ``[0, N)``; a *position* ``p`` is an index into it.
* ``start`` is the number of positions of this epoch already consumed by all ranks together.
* The remaining positions ``[start, N)`` are cut to ``usable_end = start + per_rank * world`` with
  ``per_rank = (N - start) // world`` (``drop_last``; the tail of fewer than ``world`` samples is dropped), and
  rank ``r`` takes positions ``start + r, start + r + world, ...`` (``remaining[r::world]``, as torch does).
* So after every rank has consumed ``j`` samples, the consumed set is exactly the prefix
  ``perm[:start + j * world]``, and an optimizer step of ``micro_batch * grad_accum`` samples per rank consumes
  one contiguous block of ``global_batch`` positions. Resuming on any world size only needs that global count.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Iterator, Sized

import numpy as np
from torch.utils.data import Dataset, DistributedSampler

_ROUNDS = 6
_BLOCK = 1 << 16  # positions evaluated per numpy call while iterating: 0.5 MiB of int64
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


def _round_keys(seed: int, epoch: int, n: int) -> np.ndarray:
    digest = hashlib.blake2b(
        f"pileworks-sampler/{seed}/{epoch}/{n}".encode(), digest_size=8 * _ROUNDS
    ).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser over ``x ^ key``: a cheap round function with good avalanche."""
    z = x ^ key
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    return z ^ (z >> np.uint64(31))


class EpochPermutation:
    """A seeded bijection of ``[0, n)``; ``perm(positions)`` maps positions to dataset indices, vectorized.

    The Feistel network works on ``k`` bits (``2**k >= n``) with halves of ``k // 2`` and ``k - k // 2`` bits
    whose roles swap every round, so any ``k`` works and each round is a bijection of the k-bit integers. Values
    that land in ``[n, 2**k)`` are walked through the network again (cycle walking) until they fall in range,
    which keeps the map a bijection of ``[0, n)``; as ``2**k < 2n`` the expected number of walks is below 2.
    """

    def __init__(self, n: int, *, seed: int, epoch: int, shuffle: bool = True):
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self.n = n
        self.shuffle = shuffle and n > 1
        self._bits = max(2, (n - 1).bit_length())
        self._keys = _round_keys(seed, epoch, n)

    def _network(self, x: np.ndarray) -> np.ndarray:
        hi_bits = self._bits // 2
        lo_bits = self._bits - hi_bits
        for key in self._keys:
            hi = x >> np.uint64(lo_bits)
            lo = x & np.uint64((1 << lo_bits) - 1)
            new = hi ^ (_mix(lo, key) & np.uint64((1 << hi_bits) - 1))
            x = (lo << np.uint64(hi_bits)) | new
            hi_bits, lo_bits = lo_bits, hi_bits
        return x

    def __call__(self, positions: np.ndarray | int) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise IndexError(f"positions must lie in [0, {self.n})")
        if not self.shuffle:
            return pos.copy()
        x = self._network(pos.reshape(-1).astype(np.uint64))
        out = np.flatnonzero(x >= np.uint64(self.n))
        while out.size:
            x[out] = self._network(x[out])
            out = out[x[out] >= np.uint64(self.n)]
        return x.astype(np.int64).reshape(pos.shape)

    def __getitem__(self, item: int | slice) -> np.ndarray | int:
        if isinstance(item, slice):
            return self(np.arange(*item.indices(self.n), dtype=np.int64))
        index = item + self.n if item < 0 else item
        return int(self(np.array([index]))[0])


def samples_per_rank(n: int, world: int, start: int = 0, drop_last: bool = True) -> int:
    """How many samples each rank gets from the positions ``[start, n)`` of an epoch (the same on every rank)."""
    _check_layout(n, world, start)
    remaining = n - start
    return remaining // world if drop_last else math.ceil(remaining / world)


def global_index_of(rank: int, local_index: int, *, world: int, start: int = 0) -> int:
    """The epoch position of rank ``rank``'s ``local_index``-th sample when the sampler started at ``start``.

    A *position* indexes the epoch's permutation; :class:`EpochPermutation` turns it into a dataset index.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside [0, {world})")
    if local_index < 0 or start < 0:
        raise ValueError("local_index and start must be >= 0")
    return start + local_index * world + rank


def samples_of_step(
    consumed_in_epoch: int,
    *,
    n: int,
    world: int,
    micro_batch: int,
    grad_accum: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> np.ndarray:
    """Dataset indices an optimizer step trained on, as ``[world, grad_accum, micro_batch]``.

    ``consumed_in_epoch`` is the global count consumed before the step. Entry ``[r, a, b]`` is sample ``b`` of
    rank ``r``'s micro batch ``a``: position ``consumed + (a * micro_batch + b) * world + r``. Used for lineage
    ("which documents did step N see") with :meth:`training.data.ShardDataset.sample_to_shards`.
    """
    global_batch = world * micro_batch * grad_accum
    if consumed_in_epoch < 0 or consumed_in_epoch + global_batch > n:
        raise ValueError(f"a step from position {consumed_in_epoch} of {global_batch} samples exceeds n={n}")
    local = np.arange(micro_batch * grad_accum, dtype=np.int64).reshape(grad_accum, micro_batch)
    ranks = np.arange(world, dtype=np.int64).reshape(world, 1, 1)
    positions = consumed_in_epoch + local[None, :, :] * world + ranks
    return EpochPermutation(n, seed=seed, epoch=epoch, shuffle=shuffle)(positions)


def _check_layout(n: int, world: int, start: int) -> None:
    if world < 1:
        raise ValueError(f"num_replicas must be >= 1, got {world}")
    if n < 0:
        raise ValueError(f"dataset length must be >= 0, got {n}")
    if not 0 <= start <= n:
        raise ValueError(f"start (consumed samples this epoch) must lie in [0, {n}], got {start}")


class _Length(Dataset):
    """A stand-in dataset for DistributedSampler's constructor: only ``len()`` is ever used."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler with an on-the-fly permutation and a global start offset (see the module docstring).

    ``set_epoch(e)`` selects the epoch's permutation and, when ``e`` differs from the current epoch, resets the
    start to 0; call ``set_start(consumed_in_epoch)`` after it when resuming mid-epoch. With ``drop_last=False``
    the positions past ``n`` wrap around to the start of the remaining ones (torch's padding), so every rank
    still gets the same count.
    """

    def __init__(
        self,
        dataset_len: int | Sized,
        *,
        num_replicas: int,
        rank: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = True,
    ):
        try:
            n = operator.index(dataset_len)  # type: ignore[arg-type]  # an int, numpy integer...
        except TypeError:
            n = len(dataset_len)  # type: ignore[arg-type]
        _check_layout(n, num_replicas, 0)
        super().__init__(
            _Length(n), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self.n = n
        self.start = 0
        self._update_counts()

    def _update_counts(self) -> None:
        self.num_samples = samples_per_rank(self.n, self.num_replicas, self.start, self.drop_last)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.start = 0
        self.epoch = epoch
        self._update_counts()

    def set_start(self, consumed_in_epoch: int) -> None:
        """Skip the first ``consumed_in_epoch`` positions of this epoch (a global count over all ranks)."""
        _check_layout(self.n, self.num_replicas, consumed_in_epoch)
        self.start = consumed_in_epoch
        self._update_counts()

    def permutation(self) -> EpochPermutation:
        return EpochPermutation(self.n, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)

    def positions(self) -> Iterator[np.ndarray]:
        """This rank's epoch positions in blocks (the sampler's layout before the permutation)."""
        remaining = self.n - self.start
        first = self.start + self.rank
        stop = first + self.num_samples * self.num_replicas
        for lo in range(first, stop, _BLOCK * self.num_replicas):
            hi = min(stop, lo + _BLOCK * self.num_replicas)
            block = np.arange(lo, hi, self.num_replicas, dtype=np.int64)
            if not self.drop_last:
                wrapped = block >= self.n
                block[wrapped] = self.start + (block[wrapped] - self.n) % remaining
            yield block

    def iter_blocks(self) -> Iterator[np.ndarray]:
        """This rank's dataset indices in numpy blocks (fast path for prefetchers and benchmarks)."""
        perm = self.permutation()
        for block in self.positions():
            yield perm(block)

    def __iter__(self) -> Iterator[int]:
        for block in self.iter_blocks():
            yield from block.tolist()

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> dict[str, int | bool]:
        """What a checkpoint needs to check that a resume uses the same permutation."""
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "shuffle": bool(self.shuffle)}
