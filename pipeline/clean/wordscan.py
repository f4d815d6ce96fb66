"""The byte-level word scan of the quality rules (``pipeline.clean.quality.check_quality_batch``).

``text.split()`` builds a str object per word (~75 MB/s). The batch path instead finds the words of all its
documents at once in their UTF-8 bytes: whitespace bytes come from one ``bytes.translate``, word bounds
from where the mask flips, character lengths are byte lengths less the UTF-8 continuation bytes, and a
word's hash mixes its byte length with its first and last 8 bytes (equal words hash equal; the rare long
words that collide only make the n-gram screen more cautious). In a chunk with non-ASCII bytes, the
characters are decoded from their lead bytes: non-ASCII whitespace (NBSP, U+2000-U+200A, ...) and CJK
characters (``CJK_RANGES``) become separators, and the CJK characters are counted per document. This gives
exactly the words of ``pipeline.clean.quality._split_cjk`` (``text.split()`` with every CJK character taken
out) and its CJK count. Only a document with a lone surrogate (which ``str.split`` may see differently) takes
the per-document path.

The scan is proven against ``text.split()`` and the per-document rules in ``tests/pipeline/clean/test_quality.py``
(the reference rules live in ``tests/pipeline/clean/quality_oracle.py``).

Where the install found a C compiler, :func:`scan_chunks` runs the compiled scan (``pipeline/clean/_wordscan.c``:
one pass over each document's UTF-8 bytes, the same words, lengths, hashes, word and CJK counts and
per-document routing, and repetition bounds with exact keys instead of packed ones, so never looser); the
numpy scan below stays the path without it, and both are tested against the reference rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import IntEnum
from types import ModuleType
from typing import Any

import numpy as np

from pipeline.clean.config import QualityConfig
from pipeline.units.protocol import packed_ranges

scan_kernel: ModuleType | None
try:  # the compiled scan (pipeline/clean/_wordscan.c), built at install where a C compiler is found
    import pipeline.clean._wordscan as scan_kernel
except ImportError:  # pragma: no cover - exercised by the tests through monkeypatch
    scan_kernel = None

# Kana, CJK symbols/punctuation, CJK ideographs (+ ext. A), Yi, Hangul syllables, compatibility ideographs,
# halfwidth/fullwidth forms and the CJK ideograph extensions in the supplementary planes.
CJK_RANGES = (
    (0x3000, 0x30FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xA000, 0xA4CF),
    (0xAC00, 0xD7A3),
    (0xF900, 0xFAFF),
    (0xFF00, 0xFFEF),
    (0x20000, 0x3134F),
)
# 64-bit mixing constants shared with the n-gram screen of ``quality``.
MIX = np.uint64(0x9E3779B97F4A7C15)
STEP = np.uint64(0xD6E8FEB86659FD93)
_WS_TABLE = bytes(int(chr(b).isspace()) for b in range(128)) + bytes(128)
_ALPHA_TABLE = bytes(int(chr(b).isalpha()) for b in range(128)) + bytes(128)
# The non-ASCII code points ``str.isspace`` says are spaces (a test recomputes them over every code point: 90 ms
# of CPU that each process importing this module paid before).
_NON_ASCII_SPACES = np.array(
    [0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000], dtype=np.int64
)
# code point c is CJK iff searchsorted(_CJK_EDGES, c, "right") is odd
_CJK_EDGES = np.array([e for a, b in CJK_RANGES for e in (a, b + 1)], dtype=np.int64)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)  # the first k bytes
SCAN_BYTES = 1 << 19


class Mark(IntEnum):
    """The counts the compiled scan gives per document for the per-document rules (``quality._counted_reason``,
    ``quality._line_reason``): a document's marks are a row indexed by these. The C side's ``enum { MARK_HASH,
    ... }`` in ``pipeline/clean/_wordscan.c`` spells the same names in the same order (a test parses it)."""

    HASH = 0  # text.count("#")
    DOTS = 1  # text.count("...")
    ELLIPSIS = 2  # text.count("…")
    NEWLINES = 3  # text.count("\n")
    BULLET_LINES = 4  # lines starting (after spaces and tabs) with a bullet
    ELLIPSIS_ENDS = 5  # lines ending in "..." or "…"


MARKS = len(Mark)


def _word_hashes(buf: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each word ``buf[start:end]`` (buf ends with at least 8 padding bytes)."""
    blen = ends - starts
    mask = _BYTE_MASKS[np.minimum(blen, 8)]
    u64 = np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))  # unaligned view
    first = u64[starts] & mask
    last = u64[np.maximum(ends - 8, starts)] & mask
    return (first * _M1) ^ (last * _M2) ^ blen.astype(np.uint64)  # the screen mixes the bits further


def _wide_chars(
    b: np.ndarray, doc_start: np.ndarray, n_docs: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The multi-byte characters of a chunk, decoded from their lead bytes: per document whether it holds a
    lone surrogate, how many CJK characters and how many of those are alphabetic; a mask of the bytes of the
    CJK and non-ASCII whitespace characters (the separators ``_split_cjk`` adds to ``str.split``'s); and the
    lead bytes of the alphabetic characters."""
    lead = np.flatnonzero(b >= 0xC0)
    per_doc, cjk = np.zeros(n_docs, dtype=bool), np.zeros(n_docs, dtype=np.int64)
    separator = np.zeros(len(b), dtype=bool)
    if not len(lead):
        return per_doc, cjk, cjk.copy(), separator, lead
    b0 = b[lead].astype(np.int64)
    b1, b2, b3 = ((b[lead + k] & 0x3F).astype(np.int64) for k in (1, 2, 3))
    cp = np.where(
        b0 < 0xE0,
        ((b0 & 0x1F) << 6) | b1,
        np.where(
            b0 < 0xF0, ((b0 & 0x0F) << 12) | (b1 << 6) | b2, ((b0 & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3
        ),
    )
    doc = np.searchsorted(doc_start, lead, side="right") - 1
    per_doc[doc[(cp >= 0xD800) & (cp <= 0xDFFF)]] = True
    is_cjk = np.searchsorted(_CJK_EDGES, cp, side="right") % 2 == 1
    cjk += np.bincount(doc[is_cjk], minlength=n_docs)
    # str.isalpha of each distinct code point of the chunk (a few hundred), spread back by the inverse
    distinct, inverse = np.unique(cp, return_inverse=True)
    is_alpha = np.array([chr(c).isalpha() for c in distinct.tolist()], dtype=bool)[inverse]
    cjk_alpha = np.bincount(doc[is_cjk & is_alpha], minlength=n_docs)
    wide = is_cjk | np.isin(cp, _NON_ASCII_SPACES)
    first, size = lead[wide], 2 + (b0[wide] >= 0xE0) + (b0[wide] >= 0xF0)
    for k in range(4):
        separator[first[size > k] + k] = True
    return per_doc, cjk, cjk_alpha, separator, lead[is_alpha]


def _segment_dups(
    seg: tuple[np.ndarray, np.ndarray],
    doc_start: np.ndarray,
    words: tuple[np.ndarray, np.ndarray],
    cont: np.ndarray | None,
) -> tuple[np.ndarray, ...]:
    """For the non-empty byte ranges ``seg = (s, e)`` (lines or paragraphs): document index, characters and
    whether a range with the same key came earlier. The key mixes the document, the range's byte length and
    the sum of its words' hashes: equal ranges of a document get equal keys, so "repeats" can only be too
    many."""
    s, e = seg[0][seg[1] > seg[0]], seg[1][seg[1] > seg[0]]
    word_starts, cum_hash = words
    word_sum = cum_hash[np.searchsorted(word_starts, e)] - cum_hash[np.searchsorted(word_starts, s)]
    doc = np.searchsorted(doc_start, s, side="right") - 1
    key = ((word_sum * _M2) ^ (e - s).astype(np.uint64)) * MIX + doc.astype(np.uint64) * STEP
    chars = e - s
    if cont is not None:
        chars = chars - (np.searchsorted(cont, e) - np.searchsorted(cont, s))
    return doc, chars, repeated_keys(key)


def repeated_keys(key: np.ndarray) -> np.ndarray:
    """Per key: whether an equal key comes earlier. The key's low bits are replaced by its position and the
    values sorted (several times faster than a stable argsort): equal high bits then come in position order,
    and all but the first of each run repeat. Keys equal only in their high bits count as repeats too, which
    can only make the bound more cautious."""
    shift = np.uint64(max(len(key).bit_length(), 1))
    packed = np.sort(((key >> shift) << shift) | np.arange(len(key), dtype=np.uint64))
    later = packed[1:][(packed[1:] >> shift) == (packed[:-1] >> shift)]
    repeat = np.zeros(len(key), dtype=bool)
    repeat[(later & ((np.uint64(1) << shift) - np.uint64(1))).astype(np.intp)] = True
    return repeat


def _repetition_passes(
    buf: bytes,
    doc_start: np.ndarray,
    words: tuple[np.ndarray, np.ndarray],
    cont: np.ndarray | None,
    cfg: QualityConfig,
) -> np.ndarray:
    """Per document: True when upper bounds prove that it passes the four repetition rules. Lines are the
    ranges between newlines, paragraphs those between runs of >= 2 newlines or a document's ends (the caller
    trusts no proof for a document that starts or ends with a newline: ``_paragraphs`` keeps that newline)."""
    nl = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10)
    run = nl[1:] == nl[:-1] + 1
    brk = np.concatenate((run, [True])) | np.concatenate(([True], run))  # in a run of >= 2 newlines
    brk[np.searchsorted(nl, doc_start - 1)] = True  # the newline before each document
    paras = nl[brk]
    ok = np.ones(len(doc_start), dtype=bool)
    kinds = (
        ((nl[:-1] + 1, nl[1:]), cfg.max_dup_line_fraction, cfg.max_dup_line_char_fraction),
        ((paras[:-1] + 1, paras[1:]), cfg.max_dup_para_fraction, cfg.max_dup_para_char_fraction),
    )
    for seg, max_frac, max_char_frac in kinds:
        if max_frac is None and max_char_frac is None:
            continue
        doc, chars, repeat = _segment_dups(seg, doc_start, words, cont)
        n = len(doc_start)
        items = np.bincount(doc, minlength=n)
        total = np.bincount(doc, weights=chars, minlength=n)
        if max_frac is not None:
            ok &= ~(np.bincount(doc, weights=repeat, minlength=n) / np.maximum(items, 1) > max_frac)
        if max_char_frac is not None:
            ok &= ~(
                np.bincount(doc, weights=chars * repeat, minlength=n) / np.maximum(total, 1) > max_char_frac
            )
    return ok


def _scan_chunk(
    encoded: list[bytes], ascii_only: bool, cfg: QualityConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    buf = b"\n" + b"\n".join(encoded) + b"\n" * 9  # the padding lets every word read 8 bytes
    doc_start = np.cumsum([1] + [len(e) + 1 for e in encoded])[:-1]
    space = np.frombuffer(buf.translate(_WS_TABLE), dtype=np.bool_)
    per_doc, cjk = np.zeros(len(encoded), dtype=bool), np.zeros(len(encoded), dtype=np.int64)
    alpha_byte = np.frombuffer(buf.translate(_ALPHA_TABLE), dtype=np.bool_)  # ASCII letters
    cjk_alpha, cont = cjk, None
    if not ascii_only:
        b = np.frombuffer(buf, dtype=np.uint8)
        per_doc, cjk, cjk_alpha, separator, alpha_lead = _wide_chars(b, doc_start, len(encoded))
        space = space | separator
        cont = np.flatnonzero((b & 0xC0) == 0x80)
        alpha_byte = alpha_byte.copy()
        alpha_byte[alpha_lead] = True  # a CJK one is a separator, never inside a word
    edges = np.flatnonzero(space[1:] != space[:-1]) + 1
    starts, ends = edges[0::2], edges[1::2]
    lengths = ends - starts
    if cont is not None:  # a word's characters: its bytes less its continuation bytes
        in_word = cont[~space[cont]]
        lengths = lengths - np.bincount(
            np.searchsorted(starts, in_word, side="right") - 1, minlength=len(starts)
        )
    sizes = np.diff(np.searchsorted(starts, np.append(doc_start, len(buf))))  # a newline parts documents
    hashes = _word_hashes(buf, starts, ends)
    words = (starts, np.concatenate((np.zeros(1, dtype=np.uint64), np.cumsum(hashes))))
    rep_ok = _repetition_passes(buf, doc_start, words, cont, cfg)
    return (
        hashes,
        lengths,
        sizes,
        per_doc,
        rep_ok,
        cjk,
        _alpha_words(alpha_byte, starts, ends, sizes) + cjk_alpha,
    )


def _alpha_words(
    alpha_byte: np.ndarray, starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray
) -> np.ndarray:
    """Per document: its words (``starts``/``ends``, ``sizes`` per document) holding an alphabetic byte."""
    alpha_before = np.zeros(len(alpha_byte) + 1, dtype=np.int32)
    np.cumsum(alpha_byte, out=alpha_before[1:])
    words_before = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(alpha_before[ends] > alpha_before[starts], out=words_before[1:])
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    return words_before[bounds[1:]] - words_before[bounds[:-1]]


def _limit(fraction: float | None) -> float:
    return -1.0 if fraction is None else float(fraction)


def _scan_compiled(
    kernel: ModuleType, texts: list[str], cfg: QualityConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    limits = (
        cfg.max_dup_line_fraction,
        cfg.max_dup_line_char_fraction,
        cfg.max_dup_para_fraction,
        cfg.max_dup_para_char_fraction,
    )
    h, n, sizes, per_doc, ok, cjk, alpha, marks = kernel.scan_words(texts, *map(_limit, limits))
    return (
        np.frombuffer(h, dtype=np.uint64),
        np.frombuffer(n, dtype=np.int64),
        np.frombuffer(sizes, dtype=np.int64),
        np.frombuffer(per_doc, dtype=np.bool_),
        np.frombuffer(ok, dtype=np.bool_),
        np.frombuffer(cjk, dtype=np.int64),
        np.frombuffer(alpha, dtype=np.int64),
        np.frombuffer(marks, dtype=np.int64).reshape(len(texts), MARKS),
    )


def scan_chunks(
    texts: list[str], cfg: QualityConfig
) -> Iterator[
    tuple[int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any]
]:
    """Words of ``texts`` in chunks of ~0.5 MB, which keep numpy's temporaries in cache: ``(lo, hi, hashes,
    lengths, sizes, per_doc, repetition_ok, cjk, alpha, marks)`` for texts lo..hi-1: per word its hash and
    character length (concatenated in order), per document its word count (CJK characters left out), whether it
    must take the per-document path instead (then its words here are not its words), whether it passes the
    repetition rules for certain (see ``_repetition_passes``), its CJK character count (each one a word) and its
    words with an alphabetic character (``str.isalpha``; the CJK ones included); ``marks``
    (the compiled scan only, else None): per document the counts of :class:`Mark` that the per-document
    rules take."""
    kernel = scan_kernel
    if not texts:
        return
    if kernel is not None:
        for lo, hi in packed_ranges([len(t) for t in texts], SCAN_BYTES):
            yield lo, hi, *_scan_compiled(kernel, texts[lo:hi], cfg)
        return
    encoded: list[bytes] = []
    lo, size, ascii_only = 0, 0, True
    for i, text in enumerate(texts):
        encoded.append(text.encode("utf-8", "surrogatepass"))
        size += len(encoded[-1])
        ascii_only = ascii_only and len(encoded[-1]) == len(text)
        if size >= SCAN_BYTES or i == len(texts) - 1:
            yield lo, i + 1, *_scan_chunk(encoded, ascii_only, cfg), None
            encoded, lo, size, ascii_only = [], i + 1, 0, True
