"""One object-store interface for ``file://`` (the embedded default) and ``s3://`` (boto3).

Keys are relative to the store's root (a local folder or an S3 bucket+prefix), use ``/`` separators and are
checked by :func:`normalize_key`: no ``..``, no leading ``/``, no NUL, nothing outside the root. Nothing outside
this package touches boto3.
"""

from __future__ import annotations

import os

from pipeline.errors import AlreadyExistsError, StorageError
from pipeline.storage.base import (
    ObjectInfo,
    ObjectStore,
    join_key,
    normalize_key,
    sha256_bytes,
    sha256_file,
)
from pipeline.storage.local import FileStore
from pipeline.storage.options import S3Options


def open_store(uri: str, s3: S3Options | None) -> ObjectStore:
    """Open the store rooted at ``uri``: a local path, ``file:///abs/path`` or ``s3://bucket/prefix``.

    ``s3`` is the resolved store configuration and has no default: an ``s3://`` URI with ``None`` is refused,
    so no path can fall back to boto3's defaults (AWS) while the user configured another endpoint. A local
    store keeps ``s3`` too, for the stores it opens in turn (:meth:`ObjectStore.open`).
    """
    if uri.startswith("s3://"):
        if s3 is None:
            raise ValueError(
                f"{uri}: opening an s3:// store needs the s3 settings (the config's s3: section)"
            )
        from pipeline.storage.s3 import S3Store  # boto3 (0.2 CPU-s) loads for s3:// stores only

        return S3Store.from_uri(uri, options=s3)
    if "://" in uri and not uri.startswith("file://"):
        raise ValueError(f"unsupported store URI {uri!r}: use a local path, file:// or s3://")
    return FileStore.from_uri(uri, s3=s3)


def split_uri(uri: str) -> tuple[str, str]:
    """Split ``<root>/<key>`` where key is the last path component: ``(root_uri, key)``."""
    uri = uri.rstrip("/")
    head, sep, tail = uri.rpartition("/")
    if not sep or not tail:
        raise ValueError(f"{uri!r} has no object name")
    return head, tail


def read_object(uri: str, s3: S3Options | None, field: str) -> bytes:
    """The bytes of one small object a config field names (a list file): a local path, ``file://`` or ``s3://``.
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
    "AlreadyExistsError",
    "FileStore",
    "ObjectInfo",
    "ObjectStore",
    "S3Options",
    "StorageError",
    "join_key",
    "normalize_key",
    "open_store",
    "read_object",
    "sha256_bytes",
    "sha256_file",
    "split_uri",
]
