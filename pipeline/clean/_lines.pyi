"""Type stub of the compiled boilerplate lines (``pipeline/clean/_lines.c``)."""

from typing import Any as Buffer  # collections.abc.Buffer is Python 3.12+

def line_hashes(text: str, min_line_chars: int, /) -> bytes | None: ...
def remove_lines(text: str, boilerplate: Buffer, min_line_chars: int, /) -> tuple[str, int] | None: ...
def xxh64(data: Buffer, /) -> int:
    """XXH64 with seed 0 of ``data``: the key of a line's stripped UTF-8 bytes (``xxhash.xxh64_intdigest``)."""
