"""The named part of the suite that the lowest-versions job runs (`make test-lowest`, `pytest -m lowest`).

Together these start every flow (build_corpus, train, prepare_and_train, ablate, evaluate, doctor) and every
command of `pileworks --help` (the command each entry starts is named beside it), on Prefect's test server, on a
local server that pileworks starts, on S3 (moto) and on DeepSpeed ranks, within a few minutes on 2 cores. Listed
here, in one place, rather than as a marker in each file; an entry that no longer names a test fails the run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# node-id prefixes (relative to tests/): a file, or a file's one test
LOWEST_PART = (
    "flows/test_prefect_range.py",  # build_corpus, Prefect in pyproject's range
    "flows/build/test_s3_guard.py",  # build, train, inspect, trace, sample, janitor, doctor (on S3)
    "flows/cli/test_first_hour.py::test_run_names_the_dataset_clips_warmup_and_ends_with_the_next_commands",  # run
    "flows/cli/test_every_command.py",  # server start/status/stop, serve
    "flows/cli/test_main.py",  # build, trace, janitor in-process; errors by type
    "flows/cli/test_failures.py",  # every command's usage errors and help, reap without a server
    "flows/cli/test_doctor.py",  # doctor
    "flows/cli/test_verify.py",  # verify
    "flows/cli/test_quality.py",  # quality (fastText)
    "flows/train/test_evaluate.py",  # evaluate
    "flows/train/test_ablate.py",  # ablate
    "training/test_export_fp32.py",  # export
    "flows/cli/test_train_stop.py::test_sigterm_saves_the_step_reached_and_the_rerun_resumes_from_it",  # train, stopped
    "training/test_safe_load.py",  # the weights-only loader at torch's floor (every resume and export loads by it)
    "flows/runtime/test_reaper.py",  # reap
    "flows/runtime/test_local_server.py",  # the local server: started, reused, stopped when idle
    "flows/runtime/test_runners.py",  # local, thread and Dask runners (prefect-dask); Prefect's heartbeat setting
    "flows/test_deployments.py",  # serve's deployments
    # beside the flows, floors whose failure a build would not show
    "pipeline/ingest/test_encoding.py",  # charset-normalizer's detection (Shift-JIS, not gb18030)
    "pipeline/ingest/test_crawlers.py",  # warcio's ARC, LF-only and whole-file gzip reading; trafilatura's per-page cache
    "pipeline/ingest/test_warc.py",  # trafilatura's and jusText's extraction, FastWARC's reading
    "pipeline/storage/test_storage.py::test_put_if_absent_race_has_one_winner",  # create-only puts on S3 (boto3, moto)
)


def mark_lowest_part(items: list[pytest.Item]) -> None:
    """Mark the collected tests of :data:`LOWEST_PART` `lowest`; raise where an entry names no test of a
    collected file (a renamed test would otherwise drop out of the job unseen) or a file that is gone."""
    collected_files = {item.path.resolve() for item in items}
    for entry in LOWEST_PART:
        path = (TESTS / entry.split("::", 1)[0]).resolve()
        if not path.is_file():
            raise pytest.UsageError(f"tests/lowest_part.py: {entry} names no file")
        if path not in collected_files:
            continue
        matched = [item for item in items if _matches(item, path, entry)]
        if not matched:
            raise pytest.UsageError(f"tests/lowest_part.py: {entry} names no test")
        for item in matched:
            item.add_marker(pytest.mark.lowest)


def _matches(item: pytest.Item, path: Path, entry: str) -> bool:
    if item.path.resolve() != path:
        return False
    if "::" not in entry:
        return True
    name = entry.split("::", 1)[1]
    return item.name == name or item.name.startswith(f"{name}[")
