"""``gs://`` backend over google-cloud-storage: the only module in the project that talks to Google Cloud Storage.

A store is ``bucket`` + ``prefix``, keys joined below the prefix as on S3. Credentials come from Application
Default Credentials only (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, the
metadata server); ``STORAGE_EMULATOR_HOST`` (the SDK's own emulator variable) points the client at an emulator
with no flag, and ``s3.gcs_endpoint_url`` (``--gcs-endpoint-url``) at any endpoint: an ``http://`` one is
reached anonymously (an emulator), an ``https://`` one with ADC.

The SDK's own retries are off (``retry=None`` on every call): ours run per operation within
``retry_budget_s`` (``pipeline.storage.retry``), as for S3. Large files go up as resumable uploads, one
chunk per request; after a failed chunk the session is asked how much it holds and the upload goes on from
there. The session URL is recorded in the upload journal while it runs, so the janitor can cancel a killed
run's session (GCS keeps no listing of open sessions; an unfinished one expires after a week).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import google.api_core.exceptions as gexc
import google.auth
import google.auth.exceptions
import requests
import urllib3.exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage
from google.resumable_media import DataCorruption, InvalidResponse

from pipeline.errors import AlreadyExistsError, PermanentStorageError, StorageError, UploadAborted
from pipeline.storage.base import ObjectInfo, join_key, normalize_key
from pipeline.storage.options import S3Options
from pipeline.storage.ranged import RangedStore, open_ranged
from pipeline.storage.retry import call_with_retries

log = logging.getLogger(__name__)
T = TypeVar("T")
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
UPLOAD_RESTARTS = 2  # times a resumable upload whose session vanished starts again
_RESUME_INCOMPLETE = 308
NO_CREDENTIALS_FIX = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, run `gcloud auth application-default "
    "login`, or run on a Google machine; for an emulator set STORAGE_EMULATOR_HOST or s3.gcs_endpoint_url "
    "(--gcs-endpoint-url) to its http:// URL"
)


def transient_reason(exc: BaseException) -> str | None:
    """Why a GCS failure is worth another try (``throttled``, ``server-5xx``, ``connection``), or None."""
    if isinstance(exc, gexc.GoogleAPICallError):
        code = int(exc.code or 0)
        if code in (429, 503):
            return "throttled"
        if code == 408 or code >= 500:
            return "server-5xx"
        return None
    if isinstance(exc, InvalidResponse):
        status = int(getattr(exc.response, "status_code", 0) or 0)
        return "throttled" if status in (429, 503) else "server-5xx" if status >= 500 else None
    if isinstance(exc, DataCorruption):
        return "connection"  # a body cut short fails its checksum: the next try reads it whole
    if isinstance(exc, requests.exceptions.HTTPError):
        return None
    if isinstance(
        exc,
        (
            requests.exceptions.RequestException,
            urllib3.exceptions.HTTPError,
            http.client.HTTPException,
            google.auth.exceptions.TransportError,
            ConnectionError,
            TimeoutError,
        ),
    ):
        return "connection"
    return None


def _credentials(options: S3Options) -> tuple[Credentials, str | None]:
    """ADC, or none for an emulator (``STORAGE_EMULATOR_HOST``, an ``http://`` endpoint)."""
    endpoint = options.gcs_endpoint_url or os.environ.get("STORAGE_EMULATOR_HOST")
    if endpoint and not endpoint.startswith("https://"):
        return AnonymousCredentials(), os.environ.get("GOOGLE_CLOUD_PROJECT")
    try:
        credentials, project = google.auth.default(scopes=SCOPES)
    except google.auth.exceptions.DefaultCredentialsError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PermanentStorageError(f"no Google credentials ({first}); {NO_CREDENTIALS_FIX}") from None
    return credentials, project


class _Client:
    """The SDK client and an authorised session (for resumable chunks) of one process and one options."""

    def __init__(self, options: S3Options):
        credentials, project = _credentials(options)
        endpoint = options.gcs_endpoint_url
        kwargs: dict[str, Any] = {"credentials": credentials, "project": project or "<none>"}
        if endpoint:
            kwargs["client_options"] = {"api_endpoint": endpoint.rstrip("/")}
        self.storage = storage.Client(**kwargs)
        self.session = AuthorizedSession(credentials)
        self.timeout = (options.connect_timeout, options.read_timeout)


_clients: dict[S3Options, tuple[int, _Client]] = {}
_clients_lock = threading.Lock()


def client_for(options: S3Options) -> _Client:
    """The process's client for ``options``; rebuilt in a forked child (the parent's sockets are not ours)."""
    pid = os.getpid()
    cached = _clients.get(options)
    if cached is None or cached[0] != pid:
        with _clients_lock:
            cached = _clients.get(options)
            if cached is None or cached[0] != pid:
                cached = (pid, _Client(options))
                _clients[options] = cached
    return cached[1]


class GCSStore(RangedStore):
    """Objects under ``gs://bucket/prefix``. See :class:`ObjectStore` for the contract of each method.

    ``put_if_absent`` is an upload with ``ifGenerationMatch=0``, which GCS enforces atomically. (The PyPI
    emulator the tests use ignores preconditions; the tests put a front in its way that keeps them.)
    """

    io_threads = 8  # the SDK's HTTP pool keeps 10 connections

    def __init__(self, bucket: str, prefix: str = "", *, options: S3Options):
        if not bucket or "/" in bucket:
            raise ValueError(f"bad GCS bucket name {bucket!r}")
        if not isinstance(options, S3Options):
            raise TypeError("GCSStore needs the resolved S3Options (the config's s3: section)")
        self.bucket = bucket
        self.prefix = normalize_key(prefix).rstrip("/") if prefix.strip("/") else ""
        self.options = self.s3 = options
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        self._bucket_seen = False  # a bucket that answered once exists: no need to ask on every 404

    @classmethod
    def from_uri(cls, uri: str, *, options: S3Options) -> GCSStore:
        if not uri.startswith("gs://"):
            raise ValueError(f"not a gs:// URI: {uri!r}")
        bucket, _, prefix = uri[len("gs://") :].partition("/")
        return cls(bucket, prefix, options=options)

    def __repr__(self) -> str:
        return f"GCSStore({self.uri!r}, endpoint_url={self.options.gcs_endpoint_url!r})"

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()  # no client inside: each process builds its own

    @property
    def client(self) -> _Client:
        return client_for(self.options)

    def child(self, prefix: str) -> GCSStore:
        store = GCSStore(
            self.bucket, join_key(self.prefix, normalize_key(prefix).rstrip("/")), options=self.options
        )
        store.uploads = self.uploads
        return store

    def _key(self, key: str) -> str:
        norm = normalize_key(key)
        return f"{self.prefix}/{norm}" if self.prefix else norm

    def _blob(self, key: str, generation: int | None = None) -> storage.Blob:
        return self.client.storage.bucket(self.bucket).blob(self._key(key), generation=generation)

    @property
    def _timeout(self) -> tuple[float, float]:
        return (self.options.connect_timeout, self.options.read_timeout)

    # -- errors and retries -------------------------------------------------------------------------

    def _bucket_missing(self) -> bool:
        if self._bucket_seen:
            return False
        bucket = self.client.storage.bucket(self.bucket)
        exists = call_with_retries(
            lambda: bucket.exists(retry=None, timeout=self._timeout),
            self.options,
            f"GCS bucket check {self.uri}",
            classify=transient_reason,
        )
        self._bucket_seen = bool(exists)
        return not exists

    def _missing(self, op: str, uri: str) -> Exception:
        if self._bucket_missing():
            endpoint = self.options.gcs_endpoint_url or os.environ.get("STORAGE_EMULATOR_HOST") or "Google"
            return PermanentStorageError(
                f"GCS {op} {uri} failed: bucket {self.bucket!r} does not exist at {endpoint}; create it or "
                "fix the URI / s3.gcs_endpoint_url"
            )
        return FileNotFoundError(f"{uri} does not exist ({op})")

    @contextlib.contextmanager
    def _errors(self, op: str, key: str | None) -> Iterator[None]:
        """Map SDK errors to one line naming the URI and the fix (never a token)."""
        uri = self.uri_of(key) if key else self.uri
        try:
            yield
        except gexc.NotFound:
            raise self._missing(op, uri) from None
        except (gexc.Forbidden, gexc.Unauthorized) as e:
            raise PermissionError(
                f"{uri}: access denied ({op}, {e.code}); check the credentials and their roles on the bucket"
            ) from None
        except google.auth.exceptions.RefreshError as e:
            raise PermanentStorageError(
                f"GCS {op} {uri}: the credentials were refused ({e}); {NO_CREDENTIALS_FIX}"
            ) from None
        except gexc.GoogleAPICallError as e:
            raise StorageError(f"GCS {op} {uri} failed: {e.code} {e.message}") from e
        except (requests.exceptions.RequestException, google.auth.exceptions.GoogleAuthError) as e:
            raise StorageError(f"GCS {op} {uri} failed: {type(e).__name__}: {e}") from e

    def _call(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        what = f"GCS {op} {self.uri_of(key) if key else self.uri}"
        with self._errors(op, key):
            result = call_with_retries(fn, self.options, what, classify=transient_reason)
        self._bucket_seen = True
        return result

    # -- writes -------------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(
            "put", key, lambda: self._blob(key).upload_from_string(data, retry=None, timeout=self._timeout)
        )

    def put_if_absent(self, key: str, data: bytes) -> None:
        def put() -> None:
            self._blob(key).upload_from_string(data, if_generation_match=0, retry=None, timeout=self._timeout)

        try:
            self._call("put_if_absent", key, put)
        except StorageError as e:
            if isinstance(e.__cause__, gexc.PreconditionFailed):
                raise AlreadyExistsError(f"{self.uri_of(key)} already exists") from None
            raise

    def put_file(self, key: str, path: str | Path) -> None:
        size = os.path.getsize(path)
        if size <= self.options.multipart_threshold:
            self._call(
                "put",
                key,
                lambda: self._blob(key).upload_from_filename(str(path), retry=None, timeout=self._timeout),
            )
            return
        for attempt in range(1, UPLOAD_RESTARTS + 2):
            try:
                self._resumable_upload(key, path, size)
                return
            except UploadAborted:
                if attempt > UPLOAD_RESTARTS:
                    raise
                log.warning("resumable upload of %s lost its session; starting it again", self.uri_of(key))

    def _resumable_upload(self, key: str, path: str | Path, size: int) -> None:
        blob = self._blob(key)
        url = self._call(
            "start_resumable_upload",
            key,
            lambda: blob.create_resumable_upload_session(size=size, retry=None, timeout=self._timeout),
        )
        self.uploads.started(self.bucket, self._key(key), url, store_uri=f"gs://{self.bucket}")
        try:
            self._send_chunks(key, url, path, size)
        except BaseException:  # KeyboardInterrupt too
            self._abort_quietly(key, url)
            raise
        self.uploads.finished(self.bucket, self._key(key), url)

    def _abort_quietly(self, key: str, url: str) -> None:
        try:
            self.abort_upload(self._key(key), url)
        except Exception as e:  # recorded in the upload journal: a rerun or the janitor cancels it
            log.warning("could not cancel the resumable upload of %s: %s", self.uri_of(key), e)
            return
        self.uploads.finished(self.bucket, self._key(key), url)

    def _send_chunks(self, key: str, url: str, path: str | Path, size: int) -> None:
        """Send the file a chunk per request; after a failure ask the session what it holds, go on from there."""
        chunk, state = self.options.multipart_chunk, {"offset": 0, "known": True}
        with open(path, "rb") as f:

            def step() -> int:
                if not state["known"]:
                    state["offset"], state["known"] = self._session_offset(url, size), True
                    if state["offset"] >= size:
                        return size
                offset = state["offset"]
                f.seek(offset)
                data = f.read(min(chunk, size - offset))
                headers = {"Content-Range": f"bytes {offset}-{offset + len(data) - 1}/{size}"}
                state["known"] = False  # until the answer says how far the session got
                resp = self.client.session.put(url, data=data, headers=headers, timeout=self._timeout)
                state["offset"], state["known"] = self._persisted(resp, size), True
                return int(state["offset"])

            while state["offset"] < size:
                if self._call("upload_chunk", key, step) > size:
                    raise AssertionError("unreachable: the session holds more than the file")

    def _session_offset(self, url: str, size: int) -> int:
        resp = self.client.session.put(
            url, headers={"Content-Range": f"bytes */{size}"}, timeout=self._timeout
        )
        return self._persisted(resp, size)

    @staticmethod
    def _persisted(resp: requests.Response, size: int) -> int:
        """Bytes the session holds, from a chunk's or a status query's answer (raises on an error answer)."""
        if resp.status_code in (200, 201):
            return size
        if resp.status_code == _RESUME_INCOMPLETE:
            held = resp.headers.get("Range", "")  # "bytes=0-N", absent when nothing is held yet
            return int(held.rpartition("-")[2]) + 1 if held else 0
        if resp.status_code in (404, 410):
            raise UploadAborted(
                f"the resumable upload session {resp.status_code}: gone (cancelled or expired)"
            )
        raise gexc.from_http_status(resp.status_code, resp.text[:200] or resp.reason, response=resp)

    def abort_upload(self, key: str, upload_id: str) -> bool:
        """Cancel one resumable session (``upload_id``: its URL); False when it was gone already."""

        def cancel() -> requests.Response:
            resp = self.client.session.delete(upload_id, timeout=self._timeout)
            if resp.status_code in (408, 429) or (resp.status_code >= 500 and resp.status_code != 501):
                raise gexc.from_http_status(resp.status_code, resp.text[:200] or resp.reason, response=resp)
            return resp

        resp = self._call("cancel_upload", None, cancel)
        if resp.status_code == 501:  # an emulator without cancel: the session expires by itself
            log.info("%s cannot cancel upload sessions; the one of %s expires by itself", self.uri, key)
        return resp.status_code not in (404, 410)

    def copy(self, src_key: str, dst_key: str, size: int | None = None) -> None:
        """Server-side rewrite (no bytes through this process), in as many calls as GCS asks for."""
        src, dst = self._blob(src_key), self._blob(dst_key)
        token: str | None = None
        for _ in range(10_000):  # each call copies at least 1 MiB or finishes: bounded by the object
            token, _done, _total = self._call(
                "copy", src_key, functools.partial(self._rewrite, src, dst, token)
            )
            if token is None:
                return
        raise StorageError(f"GCS copy of {self.uri_of(src_key)} did not finish in 10,000 rewrite calls")

    def _rewrite(
        self, src: storage.Blob, dst: storage.Blob, token: str | None
    ) -> tuple[str | None, int, int]:
        return dst.rewrite(src, token=token, retry=None, timeout=self._timeout)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call("delete", key, lambda: self._blob(key).delete(retry=None, timeout=self._timeout))

    # -- reads --------------------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        return self._call(
            "get", key, lambda: self._blob(key).download_as_bytes(retry=None, timeout=self._timeout)
        )

    def _range(self, key: str, start: int, length: int, generation: int | None) -> bytes:
        blob = self._blob(key, generation)
        end = start + length - 1
        try:
            return self._call(
                "get_range",
                key,
                lambda: blob.download_as_bytes(
                    start=start, end=end, retry=None, timeout=self._timeout, checksum=None
                ),
            )
        except StorageError as e:
            if isinstance(e.__cause__, gexc.RequestRangeNotSatisfiable):
                return b""  # start at or past the end: the same answer as a local file
            raise

    def open_read(self, key: str) -> BinaryIO:
        """Ranged GETs pinned to the generation first seen: a cut costs one block, a rewrite is an error."""
        blob = self._get_blob(key)
        generation = blob.generation
        return open_ranged(
            lambda s, n: self._range(key, s, n, generation), int(blob.size or 0), self.uri_of(key)
        )

    def _get_blob(self, key: str) -> storage.Blob:
        bucket = self.client.storage.bucket(self.bucket)
        blob = self._call(
            "head", key, lambda: bucket.get_blob(self._key(key), retry=None, timeout=self._timeout)
        )
        if blob is None:  # the SDK answers a 404 with None
            raise self._missing("head", self.uri_of(key))
        return blob

    def stat(self, key: str) -> ObjectInfo:
        blob = self._get_blob(key)
        return ObjectInfo(
            key=normalize_key(key),
            size=int(blob.size or 0),
            etag=str(blob.etag or blob.generation),
            mtime=blob.updated.timestamp() if blob.updated else 0.0,
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every page in one retried call (a failed page restarts the listing), sorted here."""
        root = f"{self.prefix}/" if self.prefix else ""
        full = root + (normalize_key(prefix) if prefix else "")

        def fetch() -> list[ObjectInfo]:
            blobs = self.client.storage.list_blobs(
                self.bucket, prefix=full, retry=None, timeout=self._timeout
            )
            return [
                ObjectInfo(
                    key=b.name[len(root) :],
                    size=int(b.size or 0),
                    etag=str(b.etag or b.generation),
                    mtime=b.updated.timestamp() if b.updated else 0.0,
                )
                for b in blobs
            ]

        found = self._call("list", prefix or None, fetch)
        found.sort(key=lambda info: info.key)
        yield from found
