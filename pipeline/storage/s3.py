"""``s3://`` backend over boto3: the only module in the project that talks to S3.

A store is ``bucket`` + ``prefix``; every key is normalised and joined below the prefix, so nothing is written
outside it. The boto3 client is built lazily, once per process and per :class:`S3Options` (boto3 clients are
thread-safe but must not cross a ``fork``), from the standard credential chain or a named profile only.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, BinaryIO

import boto3
import botocore.config
import botocore.exceptions

from pipeline.errors import AlreadyExistsError, StorageError
from pipeline.storage.base import (
    ObjectInfo,
    ObjectStore,
    join_key,
    normalize_key,
    write_local_file,
)
from pipeline.storage.options import S3Options

log = logging.getLogger(__name__)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_PRECONDITION = {"412", "PreconditionFailed", "ConditionalRequestConflict"}
# Errors raised while reading a response body; botocore does not retry these, so readers resume themselves.
_STREAM_ERRORS = (
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
)
_LOGGER_ROOTS = ("botocore", "boto3", "urllib3", "s3transfer")


class RedactSecretsFilter(logging.Filter):
    """Blank out AWS secrets (secret keys, session tokens, signatures, Authorization headers) in log records.

    botocore at DEBUG logs request headers and canonical requests, which carry the session token and the
    signature. The filter rewrites the formatted message, so it also catches secrets passed as ``%`` args.
    """

    _PATTERNS = (
        re.compile(r"(authorization['\"]?\s*[:=]\s*b?['\"]?)[^'\"\n]+", re.I),
        re.compile(r"(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s&,;}]+", re.I),
        re.compile(r"(x-amz-signature['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s&,;}]+", re.I),
        re.compile(r"(signature\s*[:=]\s*)[0-9a-f]{64}", re.I),
        re.compile(
            r"((?:aws_)?(?:secret_access_key|session_token|secretaccesskey|sessiontoken|secretkey)"
            r"['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s,;}]+",
            re.I,
        ),
    )

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the logging module's problem, not ours to hide
            return True
        redacted = redact_secrets(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def redact_secrets(text: str) -> str:
    for pattern in RedactSecretsFilter._PATTERNS:
        text = pattern.sub(r"\1<redacted>", text)
    return text


def install_redaction() -> None:
    """Put one :class:`RedactSecretsFilter` on every existing botocore/boto3/urllib3/s3transfer logger.

    Logger filters do not apply to records propagated from child loggers, so each child gets its own.
    """
    names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in _LOGGER_ROOTS]
    for name in {*names, *_LOGGER_ROOTS}:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecretsFilter) for f in logger.filters):
            logger.addFilter(RedactSecretsFilter())


def build_client(options: S3Options) -> Any:
    """A boto3 S3 client; credentials come from boto3's chain (env, profile, IMDS...), never from us."""
    session = boto3.Session(profile_name=options.profile) if options.profile else boto3.Session()
    # total_max_attempts counts the first try, matching S3Options.max_attempts and AWS_MAX_ATTEMPTS.
    retries: Any = {"mode": options.retry_mode, "total_max_attempts": options.max_attempts}
    config = botocore.config.Config(
        retries=retries,
        connect_timeout=options.connect_timeout,
        read_timeout=options.read_timeout,
        max_pool_connections=32,
    )
    client = session.client(
        "s3", endpoint_url=options.endpoint_url, region_name=options.region, config=config
    )
    install_redaction()
    return client


_clients: dict[S3Options, tuple[int, Any]] = {}
_clients_lock = threading.Lock()


def client_for(options: S3Options) -> Any:
    """The process's client for ``options``; rebuilt in a forked child (the parent's sockets are not ours)."""
    pid = os.getpid()
    cached = _clients.get(options)
    if cached is not None and cached[0] == pid:
        return cached[1]
    with _clients_lock:
        cached = _clients.get(options)
        if cached is None or cached[0] != pid:
            cached = (pid, build_client(options))
            _clients[options] = cached
    return cached[1]


def _error_code(err: botocore.exceptions.ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _status(err: botocore.exceptions.ClientError) -> int:
    return int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


class S3Store(ObjectStore):
    """Objects under ``s3://bucket/prefix``. See :class:`ObjectStore` for the contract of each method.

    ``put_if_absent`` is a conditional put (``If-None-Match: *``; AWS S3 since 2024-08, recent MinIO), which
    the server enforces atomically. moto (5.2) enforces it too, but checks and writes without a lock, so a
    race there is decided by timing (no double winner seen in 200 two-thread races). Servers that ignore the
    header would let both racers "win": check yours before relying on it. A caveat of every conditional
    write: if the winner's response is lost and botocore retries, the retry reports AlreadyExistsError.
    """

    def __init__(self, bucket: str, prefix: str = "", *, options: S3Options | None = None):
        if not bucket or "/" in bucket:
            raise ValueError(f"bad S3 bucket name {bucket!r}")
        self.bucket = bucket
        self.prefix = normalize_key(prefix).rstrip("/") if prefix.strip("/") else ""
        self.options = options or S3Options()
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"

    @classmethod
    def from_uri(cls, uri: str, *, options: S3Options | None = None) -> S3Store:
        if not uri.startswith("s3://"):
            raise ValueError(f"not an s3:// URI: {uri!r}")
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        return cls(bucket, prefix, options=options)

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, endpoint_url={self.options.endpoint_url!r})"

    @property
    def client(self) -> Any:
        return client_for(self.options)

    def child(self, prefix: str) -> S3Store:
        sub = normalize_key(prefix).rstrip("/")
        return S3Store(self.bucket, join_key(self.prefix, sub), options=self.options)

    def _key(self, key: str) -> str:
        norm = normalize_key(key)
        return f"{self.prefix}/{norm}" if self.prefix else norm

    def _root(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    @contextlib.contextmanager
    def _errors(self, op: str, key: str | None) -> Iterator[None]:
        """Map botocore errors to FileNotFoundError / StorageError naming the URI (never the credentials)."""
        uri = self.uri_of(key) if key else self.uri
        try:
            yield
        except botocore.exceptions.ClientError as e:
            code = _error_code(e)
            if code == "NoSuchBucket":
                raise StorageError(f"S3 {op} {uri} failed: bucket {self.bucket!r} does not exist") from None
            if code in _NOT_FOUND or _status(e) == 404:
                raise FileNotFoundError(f"{uri} does not exist ({op})") from None
            if code in {"AccessDenied", "AllAccessDisabled"} or _status(e) == 403:
                # PermissionError: ingest quarantines the object as read_error instead of failing the run.
                raise PermissionError(
                    f"{uri}: access denied ({op}); check the credentials' S3 policy"
                ) from None
            raise StorageError(f"S3 {op} {uri} failed: {redact_secrets(str(e))}") from e
        except botocore.exceptions.BotoCoreError as e:
            raise StorageError(f"S3 {op} {uri} failed: {type(e).__name__}: {redact_secrets(str(e))}") from e

    # -- writes -------------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._errors("put", key):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        with self._errors("put_if_absent", key):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
            except botocore.exceptions.ClientError as e:
                if _error_code(e) in _PRECONDITION or _status(e) in (409, 412):
                    raise AlreadyExistsError(f"{self.uri_of(key)} already exists") from None
                raise

    def put_file(self, key: str, path: str | Path) -> None:
        size = os.path.getsize(path)
        if size <= self.options.multipart_threshold:
            with open(path, "rb") as f, self._errors("put", key):
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=f)
            return
        with self._errors("create_multipart_upload", key):
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=self._key(key))[
                "UploadId"
            ]
        try:
            parts = self._upload_parts(key, upload_id, path, size)
            with self._errors("complete_multipart_upload", key):
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=self._key(key),
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
        except BaseException:  # KeyboardInterrupt too: a dangling upload is billed storage
            self._abort_upload(key, upload_id)
            raise

    def _upload_parts(self, key: str, upload_id: str, path: str | Path, size: int) -> list[dict]:
        """Upload ``max_concurrency`` parts at a time, holding at most that many chunks in memory."""
        chunk, width = self.options.multipart_chunk, self.options.max_concurrency
        etags: dict[int, str] = {}
        pending: dict[Future, int] = {}
        pool = ThreadPoolExecutor(width, thread_name_prefix="pw-s3-part")
        try:
            with open(path, "rb") as f:
                for number, offset in enumerate(range(0, size, chunk), start=1):
                    if len(pending) >= width:
                        done, _ = wait(pending, return_when=FIRST_COMPLETED)
                        etags.update((pending.pop(fut), fut.result()) for fut in done)
                    data = f.read(chunk)
                    if len(data) != min(chunk, size - offset):
                        raise StorageError(f"{path} changed size during upload to {self.uri_of(key)}")
                    pending[pool.submit(self._upload_part, key, upload_id, number, data)] = number
            etags.update((number, fut.result()) for fut, number in pending.items())
        finally:
            # Let in-flight parts finish before the caller aborts, or S3 may keep a part of a dead upload.
            pool.shutdown(wait=True, cancel_futures=True)
        return [{"PartNumber": n, "ETag": etags[n]} for n in sorted(etags)]

    def _upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        with self._errors("upload_part", key):
            resp = self.client.upload_part(
                Bucket=self.bucket, Key=self._key(key), UploadId=upload_id, PartNumber=number, Body=data
            )
        return resp["ETag"]

    def _abort_upload(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id)
        except Exception as e:  # the janitor (abort_stale_uploads) gets whatever this misses
            log.warning(
                "could not abort multipart upload of %s: %s", self.uri_of(key), redact_secrets(str(e))
            )

    def copy(self, src_key: str, dst_key: str) -> None:
        """Server-side copy (no bytes through this process); objects up to 5 GB, our unit files are far smaller."""
        with self._errors("copy", src_key):
            self.client.copy_object(
                Bucket=self.bucket,
                Key=self._key(dst_key),
                CopySource={"Bucket": self.bucket, "Key": self._key(src_key)},
            )

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def abort_stale_uploads(self, older_than_s: float = 3600.0) -> int:
        """Abort multipart uploads under the prefix initiated more than ``older_than_s`` ago (the janitor).

        Keep ``older_than_s`` above the longest upload you run: a live upload older than it is aborted too.
        (moto reports every upload as initiated on 2010-11-10, so there any age up to ~16 years matches.)
        """
        cutoff = time.time() - older_than_s
        aborted = 0
        paginator = self.client.get_paginator("list_multipart_uploads")
        with self._errors("list_multipart_uploads", None):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._root()):
                for upload in page.get("Uploads", []):
                    if upload["Initiated"].timestamp() >= cutoff:
                        continue
                    try:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                    except botocore.exceptions.ClientError as e:
                        if _error_code(e) != "NoSuchUpload":  # completed or aborted meanwhile: fine
                            raise
                        continue
                    aborted += 1
        if aborted:
            log.info("aborted %d stale multipart uploads under %s", aborted, self.uri)
        return aborted

    # -- reads --------------------------------------------------------------------------------------

    def _get_object(self, key: str, **kwargs: Any) -> dict:
        with self._errors("get", key):
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key), **kwargs)

    def get_bytes(self, key: str) -> bytes:
        with self.open_read(key) as f:
            return f.read()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length}")
        if length == 0:
            return b""
        with self._errors("get", key):
            try:
                resp = self.client.get_object(
                    Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{start + length - 1}"
                )
            except botocore.exceptions.ClientError as e:
                if _error_code(e) == "InvalidRange":
                    return b""  # start at or past the end: the same answer as a local file
                raise
        with _S3RawReader(self, key, resp) as raw:
            return io.BufferedReader(raw).read()

    def get_file(self, key: str, path: str | Path) -> None:
        def copy(out: BinaryIO) -> None:
            with self.open_read(key) as src:
                while block := src.read(1 << 20):
                    out.write(block)

        write_local_file(Path(path), copy)

    def open_read(self, key: str) -> io.BufferedReader:
        """A buffered binary reader that resumes (ranged GET pinned to the ETag) after a dropped connection."""
        raw = _S3RawReader(self, key, self._get_object(key))
        return io.BufferedReader(raw, buffer_size=1 << 20)

    def stat(self, key: str) -> ObjectInfo:
        with self._errors("head", key):
            resp = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        return ObjectInfo(
            key=normalize_key(key),
            size=int(resp["ContentLength"]),
            etag=resp["ETag"].strip('"'),
            mtime=resp["LastModified"].timestamp(),
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Paginated listing, sorted here too: S3-compatible servers (and directory buckets) differ in order."""
        root = self._root()
        full = root + (normalize_key(prefix) if prefix else "")
        found = []
        paginator = self.client.get_paginator("list_objects_v2")
        with self._errors("list", prefix or None):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    found.append(
                        ObjectInfo(
                            key=obj["Key"][len(root) :],
                            size=int(obj["Size"]),
                            etag=obj["ETag"].strip('"'),
                            mtime=obj["LastModified"].timestamp(),
                        )
                    )
        found.sort(key=lambda info: info.key)
        yield from found


class _S3RawReader(io.RawIOBase):
    """A raw stream over a GetObject body; after a read error it re-requests the rest pinned by ``If-Match``."""

    def __init__(self, store: S3Store, key: str, response: dict):
        self._store, self._key = store, key
        self._body = response["Body"]
        self._etag = response["ETag"]
        self._start = 0
        content_range = response.get("ContentRange")  # "bytes a-b/total" for ranged reads
        if content_range:
            self._start = int(content_range.split()[1].split("-")[0])
        self._end = self._start + int(response["ContentLength"])
        self._pos = self._start
        self._retries = store.options.max_attempts - 1

    def readable(self) -> bool:
        return True

    def readall(self) -> bytes:
        # RawIOBase.readall reads 8 KiB at a time; whole-object reads (get_bytes) deserve bigger gulps.
        parts = []
        while chunk := self.read(max(1 << 16, min(8 << 20, self._end - self._pos))):
            parts.append(chunk)
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while self._pos < self._end:
            try:
                data = self._body.read(min(len(view), self._end - self._pos))
            except _STREAM_ERRORS as e:
                self._resume(e)
                continue
            if not data:
                self._resume(None)
                continue
            view[: len(data)] = data
            self._pos += len(data)
            return len(data)
        return 0

    def _resume(self, error: Exception | None) -> None:
        uri = self._store.uri_of(self._key)
        if self._retries <= 0:
            raise StorageError(f"S3 read of {uri} failed at byte {self._pos}: {error or 'connection closed'}")
        self._retries -= 1
        log.warning("S3 read of %s interrupted at byte %d (%s); resuming", uri, self._pos, error)
        with contextlib.suppress(Exception):
            self._body.close()
        try:
            resp = self._store._get_object(
                self._key, Range=f"bytes={self._pos}-{self._end - 1}", IfMatch=self._etag
            )
        except StorageError as e:
            raise StorageError(f"{uri} could not be resumed (changed while reading?): {e}") from None
        self._body = resp["Body"]

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(Exception):
                self._body.close()
        super().close()
