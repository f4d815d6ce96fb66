"""Loss and perplexity of a checkpoint on the valid split of a dataset or on a user's JSONL file.

The data is cut the way training cuts it: one token stream (documents each ending in EOS), windows of
``seq_len + 1`` tokens, window ``i`` = tokens ``[i*L, i*L + L + 1)``. The loss is the mean next-token
cross-entropy over every predicted token (token-weighted, not a mean of batch means) and the perplexity its
exponential, so two checkpoints evaluated on the same data and ``seq_len`` compare directly.

* no ``data``: the valid split of the dataset the checkpoint was trained on (its record's manifest URI);
* a manifest URI, dataset folder or ``datasets/<name>``: that dataset's valid split; its tokenizer must be the
  checkpoint's (ids of another tokenizer mean nothing to the model);
* ``tokens``: a user's documents already encoded as one stream (each ending in EOS): ``flows.train.evaluate`` encodes
  a ``.jsonl`` file with the pipeline's tokenize stage and the checkpoint's tokenizer, then calls this.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.dataset.manifest import load_manifest
from pipeline.storage import S3Options, sha256_bytes
from training.cache import ShardCache
from training.data import ShardDataset
from training.generate import load_model
from training.model import GPT

EVAL_CACHE_BYTES = 4 * 2**30


def stream_windows(stream: np.ndarray, seq_len: int) -> Iterator[np.ndarray]:
    """Training's windows over a token stream; a stream shorter than one window is one shorter window."""
    count = (len(stream) - 1) // seq_len
    if count == 0 and len(stream) >= 2:
        yield stream
    for i in range(count):
        yield stream[i * seq_len : i * seq_len + seq_len + 1]


@torch.no_grad()
def _loss_sums(model: GPT, windows: Iterator[np.ndarray], batch_size: int, max_samples: int | None) -> tuple:
    total, tokens, samples = 0.0, 0, 0
    batch: list[np.ndarray] = []
    device = next(model.parameters()).device

    def flush() -> None:
        nonlocal total, tokens
        x = torch.from_numpy(np.stack(batch)).long().to(device)
        logits = model(x[:, :-1]).float()
        total += float(
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        )
        tokens += int(x[:, 1:].numel())
        batch.clear()

    for window in windows:
        if max_samples is not None and samples >= max_samples:
            break
        if batch and len(window) != len(batch[0]):
            flush()
        batch.append(window)
        samples += 1
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    return total, tokens, samples


def evaluate_checkpoint(
    checkpoint: str | Path,
    data: str | None = None,
    *,
    tokens: np.ndarray | None = None,
    s3: S3Options | None = None,
    seq_len: int | None = None,
    batch_size: int = 8,
    max_samples: int | None = None,
) -> dict[str, Any]:
    """Loss and perplexity of the checkpoint's model (see the module docstring) as a JSON dict.

    ``data``: a manifest URI / dataset folder (its valid split; default: the checkpoint's own dataset), or,
    with ``tokens``, only the name of where those tokens came from."""
    if batch_size < 1 or (max_samples is not None and max_samples < 1):
        raise ValueError("batch_size and max_samples must be >= 1")
    model, record, tag_dir = load_model(checkpoint)
    model.to("cuda" if torch.cuda.is_available() else "cpu")  # an ablation on a GPU evaluates there too
    seq_len = seq_len or int(record.get("train_config", {}).get("seq_len") or model.cfg.max_seq_len)
    if not 1 <= seq_len <= model.cfg.max_seq_len:
        raise ValueError(f"seq_len must lie in [1, {model.cfg.max_seq_len}] for this model; got {seq_len}")
    result: dict[str, Any] = {"checkpoint": str(tag_dir), "step": record["step"], "seq_len": seq_len}
    with tempfile.TemporaryDirectory(prefix="pileworks-eval-") as cache_dir:
        if tokens is not None:
            windows: Iterator[np.ndarray] = stream_windows(np.asarray(tokens, dtype=np.int64), seq_len)
            result.update(data=data, dataset_id=None, split=None)
        else:
            windows, info = _valid_windows(data or record["manifest_uri"], tag_dir, seq_len, cache_dir, s3)
            result.update(info)
        total, counted, samples = _loss_sums(model, windows, batch_size, max_samples)
    if counted == 0:
        raise ValueError(f"{result['data']}: no window of at least 2 tokens to evaluate")
    loss = total / counted
    result.update(samples=samples, tokens=counted, loss=loss, perplexity=math.exp(min(loss, 700.0)))
    return result


def _valid_windows(
    data: str, tag_dir: Path, seq_len: int, cache_dir: str, s3: S3Options | None
) -> tuple[Iterator[np.ndarray], dict]:
    manifest, store = load_manifest(data, s3)
    own = sha256_bytes((tag_dir / "tokenizer.json").read_bytes())
    if manifest.tokenizer.sha256 != own:
        raise ValueError(
            f"dataset {manifest.dataset_id} uses another tokenizer (sha256 {manifest.tokenizer.sha256[:12]}) "
            f"than checkpoint {tag_dir.name} ({own[:12]}): its token ids mean nothing to this model"
        )
    ds = ShardDataset(manifest, store, seq_len, "valid", ShardCache(store, cache_dir, EVAL_CACHE_BYTES))

    def windows() -> Iterator[np.ndarray]:
        for i in range(len(ds)):
            item = ds[i]
            yield torch.cat([item["input_ids"], item["labels"][-1:]]).numpy()

    info = {"data": store.uri_of("manifest.json"), "dataset_id": manifest.dataset_id, "split": "valid"}
    return windows(), info
