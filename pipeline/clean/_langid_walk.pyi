"""Type stub of the compiled language-ID walk (``pipeline/clean/_langid_walk.c``)."""

from typing import Any as Buffer  # collections.abc.Buffer is Python 3.12+

def walk_counts(
    next_row: Buffer,
    next_feature: Buffer,
    root_row: int,
    depth: int,
    num_features: int,
    data: Buffer,
    offsets: Buffer,
    out_features: Buffer,
    out_counts: Buffer,
    out_offsets: Buffer,
    /,
) -> int: ...
