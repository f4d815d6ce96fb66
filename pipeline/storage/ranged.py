"""A streaming reader made of ranged GETs, for the stores whose SDK body streams cannot resume by themselves.

Each block is one ranged request that the store retries as a whole (``call_with_retries``), pinned to the
version first seen (a GCS generation, an Azure ETag): a dropped connection costs one block again, never the
object, and an object replaced while it is read is an error, not a mix of two versions.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

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
