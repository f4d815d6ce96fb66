"""Tokenizer training runs in a process of its own, which gives the tokenizer training here would give, and its
CPU counts as the step's work."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flows.build.context import BuildContext
from flows.build.tokenizer_process import train_in_child
from pipeline.corpus_config import load_corpus_config
from pipeline.records import write_part
from pipeline.storage import FileStore
from pipeline.tokenize import run_train_tokenizer, sample_record_key
from pipeline.units import StageStats
from tests.fixtures.tiny_dataset import make_records


def test_training_in_a_child_process_gives_the_same_tokenizer(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    for i in range(4):
        write_part(store, "docs", i, make_records(30, seed=i), StageStats(stage="clean", bytes_out=30_000))
    cfg = load_corpus_config(inputs=["unused"], output=str(tmp_path / "store"), name="t")
    cfg_dict = cfg.to_dict()
    cfg_dict["tokenize"]["vocab_size"] = 400
    ctx = BuildContext(store_uri=store.uri, work="work/x", config=cfg_dict).to_json()

    measured: dict = {}
    sha = train_in_child(ctx, "docs", 4, "child.json", None, 2, measured)
    here = run_train_tokenizer(store, "docs", 4, "here.json", BuildContext(**ctx).cfg.tokenize, None)
    assert sha == here  # byte for byte: the dataset's token ids do not depend on where it trained
    assert store.get_bytes("child.json") == store.get_bytes("here.json")
    child_record = json.loads(store.get_bytes(sample_record_key("child.json")))
    assert child_record == json.loads(store.get_bytes(sample_record_key("here.json")))
    assert measured["child_pid"] != os.getpid() and measured["child_cpu_s"] > 0


def test_a_failed_training_names_the_step(tmp_path: Path) -> None:
    from pipeline.errors import StageFailed

    store = FileStore(tmp_path / "store")
    cfg = load_corpus_config(inputs=["unused"], output=str(tmp_path / "store"), name="t")
    ctx = BuildContext(store_uri=store.uri, work="work/x", config=cfg.to_dict()).to_json()
    with pytest.raises(StageFailed, match="stage 'train-tokenizer' failed in its training process"):
        train_in_child(ctx, "missing", 2, "tok.json", [10, 10], 1, {})
