"""Lineage: which shards and documents an optimizer step trained on.

The data order is a pure function of (dataset, seq_len, seed, world size, micro batch, grad accumulation): the
sampler's epoch permutation is a seeded bijection and the trainer consumes it in contiguous global blocks
(``training.sampler``). So a step's samples are recomputed, not logged: walk the micro batches from the run's
start (or from the last metrics record that carries a data position), the way ``training.train.batch_stream``
does, then map each sample to shard token ranges and to the documents in each shard's ``docs.parquet``.

Assumption, stated in the output: the world size and batch shape recorded in the checkpoint held for the whole
run. A run resumed with another world size is traced exactly from the first metrics record after the change
when those records carry ``epoch``/``consumed_in_epoch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.dataset.manifest import load_manifest
from pipeline.storage import S3Options
from training.blend import SourceSamples, blend_sources, epoch_order
from training.cache import ShardCache
from training.checkpoint import read_record
from training.data import ShardDataset
from training.generate import resolve_tag_dir
from training.metrics import read_metrics


@dataclass(frozen=True, kw_only=True)
class DataShape:
    n: int  # samples per epoch in the train split
    world: int
    micro_batch: int
    grad_accum: int
    seed: int


def micro_batch_positions(shape: DataShape, epoch: int, consumed: int) -> tuple[int, int, np.ndarray]:
    """The next micro batch from (epoch, consumed-in-epoch): (epoch, start, positions[world, micro]).

    An epoch ends when a rank cannot fill a whole micro batch (the loader drops the partial last batch).
    """
    if (shape.n - consumed) // shape.world < shape.micro_batch:
        epoch, consumed = epoch + 1, 0
        if shape.n // shape.world < shape.micro_batch:
            raise ValueError(f"{shape.n} samples cannot fill one micro batch on {shape.world} ranks")
    b = np.arange(shape.micro_batch, dtype=np.int64)[None, :]
    r = np.arange(shape.world, dtype=np.int64)[:, None]
    return epoch, consumed, consumed + b * shape.world + r


def step_samples(
    shape: DataShape,
    step: int,
    start: tuple[int, int, int] = (0, 0, 0),
    sources: list[SourceSamples] | None = None,
) -> list[dict[str, Any]]:
    """Samples of optimizer step ``step`` (1-based), walking forward from ``start`` = (step, epoch, consumed)
    reached after that step. Returns one entry per micro batch: epoch, positions and dataset indices."""
    done, epoch, consumed = start
    if step <= done:
        raise ValueError(f"step {step} is not after the starting point (step {done})")
    per_micro = shape.world * shape.micro_batch
    for _ in range((step - 1 - done) * shape.grad_accum):
        epoch, consumed, _pos = micro_batch_positions(shape, epoch, consumed)
        consumed += per_micro
    out = []
    for a in range(shape.grad_accum):
        epoch, consumed, pos = micro_batch_positions(shape, epoch, consumed)
        perm = epoch_order(sources or [], shape.n, seed=shape.seed, epoch=epoch)
        out.append({"micro_batch": a, "epoch": epoch, "positions": pos, "samples": perm(pos)})
        consumed += per_micro
    return out


def _start_from_metrics(output_dir: Path, step: int) -> tuple[int, int, int]:
    best = (0, 0, 0)
    for rec in read_metrics(output_dir, "train"):
        s = int(rec.get("step", 0))
        if s < step and "epoch" in rec and "consumed_in_epoch" in rec:
            best = max(best, (s, int(rec["epoch"]), int(rec["consumed_in_epoch"])))
    return best


def check_step_in_checkpoint(step: int, trained: int, tag_dir: str | Path) -> None:
    """A step the checkpoint has not reached was never trained: its samples would be a guess, so refuse it."""
    if not 1 <= step <= trained:
        raise ValueError(
            f"step {step} is not in checkpoint {tag_dir}, which has trained steps 1..{trained}; "
            f"trace a step in that range (or pass a later checkpoint)"
        )


def trace_step(
    checkpoint: str | Path,
    step: int,
    *,
    s3: S3Options,
    manifest_uri: str | None = None,
    max_docs: int = 50,
    input_root: str | None = None,
) -> dict[str, Any]:
    """Shards and documents that optimizer step ``step`` trained on, for the run that wrote ``checkpoint``. Each
    document's ``uri`` is its input's, where the dataset's build read it, or under ``input_root`` (moved since)."""
    tag_dir = resolve_tag_dir(checkpoint)
    record = read_record(tag_dir)
    check_step_in_checkpoint(step, int(record["step"]), tag_dir)
    cfg = record["train_config"]
    manifest, store = load_manifest(manifest_uri or record["manifest_uri"], s3)
    if manifest.dataset_id != record["dataset_id"]:
        raise ValueError(
            f"manifest {manifest.dataset_id} is not the checkpoint's dataset {record['dataset_id']}"
        )
    output_dir = tag_dir.parent.parent
    cache = ShardCache(
        store, Path(cfg.get("cache_dir") or output_dir / "shard-cache"), int(cfg["cache_max_bytes"])
    )
    dataset = ShardDataset(manifest, store, int(cfg["seq_len"]), "train", cache)
    world = int(record["world_size"])
    micro = int(cfg["micro_batch_size"])
    accum = _grad_accum(cfg, world)
    shape = DataShape(n=len(dataset), world=world, micro_batch=micro, grad_accum=accum, seed=int(cfg["seed"]))
    blend = blend_sources(manifest.mixture, int(cfg["seq_len"]), bool(cfg.get("blend", True)))
    batches = step_samples(shape, step, _start_from_metrics(output_dir, step), blend)
    samples = np.concatenate([b["samples"].reshape(-1) for b in batches])
    docs: dict[str, dict[str, Any]] = {}
    per_source: dict[str, int] = {}
    for i in samples.tolist():
        for piece in dataset.documents_of_sample(int(i)):
            entry = docs.setdefault(
                piece["doc_id"], {k: piece.get(k) for k in ("doc_id", "source", "location", "source_name")}
            )
            entry.setdefault("uri", manifest.input_uri(str(piece.get("source") or ""), input_root))
            entry["tokens"] = entry.get("tokens", 0) + int(piece["end"] - piece["start"])
            name = piece.get("source_name") or "default"
            per_source[name] = per_source.get(name, 0) + int(piece["end"] - piece["start"])
    shards = sorted(
        {
            manifest.split_shards("train")[k].key
            for i in samples.tolist()
            for k, _, _ in dataset.sample_to_shards(int(i))
        }
    )
    dataset.close()
    return {
        "checkpoint": str(tag_dir),
        "dataset_id": manifest.dataset_id,
        "prefect_flow_run_id": (record.get("lineage") or {}).get("prefect_flow_run_id"),
        "dataset_flow_run_id": manifest.lineage.get("prefect_flow_run_id"),
        "step": step,
        "epochs": sorted({b["epoch"] for b in batches}),
        "world_size": world,
        "samples": samples.tolist(),
        "shards": shards,
        "documents": sorted(docs.values(), key=lambda d: -d["tokens"])[:max_docs],
        "documents_total": len(docs),
        "source_tokens": dict(sorted(per_source.items())),
        "assumes": "world size and batch shape of the checkpoint held since the last recorded data position",
    }


def _grad_accum(cfg: dict[str, Any], world: int) -> int:
    if cfg.get("grad_accum_steps"):
        return int(cfg["grad_accum_steps"])
    if cfg.get("global_batch_size"):
        return int(cfg["global_batch_size"]) // (int(cfg["micro_batch_size"]) * world)
    return 1
