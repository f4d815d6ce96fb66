"""A multi-part build through the fault proxy: sustained throttling costs time, never the build or its id."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.fault_proxy import FaultProxy
from tests.fixtures.s3_corpus import FAST_BUILD, THROTTLED_RETRIES, upload_corpus, write_corpus

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def _build(inputs: str, output: str, endpoint: str) -> dict:
    from flows.build.flow import build_corpus

    overrides = (
        FAST_BUILD
        | THROTTLED_RETRIES
        | {
            "ingest.target_part_bytes": 400_000,  # ~8 parts: every stage fans out, hundreds of requests
            "s3.endpoint_url": endpoint,
            "s3.region": "us-east-1",
        }
    )
    return build_corpus(inputs=[inputs], output=output, overrides=overrides)


def test_a_multipart_build_completes_at_30_percent_503_with_the_clean_dataset_id(
    prefect_harness, s3_server: str, tmp_path: Path
) -> None:
    size = write_corpus(tmp_path / "raw", megabytes=3.0)
    assert size >= 3_000_000
    inputs = upload_corpus(tmp_path / "raw", s3_server, "pw-faults")
    proxy = FaultProxy(s3_server, seed=3)
    try:
        clean = _build(inputs, "s3://pw-faults/clean", proxy.url)
        clean_requests = proxy.counts()["requests"]
        proxy.reset_counts()
        proxy.error_rate = 0.3
        faulty = _build(inputs, "s3://pw-faults/faulty", proxy.url)
    finally:
        proxy.close()
    # The build's own count over every process (worker processes report theirs with each unit).
    counts, stats = proxy.counts(), faulty["profile"]["storage"]
    assert faulty["dataset_id"] == clean["dataset_id"]
    assert faulty["docs_out"] == clean["docs_out"] > 1000 and faulty["tokens"] == clean["tokens"]
    assert clean_requests > 300, clean_requests  # enough that a drained retry quota would have shown
    assert counts["injected_503"] > 0.25 * counts["requests"]
    assert stats["retries_throttled"] >= counts["injected_503"] * 0.9  # each 503 retried by the S3 call
