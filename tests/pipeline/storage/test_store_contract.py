"""The one contract every store keeps: a folder, S3 (moto), GCS (gcp-storage-emulator) and Azure (Azurite), each a
real server on 127.0.0.1. Faults (throttling, cuts, refusals, denials) come from a fault proxy in front of each
emulator (tests/fixtures/fault_proxy.py); tests/pipeline/storage/test_storage.py keeps the S3-only details."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.dataset.manifest import MANIFEST_KEY, load_manifest
from pipeline.errors import PermanentStorageError
from pipeline.storage import AlreadyExistsError, ObjectStore, S3Options, StorageError, open_store, sha256_file
from pipeline.storage.azure import AzureStore
from pipeline.storage.gcs import GCSStore
from pipeline.storage.janitor import abort_recorded_uploads
from pipeline.storage.retry import STATS
from pipeline.storage.s3 import S3Store
from pipeline.storage.uploads import UploadJournal
from tests.fixtures.emulators import AZURITE_KEY, azurite_connection_string
from tests.fixtures.fault_proxy import FaultProxy
from tests.fixtures.tiny_dataset import build_tiny_dataset

MiB = 1 << 20
REMOTE = [
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("gcs", marks=pytest.mark.gcs),
    pytest.param("azure", marks=pytest.mark.azure),
]
ALL = [pytest.param("file"), *REMOTE]
BUCKET_FIXTURE = {"s3": "s3_bucket", "gcs": "gcs_bucket", "azure": "azure_container"}
SMALL_PARTS = {"multipart_threshold": 5 * MiB, "multipart_chunk": 5 * MiB}


def _bucket(request: pytest.FixtureRequest, kind: str) -> Any:
    return request.getfixturevalue(BUCKET_FIXTURE[kind])


@pytest.fixture(params=ALL)
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """An empty store of each kind, with 5 MiB parts so a large upload is a few parts."""
    if request.param == "file":
        return open_store(str(tmp_path / "store"), None)
    bucket = _bucket(request, request.param)
    return open_store(bucket.uri, dataclasses.replace(bucket.options, **SMALL_PARTS))


# -- every store ------------------------------------------------------------------------------------


def test_put_get_ranges_overwrite_and_missing(any_store: ObjectStore) -> None:
    store = any_store
    store.put_bytes("a/b.txt", b"hello world")
    assert store.get_bytes("a/b.txt") == b"hello world"
    assert store.get_range("a/b.txt", 6, 5) == b"world"
    assert store.get_range("a/b.txt", 6, 100) == b"world"  # shorter at the end
    assert store.get_range("a/b.txt", 11, 4) == b"" and store.get_range("a/b.txt", 50, 4) == b""
    assert store.get_range("a/b.txt", 0, 0) == b""
    store.put_bytes("a/b.txt", b"v2")
    assert store.get_bytes("a/b.txt") == b"v2" and store.stat("a/b.txt").size == 2
    assert store.exists("a/b.txt") and not store.exists("a/missing")
    with pytest.raises(FileNotFoundError):
        store.get_bytes("a/missing")
    with pytest.raises(FileNotFoundError):
        store.stat("a/missing")
    store.delete("a/b.txt")
    store.delete("a/b.txt")  # no error when missing
    assert not store.exists("a/b.txt")


def test_list_is_sorted_prefix_filtered_and_a_boundary(any_store: ObjectStore) -> None:
    for key in ["b/2", "a/1", "b/1", "b10/x", "c"]:
        any_store.put_bytes(key, key.encode())
    assert [i.key for i in any_store.list()] == ["a/1", "b/1", "b/2", "b10/x", "c"]
    assert [i.key for i in any_store.list("b/")] == ["b/1", "b/2"]
    assert [i.key for i in any_store.list("b")] == ["b/1", "b/2", "b10/x"]
    assert [(i.key, i.size) for i in any_store.child("b").list()] == [("1", 3), ("2", 3)]
    with pytest.raises(ValueError):
        any_store.put_bytes("../escape", b"x")


def test_a_large_file_goes_up_in_parts_and_its_sha256_is_checked(
    any_store: ObjectStore, tmp_path: Path
) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(11 * MiB + 123))  # three parts of 5 MiB on a cloud store
    digest = sha256_file(src)
    any_store.uploads = UploadJournal(any_store)
    any_store.put_file("shards/big.bin", src)
    assert any_store.stat("shards/big.bin").size == src.stat().st_size
    any_store.verify_sha256("shards/big.bin", digest)
    with pytest.raises(StorageError, match="sha256"):
        any_store.verify_sha256("shards/big.bin", "0" * 64)
    out = tmp_path / "dl" / "big.bin"
    any_store.get_file("shards/big.bin", out)
    assert sha256_file(out) == digest and [p.name for p in out.parent.iterdir()] == ["big.bin"]
    assert (
        any_store.get_range("shards/big.bin", 5 * MiB - 3, 6) == src.read_bytes()[5 * MiB - 3 : 5 * MiB + 3]
    )
    assert UploadJournal(any_store).records() == []  # a finished upload leaves no record
    assert [i.key for i in any_store.list()] == ["shards/big.bin"]  # nor any part or block beside it


def test_put_if_absent_has_exactly_one_winner(any_store: ObjectStore) -> None:
    any_store.put_if_absent("once", b"first")
    with pytest.raises(AlreadyExistsError, match="once"):
        any_store.put_if_absent("once", b"second")
    assert any_store.get_bytes("once") == b"first"
    for round_ in range(6):
        results = _race(any_store, f"race/{round_}", ["t1", "t2"])
        assert sorted(results.values()) == ["lost", "won"]
        winner = next(n for n, r in results.items() if r == "won")
        assert any_store.get_bytes(f"race/{round_}") == winner.encode()


def _race(store: ObjectStore, key: str, names: list[str]) -> dict[str, str]:
    barrier, results = threading.Barrier(len(names)), {}

    def racer(name: str) -> None:
        barrier.wait(timeout=10)  # release every racer at once
        try:
            store.put_if_absent(key, name.encode())
            results[name] = "won"
        except AlreadyExistsError:
            results[name] = "lost"

    threads = [threading.Thread(target=racer, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def test_open_read_streams_a_compressed_object(any_store: ObjectStore) -> None:
    lines = [f"line {i} · ünïcödé {'x' * (i % 97)}\n" for i in range(60_000)]  # ~4 MiB of text
    any_store.put_bytes("raw/a.txt.gz", gzip.compress("".join(lines).encode(), compresslevel=1))
    with (
        any_store.open_read("raw/a.txt.gz") as f,
        gzip.GzipFile(fileobj=f) as g,
        io.TextIOWrapper(g, encoding="utf-8") as t,
    ):
        assert t.readlines() == lines


def test_copy_within_the_store(any_store: ObjectStore) -> None:
    data = os.urandom(300_000)
    any_store.put_bytes("work/x.bin", data)
    any_store.copy("work/x.bin", "datasets/x.bin", len(data))
    assert any_store.get_bytes("datasets/x.bin") == data


def _recording(store: ObjectStore) -> list[tuple[str, str]]:
    """Make ``store`` record each write and check ``(op, key)`` in order; returns the record."""
    log: list[tuple[str, str]] = []

    class Recording(type(store)):  # type: ignore[misc,valid-type]
        def put_bytes(self, key: str, data: bytes) -> None:
            super().put_bytes(key, data)
            log.append(("put", key))

        def put_file(self, key: str, path: Any) -> None:
            super().put_file(key, path)
            log.append(("put", key))

        def put_if_absent(self, key: str, data: bytes) -> None:
            super().put_if_absent(key, data)
            log.append(("put", key))

        def copy(self, src_key: str, dst_key: str, size: int | None = None) -> None:
            super().copy(src_key, dst_key, size)
            log.append(("put", dst_key))

        def verify_sha256(self, key: str, expected: str) -> None:
            super().verify_sha256(key, expected)
            log.append(("verified", key))

    store.__class__ = Recording
    return log


def test_publish_puts_the_manifest_last_with_every_object_verified(
    any_store: ObjectStore, tmp_path: Path
) -> None:
    """The production path (parts, tokenizer, shards, copy into the dataset's prefix, commit) on each store
    gives the dataset id of a local build; every object is re-read and hashed before the manifest is put."""
    local_uri = build_tiny_dataset(tmp_path / "local", n_docs=60)
    local_manifest, _ = load_manifest(local_uri, None)
    log = _recording(any_store)
    uri = build_tiny_dataset(any_store, n_docs=60)
    manifest, store = load_manifest(uri, any_store.s3)
    assert manifest.dataset_id == local_manifest.dataset_id
    prefix = store.uri[len(any_store.uri) + 1 :]
    objects = [f"{prefix}/{key}" for shard in manifest.shards for key, _, _ in shard.objects()]
    objects.append(f"{prefix}/{manifest.tokenizer.key}")
    manifest_at = log.index(("put", f"{prefix}/{MANIFEST_KEY}"))
    for key in objects:
        put, verified = log.index(("put", key)), log.index(("verified", key))
        assert put < verified < manifest_at, key
    assert [k for op, k in log[manifest_at + 1 :] if op == "put"] == [
        f"{prefix.rsplit('/', 1)[0]}/latest.json"
    ]


# -- faults, through a proxy in front of each server -------------------------------------------------


@pytest.fixture
def faulty(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, FaultProxy, S3Options]]:
    """``(kind, bucket, proxy, options through the proxy)``: quick backoff, a 40 s budget, 5 MiB parts."""
    kind = request.param
    bucket = _bucket(request, kind)
    upstream = bucket.options.endpoint_url if kind == "s3" else bucket.server
    flavour = {"s3": "s3", "gcs": "gcs", "azure": "azure"}[kind]
    proxy = FaultProxy(
        upstream.split("/devstoreaccount1")[0],
        seed=1,
        flavour=flavour,
        throttle_status=503 if kind != "gcs" else 429,
    )
    endpoint = {"s3": "endpoint_url", "gcs": "gcs_endpoint_url", "azure": "azure_endpoint_url"}[kind]
    path = "/devstoreaccount1" if kind == "azure" else ""
    options = dataclasses.replace(
        bucket.options,
        retry_budget_s=40.0,
        max_attempts=200,
        retry_base_s=0.05,
        retry_cap_s=1.0,
        connect_timeout=2.0,
        read_timeout=10.0,
        **SMALL_PARTS,
        **{endpoint: proxy.url + path},
    )
    try:
        yield kind, bucket, proxy, options
    finally:
        proxy.close()


faults = pytest.mark.parametrize("faulty", REMOTE, indirect=True)


@faults
def test_a_burst_of_throttled_answers_is_retried(faulty) -> None:
    _kind, bucket, proxy, options = faulty
    store = open_store(bucket.uri, options)
    STATS.reset()
    proxy.fail_next(12)
    store.put_bytes("k", b"v" * 1000)
    assert store.get_bytes("k") == b"v" * 1000
    assert proxy.counts()["injected_503"] == 12
    assert STATS.snapshot()["retries_throttled"] == 12


@faults
def test_30_percent_throttled_answers_lose_nothing(faulty) -> None:
    _kind, bucket, proxy, options = faulty
    store = open_store(bucket.uri, options)
    proxy.error_rate = 0.3
    blobs = {f"k{i:02d}": os.urandom(2000 + i) for i in range(30)}
    for key, data in blobs.items():
        store.put_bytes(key, data)
    assert [i.key for i in store.list()] == sorted(blobs)
    assert all(store.get_bytes(k) == v and store.get_range(k, 10, 5) == v[10:15] for k, v in blobs.items())
    counts = proxy.counts()
    assert counts["injected_503"] > 0.2 * counts["requests"]


@faults
def test_a_refusal_is_ridden_out_and_one_past_the_budget_fails_naming_it(faulty) -> None:
    _kind, bucket, proxy, options = faulty
    store = open_store(bucket.uri, options)
    store.put_bytes("before", b"1")
    proxy.refuse_for(4.0)
    started = time.monotonic()
    store.put_bytes("during", b"2")
    assert time.monotonic() - started >= 3.5
    assert store.get_bytes("during") == b"2"
    short = open_store(bucket.uri, dataclasses.replace(options, retry_budget_s=1.5))
    assert short.exists("during")  # the client is built before the clock starts
    proxy.refuse_for(6.0)
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"failed after \d+ tries .*retry_budget_s=1.5"):
        short.put_bytes("k", b"v")
    assert time.monotonic() - started < 5.0


@faults
def test_cut_connections_mid_upload_and_mid_download_are_resumed(faulty, tmp_path: Path) -> None:
    _kind, bucket, proxy, options = faulty
    store = open_store(bucket.uri, options)
    data = os.urandom(MiB)
    proxy.cut_next_upload(300_000)
    store.put_bytes("single", data)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 * MiB))
    # Inside the second part / chunk / block: the GCS emulator answers a status query with "bytes=0-0" where it
    # holds nothing (GCS sends no Range then), so a cut in the first chunk would resume it one byte off.
    proxy.cut_next_upload(2 * MiB, skip=1)
    store.put_file("multi", big)
    assert proxy.counts()["cut_uploads"] == 2
    assert store.get_bytes("single") == data
    proxy.cut_next_download(MiB)
    with store.open_read("multi") as f:
        assert f.read() == big.read_bytes()
    assert proxy.counts()["cut_downloads"] == 1
    assert [i.key for i in store.list()] == ["multi", "single"]


@faults
def test_a_cut_upload_without_retries_leaves_no_object(faulty, tmp_path: Path) -> None:
    _kind, bucket, proxy, options = faulty
    store = open_store(bucket.uri, dataclasses.replace(options, retry_budget_s=0.0))
    store.uploads = UploadJournal(open_store(str(tmp_path / "work"), None))
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 * MiB))
    proxy.cut_next_upload(2 * MiB)
    with pytest.raises(StorageError):
        store.put_file("multi", big)
    assert not store.exists("multi") and list(store.list()) == []
    assert store.uploads.records() == []  # aborted by the writer itself


@faults
def test_access_denied_fails_at_once_in_one_line(faulty) -> None:
    _kind, bucket, proxy, options = faulty
    store = open_store(bucket.uri, options)
    store.put_bytes("k", b"v")
    before = proxy.counts()["requests"]
    proxy.deny_next(1)
    started = time.monotonic()
    with pytest.raises(PermissionError, match="access denied") as err:
        store.get_bytes("k")
    assert time.monotonic() - started < 5.0 and "\n" not in str(err.value)
    assert proxy.counts()["requests"] == before + 1, proxy.log  # the denied get: never retried


@pytest.mark.parametrize("kind", REMOTE)
def test_a_missing_bucket_fails_at_once_in_one_line(request: pytest.FixtureRequest, kind: str) -> None:
    bucket = _bucket(request, kind)
    uri = bucket.uri.replace(bucket.bucket, "pw-no-such-bucket", 1)
    store = open_store(uri, bucket.options)
    for op in (lambda: store.put_bytes("k", b"v"), lambda: store.get_bytes("k"), lambda: list(store.list())):
        started = time.monotonic()
        with pytest.raises(PermanentStorageError, match="does not exist") as err:
            op()
        assert time.monotonic() - started < 5.0 and "\n" not in str(err.value)


@pytest.mark.parametrize("kind", REMOTE)
def test_no_credentials_fail_at_once_in_one_line(
    request: pytest.FixtureRequest, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing in the cloud's standard chain: S3 without keys, GCS without ADC (an https endpoint, no
    emulator), Azure without a connection string, SAS or identity. The metadata servers are trapped on
    127.0.0.1 (tests/conftest.py). Azure's managed identity is left out of its chain here with Azure's own switch
    (``AZURE_TOKEN_CREDENTIALS=dev``): its probe would ask 169.254.169.254, and the trap that keeps it on
    127.0.0.1 also skips the probe's 1 s limit for five retries."""
    bucket = _bucket(request, kind)
    monkeypatch.delenv("AZURE_POD_IDENTITY_AUTHORITY_HOST")
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "dev")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(name, raising=False)
    changes = {
        "s3": {"read_timeout": 9.5},  # another options object: a client of its own, built now
        "gcs": {"gcs_endpoint_url": "https://127.0.0.1:9"},
        "azure": {"azure_endpoint_url": "https://127.0.0.1:9/account"},
    }[kind]
    store = open_store(bucket.uri, dataclasses.replace(bucket.options, **changes))
    started = time.monotonic()
    with pytest.raises(PermanentStorageError, match=r"[Cc]redentials") as err:
        store.put_bytes("k", b"v")
    assert time.monotonic() - started < 5.0 and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("faulty", [pytest.param("azure", marks=pytest.mark.azure)], indirect=True)
def test_a_wrong_azure_account_key_is_refused_at_once_in_one_line(
    faulty, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Azurite checks each request's shared-key signature, as Azure does: a connection string with another
    key is answered 403 (Azure: AuthenticationFailed; Azurite: AuthorizationFailure), never retried. (The GCS
    emulator and moto check no credential: a wrong key cannot be shown refused on them here; the storage
    README says so.)"""
    _kind, bucket, proxy, options = faulty
    wrong = base64.b64encode(b"not the key of devstoreaccount1, wrong on purpose!").decode()
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        azurite_connection_string(bucket.server).replace(AZURITE_KEY, wrong),
    )
    store = open_store(bucket.uri, options)  # the proxy's endpoint: a client of its own, built with this key
    started = time.monotonic()
    with pytest.raises(PermissionError, match=r"access denied \(put, 403 Auth\w+Failure?\)") as err:
        store.put_bytes("k", b"v")
    assert time.monotonic() - started < 5.0 and "\n" not in str(err.value)
    assert proxy.counts()["requests"] == 1, proxy.log  # refused once, never retried
    assert AZURITE_KEY not in str(err.value) and wrong not in str(err.value)


@pytest.mark.gcs
def test_a_google_key_file_that_is_no_key_fails_at_once_in_one_line(
    gcs_bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad credential on the client's side: ADC names a file that holds no key (google-auth refuses it
    before any request). A well-formed key with a wrong secret is refused only by Google's token server: not
    run here."""
    junk = tmp_path / "key.json"
    junk.write_text('{"type": "service_account", "client_email": "x@y"}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(junk))
    store = open_store(
        gcs_bucket.uri, dataclasses.replace(gcs_bucket.options, gcs_endpoint_url="https://127.0.0.1:9")
    )
    started = time.monotonic()
    with pytest.raises(PermanentStorageError, match=r"no Google credentials .*key\.json") as err:
        store.put_bytes("k", b"v")
    assert time.monotonic() - started < 5.0 and "\n" not in str(err.value), str(err.value)


# -- leases and the janitor -------------------------------------------------------------------------


def _kill_mid_upload(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next large upload die (SystemExit) after its first part, as a killed process: nothing aborts."""

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise SystemExit("killed")

    if isinstance(store, S3Store):
        monkeypatch.setattr(S3Store, "_upload_parts", killed)
        monkeypatch.setattr(S3Store, "_abort_upload", lambda self, key, upload_id: None)
    elif isinstance(store, GCSStore):
        monkeypatch.setattr(GCSStore, "_send_chunks", killed)
        monkeypatch.setattr(GCSStore, "_abort_quietly", lambda self, key, url: None)
    else:
        assert isinstance(store, AzureStore)
        real = AzureStore._stage_blocks

        def one_block_then_killed(self, key, upload_id, path, size):  # type: ignore[no-untyped-def]
            real(self, key, upload_id, path, min(size, self.options.multipart_chunk))
            raise SystemExit("killed")

        monkeypatch.setattr(AzureStore, "_stage_blocks", one_block_then_killed)
        monkeypatch.setattr(AzureStore, "abort_upload", killed)


def _uncommitted(store: ObjectStore) -> list[str]:
    if isinstance(store, AzureStore):
        every = {b.name for b in store.client.list_blobs(include=["uncommittedblobs"])}
        return sorted(every - {b.name for b in store.client.list_blobs()})
    if isinstance(store, S3Store):
        return sorted(u["Key"] for u in store.list_uploads())
    return []  # GCS keeps no listing of open sessions


@pytest.mark.parametrize("kind", REMOTE)
def test_an_upload_recorded_by_a_killed_run_is_aborted_by_the_janitor(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = _bucket(request, kind)
    options = dataclasses.replace(bucket.options, **SMALL_PARTS)
    store = open_store(bucket.uri, options)
    store.uploads = UploadJournal(store, run="dead-run")  # its lease was never taken: the run is gone
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 * MiB))
    _kill_mid_upload(store, monkeypatch)
    with pytest.raises(SystemExit):
        store.put_file("shard.bin", big)
    monkeypatch.undo()
    assert len(UploadJournal(store).records()) == 1
    if kind == "azure":
        assert _uncommitted(store) == ["root/shard.bin"]
    assert abort_recorded_uploads(UploadJournal(store), options) == 1
    assert UploadJournal(store).records() == [] and _uncommitted(store) == []
    assert not store.exists("shard.bin")
    store.put_file("shard.bin", big)  # a finished upload leaves no record behind
    assert UploadJournal(store).records() == [] and store.stat("shard.bin").size == 11 * MiB


@pytest.mark.azure
def test_azure_uncommitted_blocks_nobody_recorded_go_by_age_unless_a_live_run_owns_them(
    azure_container,
) -> None:
    store = open_store(azure_container.uri, azure_container.options)
    assert isinstance(store, AzureStore)
    blob = store.client.get_blob_client("root/orphan.bin")
    blob.stage_block("b3JwaGFuLWlkLTAwMDAwMDAx", b"x" * 100)  # "orphan-id-00000001"
    store.put_bytes("kept", b"committed")
    assert store.abort_stale_uploads(older_than_s=3600) == 0  # too young
    assert store.abort_stale_uploads(older_than_s=0, keep=frozenset({"orphan-id"})) == 0  # a live run's
    assert store.abort_stale_uploads(older_than_s=0) == 1
    assert _uncommitted(store) == [] and store.get_bytes("kept") == b"committed"


# -- URIs, endpoints and each SDK's own emulator variable -------------------------------------------


@pytest.mark.gcs
def test_storage_emulator_host_needs_no_flag(gcs_bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_bucket.server)
    store = open_store(gcs_bucket.uri, S3Options(read_timeout=9.0))  # no gcs_endpoint_url
    store.put_bytes("env.txt", b"found")
    assert store.get_bytes("env.txt") == b"found"


@pytest.mark.azure
def test_abfs_uris_and_the_endpoint_flag_reach_the_same_container(azure_container) -> None:
    az = open_store(azure_container.uri, azure_container.options)  # the connection string: no flag
    az.put_bytes("x", b"1")
    abfs = open_store(f"abfs://{azure_container.bucket}/root", azure_container.options)
    assert abfs.get_bytes("x") == b"1"
    flagged = S3Options(azure_endpoint_url=azure_container.server, read_timeout=9.0)
    hadoop = f"abfss://{azure_container.bucket}@devstoreaccount1.dfs.core.windows.net/root"
    assert open_store(hadoop, flagged).get_bytes("x") == b"1"
    assert open_store(hadoop, flagged).uri_of("y") == hadoop + "/y"
