"""Type stub of the compiled BPE training (``pipeline/tokenize/_bpe.c``)."""

from typing import Any as Buffer  # collections.abc.Buffer is Python 3.12+

def count_words(texts: list[str], /) -> tuple[bytes, bytes, bytes]:
    """The texts' GPT-2 words in the order first seen: (their bytes concatenated, int64 ends, int64 counts)."""

def train_merges(blob: Buffer, ends: Buffer, counts: Buffer, new_tokens: int, min_frequency: int, /) -> bytes:
    """Byte-level BPE merges from word counts, as int32 triples (left, right, token)."""
