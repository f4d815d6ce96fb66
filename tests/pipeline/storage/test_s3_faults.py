"""S3 through a fault-injecting proxy (tests/fixtures/fault_proxy.py) in front of moto on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from pipeline.storage import S3Options, StorageError, open_store
from pipeline.storage.janitor import abort_recorded_uploads
from pipeline.storage.retry import STATS
from pipeline.storage.s3 import S3Store
from pipeline.storage.uploads import UploadJournal
from tests.fixtures.fault_proxy import FaultProxy

pytestmark = [pytest.mark.s3]
MiB = 1 << 20


@pytest.fixture
def proxy(s3_server: str) -> Iterator[FaultProxy]:
    p = FaultProxy(s3_server, seed=1)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def via_proxy(s3_bucket, proxy: FaultProxy) -> S3Options:
    """The bucket's options with the endpoint at the proxy; quick backoff so tests stay short."""
    return dataclasses.replace(
        s3_bucket.options,
        endpoint_url=proxy.url,
        retry_budget_s=40.0,
        max_attempts=200,
        retry_base_s=0.05,
        retry_cap_s=1.0,
        connect_timeout=2.0,
        read_timeout=10.0,
        multipart_threshold=5 * MiB,
        multipart_chunk=5 * MiB,
    )


def _admin(s3_server: str):
    return boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")


def test_a_burst_of_consecutive_503s_is_retried(s3_bucket, proxy: FaultProxy, via_proxy: S3Options) -> None:
    store = open_store(s3_bucket.uri, via_proxy)
    STATS.reset()
    proxy.fail_next(12)  # more than botocore's standard mode would try (and no shared quota to drain)
    store.put_bytes("k", b"v" * 1000)
    assert store.get_bytes("k") == b"v" * 1000
    assert proxy.counts()["injected_503"] == 12
    assert STATS.snapshot()["retries_throttled"] == 12


def test_random_503s_at_30_percent_and_added_latency(
    s3_bucket, proxy: FaultProxy, via_proxy: S3Options
) -> None:
    store = open_store(s3_bucket.uri, via_proxy)
    proxy.error_rate, proxy.latency_s = 0.3, 0.01
    blobs = {f"k{i}": os.urandom(2000 + i) for i in range(40)}
    for key, data in blobs.items():
        store.put_bytes(key, data)
    assert [i.key for i in store.list()] == sorted(blobs)
    assert all(store.get_bytes(k) == v for k, v in blobs.items())
    counts = proxy.counts()
    assert counts["injected_503"] > 0.2 * counts["requests"]


def test_a_20_second_refusal_is_ridden_out(s3_bucket, proxy: FaultProxy, via_proxy: S3Options) -> None:
    store = open_store(s3_bucket.uri, via_proxy)
    store.put_bytes("before", b"1")
    STATS.reset()
    proxy.refuse_for(20.0)
    started = time.monotonic()
    store.put_bytes("during", b"2")  # connection refused for 20 s, then the server is back
    assert time.monotonic() - started >= 19.0
    assert store.get_bytes("during") == b"2" and store.get_bytes("before") == b"1"
    assert STATS.snapshot()["retries_connection"] >= 3


def test_a_refusal_longer_than_the_budget_fails_with_the_budget_named(
    s3_bucket, proxy: FaultProxy, via_proxy: S3Options
) -> None:
    store = open_store(s3_bucket.uri, dataclasses.replace(via_proxy, retry_budget_s=2.0))
    assert not store.exists("k")  # builds the client first: on a loaded machine that alone can take seconds
    proxy.refuse_for(6.0)
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"s3://.*/k failed after \d+ tries .*retry_budget_s=2"):
        store.put_bytes("k", b"v")
    assert time.monotonic() - started < 5.0


def test_a_proxy_closed_during_a_refusal_never_listens_again(proxy: FaultProxy) -> None:
    """What lets a test end inside a refusal window (the fixture closes the proxy at once, without waiting the
    window out): the window's end finds the proxy closed and leaves its port shut."""
    import socket

    proxy.refuse_for(0.2)
    proxy.close()
    time.sleep(0.5)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", proxy.port)) != 0


def test_a_cut_mid_upload_leaves_no_partial_object(
    s3_server: str, s3_bucket, proxy: FaultProxy, via_proxy: S3Options, tmp_path: Path
) -> None:
    admin = _admin(s3_server)
    no_retry = open_store(s3_bucket.uri, dataclasses.replace(via_proxy, retry_budget_s=0.0))
    data = os.urandom(MiB)
    proxy.cut_next_upload(300_000)  # the connection drops after 300 KB of the body
    with pytest.raises(StorageError):
        no_retry.put_bytes("single", data)
    assert proxy.counts()["cut_uploads"] == 1
    assert "Contents" not in admin.list_objects_v2(Bucket=s3_bucket.bucket, Prefix="root/single")

    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 * MiB))  # three parts of 5 MiB
    proxy.cut_next_upload(2 * MiB)  # the first part is cut (no retry): the upload is aborted
    with pytest.raises(StorageError):
        no_retry.put_file("multi", big)
    assert "Contents" not in admin.list_objects_v2(Bucket=s3_bucket.bucket, Prefix="root/multi")
    assert not admin.list_multipart_uploads(Bucket=s3_bucket.bucket).get("Uploads")

    store = open_store(s3_bucket.uri, via_proxy)  # with retries, the same cuts are ridden out
    proxy.cut_next_upload(300_000)
    store.put_bytes("single", data)
    proxy.cut_next_upload(2 * MiB)
    store.put_file("multi", big)
    assert store.get_bytes("single") == data and store.get_bytes("multi") == big.read_bytes()


def test_a_cut_mid_download_resumes(s3_bucket, proxy: FaultProxy, via_proxy: S3Options) -> None:
    store = open_store(s3_bucket.uri, via_proxy)
    data = os.urandom(3 * MiB)
    store.put_bytes("blob", data)
    proxy.cut_next_download(MiB)
    assert store.get_bytes("blob") == data
    assert proxy.counts()["cut_downloads"] == 1


def test_uploads_recorded_by_a_killed_run_are_aborted_at_once(
    s3_server: str, s3_bucket, via_proxy: S3Options, tmp_path: Path, monkeypatch
) -> None:
    """A run killed mid-upload cannot abort; its journal lets the next run (or the janitor) do it now."""
    admin = _admin(s3_server)
    store = open_store(s3_bucket.uri, s3_bucket.options)
    assert isinstance(store, S3Store)
    store.uploads = UploadJournal(store)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 * MiB))
    small = dataclasses.replace(s3_bucket.options, multipart_threshold=5 * MiB, multipart_chunk=5 * MiB)
    store.options = store.s3 = small

    def killed(*args, **kwargs):
        raise SystemExit("killed")  # the process dies: no abort runs, the record stays

    monkeypatch.setattr(S3Store, "_upload_parts", killed)
    monkeypatch.setattr(S3Store, "_abort_upload", lambda self, key, upload_id: None)
    with pytest.raises(SystemExit):
        store.put_file("shard.bin", big)
    monkeypatch.undo()
    assert len(admin.list_multipart_uploads(Bucket=s3_bucket.bucket).get("Uploads", [])) == 1
    assert len(UploadJournal(store).records()) == 1
    # moto dates every upload 2010, so age alone would abort it too: prove the journal does it, age unused
    assert abort_recorded_uploads(UploadJournal(store), s3_bucket.options) == 1
    assert not admin.list_multipart_uploads(Bucket=s3_bucket.bucket).get("Uploads")
    assert UploadJournal(store).records() == []
    store.put_file("shard.bin", big)  # a completed upload leaves no record behind
    assert UploadJournal(store).records() == [] and store.stat("shard.bin").size == 11 * MiB
