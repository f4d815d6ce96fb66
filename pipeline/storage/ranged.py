"""A streaming reader made of ranged GETs, for the stores whose SDK body streams cannot resume by themselves.

Each block is one ranged request that the store retries as a whole (``call_with_retries``), pinned to the
version first seen (a GCS generation, an Azure ETag): a dropped connection costs one block again, never the
object, and an object replaced while it is read is an error, not a mix of two versions.
"""

from __future__ import annotations

import io
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from pipeline.storage.base import ObjectStore, write_local_file

READ_BLOCK = 8 * 1024 * 1024  # bytes per ranged GET: few requests per shard, bounded memory per reader


class RangedReader(io.RawIOBase):
    """Bytes ``[0, size)`` of one object version through ``fetch(start, length)`` (retried by the store)."""

    def __init__(self, fetch: Callable[[int, int], bytes], size: int, uri: str):
        self._fetch, self._size, self._uri = fetch, size, uri
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readall(self) -> bytes:
        parts = []
        while chunk := self.read(min(READ_BLOCK, max(1, self._size - self._pos))):
            parts.append(chunk)
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        data = self._fetch(self._pos, want)
        if not data:
            raise EOFError(f"{self._uri} ended at byte {self._pos} of {self._size} (changed while reading?)")
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def open_ranged(fetch: Callable[[int, int], bytes], size: int, uri: str) -> io.BufferedReader:
    return io.BufferedReader(RangedReader(fetch, size, uri), buffer_size=READ_BLOCK)


class RangedStore(ObjectStore):
    """A store whose reads are ranged GETs (GCS, Azure): ``get_range`` and ``get_file`` over its own
    ``_range(key, start, length, version)`` and :func:`open_ranged` stream."""

    @abstractmethod
    def _range(self, key: str, start: int, length: int, version: Any) -> bytes:
        """Bytes ``[start, start + length)`` of ``key`` (of that ``version`` when not None), retried."""

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length}")
        if length == 0:
            return b""
        return self._range(key, start, length, None)

    def get_file(self, key: str, path: str | Path) -> None:
        def copy(out: BinaryIO) -> None:
            with self.open_read(key) as src:
                while block := src.read(1 << 20):
                    out.write(block)

        write_local_file(Path(path), copy)
