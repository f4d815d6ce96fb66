"""What the train flow makes of its ranks' output: the first failing rank's own line, and the progress row."""

from __future__ import annotations

from flows.train.flow import STEP_LINE, first_rank_error

TORCHRUN_BANNER = [
    "E1130 15:17:41.983000 8441 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2)",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "Root Cause (first observed failure):",
    "[0]:",
    "============================================================",
]


def test_the_first_failing_rank_s_error_line_wins_over_the_launcher_banner() -> None:
    lines = [
        "[Rank 0] INFO training.train: pid 1, rank 0 of 2",
        "[Rank 1] ERROR training.train: no dataset at file:///work/nope",
        "[Rank 0] ERROR training.train: no dataset at file:///work/nope (rank 0)",
        *TORCHRUN_BANNER,
    ]
    assert first_rank_error(lines) == "rank 1: no dataset at file:///work/nope"


def test_an_unexpected_exception_is_named_by_the_last_line_of_its_traceback() -> None:
    lines = [
        "[Rank 0] 2026-11-30 15:04:20,916 ERROR training.train: training failed",
        "[Rank 0] Traceback (most recent call last):",
        '[Rank 0]   File "training/data.py", line 10, in read',
        "[Rank 1] INFO training.train: step 3/6 loss 8.1",
        "[Rank 0] training.cache.ShardCorrupt: shard train/shard-00001.bin: sha256 mismatch; delete the cache",
        *TORCHRUN_BANNER,
    ]
    assert first_rank_error(lines) == (
        "rank 0: training.cache.ShardCorrupt: shard train/shard-00001.bin: sha256 mismatch; delete the cache"
    )


def test_no_rank_error_gives_none() -> None:
    assert first_rank_error(["[Rank 0] INFO training.train: done", *TORCHRUN_BANNER]) is None


def test_rank_0_step_lines_feed_the_progress_row_with_or_without_a_timestamp() -> None:
    for line in (
        "[Rank 0] INFO training.train: step 20/200 loss 7.615328 (this rank 7.51) lr 3.0e-03 | 4678 tok/s 36 samples/s",
        "[Rank 0] 2026-11-30 15:04:35,840 INFO training.train: step 20/200 loss 7.615328 lr 3e-03 | 4678 tok/s",
    ):
        assert STEP_LINE.match(line).groups() == ("20", "200", "7.615328", "4678")
    assert STEP_LINE.match("[Rank 1] INFO training.train: step 20/200 loss 7.6 | 4678 tok/s") is None
