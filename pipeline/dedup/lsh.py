"""LSH banding: band parameters, band keys, the partition planner and candidate pairs.

Everything here is a pure function over numpy arrays, so the steps in ``near.py`` can run it on any worker.

A *doc ref* is a uint64 naming one document across parts: bit 63 is set for documents of a persisted index (a
previous dataset's kept documents), bits 32-62 hold the part number and bits 0-31 the row within the part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pipeline.dedup.minhash import fmix64

INDEX_FLAG = np.uint64(1 << 63)
_ROW_BITS = np.uint64(32)
_ROW_MASK = np.uint64((1 << 32) - 1)
_BAND_MUL = np.uint64(0x9E3779B97F4A7C15)
# Bytes of memory per band entry while a partition is grouped: key + ref (16), argsort index (8), sorted copies
# (16) and the pair arrays of the window scan; 64 leaves head-room for numpy temporaries.
BYTES_PER_ENTRY = 64
MAX_PARTITIONS = 1 << 12


def make_refs(part: int, rows: np.ndarray, *, index: bool = False) -> np.ndarray:
    if not 0 <= part < (1 << 31):
        raise ValueError(f"part number {part} out of range for a doc ref")
    refs = (np.uint64(part) << _ROW_BITS) | rows.astype(np.uint64)
    return refs | INDEX_FLAG if index else refs


def split_refs(refs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(is_index, part, row) of each ref."""
    is_index = (refs & INDEX_FLAG) != 0
    part = ((refs & ~INDEX_FLAG) >> _ROW_BITS).astype(np.int64)
    return is_index, part, (refs & _ROW_MASK).astype(np.int64)


@lru_cache(maxsize=64)
def optimal_params(threshold: float, num_perm: int, fp_weight: float, fn_weight: float) -> tuple[int, int]:
    """Bands and rows minimizing the weighted false positive/negative areas, as datasketch's ``MinHashLSH``
    chooses them (tests check they agree), without its import (datasketch and scipy: ~0.7 CPU-s per process).

    For every ``b * r <= num_perm`` (in datasketch's order: b, then r; the first minimum wins) the areas under
    ``P(s) = 1 - (1 - s**r)**b`` below the threshold (false positives) and above it (false negatives) are
    integrated exactly: ``P`` is a polynomial of degree ``b * r``, and Gauss-Legendre with ``n`` nodes is exact
    up to degree ``2n - 1``."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    pairs = np.array(
        [(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)], dtype=float
    )
    b, r = pairs[:, 0:1], pairs[:, 1:2]
    nodes, weights = np.polynomial.legendre.leggauss(num_perm // 2 + 1)

    def area(lo: float, hi: float) -> np.ndarray:  # of P over [lo, hi], per (b, r)
        s = (hi - lo) / 2.0 * nodes + (hi + lo) / 2.0
        return (1.0 - (1.0 - s**r) ** b) @ weights * ((hi - lo) / 2.0)

    false_pos = area(0.0, threshold)
    false_neg = (1.0 - threshold) - area(threshold, 1.0)
    best = int(np.argmin(false_pos * fp_weight + false_neg * fn_weight))
    bands, rows = int(pairs[best, 0]), int(pairs[best, 1])
    if bands < 2:
        raise ValueError(f"threshold {threshold} with num_perm {num_perm} gives fewer than 2 bands")
    return bands, rows


def s_curve(b: int, r: int, points: int = 21) -> list[tuple[float, float]]:
    """Probability that a pair at Jaccard s shares at least one band bucket: 1 - (1 - s^r)^b."""
    return [(round(s, 4), round(1.0 - (1.0 - s**r) ** b, 6)) for s in np.linspace(0.0, 1.0, points).tolist()]


def band_keys(sigs: np.ndarray, b: int, r: int) -> np.ndarray:
    """(docs, b) uint64 keys; equal keys <=> equal band values (up to 64-bit collisions, which verify removes).

    The band number is mixed in, so keys of different bands never meet in one bucket.
    """
    if b * r > sigs.shape[1]:
        raise ValueError(f"b*r = {b * r} exceeds the signature length {sigs.shape[1]}")
    vals = sigs[:, : b * r].reshape(len(sigs), b, r)
    # A polynomial over the band's values (mod 2**64, odd multiplier) seeded by the band number, then one
    # avalanche: 2 cheap passes per row instead of a full mix per value.
    acc = np.broadcast_to(np.arange(1, b + 1, dtype=np.uint64), (len(sigs), b)).copy()
    for j in range(r):
        acc *= _BAND_MUL
        acc += vals[:, :, j]
    return fmix64(acc)


@dataclass(frozen=True, kw_only=True)
class BandPlan:
    """How many bucket partitions the band entries are split into, and the memory each one needs."""

    num_docs: int
    num_bands: int
    num_partitions: int
    partition_bytes: int
    memory_budget_mb: int


def plan_partitions(num_docs: int, num_bands: int, memory_budget_mb: int) -> BandPlan:
    """Smallest power-of-two number of partitions whose grouping fits the budget (assuming even spread)."""
    if num_docs < 0 or num_bands < 1 or memory_budget_mb < 1:
        raise ValueError("plan_partitions needs num_docs >= 0, num_bands >= 1 and memory_budget_mb >= 1")
    total = num_docs * num_bands * BYTES_PER_ENTRY
    budget = memory_budget_mb << 20
    # Keys are uniform hashes, so a partition holds total/P (+ a few sigma); keep 25% slack for that.
    parts = 1 << max(0, math.ceil(math.log2(max(1.0, total * 1.25 / budget))))
    if parts > MAX_PARTITIONS:
        raise ValueError(
            f"memory_budget_mb={memory_budget_mb} is too small for {num_docs} documents "
            f"({MAX_PARTITIONS} partitions would not fit); raise memory_budget_mb"
        )
    return BandPlan(
        num_docs=num_docs,
        num_bands=num_bands,
        num_partitions=parts,
        partition_bytes=math.ceil(total / parts),
        memory_budget_mb=memory_budget_mb,
    )


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """Partition of each key from its top bits (num_partitions is a power of two)."""
    if num_partitions & (num_partitions - 1) or num_partitions < 1:
        raise ValueError(f"num_partitions must be a power of two, got {num_partitions}")
    shift = np.uint64(64 - int(math.log2(num_partitions))) if num_partitions > 1 else None
    if shift is None:
        return np.zeros(keys.shape, dtype=np.int64)
    return (keys >> shift).astype(np.int64)


def candidate_pairs(keys: np.ndarray, refs: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Unique (u < v) pairs of refs sharing a key, and the number of buckets larger than ``window + 1``.

    Buckets of up to ``window + 1`` members give all their pairs (what ``MinHashLSH.query`` finds); a larger
    bucket gives each member's pairs with its next ``window`` members in ref order, which keeps the bucket
    connected while bounding the work at ``window`` pairs per member.
    """
    k, r = _shared_entries(keys, refs)
    us, vs = [], []
    for d in range(1, window + 1):
        same = k[:-d] == k[d:]
        if not same.any():
            break
        us.append(r[:-d][same])
        vs.append(r[d:][same])
    big = 0
    w = window + 1
    if len(k) > w:
        # A bucket start i with k[i] == k[i + window + 1] has more than window + 1 members.
        big_start = (k[:-w] == k[w:]) & np.concatenate(([True], k[1:-w] != k[: -w - 1]))
        big = int(np.count_nonzero(big_start))
    if not us:
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty, big
    u, v = np.concatenate(us), np.concatenate(vs)
    lo, hi = np.minimum(u, v), np.maximum(u, v)
    keep = lo != hi
    both_index = ((lo & INDEX_FLAG) != 0) & ((hi & INDEX_FLAG) != 0)
    lo, hi = lo[keep & ~both_index], hi[keep & ~both_index]
    return (*unique_pairs(lo, hi), big)


def _shared_entries(keys: np.ndarray, refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entries whose key occurs more than once, sorted by (key, ref).

    Sorting the bare keys (SIMD value sort) and then only the few shared entries is several times faster than
    an argsort of everything: almost every band key is unique.
    """
    sk = np.sort(keys)
    shared = np.unique(sk[1:][sk[1:] == sk[:-1]])
    if not len(shared):
        return keys[:0], refs[:0]
    pos = np.minimum(np.searchsorted(shared, keys), len(shared) - 1)
    sub = np.flatnonzero(shared[pos] == keys)
    sub = sub[np.lexsort((refs[sub], keys[sub]))]
    return keys[sub], refs[sub]


def unique_pairs(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(u) == 0:
        return u, v
    order = np.lexsort((v, u))
    u, v = u[order], v[order]
    first = np.concatenate(([True], (u[1:] != u[:-1]) | (v[1:] != v[:-1])))
    return u[first], v[first]
