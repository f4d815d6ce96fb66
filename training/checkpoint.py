"""Checkpoints whose commit we own: DeepSpeed writes the files, a verified ``COMPLETE.json`` makes them real.

DeepSpeed's own ``latest`` file is written by rank 0 without waiting for the other ranks, so a rank killed
mid-save leaves it naming a torn checkpoint. Here every rank writes its files under ``<dir>/<tag>/``, then after
a barrier rank 0 writes ``<tag>/COMPLETE.json`` listing every file with its size and sha256 (temp file, fsync,
rename), and only then ``<dir>/latest`` (for DeepSpeed's tools: ``zero_to_fp32.py``, ``load_checkpoint(dir)``).
Resume never reads ``latest``: it takes the newest tag whose record verifies and falls back to the one before.
Files are re-hashed before anything is unpickled, and unpickled weights-only (:mod:`training.safe_load`): the
record catches corruption, the restricted loader catches tampering. The record also carries what resume must
check before loading (dataset id, sampler state) and what sampling needs without unpickling (the model config).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.errors import CheckpointError
from training.resume import ResumeDecision, ResumeState, check_resume
from training.safe_load import safe_load

logger = logging.getLogger(__name__)

RECORD_NAME = "COMPLETE.json"
LATEST_NAME = "latest"  # DeepSpeed's pointer: written after the commit for its tools, never read by resume
RECORD_FORMAT = "pileworks-checkpoint/1"
TAG_RE = re.compile(r"^step-(\d{8,})$")
# Test hook: "<step>:<rank>" makes that rank os._exit() after DeepSpeed wrote its files, before the commit.
CRASH_IN_SAVE_ENV = "PILEWORKS_TEST_EXIT_IN_SAVE"


def tag_for_step(step: int) -> str:
    return f"step-{step:08d}"


def step_of_tag(tag: str) -> int | None:
    match = TAG_RE.match(tag)
    return int(match.group(1)) if match else None


def list_tags(ckpt_dir: str | Path) -> list[str]:
    """Checkpoint tags in ``ckpt_dir``, newest (highest step) first; other entries are ignored."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    tags = [p.name for p in root.iterdir() if p.is_dir() and step_of_tag(p.name) is not None]
    return sorted(tags, key=lambda t: step_of_tag(t) or 0, reverse=True)


# ---------------------------------------------------------------- the COMPLETE record
def _hash_file(path: Path, *, sync: bool) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
        if sync:
            os.fsync(fh.fileno())  # the record must not outlive the data it vouches for
    return digest.hexdigest()


def _tag_files(tag_dir: Path) -> list[Path]:
    return sorted(
        p for p in tag_dir.rglob("*") if p.is_file() and p.name != RECORD_NAME and ".tmp" not in p.name
    )


def write_complete_record(tag_dir: str | Path, *, step: int, meta: Mapping[str, Any]) -> dict[str, Any]:
    """Hash (and fsync) every file of the tag, then atomically publish the record. Rank 0 only."""
    tag_dir = Path(tag_dir)
    files = [
        {
            "path": p.relative_to(tag_dir).as_posix(),
            "size": p.stat().st_size,
            "sha256": _hash_file(p, sync=True),
        }
        for p in _tag_files(tag_dir)
    ]
    record = {
        "format": RECORD_FORMAT,
        "tag": tag_dir.name,
        "step": step,
        "created_at": time.time(),
        **dict(meta),
        "files": files,
    }
    tmp = tag_dir / f"{RECORD_NAME}.tmp"
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, tag_dir / RECORD_NAME)
    dir_fd = os.open(tag_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return record


def write_latest(ckpt_dir: str | Path, tag: str) -> None:
    """Point DeepSpeed's ``latest`` at a committed tag (temp file + rename). Call only after the record."""
    if not (Path(ckpt_dir) / tag / RECORD_NAME).is_file():
        raise CheckpointError(
            f"{tag} has no {RECORD_NAME}: DeepSpeed's latest must never name an uncommitted tag"
        )
    tmp = Path(ckpt_dir) / f"{LATEST_NAME}.tmp"
    tmp.write_text(tag, encoding="utf-8")
    os.replace(tmp, Path(ckpt_dir) / LATEST_NAME)


def read_record(tag_dir: str | Path) -> dict[str, Any]:
    path = Path(tag_dir) / RECORD_NAME
    if not path.is_file():
        raise CheckpointError(f"{Path(tag_dir).name}: no {RECORD_NAME} (the save never committed)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable record ({exc})") from exc
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise CheckpointError(f"{path}: not a {RECORD_FORMAT} record")
    return record


def verify_tag(tag_dir: str | Path) -> dict[str, Any]:
    """The tag's record, once every listed file matches its size and sha256 and no unlisted file exists."""
    tag_dir = Path(tag_dir)
    record = read_record(tag_dir)
    listed = {}
    for entry in record.get("files", []):
        rel = str(entry["path"])
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise CheckpointError(f"{tag_dir.name}: record lists a path outside the tag: {rel!r}")
        listed[rel] = entry
    present = {p.relative_to(tag_dir).as_posix() for p in _tag_files(tag_dir)}
    if present - set(listed):
        raise CheckpointError(f"{tag_dir.name}: files not in the record: {sorted(present - set(listed))}")
    for rel, entry in listed.items():
        path = tag_dir / rel
        if not path.is_file():
            raise CheckpointError(f"{tag_dir.name}: {rel} is missing")
        if path.stat().st_size != entry["size"]:
            raise CheckpointError(
                f"{tag_dir.name}: {rel} has {path.stat().st_size} bytes, record says {entry['size']}"
            )
        if _hash_file(path, sync=False) != entry["sha256"]:
            raise CheckpointError(f"{tag_dir.name}: {rel} does not match its sha256")
    return record


def select_resume_tag(ckpt_dir: str | Path) -> str | None:
    """The newest tag whose record verifies; each rejected newer tag is logged with the reason."""
    for tag in list_tags(ckpt_dir):
        try:
            verify_tag(Path(ckpt_dir) / tag)
        except CheckpointError as exc:
            logger.warning("skipping checkpoint %s: %s; falling back to the one before", tag, exc)
            continue
        return tag
    return None


def prune_checkpoints(ckpt_dir: str | Path, keep_last: int) -> list[str]:
    """Keep the newest ``keep_last`` complete tags; delete every tag older than the oldest kept one."""
    complete = [t for t in list_tags(ckpt_dir) if (Path(ckpt_dir) / t / RECORD_NAME).is_file()]
    if len(complete) <= keep_last:
        return []
    oldest_kept = step_of_tag(complete[keep_last - 1]) or 0
    removed = [t for t in list_tags(ckpt_dir) if (step_of_tag(t) or 0) < oldest_kept]
    for tag in removed:
        shutil.rmtree(Path(ckpt_dir) / tag, ignore_errors=True)
    if removed:
        logger.info("removed old checkpoints %s (keep_last=%d)", ", ".join(removed), keep_last)
    return removed


# ---------------------------------------------------------------- RNG state, one file per rank
def capture_rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_file(tag_dir: Path, rank: int) -> Path:
    return tag_dir / f"rng-rank-{rank:05d}.pt"


# ---------------------------------------------------------------- save / load (collective)
def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _maybe_crash_in_save(step: int) -> None:
    spec = os.environ.get(CRASH_IN_SAVE_ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    at_step, at_rank = (int(x) for x in spec.split(":"))
    if step == at_step and _rank() == at_rank:
        logger.error("test hook %s: exiting in the middle of saving step %d", CRASH_IN_SAVE_ENV, step)
        logging.shutdown()
        os._exit(17)


def save_checkpoint(
    engine: Any,
    ckpt_dir: str | Path,
    *,
    step: int,
    client_state: Mapping[str, Any],
    meta: Mapping[str, Any],
    keep_last: int,
    extra_files: Mapping[str, bytes] | None = None,
) -> Path:
    """Collective: every rank calls it. Returns the tag folder once rank 0 has committed it.

    ``meta`` goes into the JSON record (readable without unpickling); ``extra_files`` (name -> bytes, e.g. the
    tokenizer) are written by rank 0 into the tag so a checkpoint is self-contained and covered by the record.
    """
    ckpt_dir = Path(ckpt_dir)
    tag = tag_for_step(step)
    tag_dir = ckpt_dir / tag
    if _rank() == 0 and tag_dir.exists():
        shutil.rmtree(tag_dir)  # a torn save of the same step from an earlier attempt: start clean
    _barrier()
    tag_dir.mkdir(parents=True, exist_ok=True)
    torch.save(capture_rng_state(), rng_file(tag_dir, _rank()))
    if _rank() == 0:
        for name, data in (extra_files or {}).items():
            (tag_dir / name).write_bytes(data)
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=dict(client_state), save_latest=False)
    _maybe_crash_in_save(step)
    _barrier()  # every rank's files are on disk before rank 0 vouches for them
    if _rank() == 0:
        write_complete_record(tag_dir, step=step, meta=meta)
        write_latest(ckpt_dir, tag)
        prune_checkpoints(ckpt_dir, keep_last)
    _barrier()
    return tag_dir


def _broadcast_tag(tag: str | None) -> str | None:
    if not dist.is_initialized():
        return tag
    box = [tag]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load_checkpoint(
    engine: Any, ckpt_dir: str | Path, *, expected: ResumeState, allowed: Collection[str] = ()
) -> tuple[dict[str, Any], dict[str, Any], ResumeDecision] | None:
    """Collective: restore the newest verified checkpoint; ``(client_state, record, decision)`` or None.

    Rank 0 picks the tag (verifying newest first) and broadcasts it; the first rank of every other node verifies
    it again, since nodes may see different disks. Before anything is unpickled, the record's resume state is
    compared with ``expected`` (:func:`training.resume.check_resume`): a difference not in ``allowed`` is refused.
    """
    tag = _broadcast_tag(select_resume_tag(ckpt_dir) if _rank() == 0 else None)
    if tag is None:
        return None
    tag_dir = Path(ckpt_dir) / tag
    record = verify_tag(tag_dir) if _rank() != 0 and os.environ.get("LOCAL_RANK", "0") == "0" else None
    record = record or read_record(tag_dir)
    decision = _check_record(record, expected, tag, allowed)
    _check_world_size(record, tag)
    _barrier()
    load_path, client_state = engine.load_checkpoint(
        str(ckpt_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if load_path is None:
        raise CheckpointError(f"DeepSpeed could not load verified checkpoint {tag_dir}")
    client_state = dict(client_state or {})
    if "resume_state" in record and client_state.get("resume_state") != record["resume_state"]:
        raise CheckpointError(f"{tag}: the client state's resume state differs from the COMPLETE record's")
    own_rng = rng_file(tag_dir, _rank())
    if own_rng.is_file():
        restore_rng_state(safe_load(own_rng))
    else:
        logger.warning(
            "%s has no RNG state for rank %d (world size changed); keeping the seeded RNG", tag, _rank()
        )
    logger.info("resumed from %s (step %s)", tag_dir, record["step"])
    return client_state, record, decision


def _check_record(
    record: Mapping[str, Any], expected: ResumeState, tag: str, allowed: Collection[str]
) -> ResumeDecision:
    """The resume check; a record from before resume states were saved is checked on its dataset id only."""
    if "resume_state" in record:
        saved = ResumeState.from_dict(record["resume_state"])
        return check_resume(saved, expected, tag=tag, allowed=allowed)
    if record.get("dataset_id") != expected.dataset_id:
        if "dataset_id" not in allowed:
            raise CheckpointError(
                f"checkpoint {tag} was trained on dataset {record.get('dataset_id')}, this run reads dataset "
                f"{expected.dataset_id}; pass --allow-dataset-change to continue training on the new data"
            )
        return ResumeDecision(continue_order=False, changed=("dataset_id",))
    logger.warning("checkpoint %s predates resume checks: only its dataset id was compared", tag)
    return ResumeDecision(continue_order=True, changed=())


def _check_world_size(record: Mapping[str, Any], tag: str) -> None:
    """DeepSpeed's ZeRO loader refuses another data-parallel size; say so before it fails mid-load."""
    saved, now = record.get("world_size"), dist.get_world_size() if dist.is_initialized() else 1
    if int(record.get("zero_stage", 0)) > 0 and saved is not None and saved != now:
        raise CheckpointError(
            f"checkpoint {tag} holds ZeRO-{record['zero_stage']} optimizer shards of {saved} ranks and this job "
            f"has {now}: DeepSpeed cannot re-partition them on load; resume with {saved} ranks, or convert the "
            "tag to a universal checkpoint (python -m deepspeed.checkpoint.ds_to_universal) and load that"
        )


def upload_checkpoint(tag_dir: str | Path, store: Any, prefix: str = "") -> int:
    """Copy a committed tag to an object store (pipeline.storage), the record last; returns files copied."""
    tag_dir = Path(tag_dir)
    record = verify_tag(tag_dir)
    base = f"{prefix.strip('/')}/{tag_dir.name}" if prefix.strip("/") else tag_dir.name
    for entry in record["files"]:
        store.put_file(f"{base}/{entry['path']}", tag_dir / entry["path"])
    store.put_file(f"{base}/{RECORD_NAME}", tag_dir / RECORD_NAME)
    return len(record["files"]) + 1
