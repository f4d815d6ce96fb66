"""ObjectStore contract on both backends (a tmp folder and a real moto S3 server), plus S3-only behaviour."""

from __future__ import annotations

import dataclasses
import gzip
import io
import logging
import multiprocessing
import os
import pickle
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import boto3
import pytest
import zstandard

from pipeline.storage import (
    AlreadyExistsError,
    FileStore,
    ObjectStore,
    S3Options,
    StorageError,
    open_store,
    sha256_file,
)
from pipeline.storage.base import TMP_PREFIX, tmp_prefix
from pipeline.storage.s3 import RedactSecretsFilter, S3Store, _S3RawReader, client_for

MiB = 1 << 20


def _small_parts(store: ObjectStore) -> ObjectStore:
    """The same store with 5 MiB multipart threshold/chunks on S3 (the S3 minimum part size)."""
    if not isinstance(store, S3Store):
        return store
    opts = dataclasses.replace(store.options, multipart_threshold=5 * MiB, multipart_chunk=5 * MiB)
    return S3Store.from_uri(store.uri, options=opts)


def _raw_client(store: S3Store):
    return boto3.client("s3", endpoint_url=store.options.endpoint_url, region_name="us-east-1")


def _uploads(store: S3Store) -> list[str]:
    resp = _raw_client(store).list_multipart_uploads(Bucket=store.bucket)
    return sorted(u["Key"] for u in resp.get("Uploads", []))


# -- both backends ---------------------------------------------------------------------------------


def test_put_get_range_overwrite(store: ObjectStore) -> None:
    store.put_bytes("a/b/x.bin", b"0123456789")
    assert store.get_bytes("a/b/x.bin") == b"0123456789"
    assert store.get_range("a/b/x.bin", 2, 3) == b"234"
    assert store.get_range("a/b/x.bin", 8, 100) == b"89"  # shorter at the end
    assert store.get_range("a/b/x.bin", 10, 5) == b""  # at the end
    assert store.get_range("a/b/x.bin", 50, 5) == b""  # past the end
    assert store.get_range("a/b/x.bin", 3, 0) == b""
    with pytest.raises(ValueError):
        store.get_range("a/b/x.bin", -1, 2)
    store.put_bytes("a/b/x.bin", b"new")
    assert store.get_bytes("a/b/x.bin") == b"new"
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty") == b"" and store.stat("empty").size == 0
    assert store.uri_of("a/b/x.bin") == store.uri + "/a/b/x.bin"


def test_map_keeps_order_and_raises_the_first_error(store: ObjectStore) -> None:
    keys = [f"many/{i:03d}" for i in range(40)]
    store.map(lambda k: store.put_bytes(k, k.encode()), keys)
    assert store.map(store.get_bytes, keys) == [k.encode() for k in keys]
    with pytest.raises(FileNotFoundError):
        store.map(store.get_bytes, [*keys[:5], "many/missing", *keys[5:]])


def test_map_keeps_round_trips_in_flight_on_s3_only(store: ObjectStore) -> None:
    """The steps that read one small object per part wait for one S3 round trip at a time no longer; a local
    store keeps its calls in turn."""
    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def call(key: str) -> bool:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            time.sleep(0.01)
            return store.exists(key)
        finally:
            with lock:
                state["now"] -= 1

    assert store.map(call, [f"k{i}" for i in range(48)]) == [False] * 48
    if isinstance(store, FileStore):
        assert state["most"] == 1
    else:
        assert 4 <= state["most"] <= store.io_threads == 16


def test_list_sorted_and_prefix_filtered(store: ObjectStore) -> None:
    for key in ["b/2", "a/1", "ab", "a/0", "c"]:
        store.put_bytes(key, key.encode())
    assert [i.key for i in store.list()] == ["a/0", "a/1", "ab", "b/2", "c"]
    assert [i.key for i in store.list("a/")] == ["a/0", "a/1"]
    assert [i.key for i in store.list("a")] == ["a/0", "a/1", "ab"]
    assert list(store.list("zzz/")) == []
    info = next(iter(store.list("c")))
    assert info.size == 1 and info.etag and '"' not in info.etag and abs(info.mtime - time.time()) < 300
    assert info == store.stat("c")


def test_list_paginates_past_1000_keys(store: ObjectStore) -> None:
    keys = [f"many/{i:05d}" for i in range(1013)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put_bytes(k, b"x"), reversed(keys)))
    assert [i.key for i in store.list("many/")] == keys


def test_stat_exists_delete_and_missing(store: ObjectStore, tmp_path) -> None:
    store.put_bytes("k", b"abc")
    assert store.exists("k") and store.stat("k").size == 3
    store.delete("k")
    assert not store.exists("k")
    store.delete("k")  # deleting a missing object is not an error
    for read in (
        lambda: store.stat("k"),
        lambda: store.get_bytes("k"),
        lambda: store.get_range("k", 0, 1),
        lambda: store.open_read("k"),
        lambda: store.get_file("k", tmp_path / "out"),
    ):
        with pytest.raises(FileNotFoundError, match="k"):
            read()
    assert not (tmp_path / "out").exists()


def test_put_file_large_roundtrip(store: ObjectStore, tmp_path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(11 * MiB + 123))
    digest = sha256_file(src)
    small = _small_parts(store)
    small.put_file("shards/big.bin", src)
    info = small.stat("shards/big.bin")
    assert info.size == src.stat().st_size
    if isinstance(store, S3Store):
        assert info.etag.endswith("-3")  # three parts: 5 + 5 + 1 MiB
        assert _uploads(store) == []
    small.verify_sha256("shards/big.bin", digest)
    with pytest.raises(StorageError, match="sha256"):
        small.verify_sha256("shards/big.bin", "0" * 64)
    out = tmp_path / "dl" / "big.bin"
    small.get_file("shards/big.bin", out)
    assert sha256_file(out) == digest
    assert [p.name for p in out.parent.iterdir()] == ["big.bin"]  # no temp files left behind


def test_put_file_small_single_put(store: ObjectStore, tmp_path) -> None:
    src = tmp_path / "small.txt"
    src.write_bytes(b"tiny")
    store.put_file("s.txt", src)
    assert store.get_bytes("s.txt") == b"tiny"
    if isinstance(store, S3Store):
        assert "-" not in store.stat("s.txt").etag  # a single put, not multipart


def test_failed_put_file_leaves_nothing(store: ObjectStore, tmp_path) -> None:
    with pytest.raises((FileNotFoundError, IsADirectoryError)):
        store.put_file("x", tmp_path / "missing")
    with pytest.raises((IsADirectoryError, PermissionError)):
        store.put_file("x", tmp_path)
    assert list(store.list()) == []


def test_put_if_absent_race_has_one_winner(store: ObjectStore) -> None:
    store.put_if_absent("once", b"first")
    with pytest.raises(AlreadyExistsError, match="once"):
        store.put_if_absent("once", b"second")
    assert store.get_bytes("once") == b"first"
    for round_ in range(8):
        results = _race_put_if_absent(store, f"race/{round_}", ["t1", "t2"])
        assert sorted(results.values()) == ["lost", "won"]
        winner = next(n for n, r in results.items() if r == "won")
        assert store.get_bytes(f"race/{round_}") == winner.encode()


def _race_put_if_absent(store: ObjectStore, key: str, names: list[str]) -> dict[str, str]:
    barrier, results = threading.Barrier(len(names)), {}

    def racer(name: str) -> None:
        barrier.wait()  # release every racer at once
        try:
            store.put_if_absent(key, name.encode())
            results[name] = "won"
        except AlreadyExistsError:
            results[name] = "lost"

    threads = [threading.Thread(target=racer, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("bad", ["..", "a/../../b", "../x", "/abs", "a\x00b", ""])
def test_bad_keys_rejected(store: ObjectStore, bad: str) -> None:
    for op in (lambda: store.put_bytes(bad, b"x"), lambda: store.get_bytes(bad), lambda: store.child(bad)):
        with pytest.raises(ValueError):
            op()
    assert list(store.list()) == []


def test_child_store_stays_inside_prefix(store: ObjectStore) -> None:
    child = store.child("sub/dir/")
    assert child.uri == store.uri_of("sub/dir")
    child.put_bytes("x.txt", b"in child")
    child.child("deeper").put_bytes("y", b"y")
    assert [i.key for i in store.list()] == ["sub/dir/deeper/y", "sub/dir/x.txt"]
    assert [i.key for i in child.list()] == ["deeper/y", "x.txt"]
    assert store.get_bytes("sub/dir/x.txt") == b"in child"
    with pytest.raises(ValueError):
        child.put_bytes("../escape", b"x")


def test_open_read_streams_through_gzip_zstd_and_text(store: ObjectStore) -> None:
    lines = [f"line {i} · ünïcödé {'x' * (i % 97)}\n" for i in range(40_000)]  # ~3 MiB of text
    text = "".join(lines)
    store.put_bytes("raw/a.txt.gz", gzip.compress(text.encode()))
    store.put_bytes("raw/a.txt.zst", zstandard.ZstdCompressor().compress(text.encode()))
    with (
        store.open_read("raw/a.txt.gz") as f,
        gzip.GzipFile(fileobj=f) as g,
        io.TextIOWrapper(g, encoding="utf-8") as t,
    ):
        assert t.readlines() == lines
    with (
        store.open_read("raw/a.txt.zst") as f,
        zstandard.ZstdDecompressor().stream_reader(f) as z,
        io.TextIOWrapper(z, encoding="utf-8") as t,
    ):
        assert sum(1 for _ in t) == len(lines)
    with store.open_read("raw/a.txt.gz") as f:
        assert f.read(2) == b"\x1f\x8b"  # partial reads work and close() releases the connection


def test_janitor_aborts_dangling_uploads(store: ObjectStore, tmp_path) -> None:
    if isinstance(store, S3Store):
        client = _raw_client(store)
        client.create_multipart_upload(Bucket=store.bucket, Key=f"{store.prefix}/dangling.bin")
        client.create_multipart_upload(Bucket=store.bucket, Key=f"{store.prefix}-other/not-ours.bin")
        # moto reports every upload as initiated in 2010, so "younger than 60 years" keeps it...
        assert store.abort_stale_uploads(older_than_s=60 * 365 * 86400) == 0
        assert store.abort_stale_uploads(older_than_s=3600) == 1
        assert _uploads(store) == [f"{store.prefix}-other/not-ours.bin"]  # outside the prefix: untouched
    else:
        assert isinstance(store, FileStore)
        (store.root / "w").mkdir()
        old, fresh = store.root / "w" / f"{TMP_PREFIX}old", store.root / "w" / f"{TMP_PREFIX}fresh"
        old.write_bytes(b"partial")
        fresh.write_bytes(b"in flight")
        os.utime(old, (time.time() - 7200, time.time() - 7200))
        assert store.abort_stale_uploads(older_than_s=3600) == 1
        assert not old.exists() and fresh.exists()
    assert store.abort_stale_uploads(older_than_s=3600) == 0


def _killed_writer_temp_file(root) -> str:
    """A process killed mid-write (``os._exit`` inside the writer) leaves its temp file; returns its name."""
    code = (
        "import os, pathlib; from pipeline.storage.base import write_local_file; "
        f"write_local_file(pathlib.Path({str(root)!r}) / 'w' / 'part.parquet', lambda f: os._exit(9))"
    )
    subprocess.run([sys.executable, "-c", code], env=os.environ | {"PYTHONPATH": os.getcwd()})
    (left,) = [p.name for p in (root / "w").iterdir()]
    return left


def test_temp_files_of_dead_writers_go_at_once_and_live_ones_stay(tmp_path) -> None:
    store = FileStore(tmp_path / "store")
    dead = _killed_writer_temp_file(store.root)
    assert dead.startswith(TMP_PREFIX) and "@" in dead  # .pw-tmp-<pid>@<host>~...: its writer is known
    mine = store.root / "w" / f"{tmp_prefix()}in-flight"  # this process: alive
    mine.write_bytes(b"in flight")
    assert store.remove_dead_temp_files() == 1  # a rerun's start-up: no age to wait for
    assert [p.name for p in (store.root / "w").iterdir()] == [mine.name]
    dead = _killed_writer_temp_file(store.root.parent / "other")  # the janitor, at its default age
    janitor_store = FileStore(store.root.parent / "other")
    assert janitor_store.abort_stale_uploads(older_than_s=3600) == 1
    assert not (janitor_store.root / "w" / dead).exists()


# -- S3 only ---------------------------------------------------------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize("failure", [ConnectionResetError, KeyboardInterrupt])
def test_multipart_failure_aborts_upload(s3_bucket, tmp_path, failure) -> None:
    opts = dataclasses.replace(s3_bucket.options, multipart_threshold=5 * MiB, multipart_chunk=5 * MiB)
    store = S3Store.from_uri(s3_bucket.uri, options=opts)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(11 * MiB))

    def fail_on_part_2(params, **_kwargs):
        if params.get("PartNumber") == 2:
            raise failure("simulated failure mid-upload")

    events = store.client.meta.events
    events.register("before-parameter-build.s3.UploadPart", fail_on_part_2)
    try:
        with pytest.raises(failure):
            store.put_file("big.bin", src)
    finally:
        events.unregister("before-parameter-build.s3.UploadPart", fail_on_part_2)
    assert _uploads(store) == []
    assert not store.exists("big.bin")


@pytest.mark.s3
def test_an_object_over_the_copy_limit_is_copied_in_parts(s3_bucket, monkeypatch) -> None:
    """One CopyObject takes up to 5 GB: a larger shard (a large ``shard.target_bytes``) is copied by byte
    ranges; a failed part aborts the upload, as for ``put_file``."""
    import pipeline.storage.s3 as s3_module

    monkeypatch.setattr(s3_module, "COPY_LIMIT", 1 * MiB)
    store = _small_parts(S3Store.from_uri(s3_bucket.uri, options=s3_bucket.options))
    data = os.urandom(11 * MiB)
    store.put_bytes("big.bin", data)
    calls: list[int] = []
    events = store.client.meta.events
    count = lambda params, **_kw: calls.append(params["PartNumber"])  # noqa: E731
    events.register("before-parameter-build.s3.UploadPartCopy", count)
    try:
        store.copy("big.bin", "copy.bin", size=len(data))
        store.copy("big.bin", "small-path.bin")  # no size given: one CopyObject (moto takes 11 MiB)
    finally:
        events.unregister("before-parameter-build.s3.UploadPartCopy", count)
    assert calls == [1, 2, 3]  # 5 + 5 + 1 MiB
    assert store.get_bytes("copy.bin") == store.get_bytes("small-path.bin") == data

    def fail_on_part_2(params, **_kwargs):
        if params.get("PartNumber") == 2:
            raise StorageError("simulated failure mid-copy")

    events.register("before-parameter-build.s3.UploadPartCopy", fail_on_part_2)
    try:
        with pytest.raises(StorageError):
            store.copy("big.bin", "failed.bin", size=len(data))
    finally:
        events.unregister("before-parameter-build.s3.UploadPartCopy", fail_on_part_2)
    assert _uploads(store) == [] and not store.exists("failed.bin")


@pytest.mark.s3
def test_prefix_is_a_boundary(s3_bucket) -> None:
    root = S3Store.from_uri(s3_bucket.uri, options=s3_bucket.options)
    sibling = open_store(s3_bucket.uri + "-other", s3=s3_bucket.options)
    sibling.put_bytes("x", b"outside")
    root.put_bytes("x", b"inside")
    assert [i.key for i in root.list()] == ["x"] and root.get_bytes("x") == b"inside"
    keys = [o["Key"] for o in _raw_client(root).list_objects_v2(Bucket=s3_bucket.bucket)["Contents"]]
    assert sorted(keys) == [f"{s3_bucket.prefix}-other/x", f"{s3_bucket.prefix}/x"]


def test_from_uri_parsing() -> None:
    assert S3Store.from_uri("s3://bkt", options=S3Options()).uri == "s3://bkt"
    store = S3Store.from_uri("s3://bkt/a//b/", options=S3Options())
    assert (store.bucket, store.prefix, store.uri) == ("bkt", "a/b", "s3://bkt/a/b")
    assert store.uri_of("c/d") == "s3://bkt/a/b/c/d"
    for bad in ("s3:///x", "s3://bkt/../x", "file:///tmp"):
        with pytest.raises(ValueError):
            S3Store.from_uri(bad, options=S3Options())


def _drop_connection(reader: io.BufferedReader) -> None:
    cast(_S3RawReader, reader.raw)._body.close()


@pytest.mark.s3
def test_open_read_resumes_after_dropped_connection(s3_bucket) -> None:
    store = S3Store.from_uri(s3_bucket.uri, options=s3_bucket.options)
    data = os.urandom(3 * MiB + 7)
    store.put_bytes("blob", data)
    with store.open_read("blob") as f:
        head = f.read(100)
        _drop_connection(f)  # the connection drops mid-object
        assert head + f.read() == data
    with store.open_read("blob") as f:  # the object changes under a reader: refuse to splice two versions
        f.read(100)
        store.put_bytes("blob", os.urandom(len(data)))  # same size: only the ETag can tell
        _drop_connection(f)
        with pytest.raises(StorageError, match="resumed"):
            f.read()


@pytest.mark.s3
def test_unreachable_endpoint_fails_fast(s3_bucket) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but never listening: connection refused
        opts = dataclasses.replace(
            s3_bucket.options,
            endpoint_url=f"http://127.0.0.1:{port}",
            max_attempts=1,
            connect_timeout=1.0,
            read_timeout=1.0,
        )
        store = open_store("s3://nowhere/p", s3=opts)
        started = time.monotonic()
        with pytest.raises(StorageError, match="s3://nowhere/p/k") as err:
            store.get_bytes("k")
    assert time.monotonic() - started < 5
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in str(err.value)


@pytest.mark.s3
def test_missing_bucket_is_a_storage_error_not_a_missing_object(s3_bucket) -> None:
    store = open_store("s3://pw-no-such-bucket/p", s3=s3_bucket.options)
    with pytest.raises(StorageError, match="does not exist") as err:
        store.put_bytes("k", b"v")
    assert not isinstance(err.value, FileNotFoundError) and "pw-no-such-bucket" in str(err.value)


def test_redact_filter_blanks_secrets() -> None:
    secret, token, sig = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "FwoGZXIvYXdzEXAMPLETOKEN+/=", "ab" * 32
    record = logging.LogRecord(
        "botocore.endpoint",
        logging.DEBUG,
        __file__,
        1,
        "headers %s url %s creds %s",
        (
            {
                "Authorization": f"AWS4-HMAC-SHA256 Credential=AKIA/x, Signature={sig}",
                "X-Amz-Security-Token": token,
            },
            f"https://h/b/k?X-Amz-Signature={sig}&X-Amz-Security-Token={token}",
            f"aws_secret_access_key={secret} SessionToken: {token}",
        ),
        None,
    )
    assert RedactSecretsFilter().filter(record)
    message = record.getMessage()
    for leaked in (secret, token, sig):
        assert leaked not in message
    assert "headers" in message and "<redacted>" in message and "https://h/b/k" in message


@pytest.mark.s3
def test_botocore_debug_logs_are_redacted(s3_bucket, monkeypatch, caplog) -> None:
    token = "SESSIONTOKEN" + "q" * 40
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    # A distinct options value gets its own client, built now with the session token in its credentials.
    opts = dataclasses.replace(s3_bucket.options, connect_timeout=7.25)
    store = open_store(s3_bucket.uri, s3=opts)
    store.put_bytes("k", b"v")  # builds the client and installs the filters
    caplog.set_level(logging.DEBUG, logger="botocore")
    caplog.set_level(logging.DEBUG, logger="urllib3")
    store.put_bytes("k", b"v2")
    assert store.get_bytes("k") == b"v2"
    text = caplog.text
    assert "X-Amz-Security-Token" in text or "x-amz-security-token" in text  # the header was logged...
    assert token not in text and os.environ["AWS_SECRET_ACCESS_KEY"] not in text  # ...but not its value
    assert not re.search(r"Signature=[0-9a-f]{64}", text)


def _child_put(store: S3Store, parent_client_id: int, queue) -> None:
    client = client_for(store.options)
    store.put_bytes("from-child", str(os.getpid()).encode())
    queue.put(id(client) != parent_client_id)


@pytest.mark.s3
def test_client_is_rebuilt_after_fork_and_store_pickles(s3_bucket) -> None:
    store = S3Store.from_uri(s3_bucket.uri, options=s3_bucket.options)
    store.put_bytes("k", b"v")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get_bytes("k") == b"v" and clone.uri == store.uri
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_put, args=(store, id(store.client), queue))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0 and queue.get(timeout=5) is True
    assert int(store.get_bytes("from-child")) == proc.pid
