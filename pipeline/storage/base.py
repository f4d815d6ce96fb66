"""The store interface and the key rules every backend shares."""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import os
import posixpath
import socket
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from pipeline.errors import StorageError
from pipeline.storage.options import S3Options
from pipeline.storage.uploads import NO_JOURNAL, UploadJournal, pid_alive

T = TypeVar("T")
R = TypeVar("R")
TMP_PREFIX = ".pw-tmp-"  # temp files of an unfinished write (the janitor removes stale ones)


def tmp_prefix() -> str:
    """This process's temp-file prefix, ``.pw-tmp-<pid>@<host>~``: whoever finds the file later can tell
    whether its writer still runs (:func:`tmp_writer_dead`)."""
    return f"{TMP_PREFIX}{os.getpid()}@{socket.gethostname()}~"


def local_temp_prefix(kind: str, pid: int | None = None) -> str:
    """``<kind><pid>-`` (this process's pid by default): the prefix of a temp file or folder made in the
    machine's temp folder (``kind``: one of ``flows/runtime/shutdown.py``'s ``TEMP_PREFIXES``). A command that
    stops kills its workers and removes their temp files by this pid, including one made but not (or no longer)
    held open at the kill (a part file between ``mkstemp`` and its writer's open)."""
    return f"{kind}{os.getpid() if pid is None else pid}-"


def tmp_writer_dead(name: str) -> bool:
    """Whether the temp file ``name`` was left by a process of this host that no longer runs (provably dead).
    A name from another host, or from before names carried their writer, is not: the age rule applies."""
    owner, sep, _ = name.removeprefix(TMP_PREFIX).partition("~")
    pid, at, host = owner.partition("@")
    if not (sep and at and pid.isdigit()) or host != socket.gethostname():
        return False
    return not pid_alive(int(pid))


def write_local_file(
    dest: Path, writer: Callable[[BinaryIO], Any], publish: Callable[[str, Path], None] = os.replace
) -> None:
    """Write a local file whole or not at all: a temp file beside ``dest`` gets the bytes, is flushed and
    fsynced, then ``publish(tmp, dest)`` puts it in place (``os.replace``; a create-only store links it);
    on any failure the temp file is removed, and a full disk or quota is one line naming ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=tmp_prefix(), dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, dest)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            # One line with the path and the fix; the errno stays, so nothing retries it (retry.is_permanent).
            raise OSError(
                exc.errno, f"no space left writing {dest}: free disk space or choose another folder/store"
            ) from None
        raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str  # S3 ETag, or "<mtime_ns>-<size>" for local files
    mtime: float


def normalize_key(key: str) -> str:
    """Return the canonical form of a relative key, or raise ValueError for keys that could escape the root."""
    if not isinstance(key, str) or not key:
        raise ValueError("object key must be a non-empty string")
    if "\x00" in key:
        raise ValueError(f"object key contains NUL: {key!r}")
    if key.startswith("/") or key.startswith("\\"):
        raise ValueError(f"object key must be relative (no leading '/'): {key!r}")
    parts = key.replace("\\", "/").split("/")
    if any(p == ".." for p in parts):
        raise ValueError(f"object key must not contain '..': {key!r}")
    trailing = key.endswith("/")
    norm = posixpath.normpath("/".join(p for p in parts if p not in ("", ".")))
    if norm in (".", ""):
        raise ValueError(f"object key is empty after normalisation: {key!r}")
    return norm + ("/" if trailing else "")


def join_key(*parts: str) -> str:
    return normalize_key("/".join(p.strip("/") for p in parts if p and p.strip("/")))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class ObjectStore(ABC):
    """A flat key space under a root URI. All keys go through :func:`normalize_key`."""

    uri: str
    s3: S3Options | None  # the store configuration this store was opened with (open_store's ``s3``)
    uploads: UploadJournal = NO_JOURNAL  # where multipart uploads are recorded (the build sets work/uploads)
    io_threads: int = 1  # calls :meth:`map` keeps in flight (remote stores: many, each call is a round trip)

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write atomically: readers see the old object or the whole new one, never a part."""

    @abstractmethod
    def put_file(self, key: str, path: str | Path) -> None:
        """Upload a local file atomically (multipart on S3 for large files, aborted on failure)."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> None:
        """Create-only write; raises AlreadyExistsError when the key exists (exactly one racer wins)."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes ``[start, start+length)`` of the object (shorter at the end of the object)."""

    @abstractmethod
    def get_file(self, key: str, path: str | Path) -> None:
        """Download to ``path`` via a temp name and an atomic rename."""

    @abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """A streaming, file-like reader (for large raw inputs)."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size/etag/mtime; raises FileNotFoundError when missing."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key (paginated on S3)."""

    def list_unit(self, unit: str) -> Iterator[ObjectInfo]:
        """Every object ``unit.<suffix>`` or ``unit/...`` (a unit's files, ``pipeline/units``): one listing."""
        for info in self.list(unit):
            if info.key.startswith((unit + ".", unit + "/")):
                yield info

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete if present (no error when missing)."""

    def copy(self, src_key: str, dst_key: str, size: int | None = None) -> None:
        """Copy an object within this store (backends override with a cheaper server-side copy); ``size``:
        the object's, when the caller knows it (S3 copies objects over 5 GB in parts)."""
        self.put_bytes(dst_key, self.get_bytes(src_key))

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> builtins.list[R]:
        """``[fn(x) for x in items]``, with up to :attr:`io_threads` calls in flight: for the steps that read or
        write one small object per part (stats, counts, drop lists), which on S3 would otherwise wait for each
        round trip in turn. Results in order; the first error is raised."""
        todo = builtins.list(items)
        if self.io_threads <= 1 or len(todo) <= 1:
            return [fn(x) for x in todo]
        with ThreadPoolExecutor(min(self.io_threads, len(todo)), thread_name_prefix="pw-io") as pool:
            return builtins.list(pool.map(fn, todo))

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except FileNotFoundError:
            return False
        return True

    def child(self, prefix: str) -> ObjectStore:
        """A store rooted at ``prefix`` below this one."""
        raise NotImplementedError(f"{type(self).__name__} does not support child stores")

    def uri_of(self, key: str) -> str:
        return self.uri.rstrip("/") + "/" + normalize_key(key)

    def abort_stale_uploads(self, older_than_s: float = 3600.0, keep: frozenset[str] = frozenset()) -> int:
        """Abort multipart uploads left behind by killed processes, except the upload ids in ``keep`` (a live
        build's); returns how many. Local: temp files (those of dead writers at once)."""
        return 0

    def abort_upload(self, key: str, upload_id: str) -> bool:
        """Abort one recorded upload (``key``: the full key in the bucket, as the journal records it); False
        when it was gone already; raises when it could not be aborted (the record stays for the next try)."""
        raise NotImplementedError(f"{type(self).__name__} records no uploads")

    def remove_dead_temp_files(self) -> int:
        """Remove the temp files of writers that provably died (a rerun's start); returns how many."""
        return 0

    def verify_sha256(self, key: str, expected: str) -> None:
        """Re-read the object and check its sha256 (our own check: S3-compatible servers differ)."""
        h = hashlib.sha256()
        with self.open_read(key) as f:  # streamed: shards are too big to hold twice in memory
            while block := f.read(1 << 20):
                h.update(block)
        got = h.hexdigest()
        if got != expected:
            raise StorageError(f"{self.uri_of(key)}: sha256 {got} != expected {expected}")
