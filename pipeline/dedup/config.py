"""The dedup configs: exact (on or off) and near (MinHash LSH: threshold, permutations, shingles, memory)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pipeline.dedup.lsh import optimal_params
from pipeline.dedup.minhash import HASHES, SCHEMES, SHINGLES, MinHasher


@dataclass(frozen=True, kw_only=True)
class ExactDedupConfig:
    enabled: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"ExactDedupConfig.enabled must be a bool, got {self.enabled!r}")


@dataclass(frozen=True, kw_only=True)
class NearDedupConfig:
    """MinHash LSH near-dedup. Signatures equal ``datasketch.MinHash(num_perm, seed, hashfunc, scheme)``."""

    enabled: bool = True
    threshold: float = 0.8
    num_perm: int = 128
    seed: int = 1
    ngram: int = 5
    shingle: str = "word"  # "char" for CJK text (use ngram ~5 characters)
    hash: str = "xxh64"  # "sha1": datasketch's default hash, bit-identical to MinHash() but ~4x slower
    scheme: str = "affine32"  # datasketch >= 2.0 default; "legacy" for sketches of datasketch < 2.0
    fp_weight: float = 0.5
    fn_weight: float = 0.5
    verify: bool = True  # keep only candidate pairs whose estimated Jaccard >= threshold
    # Memory of one LSH bucket partition in a worker (the edges step): the partitions multiply until each
    # fits, so a worker's peak does not grow with the corpus. Files: parts x partitions; on S3 with tens of
    # thousands of parts, a larger budget means fewer, larger objects.
    memory_budget_mb: int = 256
    bucket_window: int = 64
    max_clusters_in_report: int = 20
    pair_samples: int = 20
    batch_docs: int = 2048
    index_uri: str | None = None

    def __post_init__(self) -> None:
        checks = {
            "threshold": 0.0 < self.threshold <= 1.0,
            "num_perm": 2 <= self.num_perm <= 1024,
            "ngram": 1 <= self.ngram <= 64,
            "shingle": self.shingle in SHINGLES,
            "hash": self.hash in HASHES,
            "scheme": self.scheme in SCHEMES,
            "fp_weight": 0.0 <= self.fp_weight <= 1.0 and abs(self.fp_weight + self.fn_weight - 1.0) < 1e-9,
            "fn_weight": 0.0 <= self.fn_weight <= 1.0,
            "memory_budget_mb": self.memory_budget_mb >= 16,
            "bucket_window": self.bucket_window >= 1,
            "max_clusters_in_report": self.max_clusters_in_report >= 0,
            "pair_samples": self.pair_samples >= 0,
            "batch_docs": self.batch_docs >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"NearDedupConfig: invalid {bad[0]}={getattr(self, bad[0])!r} (threshold in (0,1], num_perm "
                f"2..1024, shingle {SHINGLES}, hash {HASHES}, scheme {SCHEMES}, fp_weight+fn_weight == 1, "
                "memory_budget_mb >= 16)"
            )

    def hasher(self) -> MinHasher:
        return MinHasher(
            num_perm=self.num_perm,
            seed=self.seed,
            ngram=self.ngram,
            shingle=self.shingle,
            hash=self.hash,
            scheme=self.scheme,
        )

    def bands(self) -> tuple[int, int]:
        return optimal_params(self.threshold, self.num_perm, self.fp_weight, self.fn_weight)

    def signature_params(self) -> dict[str, Any]:
        """What must match for two signature sets to be comparable (checked against a persisted index)."""
        keys = ("num_perm", "seed", "ngram", "shingle", "hash", "scheme")
        return {k: v for k, v in asdict(self).items() if k in keys}
