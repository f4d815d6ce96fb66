"""Random-token shards in the published layout plus their manifest, for the loader and GPU benchmarks
(written without a tokenizer run; the tokenizer file is a placeholder)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.dataset.manifest import Manifest, TokenizerInfo
from pipeline.dataset.shards import ShardWriter, dtype_for_vocab, plan_shards
from pipeline.storage import FileStore, sha256_bytes


def build_random_dataset(
    root: Path, total_tokens: int, shard_tokens: int, vocab: int
) -> tuple[Manifest, FileStore]:
    dtype = dtype_for_vocab(vocab)
    writer = ShardWriter(root, "train", plan_shards(total_tokens, shard_tokens), dtype)
    rng = np.random.default_rng(0)
    doc_tokens = 1 << 20
    for d in range(0, total_tokens, doc_tokens):
        writer.add(
            f"bench://{d}", "bench://", str(d), rng.integers(0, vocab, min(doc_tokens, total_tokens - d))
        )
    shards = writer.close()
    tokenizer = b'{"bench": true}'
    (root / "tokenizer.json").write_bytes(tokenizer)
    manifest = Manifest(
        name="bench",
        tokenizer=TokenizerInfo(
            key="tokenizer.json", sha256=sha256_bytes(tokenizer), vocab_size=vocab, eos_id=0
        ),
        dtype=dtype.name,
        shards=shards,
    )
    manifest.validate()
    return manifest, FileStore(root)
