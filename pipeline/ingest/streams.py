"""Byte streams for ingest: decompression that survives damage, seekable ranged reads, bounded line reading.

Byte ranges follow the Hadoop rule, stated here as ownership: the reader of ``[a, b)`` owns every line whose
first byte is in ``[a, b)``. It starts after the first newline at or after ``a - 1`` and may read past ``b``
to finish its last line, so a grid of ranges over a file yields every line exactly once.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import zstandard

from pipeline.records import QUARANTINE_SAMPLE_BYTES
from pipeline.storage import ObjectStore

_CHUNK = 1 << 20
_SLICE = 4096


class DecompressingReader(io.RawIOBase):
    """gzip/zstd decompression that reports a truncated or corrupt stream instead of raising mid-line.

    On a cut-off stream it returns EOF and sets ``error`` to ("truncated_stream" | "corrupt_stream", detail),
    so the line reader above still hands out every complete line before the damage. Multi-member gzip and
    multi-frame zstd are read whole.
    """

    def __init__(self, raw: BinaryIO, kind: str):
        if kind not in ("gz", "zst"):
            raise ValueError(f"unknown compression {kind!r}")
        self.raw, self.kind = raw, kind
        self.error: tuple[str, str] | None = None
        self.compressed_bytes = 0
        self._dec = self._new()
        self._pending = b""
        self._done = False
        self._in_frame = False

    def _new(self) -> Any:
        return (
            zlib.decompressobj(wbits=31)
            if self.kind == "gz"
            else zstandard.ZstdDecompressor().decompressobj()
        )

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while not self._pending:
            if self._done or not self._fill():
                return 0
        n = min(len(view), len(self._pending))
        view[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _fill(self) -> bool:
        chunk = self.raw.read(1 << 16)
        if not chunk:
            self._done = True
            if self._in_frame:
                self.error = ("truncated_stream", f"{self.kind} stream ends inside a frame")
            return False
        self.compressed_bytes += len(chunk)
        out = []
        # Small slices: a decompressor that hits corrupt data discards the output of that call, so this bounds
        # what a corruption costs to one slice's worth of text before it.
        for i in range(0, len(chunk), _SLICE):
            try:
                out.append(self._feed(chunk[i : i + _SLICE]))
            except (zlib.error, zstandard.ZstdError, EOFError) as e:
                self._done = True
                self.error = (
                    "corrupt_stream",
                    f"{self.kind} data corrupt near compressed byte "
                    f"{self.compressed_bytes - len(chunk) + i}: {e}",
                )
                break
        self._pending = b"".join(out)
        return bool(self._pending) or not self._done

    def _feed(self, data: bytes) -> bytes:
        out = [self._dec.decompress(data)]
        self._in_frame = True
        while self._dec.eof:
            rest = self._dec.unused_data
            self._dec = self._new()
            self._in_frame = bool(rest)
            if not rest:
                break
            out.append(self._dec.decompress(rest))
        return b"".join(out)

    def close(self) -> None:
        self.raw.close()
        super().close()


class RangeFile(io.RawIOBase):
    """A seekable raw file over ``store.get_range`` (S3 bodies cannot seek; parquet and byte ranges need to)."""

    def __init__(self, store: ObjectStore, key: str, size: int):
        self.store, self.key, self.size, self.pos = store, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self.pos >= self.size or not len(view):
            return 0
        data = self.store.get_range(self.key, self.pos, min(len(view), self.size - self.pos))
        view[: len(data)] = data
        self.pos += len(data)
        return len(data)


def open_seekable(store: ObjectStore, key: str, size: int) -> BinaryIO:
    f = store.open_read(key)
    if f.seekable():
        return f
    f.close()
    return io.BufferedReader(RangeFile(store, key, size), buffer_size=8 * _CHUNK)


@dataclass(slots=True)
class Line:
    offset: int  # of its first byte, in the (decompressed) stream
    data: bytes  # with its newline; only a sample when too_large
    too_large: bool = False


class LineReader:
    """Lines owned by ``[start, end)`` of a binary stream positioned at ``max(start - 1, 0)``, each at most
    ``max_line`` bytes in memory: a longer line is yielded as a sample with ``too_large`` and skipped in chunks."""

    def __init__(self, f: BinaryIO, start: int, end: int | None, max_line: int):
        self.f, self.start, self.end, self.max_line = f, start, end, max_line
        self.pos = start

    def _skip_line(self) -> int:
        skipped = 0
        while chunk := self.f.readline(_CHUNK):
            skipped += len(chunk)
            if chunk.endswith(b"\n"):
                break
        return skipped

    def __iter__(self) -> Iterator[Line]:
        if self.start > 0:  # the line that started before `start` belongs to the previous range
            self.pos = self.start - 1 + self._skip_line()
        while self.end is None or self.pos < self.end:
            data = self.f.readline(self.max_line + 1)
            if not data:
                return
            if len(data) > self.max_line and not data.endswith(b"\n"):
                size = len(data) + self._skip_line()
                yield Line(self.pos, data[:QUARANTINE_SAMPLE_BYTES], too_large=True)
                self.pos += size
                continue
            yield Line(self.pos, data)
            self.pos += len(data)
