"""One object-store interface for ``file://`` (the embedded default), ``s3://`` (boto3), ``gs://``
(google-cloud-storage) and ``az://`` / ``abfs[s]://`` (azure-storage-blob).

Keys are relative to the store's root (a local folder, or a bucket/container + prefix), use ``/`` separators
and are checked by :func:`normalize_key`: no ``..``, no leading ``/``, no NUL, nothing outside the root. Nothing
outside this package touches a cloud SDK. Each cloud's SDK loads only when a store of its kind is opened.
README.md beside this file says how each cloud is reached (endpoints, credentials, emulators, HDFS).

Modules: ``base`` (the interface and key rules), one backend each in ``local``, ``s3``, ``gcs`` and ``azure``;
``options`` (the one ``s3:`` config section), ``retry`` (what may be retried, and the loop), ``ranged`` (a
resumable reader of ranged GETs for the GCS and Azure stores), ``uploads`` (the journal of multipart uploads in
flight) and ``janitor`` (aborting the uploads a dead run left, on every cloud).
"""

from __future__ import annotations

import os

from pipeline.errors import AlreadyExistsError, PermanentStorageError, StorageError
from pipeline.storage.base import (
    ObjectInfo,
    ObjectStore,
    join_key,
    local_temp_prefix,
    normalize_key,
    sha256_bytes,
    sha256_file,
)
from pipeline.storage.local import FileStore
from pipeline.storage.options import S3Options

REMOTE_SCHEMES = ("s3://", "gs://", "az://", "abfs://", "abfss://")
STORE_URI_HELP = "a local path, file://, s3://, gs://, az:// or abfs[s]://"


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names a cloud store (any scheme of :data:`REMOTE_SCHEMES`)."""
    return uri.startswith(REMOTE_SCHEMES)


def is_store_uri(uri: str) -> bool:
    """Whether ``uri`` is something :func:`open_store` / :func:`read_object` take (a path or a known scheme)."""
    return "://" not in uri or uri.startswith(("file://", *REMOTE_SCHEMES))


def open_store(uri: str, s3: S3Options | None) -> ObjectStore:
    """Open the store rooted at ``uri``: a local path, ``file:///abs/path``, ``s3://bucket/prefix``,
    ``gs://bucket/prefix``, ``az://container/prefix`` or ``abfs[s]://container[@account...]/prefix``.

    ``s3`` is the resolved store configuration and has no default: a cloud URI with ``None`` is refused,
    so no path can fall back to an SDK's defaults while the user configured another endpoint. A local
    store keeps ``s3`` too, for the stores it opens in turn (:meth:`ObjectStore.open`).
    """
    if is_remote(uri):
        if s3 is None:
            raise ValueError(
                f"{uri}: opening a cloud store needs the store settings (the config's s3: section)"
            )
        return _open_remote(uri, s3)
    if "://" in uri and not uri.startswith("file://"):
        raise ValueError(f"unsupported store URI {uri!r}: use {STORE_URI_HELP}")
    return FileStore.from_uri(uri, s3=s3)


def _open_remote(uri: str, options: S3Options) -> ObjectStore:
    # Each SDK loads for its own stores only (boto3 alone costs 0.2 CPU-s); a missing one is one line.
    try:
        if uri.startswith("s3://"):
            from pipeline.storage.s3 import S3Store

            return S3Store.from_uri(uri, options=options)
        if uri.startswith("gs://"):
            from pipeline.storage.gcs import GCSStore

            return GCSStore.from_uri(uri, options=options)
        from pipeline.storage.azure import AzureStore

        return AzureStore.from_uri(uri, options=options)
    except ModuleNotFoundError as e:
        extra = "gcs" if uri.startswith("gs://") else "azure"
        raise PermanentStorageError(
            f"{uri}: {e.name} is not installed; pip install 'pileworks[{extra}]'"
        ) from None


def split_uri(uri: str) -> tuple[str, str]:
    """Split ``<root>/<key>`` where key is the last path component: ``(root_uri, key)``."""
    uri = uri.rstrip("/")
    head, sep, tail = uri.rpartition("/")
    if not sep or not tail:
        raise ValueError(f"{uri!r} has no object name")
    return head, tail


def read_object(uri: str, s3: S3Options | None, field: str) -> bytes:
    """The bytes of one small object a config field names (a list file): a local path or a store URI.
    A missing one raises ``ValueError`` naming ``field``."""
    if "://" not in uri:
        path = os.path.abspath(os.path.expanduser(uri))
        if not os.path.isfile(path):
            raise ValueError(f"{field}: {uri} is not a file")
        uri = "file://" + path
    root, key = split_uri(uri)
    try:
        return open_store(root, s3).get_bytes(key)
    except FileNotFoundError as exc:
        raise ValueError(f"{field}: {uri} does not exist") from exc


__all__ = [
    "REMOTE_SCHEMES",
    "STORE_URI_HELP",
    "AlreadyExistsError",
    "FileStore",
    "ObjectInfo",
    "ObjectStore",
    "S3Options",
    "StorageError",
    "is_remote",
    "is_store_uri",
    "join_key",
    "local_temp_prefix",
    "normalize_key",
    "open_store",
    "read_object",
    "sha256_bytes",
    "sha256_file",
    "split_uri",
]
