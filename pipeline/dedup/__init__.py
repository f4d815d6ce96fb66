"""Deduplication: exact (``pipeline.dedup.exact``: a hash of the cleaned text) and near-duplicate
(MinHash + LSH: ``minhash``, ``lsh``, ``clusters``, ``near``). Each is split into steps that hand off through
files (per-part hashes or signatures -> one global decision -> a per-part filter)."""
