"""``s3://`` backend over boto3: the only module in the project that talks to S3.

A store is ``bucket`` + ``prefix``; every key is normalised and joined below the prefix, so nothing is written
outside it. The boto3 client is built lazily, once per process and per :class:`S3Options` (boto3 clients are
thread-safe but must not cross a ``fork``), from the standard credential chain or a named profile only.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from pipeline.errors import AlreadyExistsError, StorageError, UploadAborted
from pipeline.storage.base import (
    ObjectInfo,
    ObjectStore,
    join_key,
    normalize_key,
    write_local_file,
)
from pipeline.storage.options import S3Options
from pipeline.storage.retry import STATS, PermanentStorageError, backoff_s, call_with_retries

log = logging.getLogger(__name__)
T = TypeVar("T")

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
UPLOAD_RESTARTS = 2  # times a multipart upload aborted under its writer starts again
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
    """A boto3 S3 client; credentials come from boto3's chain (env, profile, IMDS...), never from us.

    botocore makes a single attempt per call: retries are ours (``pipeline.storage.retry``), per operation
    and within a time budget, because botocore's standard mode shares a quota per client that sustained
    throttling drains.
    """
    try:
        session = boto3.Session(profile_name=options.profile) if options.profile else boto3.Session()
    except botocore.exceptions.ProfileNotFound as e:
        raise PermanentStorageError(f"{e}: fix s3.profile (--s3-profile) or ~/.aws/config") from None
    retries: Any = {"mode": "standard", "total_max_attempts": 1}
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


COPY_LIMIT = 5 * 1024**3  # the largest object one CopyObject takes


class S3Store(ObjectStore):
    """Objects under ``s3://bucket/prefix``. See :class:`ObjectStore` for the contract of each method.

    ``put_if_absent`` is a conditional put (``If-None-Match: *``; AWS S3 since 2024-08, recent MinIO), which
    the server enforces atomically. moto (5.2) enforces it too, but checks and writes without a lock, so a
    race there is decided by timing (no double winner seen in 200 two-thread races). Servers that ignore the
    header would let both racers "win": check yours before relying on it. A caveat of every conditional
    write: if the winner's response is lost and botocore retries, the retry reports AlreadyExistsError.
    """

    io_threads = 16  # ``map``'s calls in flight (the client pools 32 connections)

    def __init__(self, bucket: str, prefix: str = "", *, options: S3Options):
        if not bucket or "/" in bucket:
            raise ValueError(f"bad S3 bucket name {bucket!r}")
        self.bucket = bucket
        self.prefix = normalize_key(prefix).rstrip("/") if prefix.strip("/") else ""
        if not isinstance(options, S3Options):
            raise TypeError("S3Store needs the resolved S3Options (the config's s3: section)")
        self.options = self.s3 = options
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"

    @classmethod
    def from_uri(cls, uri: str, *, options: S3Options) -> S3Store:
        if not uri.startswith("s3://"):
            raise ValueError(f"not an s3:// URI: {uri!r}")
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        return cls(bucket, prefix, options=options)

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, endpoint_url={self.options.endpoint_url!r})"

    @property
    def client(self) -> Any:
        return client_for(self.options)

    def presigned_url(self, key: str, expires_s: int) -> str:
        """A GET URL for ``key`` valid ``expires_s`` seconds, signed locally with the configured credentials."""
        return str(
            self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=expires_s
            )
        )

    def child(self, prefix: str) -> S3Store:
        sub = normalize_key(prefix).rstrip("/")
        store = S3Store(self.bucket, join_key(self.prefix, sub), options=self.options)
        store.uploads = self.uploads
        return store

    def _key(self, key: str) -> str:
        norm = normalize_key(key)
        return f"{self.prefix}/{norm}" if self.prefix else norm

    def _root(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    @contextlib.contextmanager
    def _errors(self, op: str, key: str | None) -> Iterator[None]:
        """Map botocore errors to one line naming the URI and the fix (never the credentials)."""
        uri = self.uri_of(key) if key else self.uri
        try:
            yield
        except botocore.exceptions.ClientError as e:
            code = _error_code(e)
            if code == "NoSuchBucket":
                raise PermanentStorageError(
                    f"S3 {op} {uri} failed: bucket {self.bucket!r} does not exist at "
                    f"{self.options.endpoint_url or 'AWS'}; create it or fix the URI / s3.endpoint_url"
                ) from None
            if code == "NoSuchUpload":
                raise UploadAborted(f"S3 {op} {uri}: its multipart upload was aborted meanwhile") from None
            if code in _NOT_FOUND or _status(e) == 404:
                raise FileNotFoundError(f"{uri} does not exist ({op})") from None
            if code in {
                "AccessDenied",
                "AllAccessDisabled",
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
            } or (_status(e) == 403):
                # PermissionError: ingest quarantines the object as read_error instead of failing the run.
                raise PermissionError(
                    f"{uri}: access denied ({op}, {code or 403}); check the credentials and their S3 policy"
                ) from None
            raise StorageError(f"S3 {op} {uri} failed: {redact_secrets(str(e))}") from e
        except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError) as e:
            raise PermanentStorageError(
                f"S3 {op} {uri}: {e}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or s3.profile (--s3-profile)"
            ) from None
        except botocore.exceptions.BotoCoreError as e:
            raise StorageError(f"S3 {op} {uri} failed: {type(e).__name__}: {redact_secrets(str(e))}") from e

    def _call(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        """One S3 operation: our retries on transient failures, then the error mapping above."""
        what = f"S3 {op} {self.uri_of(key) if key else self.uri}"
        with self._errors(op, key):
            return call_with_retries(fn, self.options, what)

    # -- writes -------------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        k = self._key(key)
        self._call("put", key, lambda: self.client.put_object(Bucket=self.bucket, Key=k, Body=data))

    def put_if_absent(self, key: str, data: bytes) -> None:
        k = self._key(key)
        try:
            self._call(
                "put_if_absent",
                key,
                lambda: self.client.put_object(Bucket=self.bucket, Key=k, Body=data, IfNoneMatch="*"),
            )
        except StorageError as e:
            cause = e.__cause__
            if isinstance(cause, botocore.exceptions.ClientError) and (
                _error_code(cause) in _PRECONDITION or _status(cause) in (409, 412)
            ):
                raise AlreadyExistsError(f"{self.uri_of(key)} already exists") from None
            raise

    def put_file(self, key: str, path: str | Path) -> None:
        size = os.path.getsize(path)
        k = self._key(key)
        if size <= self.options.multipart_threshold:

            def put() -> Any:
                with open(path, "rb") as f:  # reopened per try: a retry sends the whole body again
                    return self.client.put_object(Bucket=self.bucket, Key=k, Body=f)

            self._call("put", key, put)
            return
        self._multipart(key, lambda upload_id: self._upload_parts(key, upload_id, path, size))

    def _multipart(self, key: str, send_parts: Callable[[str], list[dict]]) -> None:
        """A multipart upload of ``key`` whose parts ``send_parts(upload_id)`` sends: recorded in the upload
        journal while it runs, completed, or aborted on any failure (a dangling upload is billed storage). An
        upload aborted under us (``NoSuchUpload``: a janitor or another build took it for a dead run's) cannot
        be resumed: it starts again, a few times at most."""
        for attempt in range(1, UPLOAD_RESTARTS + 2):
            try:
                self._multipart_once(key, send_parts)
                return
            except UploadAborted:
                if attempt > UPLOAD_RESTARTS:
                    raise
                log.warning(
                    "multipart upload of %s was aborted by another process; starting it again",
                    self.uri_of(key),
                )

    def _multipart_once(self, key: str, send_parts: Callable[[str], list[dict]]) -> None:
        k = self._key(key)
        upload_id = self._call(
            "create_multipart_upload",
            key,
            lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=k)["UploadId"],
        )
        self.uploads.started(self.bucket, k, upload_id)
        try:
            parts = send_parts(upload_id)
            self._call(
                "complete_multipart_upload",
                key,
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=k, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except UploadAborted:
            self.uploads.finished(self.bucket, k, upload_id)  # gone already: nothing to abort
            raise
        except BaseException:  # KeyboardInterrupt too
            self._abort_upload(key, upload_id)
            raise
        self.uploads.finished(self.bucket, k, upload_id)

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
        k = self._key(key)
        resp = self._call(
            "upload_part",
            key,
            lambda: self.client.upload_part(
                Bucket=self.bucket, Key=k, UploadId=upload_id, PartNumber=number, Body=data
            ),
        )
        return resp["ETag"]

    def _abort_upload(self, key: str, upload_id: str) -> None:
        k = self._key(key)
        try:
            self._call(
                "abort_multipart_upload",
                key,
                lambda: self.client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id),
            )
        except Exception as e:  # recorded in the upload journal: a rerun or the janitor aborts it
            log.warning(
                "could not abort multipart upload of %s: %s", self.uri_of(key), redact_secrets(str(e))
            )
            return
        self.uploads.finished(self.bucket, k, upload_id)

    def copy(self, src_key: str, dst_key: str, size: int | None = None) -> None:
        """Server-side copy (no bytes through this process). One CopyObject takes objects up to 5 GB; a larger
        one (a shard of a large ``shard.target_bytes``, whose ``size`` the caller gives) is copied in parts."""
        if size is not None and size > COPY_LIMIT:
            self._copy_parts(src_key, dst_key, size)
            return
        src, dst = self._key(src_key), self._key(dst_key)
        self._call(
            "copy",
            src_key,
            lambda: self.client.copy_object(
                Bucket=self.bucket, Key=dst, CopySource={"Bucket": self.bucket, "Key": src}
            ),
        )

    def _copy_parts(self, src_key: str, dst_key: str, size: int) -> None:
        """A multipart copy (UploadPartCopy by byte range), recorded and aborted on failure like an upload."""
        k, source = self._key(dst_key), {"Bucket": self.bucket, "Key": self._key(src_key)}
        chunk = max(self.options.multipart_chunk, -(-size // 10_000))  # S3 takes at most 10,000 parts

        def copy_parts(upload_id: str) -> list[dict]:
            parts = []
            for number, start in enumerate(range(0, size, chunk), 1):
                part = functools.partial(
                    self.client.upload_part_copy,
                    Bucket=self.bucket,
                    Key=k,
                    UploadId=upload_id,
                    PartNumber=number,
                    CopySource=source,
                    CopySourceRange=f"bytes={start}-{min(start + chunk, size) - 1}",
                )
                result = self._call("upload_part_copy", dst_key, part)
                parts.append({"PartNumber": number, "ETag": result["CopyPartResult"]["ETag"]})
            return parts

        self._multipart(dst_key, copy_parts)

    def delete(self, key: str) -> None:
        k = self._key(key)
        self._call("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=k))

    def abort_upload(self, key: str, upload_id: str) -> bool:
        """Abort one multipart upload by its full key (as recorded); False when it no longer exists."""
        try:
            self._call(
                "abort_multipart_upload",
                None,
                lambda: self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id),
            )
        except (UploadAborted, FileNotFoundError):
            return False  # completed or aborted meanwhile: fine
        return True

    def list_uploads(self) -> list[dict[str, Any]]:
        """Multipart uploads in progress under the prefix: ``Key``, ``UploadId``, ``Initiated``."""

        def fetch() -> list[dict[str, Any]]:
            paginator = self.client.get_paginator("list_multipart_uploads")
            pages = paginator.paginate(Bucket=self.bucket, Prefix=self._root())
            return [upload for page in pages for upload in page.get("Uploads", [])]

        return self._call("list_multipart_uploads", None, fetch)

    def abort_stale_uploads(self, older_than_s: float = 3600.0, keep: frozenset[str] = frozenset()) -> int:
        """Abort multipart uploads under the prefix initiated more than ``older_than_s`` ago (the janitor).

        Keep ``older_than_s`` above the longest upload you run: a live upload older than it is aborted too,
        unless its id is in ``keep`` (a live build's, from its journal and lease: ``live_upload_ids``).
        (moto reports every upload as initiated on 2010-11-10, so there any age up to ~16 years matches.)
        Uploads recorded by runs that are gone are aborted at once by
        :func:`pipeline.storage.janitor.abort_recorded_uploads`.
        """
        cutoff = time.time() - older_than_s
        aborted = 0
        for upload in self.list_uploads():
            if upload["Initiated"].timestamp() < cutoff and upload["UploadId"] not in keep:
                aborted += self.abort_upload(upload["Key"], upload["UploadId"])
        if aborted:
            log.info("aborted %d stale multipart uploads under %s", aborted, self.uri)
        return aborted

    # -- reads --------------------------------------------------------------------------------------

    def _get_object(self, key: str, **kwargs: Any) -> dict:
        k = self._key(key)
        return self._call("get", key, lambda: self.client.get_object(Bucket=self.bucket, Key=k, **kwargs))

    def get_bytes(self, key: str) -> bytes:
        with self.open_read(key) as f:
            return f.read()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length}")
        if length == 0:
            return b""
        try:
            resp = self._get_object(key, Range=f"bytes={start}-{start + length - 1}")
        except StorageError as e:
            cause = e.__cause__
            if isinstance(cause, botocore.exceptions.ClientError) and _error_code(cause) == "InvalidRange":
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
        k = self._key(key)
        resp = self._call("head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=k))
        return ObjectInfo(
            key=normalize_key(key),
            size=int(resp["ContentLength"]),
            etag=resp["ETag"].strip('"'),
            mtime=resp["LastModified"].timestamp(),
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Paginated listing, sorted here too: S3-compatible servers (and directory buckets) differ in order.

        A failed page restarts the listing (within the retry budget): pages are cheap, partial lists wrong.
        """
        root = self._root()
        full = root + (normalize_key(prefix) if prefix else "")

        def fetch() -> list[ObjectInfo]:
            paginator = self.client.get_paginator("list_objects_v2")
            return [
                ObjectInfo(
                    key=obj["Key"][len(root) :],
                    size=int(obj["Size"]),
                    etag=obj["ETag"].strip('"'),
                    mtime=obj["LastModified"].timestamp(),
                )
                for page in paginator.paginate(Bucket=self.bucket, Prefix=full)
                for obj in page.get("Contents", [])
            ]

        found = self._call("list", prefix or None, fetch)
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
        self._resumes = 0
        self._first_error: float | None = None  # the resume budget runs from the first interruption

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
        uri, options = self._store.uri_of(self._key), self._store.options
        now = time.monotonic()
        self._first_error = self._first_error or now
        pause = backoff_s(self._resumes, options)
        if (
            self._resumes + 1 >= options.max_attempts
            or now - self._first_error + pause > options.retry_budget_s
        ):
            raise StorageError(f"S3 read of {uri} failed at byte {self._pos}: {error or 'connection closed'}")
        self._resumes += 1
        STATS.record(retry_reason="stream")
        time.sleep(pause)
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
