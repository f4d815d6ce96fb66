"""``file://`` backend: a folder. Writes go to a temp name, are fsynced, then renamed into place."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from pipeline.errors import AlreadyExistsError
from pipeline.storage.base import (
    TMP_PREFIX,
    ObjectInfo,
    ObjectStore,
    normalize_key,
    tmp_prefix,
    tmp_writer_dead,
    write_local_file,
)
from pipeline.storage.options import S3Options


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class FileStore(ObjectStore):
    def __init__(self, root: str | Path, *, s3: S3Options | None = None):
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = "file://" + str(self.root)
        self.s3 = s3  # for the stores opened from this one (e.g. a dedup index on s3://)

    @classmethod
    def from_uri(cls, uri: str, *, s3: S3Options | None = None) -> FileStore:
        path = uri[len("file://") :] if uri.startswith("file://") else uri
        if not path:
            raise ValueError(f"file URI has no path: {uri!r}")
        return cls(path, s3=s3)

    def child(self, prefix: str) -> FileStore:
        return FileStore(self._path(normalize_key(prefix).rstrip("/")), s3=self.s3)

    def _path(self, key: str) -> Path:
        path = (self.root / normalize_key(key)).resolve()
        if path != self.root and self.root not in path.parents:
            raise ValueError(f"key {key!r} resolves outside the store root {self.root}")
        return path

    def _write_atomic(self, path: Path, writer: Callable[[BinaryIO], Any], exclusive: bool = False) -> None:
        def link_once(tmp: str, dest: Path) -> None:
            # link() fails if the target exists: an atomic create-only publish on POSIX.
            try:
                os.link(tmp, dest)
            except FileExistsError:
                raise AlreadyExistsError(f"{self.uri}/{dest.relative_to(self.root)} already exists") from None
            os.unlink(tmp)

        write_local_file(path, writer, link_once if exclusive else os.replace)
        _fsync_dir(path.parent)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write_atomic(self._path(key), lambda f: f.write(data))

    def put_file(self, key: str, path: str | Path) -> None:
        def copy(f: BinaryIO) -> None:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)

        self._write_atomic(self._path(key), copy)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._write_atomic(self._path(key), lambda f: f.write(data), exclusive=True)

    def get_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length}")
        with open(self._path(key), "rb") as f:
            f.seek(start)
            return f.read(length)

    def get_file(self, key: str, path: str | Path) -> None:
        src = self._path(key)
        dest = Path(path)

        def copy(f: BinaryIO) -> None:
            with open(src, "rb") as s:
                shutil.copyfileobj(s, f, 1 << 20)

        write_local_file(dest, copy)

    def open_read(self, key: str) -> BinaryIO:
        return open(self._path(key), "rb")

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"{self.uri}/{normalize_key(key)}")
        st = path.stat()
        return ObjectInfo(
            key=normalize_key(key), size=st.st_size, etag=f"{st.st_mtime_ns}-{st.st_size}", mtime=st.st_mtime
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        norm = normalize_key(prefix) if prefix else ""
        # Walk only the deepest folder the prefix names, then filter by the full prefix.
        base_dir = self.root / norm.rsplit("/", 1)[0] if "/" in norm else self.root
        if not base_dir.is_dir():
            return
        found = []
        for dirpath, dirnames, filenames in os.walk(base_dir):
            dirnames.sort()
            for name in filenames:
                if name.startswith(TMP_PREFIX):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(norm):
                    found.append(key)
        for key in sorted(found):
            st = (self.root / key).stat()
            yield ObjectInfo(
                key=key, size=st.st_size, etag=f"{st.st_mtime_ns}-{st.st_size}", mtime=st.st_mtime
            )

    def list_unit(self, unit: str) -> Iterator[ObjectInfo]:
        """The unit's files from its own folder entries, not a walk of the whole folder (which holds every
        other part too): a rerun checks each unit, and a walk per unit would grow with the square of the parts."""
        path = self._path(unit)
        names = (
            [n for n in os.listdir(path.parent) if n.startswith(path.name + ".")]
            if path.parent.is_dir()
            else []
        )
        keys = [f"{normalize_key(unit)}{n[len(path.name) :]}" for n in names]
        keys += [info.key for info in self.list(unit + "/")] if path.is_dir() else []
        for key in sorted(keys):
            with contextlib.suppress(FileNotFoundError):
                yield self.stat(key)

    def copy(self, src_key: str, dst_key: str, size: int | None = None) -> None:
        """Hard-link when possible (immutable unit files are never rewritten in place), else copy."""
        src, dst = self._path(src_key), self._path(dst_key)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f"{tmp_prefix()}{dst.name}")
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def abort_stale_uploads(self, older_than_s: float = 3600.0, keep: frozenset[str] = frozenset()) -> int:
        """Remove temp files left by killed writers (the local analogue of dangling multipart uploads): those
        older than ``older_than_s``, and at once those whose writer provably died."""
        cutoff = time.time() - older_than_s
        return self._remove_temp_files(
            lambda full: tmp_writer_dead(full.name) or full.stat().st_mtime < cutoff
        )

    def remove_dead_temp_files(self) -> int:
        return self._remove_temp_files(lambda full: tmp_writer_dead(full.name))

    def _remove_temp_files(self, stale: Callable[[Path], bool]) -> int:
        removed = 0
        for dirpath, _dirs, filenames in os.walk(self.root):
            for name in filenames:
                if name.startswith(TMP_PREFIX):
                    full = Path(dirpath) / name
                    with contextlib.suppress(FileNotFoundError):
                        if stale(full):
                            full.unlink()
                            removed += 1
        return removed
