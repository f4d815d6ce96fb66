"""Deduplication: exact (``exact``: a hash of the cleaned text) and near-duplicate (MinHash LSH). Configs in
``config``; the near steps hand off through files: ``signatures`` -> ``candidates`` (plan, bands, edges) ->
``clusters`` (over ``graph``, reported by ``audit``) -> the filter in ``near``, which also runs them in order.
The arithmetic lives in ``minhash`` and ``lsh``."""
