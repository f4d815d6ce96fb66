"""Byte-level BPE from word counts: the ``counts`` trainer (``tokenize.trainer: counts``, the default).

Training splits into the part that grows with the corpus and the part that does not. Counting words (the GPT-2
pattern of the ByteLevel pre-tokenizer, :data:`pipeline.tokenize.fast_bpe.GPT2_PATTERN`) runs per part, where
the part is (:func:`count_words`: a table of ``word: binary, count: int64``); the trainer merges the parts'
tables (:func:`merge_counts`, sorted by word, so the same counts whatever the parts) and learns the merges
from the distinct words alone (:func:`learn_merges`), whose number grows far slower than the corpus.

Both halves run in the compiled kernel ``pipeline/tokenize/_bpe.c`` when it was built, else in Python here
(the same results, tested; the Python trainer is slow and only for a machine without a C compiler). Each merge
takes the adjacent pair of the highest count, ties to the smallest pair of ids, so the tokenizer depends on the
counts alone: the same bytes whatever the workers or the order of the parts. :func:`tokenizer_from_merges`
writes a Hugging Face byte-level BPE like the ``hf`` trainer's (special tokens first, the 256 bytes, then the
merged tokens in merge order, which the tiktoken fast path needs), so ``tokenizers``, ``AutoTokenizer`` and
GPT-NeoX load it unchanged.
"""

from __future__ import annotations

import heapq
import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from functools import lru_cache

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer, pre_tokenizers

from pipeline.tokenize.fast_bpe import unicode_to_byte

try:  # the compiled kernel (pipeline/tokenize/_bpe.c), built at install where a C compiler is found
    import pipeline.tokenize._bpe as bpe_kernel
except ImportError:  # no C compiler at install time: the Python path below (the same results, slower)
    bpe_kernel = None  # type: ignore[assignment]

COUNTS_SCHEMA = pa.schema(
    [pa.field("word", pa.binary(), nullable=False), pa.field("count", pa.int64(), nullable=False)]
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def safe_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` with lone surrogates replaced by U+FFFD: they cannot cross into Rust or C as UTF-8 (the clean
    stage should already have replaced them)."""
    out = list(texts)
    for i, t in enumerate(out):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            out[i] = _SURROGATE.sub("\ufffd", t)
    return out


def count_words(texts: Sequence[str], native: bool = True) -> pa.Table:
    """The distinct words of ``texts`` (UTF-8 bytes, split by the GPT-2 pattern) with their counts, in the order
    first seen: by the compiled kernel, else by ``tokenizers``' ByteLevel pre-tokenizer (the reference it is
    tested against). ``texts`` must hold no lone surrogate (:func:`safe_texts` replaces them)."""
    if native and bpe_kernel is not None:
        blob, ends, counts = bpe_kernel.count_words(list(texts))
        offsets = np.zeros(len(ends) // 8 + 1, dtype=np.int64)
        offsets[1:] = np.frombuffer(ends, dtype=np.int64)
        words = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(blob)]
        ).cast(pa.binary())
        return pa.table([words, pa.array(np.frombuffer(counts, dtype=np.int64))], schema=COUNTS_SCHEMA)
    # the reference: tokenizers' own ByteLevel pre-tokenizer (its words over the byte-level alphabet)
    split, to_byte = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), unicode_to_byte()
    found: Counter[bytes] = Counter()
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("count_words: a text holds a lone surrogate") from None
        found.update(bytes(to_byte[c] for c in word) for word, _ in split.pre_tokenize_str(text))
    return pa.table(
        [pa.array(list(found), pa.binary()), pa.array(list(found.values()), pa.int64())], schema=COUNTS_SCHEMA
    )


def merge_counts(tables: Iterable[pa.Table]) -> pa.Table:
    """The sum of word-count tables, sorted by word: the same table whatever the parts and their order."""
    whole = pa.concat_tables([t.select(["word", "count"]) for t in tables] or [COUNTS_SCHEMA.empty_table()])
    summed = whole.group_by("word").aggregate([("count", "sum")]).rename_columns(["word", "count"])
    return summed.sort_by("word").cast(COUNTS_SCHEMA)


@lru_cache(maxsize=1)
def byte_order() -> tuple[str, bytes]:
    """The byte-level alphabet in ``tokenizers``' order (its characters sorted) and the table (for
    ``bytes.translate``) from a byte to its place there: tokens 0-255 of :func:`learn_merges` are bytes in that
    order, so its ties between pairs fall as ``tokenizers``' trainer breaks them (the smaller pair of ids)."""
    alphabet = "".join(sorted(unicode_to_byte()))
    to_byte = unicode_to_byte()
    table = bytearray(256)
    for place, char in enumerate(alphabet):
        table[to_byte[char]] = place
    return alphabet, bytes(table)


def learn_merges(
    counts: pa.Table, new_tokens: int, min_frequency: int, native: bool = True
) -> list[tuple[int, int, int]]:
    """The merges ``(left, right, token)`` learnt from ``counts`` (:data:`COUNTS_SCHEMA`): tokens 0-255 are the
    bytes in the byte-level alphabet's order (:func:`byte_order`), merged tokens are 256, 257, ... At most
    ``new_tokens`` new tokens; none from a pair seen fewer than ``min_frequency`` times. A merge whose bytes an
    earlier token already has reuses that token."""
    words = counts.column("word").combine_chunks().cast(pa.large_binary())
    order = byte_order()[1]
    counts_arr = np.ascontiguousarray(counts.column("count").to_numpy(), dtype=np.int64)
    if native and bpe_kernel is not None:
        buffers = words.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int64)[words.offset : words.offset + len(words) + 1]
        start = int(offsets[0]) if len(offsets) else 0
        blob = bytes(buffers[2])[start : int(offsets[-1])].translate(order) if len(words) else b""
        ends = np.ascontiguousarray(offsets[1:] - start, dtype=np.int64)
        flat = np.frombuffer(
            bpe_kernel.train_merges(blob, ends.tobytes(), counts_arr.tobytes(), new_tokens, min_frequency),
            dtype=np.int32,
        )
        return [(int(a), int(b), int(t)) for a, b, t in flat.reshape(-1, 3)]
    return _learn_merges_py(
        [bytes(w).translate(order) for w in words.to_pylist()], counts_arr.tolist(), new_tokens, min_frequency
    )


def _learn_merges_py(
    words: list[bytes], counts: list[int], new_tokens: int, min_frequency: int
) -> list[tuple[int, int, int]]:
    """:func:`learn_merges` in Python: exact pair counts, a lazy heap (highest count, then smallest pair)."""
    syms = [list(w) for w in words]
    pair_counts: Counter[tuple[int, int]] = Counter()
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
    for i, s in enumerate(syms):
        for pair in itertools.pairwise(s):
            pair_counts[pair] += counts[i]
            where[pair].add(i)
    heap = [(-c, p) for p, c in pair_counts.items() if c > 0]
    heapq.heapify(heap)
    tokens = [bytes([b]) for b in range(256)]
    known = {t: i for i, t in enumerate(tokens)}
    merges: list[tuple[int, int, int]] = []
    made = 0
    while made < new_tokens and heap:
        neg, pair = heapq.heappop(heap)
        now = pair_counts[pair]
        if -neg != now:
            if now >= min_frequency and now > 0:
                heapq.heappush(heap, (-now, pair))
            continue
        if now < min_frequency or now < 1:
            break
        merged = tokens[pair[0]] + tokens[pair[1]]
        token = known.get(merged)
        if token is None:
            token = known[merged] = len(tokens)
            tokens.append(merged)
            made += 1
        merges.append((pair[0], pair[1], token))
        touched: set[tuple[int, int]] = set()
        for i in sorted(where.pop(pair, ())):
            s = syms[i]
            for old in itertools.pairwise(s):
                pair_counts[old] -= counts[i]
            s = syms[i] = _merge_word(s, pair, token)
            for new in itertools.pairwise(s):
                pair_counts[new] += counts[i]
                if token in new:
                    where[new].add(i)
                    touched.add(new)
        for new in sorted(touched):
            if pair_counts[new] >= min_frequency:
                heapq.heappush(heap, (-pair_counts[new], new))
    return merges


def _merge_word(s: list[int], pair: tuple[int, int], token: int) -> list[int]:
    out, k = [], 0
    while k < len(s):
        if k + 1 < len(s) and s[k] == pair[0] and s[k + 1] == pair[1]:
            out.append(token)
            k += 2
        else:
            out.append(s[k])
            k += 1
    return out


def tokenizer_from_merges(merges: Sequence[tuple[int, int, int]], special_tokens: Sequence[str]) -> Tokenizer:
    """The Hugging Face byte-level BPE of ``merges`` (:func:`learn_merges`): ``special_tokens`` get ids 0, 1,
    ..., the 256 bytes the next ids in the byte-level alphabet's order (as ``tokenizers``' trainer gives them),
    then each new token the next id, in merge order; a ByteLevel pre-tokenizer and decoder, no normalizer."""
    names = list(byte_order()[0])
    vocab = {tok: i for i, tok in enumerate(special_tokens)}
    for char in names:
        vocab[char] = len(vocab)
    pairs = []
    for a, b, token in merges:
        if token == len(names):
            names.append(names[a] + names[b])
            vocab[names[token]] = len(vocab)
        pairs.append([names[a], names[b]])
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": vocab[tok],
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for tok in special_tokens
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": pairs,
        },
    }
    return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))


def train_from_counts(
    counts: pa.Table, vocab_size: int, min_frequency: int, special_tokens: Sequence[str]
) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (specials and 256 bytes included) from merged word counts."""
    new_tokens = vocab_size - 256 - len(special_tokens)
    return tokenizer_from_merges(learn_merges(counts, new_tokens, min_frequency), special_tokens)
