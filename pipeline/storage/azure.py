"""``az://`` and ``abfs[s]://`` backend over azure-storage-blob: the only module that talks to Azure Storage.

URIs: ``az://container/prefix`` and ``abfs://container/prefix`` (the account from the configuration), or
``abfs[s]://container@ACCOUNT.dfs.core.windows.net/prefix`` (Hadoop's spelling: the account in the host; the
Blob endpoint of that account is used, which ADLS Gen2 accounts serve too).

Which account and which credential, in order (never a config or flow parameter):
1. ``s3.azure_endpoint_url`` (``--azure-endpoint-url``): that Blob endpoint (a sovereign cloud's, Azurite's);
2. else the account in an ``abfs[s]://container@ACCOUNT...`` URI: ``https://ACCOUNT.blob.core.windows.net``;
3. else ``AZURE_STORAGE_CONNECTION_STRING``'s endpoint (Azurite's standard variable: no flag needed);
4. else ``AZURE_STORAGE_ACCOUNT_NAME``: ``https://ACCOUNT.blob.core.windows.net``.
The credential: the connection string's key or SAS when it names the same endpoint (or none is set), else
``AZURE_STORAGE_SAS_TOKEN``, else ``DefaultAzureCredential`` (environment, workload or managed identity,
Azure CLI...). The SDK's retries are off; ours run per operation within ``retry_budget_s``.

Large files go up as block blobs: blocks staged in parallel (uncommitted: Azure's multipart upload) whose ids
carry an upload id recorded in the upload journal, then one Put Block List. A failed or killed upload's
uncommitted blocks are discarded by the writer, the journal's janitor, or the age rule.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import azure.core.exceptions as aexc
from azure.core import MatchConditions
from azure.storage.blob import BlobServiceClient, ContainerClient

from pipeline.errors import AlreadyExistsError, PermanentStorageError, StorageError
from pipeline.storage.base import ObjectInfo, join_key, normalize_key
from pipeline.storage.options import S3Options
from pipeline.storage.ranged import RangedStore, open_ranged
from pipeline.storage.retry import backoff_s, call_with_retries

log = logging.getLogger(__name__)
T = TypeVar("T")
SCHEMES = ("az://", "abfs://", "abfss://")
NO_ACCOUNT_FIX = (
    "set AZURE_STORAGE_CONNECTION_STRING, s3.azure_endpoint_url (--azure-endpoint-url) or "
    "AZURE_STORAGE_ACCOUNT_NAME, or name the account: abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX"
)
NO_CREDENTIALS_FIX = (
    "sign in (az login), use a managed or workload identity, or set AZURE_STORAGE_CONNECTION_STRING or "
    "AZURE_STORAGE_SAS_TOKEN"
)
_DENIED = {
    "AuthorizationFailure",
    "AuthenticationFailed",
    "AuthorizationPermissionMismatch",
    "InsufficientAccountPermissions",
}
_AZURE_LOGGERS = ("azure.core.pipeline.policies.http_logging_policy", "azure.identity")


def _error_code(exc: BaseException) -> str:
    """The service's error code (``AuthenticationFailed``), also where the SDK gives it as its enum."""
    code = getattr(exc, "error_code", None) or ""
    return str(getattr(code, "value", code))


def transient_reason(exc: BaseException) -> str | None:
    """Why an Azure failure is worth another try (``throttled``, ``server-5xx``, ``connection``), or None."""
    if isinstance(exc, aexc.ClientAuthenticationError) and exc.status_code is None:
        return None  # no credential at all: a second try finds none either
    if isinstance(exc, (aexc.ServiceRequestError, aexc.ServiceResponseError, aexc.IncompleteReadError)):
        return "connection"
    if isinstance(exc, aexc.HttpResponseError):
        status = int(exc.status_code or 0)
        if status in (429, 503) or _error_code(exc) in (
            "ServerBusy",
            "OperationTimedOut",
        ):
            return "throttled"
        if status == 408 or status >= 500:
            return "server-5xx"
        return None
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return "connection"
    return None


def parse_uri(uri: str) -> tuple[str, str | None, str]:
    """``(container, account or None, prefix)`` of an ``az://`` / ``abfs[s]://`` URI."""
    scheme = next((s for s in SCHEMES if uri.startswith(s)), None)
    if scheme is None:
        raise ValueError(f"not an az:// or abfs[s]:// URI: {uri!r}")
    head, _, prefix = uri[len(scheme) :].partition("/")
    container, at, host = head.partition("@")
    account = host.split(".", 1)[0] if at else None
    if not container or (at and not account):
        raise ValueError(
            f"bad Azure URI {uri!r}: use az://CONTAINER/PREFIX or abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX"
        )
    return container, account, prefix


def _connection_string() -> dict[str, str]:
    text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    fields = (part.partition("=") for part in text.split(";") if "=" in part)
    return {k.strip(): v.strip() for k, _, v in fields}


def _conn_endpoint(conn: dict[str, str]) -> str | None:
    if "BlobEndpoint" in conn:
        return conn["BlobEndpoint"].rstrip("/")
    if "AccountName" in conn:
        protocol = conn.get("DefaultEndpointsProtocol", "https")
        suffix = conn.get("EndpointSuffix", "core.windows.net")
        return f"{protocol}://{conn['AccountName']}.blob.{suffix}"
    return None


def resolve_account(options: S3Options, account: str | None) -> tuple[str, Any]:
    """``(Blob endpoint URL, credential)`` by the rules of the module doc; one line when nothing is set."""
    conn = _connection_string()
    conn_endpoint = _conn_endpoint(conn)
    if options.azure_endpoint_url:
        endpoint = options.azure_endpoint_url.rstrip("/")
    elif account:
        endpoint = f"https://{account}.blob.core.windows.net"
    elif conn_endpoint:
        endpoint = conn_endpoint
    elif os.environ.get("AZURE_STORAGE_ACCOUNT_NAME"):
        endpoint = f"https://{os.environ['AZURE_STORAGE_ACCOUNT_NAME']}.blob.core.windows.net"
    else:
        raise PermanentStorageError(f"no Azure storage account; {NO_ACCOUNT_FIX}")
    same_account = conn_endpoint is not None and (
        endpoint == conn_endpoint or (options.azure_endpoint_url is not None and account is None)
    )
    if same_account and conn.get("AccountKey"):
        return endpoint, {"account_name": conn["AccountName"], "account_key": conn["AccountKey"]}
    if same_account and conn.get("SharedAccessSignature"):
        return endpoint, conn["SharedAccessSignature"]
    if os.environ.get("AZURE_STORAGE_SAS_TOKEN"):
        return endpoint, os.environ["AZURE_STORAGE_SAS_TOKEN"]
    try:
        from azure.identity import DefaultAzureCredential  # azure-identity loads only without a key or SAS
    except ImportError:
        raise PermanentStorageError(
            f"{endpoint}: no key or SAS in the environment and azure-identity is not installed "
            "(pip install 'pileworks[azure]'); " + NO_CREDENTIALS_FIX
        ) from None
    return endpoint, DefaultAzureCredential()


_clients: dict[tuple[S3Options, str | None], tuple[int, BlobServiceClient]] = {}
_clients_lock = threading.Lock()


def service_for(options: S3Options, account: str | None) -> BlobServiceClient:
    """The process's client for ``options`` and the URI's account; rebuilt in a forked child."""
    pid, cache_key = os.getpid(), (options, account)
    cached = _clients.get(cache_key)
    if cached is None or cached[0] != pid:
        with _clients_lock:
            cached = _clients.get(cache_key)
            if cached is None or cached[0] != pid:
                endpoint, credential = resolve_account(options, account)
                for name in _AZURE_LOGGERS:  # request headers at INFO: keep them out of run logs
                    logging.getLogger(name).setLevel(max(logging.getLogger(name).level, logging.WARNING))
                client = BlobServiceClient(
                    endpoint,
                    credential=credential,
                    retry_total=0,  # ours, within the budget (pipeline.storage.retry)
                    connection_timeout=options.connect_timeout,
                    read_timeout=options.read_timeout,
                    max_single_put_size=options.multipart_threshold,
                    max_block_size=options.multipart_chunk,
                    max_single_get_size=options.multipart_chunk,
                )
                cached = (pid, client)
                _clients[cache_key] = cached
    return cached[1]


def _block_id(upload_id: str, number: int) -> str:
    return base64.b64encode(f"{upload_id}-{number:08d}".encode()).decode()


class AzureStore(RangedStore):
    """Objects under ``az://container/prefix``. See :class:`ObjectStore` for the contract of each method.

    ``put_if_absent`` is a Put Blob with ``If-None-Match: *``, which Azure Storage (and Azurite) enforce."""

    io_threads = 16

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        options: S3Options,
        account: str | None = None,
        scheme: str = "az://",
    ):
        if not container or "/" in container:
            raise ValueError(f"bad Azure container name {container!r}")
        if not isinstance(options, S3Options):
            raise TypeError("AzureStore needs the resolved S3Options (the config's s3: section)")
        self.container, self.account, self.scheme = container, account, scheme
        self.prefix = normalize_key(prefix).rstrip("/") if prefix.strip("/") else ""
        self.options = self.s3 = options
        self.root_uri = (
            f"{scheme}{container}@{account}.dfs.core.windows.net" if account else f"{scheme}{container}"
        )
        self.uri = f"{self.root_uri}/{self.prefix}" if self.prefix else self.root_uri

    @classmethod
    def from_uri(cls, uri: str, *, options: S3Options) -> AzureStore:
        container, account, prefix = parse_uri(uri)
        scheme = next(s for s in SCHEMES if uri.startswith(s))
        return cls(container, prefix, options=options, account=account, scheme=scheme)

    def __repr__(self) -> str:
        return f"AzureStore({self.uri!r}, endpoint_url={self.options.azure_endpoint_url!r})"

    @property
    def client(self) -> ContainerClient:
        return service_for(self.options, self.account).get_container_client(self.container)

    def child(self, prefix: str) -> AzureStore:
        sub = join_key(self.prefix, normalize_key(prefix).rstrip("/"))
        store = AzureStore(
            self.container, sub, options=self.options, account=self.account, scheme=self.scheme
        )
        store.uploads = self.uploads
        return store

    def _key(self, key: str) -> str:
        norm = normalize_key(key)
        return f"{self.prefix}/{norm}" if self.prefix else norm

    def _blob(self, key: str) -> Any:
        return self.client.get_blob_client(self._key(key))

    # -- errors and retries -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, op: str, key: str | None) -> Iterator[None]:
        """Map SDK errors to one line naming the URI and the fix (never a key or token)."""
        uri = self.uri_of(key) if key else self.uri
        try:
            yield
        except aexc.ClientAuthenticationError as e:
            if e.status_code is None:  # the credential chain found nothing usable
                first = (str(e.message or e).strip().splitlines() or [type(e).__name__])[0]
                raise PermanentStorageError(
                    f"Azure {op} {uri}: no usable credentials ({first}); {NO_CREDENTIALS_FIX}"
                ) from None
            raise PermissionError(
                f"{uri}: access denied ({op}, {e.status_code} {_error_code(e)}); check the credentials and "
                "their role on the container"
            ) from None
        except aexc.HttpResponseError as e:
            code, status = _error_code(e), int(e.status_code or 0)
            if code == "ContainerNotFound":
                endpoint = service_for(self.options, self.account).url
                raise PermanentStorageError(
                    f"Azure {op} {uri} failed: container {self.container!r} does not exist at {endpoint}; "
                    "create it or fix the URI / s3.azure_endpoint_url"
                ) from None
            if status == 404:
                raise FileNotFoundError(f"{uri} does not exist ({op})") from None
            if status in (401, 403) or code in _DENIED:
                raise PermissionError(
                    f"{uri}: access denied ({op}, {status} {code}); check the credentials and their role on the container"
                ) from None
            raise StorageError(f"Azure {op} {uri} failed: {status} {code or e.reason}") from e
        except aexc.AzureError as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise StorageError(f"Azure {op} {uri} failed: {type(e).__name__}: {first}") from e

    def _call(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        what = f"Azure {op} {self.uri_of(key) if key else self.uri}"
        with self._errors(op, key):
            return call_with_retries(fn, self.options, what, classify=transient_reason)

    # -- writes -------------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call("put", key, lambda: self._blob(key).upload_blob(data, overwrite=True, max_concurrency=1))

    def put_if_absent(self, key: str, data: bytes) -> None:
        try:
            self._call("put_if_absent", key, lambda: self._blob(key).upload_blob(data, overwrite=False))
        except StorageError as e:
            cause = e.__cause__
            if isinstance(cause, aexc.HttpResponseError) and int(cause.status_code or 0) in (409, 412):
                raise AlreadyExistsError(f"{self.uri_of(key)} already exists") from None
            raise

    def put_file(self, key: str, path: str | Path) -> None:
        size = os.path.getsize(path)
        if size <= self.options.multipart_threshold:

            def put() -> Any:
                with open(path, "rb") as f:  # reopened per try: a retry sends the whole body again
                    return self._blob(key).upload_blob(f, length=size, overwrite=True, max_concurrency=1)

            self._call("put", key, put)
            return
        upload_id = uuid.uuid4().hex[:16]
        full = self._key(key)
        self.uploads.started(self.container, full, upload_id, store_uri=self.root_uri)
        try:
            ids = self._stage_blocks(key, upload_id, path, size)
            self._call("commit_block_list", key, lambda: self._blob(key).commit_block_list(ids))
        except BaseException:  # KeyboardInterrupt too
            try:
                self.abort_upload(full, upload_id)
            except Exception as e:  # recorded in the upload journal: a rerun or the janitor discards them
                log.warning("could not discard the blocks of %s: %s", self.uri_of(key), e)
            else:
                self.uploads.finished(self.container, full, upload_id)
            raise
        self.uploads.finished(self.container, full, upload_id)

    def _stage_blocks(self, key: str, upload_id: str, path: str | Path, size: int) -> list[str]:
        """Stage ``max_concurrency`` blocks at a time, holding at most that many chunks in memory."""
        chunk, width = self.options.multipart_chunk, self.options.max_concurrency
        ids: list[str] = []
        pending: set[Future] = set()
        pool = ThreadPoolExecutor(width, thread_name_prefix="pw-az-block")
        blob = self._blob(key)
        try:
            with open(path, "rb") as f:
                for number, offset in enumerate(range(0, size, chunk), start=1):
                    if len(pending) >= width:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        for fut in done:
                            fut.result()
                    data = f.read(chunk)
                    if len(data) != min(chunk, size - offset):
                        raise StorageError(f"{path} changed size during upload to {self.uri_of(key)}")
                    block = _block_id(upload_id, number)
                    ids.append(block)
                    stage = lambda b=block, d=data: blob.stage_block(b, d, length=len(d))  # noqa: E731
                    pending.add(pool.submit(self._call, "stage_block", key, stage))
            for fut in pending:
                fut.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return ids

    def abort_upload(self, key: str, upload_id: str) -> bool:
        """Discard the uncommitted blocks at full key ``key``. Azure has no abort: when no committed blob is
        there, an empty block list is committed (only if still missing) and deleted, which drops them; under a
        committed blob they go with its next write (or Azure's one-week collection). False: nothing to do."""
        blob = self.client.get_blob_client(key)

        def discard() -> bool:
            try:
                created = blob.commit_block_list([], match_condition=MatchConditions.IfMissing)
            except (aexc.ResourceExistsError, aexc.ResourceModifiedError):
                return False  # a committed blob: see above
            with contextlib.suppress(aexc.ResourceNotFoundError, aexc.ResourceModifiedError):
                blob.delete_blob(etag=str(created["etag"]), match_condition=MatchConditions.IfNotModified)
            return True

        with self._errors("abort_upload", None):
            return call_with_retries(
                discard, self.options, f"Azure abort upload {self.root_uri}/{key}", classify=transient_reason
            )

    def abort_stale_uploads(self, older_than_s: float = 3600.0, keep: frozenset[str] = frozenset()) -> int:
        """Discard blobs under the prefix that have only uncommitted blocks, created more than ``older_than_s``
        ago, unless their blocks belong to an upload id in ``keep`` (a live build's)."""
        root = f"{self.prefix}/" if self.prefix else ""
        cutoff = time.time() - older_than_s

        def fetch() -> tuple[list[Any], set[str]]:
            every = list(self.client.list_blobs(name_starts_with=root, include=["uncommittedblobs"]))
            committed = {b.name for b in self.client.list_blobs(name_starts_with=root)}
            return every, committed

        every, committed = self._call("list_uploads", None, fetch)
        aborted = 0
        for blob in every:
            created = blob.creation_time.timestamp() if blob.creation_time else 0.0
            if blob.name in committed or created >= cutoff or self._upload_ids(blob.name) & keep:
                continue
            aborted += self.abort_upload(blob.name, "")
        if aborted:
            log.info("discarded %d stale uncommitted uploads under %s", aborted, self.uri)
        return aborted

    def _upload_ids(self, full_key: str) -> set[str]:
        blocks = self._call(
            "get_block_list",
            None,
            lambda: self.client.get_blob_client(full_key).get_block_list("uncommitted")[1],
        )
        return {base64.b64decode(b.id).decode(errors="replace").rpartition("-")[0] for b in blocks}

    def copy(self, src_key: str, dst_key: str, size: int | None = None) -> None:
        """Server-side copy within the account, waited for (Azure may finish it in the background)."""
        src_url, dst = self._blob(src_key).url, self._blob(dst_key)
        self._call("copy", src_key, lambda: dst.start_copy_from_url(src_url, requires_sync=None))
        deadline, polls = time.monotonic() + self.options.retry_budget_s + self.options.read_timeout, 0
        while True:
            props = self._call("copy_status", dst_key, dst.get_blob_properties)
            status = props.copy.status if props.copy else "success"
            if status in (None, "success"):
                return
            if status != "pending" or time.monotonic() > deadline:
                raise StorageError(
                    f"Azure copy of {self.uri_of(src_key)} to {dst_key}: {status} ({props.copy.status_description})"
                )
            time.sleep(backoff_s(polls, self.options) + 0.05)
            polls += 1

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call("delete", key, lambda: self._blob(key).delete_blob())

    # -- reads --------------------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        return self._call("get", key, lambda: self._blob(key).download_blob(max_concurrency=1).readall())

    def _range(self, key: str, start: int, length: int, etag: str | None) -> bytes:
        pin: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified} if etag else {}
        try:
            return self._call(
                "get_range",
                key,
                lambda: (
                    self._blob(key)
                    .download_blob(offset=start, length=length, max_concurrency=1, **pin)
                    .readall()
                ),
            )
        except StorageError as e:
            cause = e.__cause__
            if isinstance(cause, aexc.HttpResponseError) and int(cause.status_code or 0) == 416:
                return b""  # start at or past the end: the same answer as a local file
            if isinstance(cause, aexc.HttpResponseError) and int(cause.status_code or 0) == 412:
                raise StorageError(f"{self.uri_of(key)} changed while it was read") from None
            raise

    def open_read(self, key: str) -> BinaryIO:
        """Ranged GETs pinned to the ETag first seen: a cut costs one block, a rewrite is an error."""
        props = self._call("head", key, self._blob(key).get_blob_properties)
        etag = props.etag
        return open_ranged(lambda s, n: self._range(key, s, n, etag), int(props.size), self.uri_of(key))

    def stat(self, key: str) -> ObjectInfo:
        props = self._call("head", key, self._blob(key).get_blob_properties)
        return ObjectInfo(
            key=normalize_key(key),
            size=int(props.size),
            etag=str(props.etag).strip('"'),
            mtime=props.last_modified.timestamp() if props.last_modified else 0.0,
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every page in one retried call (a failed page restarts the listing), sorted here."""
        root = f"{self.prefix}/" if self.prefix else ""
        full = root + (normalize_key(prefix) if prefix else "")

        def fetch() -> list[ObjectInfo]:
            return [
                ObjectInfo(
                    key=b.name[len(root) :],
                    size=int(b.size),
                    etag=str(b.etag).strip('"'),
                    mtime=b.last_modified.timestamp() if b.last_modified else 0.0,
                )
                for b in self.client.list_blobs(name_starts_with=full)
            ]

        found = self._call("list", prefix or None, fetch)
        found.sort(key=lambda info: info.key)
        yield from found
