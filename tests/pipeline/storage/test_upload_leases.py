"""Upload leases: a janitor or a second build aborts only the uploads of runs that are gone, never a live
build's, however old it looks; an upload aborted under its writer (S3's 404 NoSuchUpload, which the fault proxy
answers where moto says 500) starts again instead of retrying a call that cannot succeed."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from flows.build.context import take_build_lease
from flows.cli.main import main
from pipeline.storage import S3Options, open_store
from pipeline.storage.s3 import S3Store
from pipeline.storage.uploads import UploadJournal, hold_lease, live_upload_ids, run_alive
from tests.fixtures.fault_proxy import FaultProxy

pytestmark = [pytest.mark.s3]
MiB = 1 << 20


@pytest.fixture
def proxy(s3_server: str) -> Iterator[FaultProxy]:
    p = FaultProxy(s3_server, seed=1, latency_s=0.4)  # every request of the live build is slow
    try:
        yield p
    finally:
        p.close()


def _slow_options(options: S3Options, proxy: FaultProxy) -> S3Options:
    return dataclasses.replace(
        options,
        endpoint_url=proxy.url,
        retry_budget_s=40.0,
        retry_base_s=0.05,
        retry_cap_s=1.0,
        multipart_threshold=5 * MiB,
        multipart_chunk=5 * MiB,
        max_concurrency=1,  # parts one after another: the upload is open long enough to race
    )


def _writer(s3_bucket, proxy: FaultProxy, run: str) -> S3Store:
    store = open_store(s3_bucket.uri, _slow_options(s3_bucket.options, proxy))
    assert isinstance(store, S3Store)
    store.uploads = UploadJournal(store, run=run)
    return store


def _upload_racing(store: S3Store, big: Path, racers) -> float:
    """Upload ``big`` in a thread; once its upload is recorded, run ``racers`` (direct to the server, fast).
    Returns the upload's seconds."""
    errors: list[BaseException] = []
    took: list[float] = []

    def upload() -> None:
        started = time.monotonic()
        try:
            store.put_file("shard.bin", big)
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)
        took.append(time.monotonic() - started)

    thread = threading.Thread(target=upload)
    thread.start()
    while not UploadJournal(store).records() and thread.is_alive():
        time.sleep(0.02)
    racers()
    thread.join(120)
    if errors:
        raise errors[0]
    return took[0]


def _janitor(s3_server: str, s3_bucket) -> None:
    argv = ["janitor", "--output", s3_bucket.uri, "--older-than", "0", "--s3-endpoint-url", s3_server]
    assert main([*argv, "--s3-region", "us-east-1"]) == 0


def _second_build_start(s3_bucket) -> None:
    take_build_lease(open_store(s3_bucket.uri, s3_bucket.options), s3_bucket.options)


def test_a_live_upload_survives_a_janitor_and_a_second_build_at_normal_speed(
    s3_server: str, s3_bucket, proxy: FaultProxy, tmp_path: Path, capsys
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(21 * MiB))
    store = _writer(s3_bucket, proxy, run="live-build")
    hold_lease(store, "live-build")
    alone = _upload_racing(store, big, lambda: None)

    def racers() -> None:
        assert live_upload_ids(UploadJournal(store))  # recorded, and its run alive
        _janitor(s3_server, s3_bucket)  # --older-than 0: by age alone it would abort everything
        _second_build_start(s3_bucket)

    raced = _upload_racing(store, big, racers)
    assert "kept 1 upload(s) of live builds" in capsys.readouterr().out
    assert proxy.counts().get("no_such_upload", 0) == 0  # never aborted under it
    assert raced < alone * 1.5 + 1.0, (raced, alone)
    assert store.stat("shard.bin").size == 21 * MiB
    admin = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    assert not admin.list_multipart_uploads(Bucket=s3_bucket.bucket).get("Uploads")


def test_the_upload_of_a_run_whose_lease_expired_is_aborted_and_its_writer_starts_again(
    s3_server: str, s3_bucket, proxy: FaultProxy, tmp_path: Path, capsys
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(21 * MiB))
    store = _writer(s3_bucket, proxy, run="stalled-build")
    hold_lease(store, "stalled-build", ttl_s=-1.0)  # its heartbeat stopped: taken for dead
    assert not run_alive(store, "stalled-build")
    seconds = _upload_racing(store, big, lambda: _janitor(s3_server, s3_bucket))
    assert "aborted 1 upload(s) recorded by runs that are gone" in capsys.readouterr().out
    assert (
        proxy.counts().get("no_such_upload", 0) >= 1
    )  # S3's answer, not moto's 500: no retries until the budget
    assert seconds < 20, seconds
    assert store.get_bytes("shard.bin") == big.read_bytes()  # started again, complete


def test_a_lease_of_a_dead_process_on_this_host_is_expired_at_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    store = open_store(str(tmp_path / "store"), None)
    code = "import sys; from pipeline.storage import open_store; from pipeline.storage.uploads import hold_lease;"
    code += f"hold_lease(open_store({str(tmp_path / 'store')!r}, None), 'killed')"
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ | {"PYTHONPATH": os.getcwd()})
    assert not run_alive(store, "killed")  # its pid is gone: no need to wait for the expiry
    hold_lease(store, "me")
    assert run_alive(store, "me")
