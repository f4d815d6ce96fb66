"""The COMPLETE record: what verifies, what is refused, fallback to the previous tag, pruning, RNG state."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.errors import CheckpointError
from training.checkpoint import (
    RECORD_NAME,
    capture_rng_state,
    list_tags,
    load_checkpoint,
    prune_checkpoints,
    restore_rng_state,
    rng_file,
    select_resume_tag,
    tag_for_step,
    upload_checkpoint,
    verify_tag,
    write_complete_record,
)
from training.resume import DATASET_CHANGE, ResumeState


def make_tag(root: Path, step: int, *, commit: bool = True) -> Path:
    """A tag folder shaped like DeepSpeed's (model states, per-rank optimizer shards, a nested file)."""
    tag_dir = root / tag_for_step(step)
    tag_dir.mkdir(parents=True)
    (tag_dir / "mp_rank_00_model_states.pt").write_bytes(f"model {step}".encode() * 100)
    for rank in range(2):
        (tag_dir / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(
            bytes([rank, step % 256]) * 50
        )
    (tag_dir / "sub").mkdir()
    (tag_dir / "sub" / "extra.bin").write_bytes(b"x" * 10)
    if commit:
        write_complete_record(tag_dir, step=step, meta={"dataset_id": "abc"})
    return tag_dir


def test_record_lists_every_file_and_verifies(tmp_path: Path) -> None:
    tag_dir = make_tag(tmp_path, 10)
    record = json.loads((tag_dir / RECORD_NAME).read_text())
    assert record["step"] == 10 and record["dataset_id"] == "abc"
    assert {f["path"] for f in record["files"]} == {
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "sub/extra.bin",
    }
    assert verify_tag(tag_dir)["tag"] == "step-00000010"
    assert not list(tag_dir.glob("*.tmp"))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink(), "missing"),
        (lambda d: (d / "mp_rank_00_model_states.pt").write_bytes(b"short"), "bytes, record says"),
        (lambda d: _flip_byte(d / "zero_pp_rank_0_mp_rank_00_optim_states.pt"), "does not match its sha256"),
        (lambda d: (d / "evil.pt").write_bytes(b"not listed"), "files not in the record"),
        (lambda d: (d / RECORD_NAME).unlink(), "no COMPLETE.json"),
        (lambda d: (d / RECORD_NAME).write_text("{not json"), "unreadable record"),
    ],
)
def test_damaged_tags_are_refused(tmp_path: Path, damage, message: str) -> None:
    tag_dir = make_tag(tmp_path, 5)
    damage(tag_dir)
    with pytest.raises(CheckpointError, match=message):
        verify_tag(tag_dir)


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[7] ^= 0xFF
    path.write_bytes(bytes(data))


def test_record_with_path_outside_the_tag_is_refused(tmp_path: Path) -> None:
    tag_dir = make_tag(tmp_path, 3)
    record = json.loads((tag_dir / RECORD_NAME).read_text())
    record["files"].append({"path": "../../etc/passwd", "size": 1, "sha256": "0" * 64})
    (tag_dir / RECORD_NAME).write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="outside the tag"):
        verify_tag(tag_dir)


def test_resume_falls_back_past_torn_and_corrupt_tags(tmp_path: Path, caplog) -> None:
    make_tag(tmp_path, 10)
    make_tag(tmp_path, 20)
    _flip_byte(tmp_path / tag_for_step(20) / "mp_rank_00_model_states.pt")
    make_tag(tmp_path, 30, commit=False)  # a save killed before the commit
    (tmp_path / "latest").write_text(tag_for_step(30))  # DeepSpeed's pointer is never trusted
    (tmp_path / "zero_to_fp32.py").write_text("# not a tag")
    assert list_tags(tmp_path) == [tag_for_step(30), tag_for_step(20), tag_for_step(10)]
    with caplog.at_level("WARNING"):
        assert select_resume_tag(tmp_path) == tag_for_step(10)
    assert (
        "skipping checkpoint step-00000030" in caplog.text
        and "skipping checkpoint step-00000020" in caplog.text
    )
    assert select_resume_tag(tmp_path / "nothing-here") is None


def test_prune_keeps_the_newest_complete_tags(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        make_tag(tmp_path, step)
    make_tag(tmp_path, 15, commit=False)  # torn and older than what is kept: removed
    make_tag(tmp_path, 50, commit=False)  # torn and newest: left for the next save of step 50 to replace
    removed = prune_checkpoints(tmp_path, keep_last=2)
    assert set(removed) == {tag_for_step(s) for s in (10, 15, 20)}
    assert list_tags(tmp_path) == [tag_for_step(s) for s in (50, 40, 30)]
    assert prune_checkpoints(tmp_path, keep_last=2) == []


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    path = tmp_path / "rng.pt"
    torch.save(capture_rng_state(), path)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng_state(torch.load(path, weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_upload_copies_a_verified_tag_record_last(tmp_path: Path) -> None:
    from pipeline.storage import open_store

    tag_dir = make_tag(tmp_path / "ckpt", 7)
    store = open_store(str(tmp_path / "store"), None)
    assert upload_checkpoint(tag_dir, store, prefix="runs/a") == 5
    keys = [info.key for info in store.list("runs/a")]
    assert f"runs/a/{tag_dir.name}/{RECORD_NAME}" in keys
    assert store.get_bytes(f"runs/a/{tag_dir.name}/sub/extra.bin") == b"x" * 10
    _flip_byte(tag_dir / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointError):
        upload_checkpoint(tag_dir, store)  # a damaged tag is never published


class FakeEngine:
    """Stands in for a DeepSpeed engine in a single process: records what it was asked to load."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, str]] = []
        self.client_state: dict = {"step": 4}

    def load_checkpoint(self, load_dir: str, tag: str, **_: object) -> tuple[str, dict]:
        self.loaded.append((load_dir, tag))
        return f"{load_dir}/{tag}", self.client_state


def expected_state(**changes: object) -> ResumeState:
    base = {
        "dataset_id": "d",
        "tokenizer_sha256": "t",
        "seed": 1,
        "shuffle": True,
        "seq_len": 64,
        "samples_per_epoch": 100,
        "world_size": 1,
        "micro_batch": 4,
        "grad_accum": 1,
    }
    return ResumeState(**{**base, **changes})  # type: ignore[arg-type]


def committed_tag(root: Path, step: int, meta: dict) -> Path:
    tag_dir = root / tag_for_step(step)
    tag_dir.mkdir()
    torch.save(capture_rng_state(), rng_file(tag_dir, 0))
    write_complete_record(tag_dir, step=step, meta=meta)
    return tag_dir


def test_another_dataset_is_refused_unless_allowed(tmp_path: Path) -> None:
    """A record from before resume states were saved: its dataset id is still checked."""
    tag_dir = committed_tag(tmp_path, 4, {"dataset_id": "old-data"})
    engine = FakeEngine()
    with pytest.raises(CheckpointError, match="--allow-dataset-change"):
        load_checkpoint(engine, tmp_path, expected=expected_state(dataset_id="new-data"))
    assert engine.loaded == []  # refused before anything was unpickled
    state, record, decision = load_checkpoint(
        engine, tmp_path, expected=expected_state(dataset_id="new-data"), allowed=DATASET_CHANGE
    )
    assert state == {"step": 4} and record["dataset_id"] == "old-data" and not decision.continue_order
    assert engine.loaded == [(str(tmp_path), tag_dir.name)]
    assert load_checkpoint(engine, tmp_path / "empty", expected=expected_state()) is None


def test_a_changed_seed_or_seq_len_is_refused_before_loading(tmp_path: Path) -> None:
    saved = expected_state(epoch=0, consumed_in_epoch=48).to_dict()
    committed_tag(tmp_path, 12, {"dataset_id": "d", "resume_state": saved})
    engine = FakeEngine()
    for changes, named in (({"seed": 2}, "seed 1 -> 2"), ({"seq_len": 32}, "seq_len 64 -> 32")):
        with pytest.raises(CheckpointError, match=f"{named}.*--allow-change {next(iter(changes))}"):
            load_checkpoint(engine, tmp_path, expected=expected_state(**changes))
    assert engine.loaded == []
    engine.client_state = {"step": 12, "resume_state": saved}
    _state, _record, decision = load_checkpoint(engine, tmp_path, expected=expected_state())
    assert decision.continue_order


def test_client_state_must_agree_with_the_record(tmp_path: Path) -> None:
    saved = expected_state().to_dict()
    committed_tag(tmp_path, 2, {"dataset_id": "d", "resume_state": saved})
    engine = FakeEngine()
    engine.client_state = {"step": 2, "resume_state": {**saved, "seed": 99}}
    with pytest.raises(CheckpointError, match="differs from the COMPLETE record"):
        load_checkpoint(engine, tmp_path, expected=expected_state())


def test_zero_shards_of_another_world_size_are_refused_before_loading(tmp_path: Path) -> None:
    tag_dir = tmp_path / tag_for_step(6)
    tag_dir.mkdir()
    write_complete_record(tag_dir, step=6, meta={"dataset_id": "d", "world_size": 2, "zero_stage": 2})
    engine = FakeEngine()
    with pytest.raises(CheckpointError, match="optimizer shards of 2 ranks and this job has 1"):
        load_checkpoint(engine, tmp_path, expected=expected_state())
    assert engine.loaded == []


def test_deepspeeds_latest_only_ever_names_a_committed_tag(tmp_path: Path) -> None:
    from training.checkpoint import write_latest

    make_tag(tmp_path, 10)
    make_tag(tmp_path, 20, commit=False)
    with pytest.raises(CheckpointError, match="never name an uncommitted tag"):
        write_latest(tmp_path, tag_for_step(20))
    assert not (tmp_path / "latest").exists()
    write_latest(tmp_path, tag_for_step(10))
    assert (tmp_path / "latest").read_text() == tag_for_step(10)
    assert select_resume_tag(tmp_path) == tag_for_step(10)
