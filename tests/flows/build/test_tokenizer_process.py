"""Tokenizer training runs in a process of its own (a fork of a local pool worker, else a fresh interpreter) or,
a small sample on the flow's one worker, in the flow's process: the same tokenizer every way, its CPU counted as
the step's work, a failure naming the step."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from flows.build import steps
from flows.build.context import BuildContext
from flows.build.tokenizer_process import (
    IN_PROCESS_SAMPLE_BYTES,
    train_in_child,
    training_args,
    where_to_train,
)
from flows.runtime import profile
from flows.runtime.pool import in_pool_worker, run_captured, start_pool
from pipeline.corpus_config import load_corpus_config
from pipeline.errors import StageFailed
from pipeline.records import write_part
from pipeline.storage import FileStore
from pipeline.storage.retry import STATS
from pipeline.tokenize.stage import TokenizeConfig, run_train_tokenizer
from pipeline.units.protocol import StageStats
from tests.fixtures.tiny_dataset import make_records

PARTS = 4
MiB = 1024 * 1024


def build_ctx(tmp_path: Path, write: bool = True) -> dict[str, Any]:
    """A build context over ``PARTS`` small parts of mixed text (a 400-token vocabulary: quick to train)."""
    store = FileStore(tmp_path / "store")
    for i in range(PARTS if write else 0):
        write_part(store, "docs", i, make_records(30, seed=i), StageStats(stage="clean", bytes_out=30_000))
    cfg = load_corpus_config(inputs=["unused"], output=str(tmp_path / "store"), name="t").to_dict()
    cfg["tokenize"]["vocab_size"] = 400
    # the trainer that runs in a process of its own (the counts trainer trains where its step runs)
    cfg["tokenize"]["trainer"] = "hf"
    return BuildContext(store_uri=store.uri, work="work/x", config=cfg).to_json()


def reference(tmp_path: Path, ctx: dict[str, Any]) -> bytes:
    """The tokenizer trained by the library call, in this process."""
    store = FileStore(tmp_path / "store")
    run_train_tokenizer(store, "docs", PARTS, "here.json", BuildContext(**ctx).cfg.tokenize, None)
    return store.get_bytes("here.json")


def trained(tmp_path: Path, result: dict[str, Any]) -> bytes:
    return FileStore(tmp_path / "store").get_bytes(result["key"])


def train_after_s3_calls(args: tuple[Any, ...]) -> dict[str, Any]:
    """In a pool worker: the step, after 5 S3 calls of the worker's own (its child must not report them)."""
    for _ in range(5):
        STATS.record()
    return run_captured(steps.train_tokenizer, args)


@pytest.fixture(scope="module")
def pool():
    with start_pool(2) as workers:
        yield workers.executor  # plain calls, as the test bodies make them


def test_a_fresh_interpreter_gives_the_same_tokenizer(tmp_path: Path) -> None:
    ctx = build_ctx(tmp_path)
    measured: dict[str, Any] = {}
    train_in_child(training_args(ctx, "docs", PARTS, "child.json", None), 2, measured)
    store = FileStore(tmp_path / "store")
    assert store.get_bytes("child.json") == reference(tmp_path, ctx)  # the dataset id does not change
    assert measured["child_pid"] != os.getpid() and measured["child_cpu_s"] > 0
    assert measured["child_start"] == "exec"


def test_a_pool_worker_trains_in_a_fork_of_itself(tmp_path: Path, pool: Any) -> None:
    ctx = build_ctx(tmp_path)
    out = pool.submit(train_after_s3_calls, (ctx, "docs", PARTS, [], [30_000] * PARTS, 2)).result()
    [record] = [r for r in out["profile"] if r["step"] == "train-tokenizer"]
    assert trained(tmp_path, out["result"]) == reference(tmp_path, ctx)
    assert record["child_start"] == "fork"
    assert record["child_pid"] not in (record["pid"], os.getpid()) and record["pid"] != os.getpid()
    assert record["cpu_s"] > 0  # the training's CPU, counted as the step's work
    assert record["child_storage"]["attempts"] == 0  # a local store: none, and the worker's not counted again
    assert record.get("storage", {}).get("attempts", 0) == 0
    assert pool.submit(in_pool_worker).result() and not in_pool_worker()


def test_one_in_process_worker_trains_a_small_sample_here(tmp_path: Path) -> None:
    ctx = build_ctx(tmp_path)
    start = len(profile.LOCAL_RECORDS)
    result = steps.train_tokenizer(ctx, "docs", PARTS, [], [30_000] * PARTS, 1, True)
    records, profile.LOCAL_RECORDS[start:] = profile.LOCAL_RECORDS[start:], []
    [record] = [r for r in records if r["step"] == "train-tokenizer"]
    assert trained(tmp_path, result) == reference(tmp_path, ctx)
    assert record["pid"] == os.getpid() and "child_pid" not in record and record["cpu_s"] > 0


def test_only_a_small_sample_at_one_in_process_worker_trains_here() -> None:
    cfg = TokenizeConfig(train_sample_bytes=256 * MiB)
    small, large = [16 * MiB] * 4, [64 * MiB] * 8  # 64 MiB in all; 256 MiB sampled of 512
    assert where_to_train(cfg, 4, small, in_process=True) == "here"
    assert where_to_train(cfg, 8, large, in_process=True) == "exec"
    assert where_to_train(cfg, 4, small, in_process=False) == "exec"  # not a worker: a fresh interpreter
    assert where_to_train(cfg, 4, None, in_process=True) == "exec"  # sizes unknown: maybe large
    assert where_to_train(cfg, 5, small, in_process=True) == "exec"  # sizes not of every part
    # the sample, not the corpus, decides: 3 parts (48 MiB) of a 1 GiB corpus train here
    assert where_to_train(TokenizeConfig(train_sample_bytes=32 * MiB), 64, [16 * MiB] * 64, True) == "here"
    assert sum(small) == IN_PROCESS_SAMPLE_BYTES


def test_a_failed_training_names_the_step_every_way(tmp_path: Path, pool: Any) -> None:
    ctx = build_ctx(tmp_path, write=False)
    cause = "UnitNotDone: .*missing/part-00000 has no .done marker"
    in_child = f"stage 'train-tokenizer' failed in its training process \\(exit 1\\): (.|\n)*{cause}"
    with pytest.raises(StageFailed, match=in_child):
        train_in_child(training_args(ctx, "missing", 2, "tok.json", [10, 10]), 1, {})
    out = pool.submit(run_captured, steps.train_tokenizer, (ctx, "missing", 2, [], [10, 10], 1)).result()
    with pytest.raises(StageFailed, match=in_child):
        raise out["error"][0]
    with pytest.raises(StageFailed, match=f"stage 'train-tokenizer' failed: {cause}"):
        steps.train_tokenizer(ctx, "missing", 2, [], [10, 10], 1, True)
