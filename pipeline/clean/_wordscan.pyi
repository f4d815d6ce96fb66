"""Type stub of the compiled word scan and n-gram screen (``pipeline/clean/_wordscan.c``)."""

from typing import Any as Buffer  # collections.abc.Buffer is Python 3.12+

def scan_words(
    texts: list[str],
    max_dup_line_fraction: float,
    max_dup_line_char_fraction: float,
    max_dup_para_fraction: float,
    max_dup_para_char_fraction: float,
    /,
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes]: ...
def screen_ngrams(
    hashes: Buffer,
    lengths: Buffer,
    sizes: Buffer,
    pending: Buffer,
    top: tuple[tuple[int, float], ...],
    dup: tuple[tuple[int, float], ...],
    /,
) -> bytes: ...
def count_stop_words(text: str, words: tuple[str, ...], need: int, /) -> int: ...
