"""Document quality filters: the Gopher rules (Rae et al. 2021, appendix A) and C4-style length bounds.

``check_quality(text, cfg)`` returns the name of the first rule a document fails (cheap rules first), or
``None`` when it passes. Every threshold is a field of :class:`QualityConfig`; ``None`` turns a rule off.

Words are whitespace-separated tokens, except that each CJK character (kana, CJK ideographs, Hangul
syllables, fullwidth forms) counts as one word: Chinese and Japanese use no spaces, so a whole paragraph would
otherwise be one "word" and every CJK document would fail the word-count and mean-length rules. The mean word
length rule is measured over the non-CJK words only, and skipped when fewer than half of the words are
non-CJK (a CJK "word" of one character says nothing about gibberish). Thai, Lao, Khmer and Myanmar, which
are also written without spaces, are not special-cased: documents in them look like few long words.

Rules, in the order checked (the reason names are the drop counters of the clean stage): ``too_short_chars``,
``too_long_chars``, ``too_few_words``, ``too_many_words``, ``mean_word_length``, ``symbol_ratio`` (``#``,
``...`` and ``…`` per word), ``bullet_lines`` (lines starting with a bullet or dash), ``ellipsis_lines``,
``dup_line_fraction``, ``dup_line_char_fraction``, ``dup_para_fraction``, ``dup_para_char_fraction`` (items
equal to an earlier item, by count and by characters; blank lines ignored), ``top_{n}gram_fraction``
(characters of the most frequent word n-gram, times its count when it occurs more than once, over all word
characters) and ``dup_{n}gram_fraction`` (word characters inside occurrences of an n-gram that repeat an
earlier occurrence, each character counted once). Documents that are mostly CJK skip the two n-gram
families: their "words" would be single characters (the line and paragraph rules still apply).

Speed: ``check_quality_batch`` never builds a Python list of words for most documents. One numpy scan over
the UTF-8 bytes of ~0.5 MB of documents at a time gives every word's bounds, character length and a 64-bit
hash (see "byte-level word scan"), hence the word count and mean length, and upper bounds on the line and
paragraph repetition fractions. The n-gram rules are screened from the word hashes with sound upper
bounds (:func:`screen_ngrams`). Only documents that a bound cannot clear get the exact computation (the
repetition rules with ``set``; the n-gram rules from first-occurrence arrays, :func:`_fast_ngram_reason`),
and documents the scan cannot split like ``str.split`` (CJK, non-ASCII whitespace, lone surrogates) take
the per-document path. ``_word_reason`` + ``_ngram_reason`` are the straightforward per-document rules;
``check_quality_batch`` gives exactly their answers on every document (tests/pipeline/clean/test_quality.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from operator import mul

import numpy as np

# Kana, CJK symbols/punctuation, CJK ideographs (+ ext. A), Yi, Hangul syllables, compatibility ideographs,
# halfwidth/fullwidth forms and the CJK ideograph extensions in the supplementary planes.
_CJK_RANGES = (
    (0x3000, 0x30FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xA000, 0xA4CF),
    (0xAC00, 0xD7A3),
    (0xF900, 0xFAFF),
    (0xFF00, 0xFFEF),
    (0x20000, 0x3134F),
)
CJK_RE = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in _CJK_RANGES) + "]")
BULLETS = ("•", "‣", "◦", "⁃", "●", "▪", "-", "*", "·", "–")
# A literal "\n" prefix lets the regex engine skip ahead with a fast search (a ^/MULTILINE anchor does not).
BULLET_LINE_RE = re.compile(r"\n[ \t]*[•‣◦⁃●▪*·–-]")
ELLIPSES = ("...", "…")
DEFAULT_TOP_NGRAM = ((2, 0.20), (3, 0.18), (4, 0.16))
DEFAULT_DUP_NGRAM = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))

_FRACTION_FIELDS = (
    "max_symbol_word_ratio",
    "max_bullet_line_fraction",
    "max_ellipsis_line_fraction",
    "max_dup_line_fraction",
    "max_dup_line_char_fraction",
    "max_dup_para_fraction",
    "max_dup_para_char_fraction",
)


@dataclass(frozen=True, kw_only=True)
class QualityConfig:
    """Thresholds of the quality rules (Gopher defaults). ``None`` disables a rule; ``enabled=False`` all."""

    enabled: bool = True
    min_chars: int | None = 100
    max_chars: int | None = 5_000_000
    min_words: int | None = 50
    max_words: int | None = 100_000
    min_mean_word_length: float | None = 3.0
    max_mean_word_length: float | None = 10.0
    max_symbol_word_ratio: float | None = 0.1
    max_bullet_line_fraction: float | None = 0.9
    max_ellipsis_line_fraction: float | None = 0.3
    max_dup_line_fraction: float | None = 0.3
    max_dup_line_char_fraction: float | None = 0.2
    max_dup_para_fraction: float | None = 0.3
    max_dup_para_char_fraction: float | None = 0.2
    # (n, max fraction of word characters in the most frequent n-gram)
    top_ngram_max_fraction: tuple[tuple[int, float], ...] = DEFAULT_TOP_NGRAM
    # (n, max fraction of word characters inside repeated occurrences of n-grams)
    dup_ngram_max_fraction: tuple[tuple[int, float], ...] = DEFAULT_DUP_NGRAM

    def __post_init__(self) -> None:
        for name in ("min_chars", "max_chars", "min_words", "max_words"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"QualityConfig.{name} must be a non-negative int or None, got {value!r}")
        for name in _FRACTION_FIELDS:
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"QualityConfig.{name} must be in [0, 1] or None, got {value!r}")
        for lo, hi in (("min_chars", "max_chars"), ("min_words", "max_words")):
            a, b = getattr(self, lo), getattr(self, hi)
            if a is not None and b is not None and a > b:
                raise ValueError(f"QualityConfig.{lo}={a} is larger than {hi}={b}")
        a, b = self.min_mean_word_length, self.max_mean_word_length
        if a is not None and b is not None and not 0 <= a <= b:
            raise ValueError(f"QualityConfig mean word length range [{a}, {b}] is empty or negative")
        for name in ("top_ngram_max_fraction", "dup_ngram_max_fraction"):
            pairs = getattr(self, name)
            ns = [n for n, _ in pairs]
            if ns != sorted(set(ns)) or any(n < 1 for n in ns) or any(not 0 <= f <= 1 for _, f in pairs):
                raise ValueError(
                    f"QualityConfig.{name} must be (n, fraction) pairs with increasing n >= 1 and "
                    f"fractions in [0, 1], got {pairs!r}"
                )


def count_words(text: str, words: list[str] | None = None) -> tuple[int, int]:
    """``(words, cjk_chars)``: whitespace tokens with every CJK character counted as one word."""
    if words is None:
        words = text.split()
    if text.isascii():
        return len(words), 0
    cjk = len(CJK_RE.findall(text)) if CJK_RE.search(text) else 0
    if not cjk:
        return len(words), 0
    return len(CJK_RE.sub(" ", text).split()) + cjk, cjk


def _line_reason(text: str, cfg: QualityConfig, ellipses: tuple[int, int] | None = None) -> str | None:
    """Bullet and ellipsis line fractions (text is whitespace-normalised: lines carry no trailing spaces).
    ``ellipses``: the counts of "..." and "…" when known (a line cannot end in one that does not occur)."""
    n_lines = text.count("\n") + 1
    if cfg.max_bullet_line_fraction is not None:
        bullets = len(BULLET_LINE_RE.findall(text)) + text.lstrip(" \t").startswith(BULLETS)
        if bullets / n_lines > cfg.max_bullet_line_fraction:
            return "bullet_lines"
    if cfg.max_ellipsis_line_fraction is not None:
        present = ELLIPSES if ellipses is None else [e for e, k in zip(ELLIPSES, ellipses, strict=True) if k]
        ends = sum(text.count(e + "\n") for e in present) + text.rstrip().endswith(ELLIPSES)
        if ends / n_lines > cfg.max_ellipsis_line_fraction:
            return "ellipsis_lines"
    return None


def _dup_fractions(items: list[str]) -> tuple[float, float]:
    """Fraction of items that repeat an earlier item, and the fraction of characters in those repeats."""
    items = list(filter(None, items))  # blank lines are empty after whitespace normalisation
    if not items:
        return 0.0, 0.0
    unique = set(items)
    total_chars = sum(map(len, items))
    dup_chars = total_chars - sum(map(len, unique))
    return (len(items) - len(unique)) / len(items), dup_chars / max(total_chars, 1)


def _paragraphs(text: str) -> list[str]:
    """Split on blank lines (str.split is several times faster than re.split on \\n{2,})."""
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.split("\n\n")


def _repetition_reason(text: str, cfg: QualityConfig) -> str | None:
    checks = (
        ("line", text.split("\n"), cfg.max_dup_line_fraction, cfg.max_dup_line_char_fraction),
        ("para", _paragraphs(text), cfg.max_dup_para_fraction, cfg.max_dup_para_char_fraction),
    )
    for kind, items, max_frac, max_char_frac in checks:
        if max_frac is None and max_char_frac is None:
            continue
        frac, char_frac = _dup_fractions(items)
        if max_frac is not None and frac > max_frac:
            return f"dup_{kind}_fraction"
        if max_char_frac is not None and char_frac > max_char_frac:
            return f"dup_{kind}_char_fraction"
    return None


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return list(zip(*(words[i:] for i in range(n)), strict=False))  # shorter tails end it


def _top_ngram_reason(words: list[str], total_chars: int, cfg: QualityConfig) -> str | None:
    """Most frequent n-gram's characters (count x length) over all word characters.

    Bound first: an n-gram's count times its length is at most n times the largest count x length of a
    single word, so the n-gram counting runs only for documents where that bound can exceed the threshold.
    """
    unigrams = Counter(words)
    top_word = max(map(mul, unigrams.values(), map(len, unigrams)), default=0)
    for n, max_frac in cfg.top_ngram_max_fraction:
        if n * top_word <= max_frac * total_chars or len(words) < n:
            continue
        counts = Counter(_ngrams(words, n))
        gram, count = counts.most_common(1)[0]
        if count > 1 and count * sum(map(len, gram)) > max_frac * total_chars:
            return f"top_{n}gram_fraction"
    return None


def _dup_ngram_fraction(words: list[str], lengths: np.ndarray, n: int) -> float:
    """Fraction of word characters covered by n-gram occurrences that repeat an earlier occurrence."""
    m = len(words) - n + 1
    if m <= 1:
        return 0.0
    grams = _ngrams(words, n)
    first = dict(
        zip(reversed(grams), range(m - 1, -1, -1), strict=True)
    )  # the earliest index of each n-gram wins
    if len(first) == m:
        return 0.0
    repeats = np.fromiter(map(first.__getitem__, grams), dtype=np.int64, count=m) != np.arange(m)
    # word j is covered when a repeated occurrence starts at some k in [j - n + 1, j]
    before = np.concatenate(([0], np.cumsum(repeats)))
    j = np.arange(len(words))
    covered = before[np.minimum(j, m - 1) + 1] - before[np.maximum(j - n + 1, 0)] > 0
    return float(lengths[covered].sum()) / max(float(lengths.sum()), 1.0)


def _dup_ngram_reason(words: list[str], cfg: QualityConfig) -> str | None:
    """Duplicate n-gram character fractions. Covered(n+1) is a subset of covered(n), so the fraction can
    only fall as n grows: stop as soon as it is at or below every remaining threshold."""
    pairs = cfg.dup_ngram_max_fraction
    if not pairs or len(words) <= pairs[0][0]:
        return None
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    for i, (n, max_frac) in enumerate(pairs):
        frac = _dup_ngram_fraction(words, lengths, n)
        if frac > max_frac:
            return f"dup_{n}gram_fraction"
        if frac <= min(f for _, f in pairs[i:]):
            return None
    return None


def _first_occurrences(words: list[str], max_n: int) -> Iterator[np.ndarray]:
    """For n = 1..max_n (while there is an n-gram): per n-gram start, the start of its first occurrence.

    Exact: two n-grams are equal iff their (n-1)-gram prefixes are and their last words are, so the pair
    (first occurrence of the prefix, first occurrence of the last word) identifies the n-gram.
    """
    w = len(words)
    first_word = dict(zip(reversed(words), range(w - 1, -1, -1), strict=True))
    word = np.fromiter(map(first_word.__getitem__, words), dtype=np.int64, count=w)
    first = word
    yield first
    for n in range(2, min(max_n, w) + 1):
        _, index, inverse = np.unique(first[: w - n + 1] * w + word[n - 1 :], True, True)
        first = index[inverse]
        yield first


def _fast_ngram_reason(words: list[str], cfg: QualityConfig) -> str | None:
    """The answer of ``_ngram_reason``, from first-occurrence arrays instead of Counters of tuples."""
    top = dict(cfg.top_ngram_max_fraction)
    pairs = cfg.dup_ngram_max_fraction
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    cum = np.concatenate(([0], np.cumsum(lengths)))
    total = int(cum[-1])
    firsts = list(_first_occurrences(words, max([1, *top, *(n for n, _ in pairs)])))
    for n in top:
        if n > len(firsts):
            continue
        first = firsts[n - 1]
        counts = np.bincount(first, minlength=len(first))
        count = int(counts.max())
        start = int(np.argmax(counts == count))  # Counter.most_common: ties go to the earliest n-gram
        if count > 1 and count * int(cum[start + n] - cum[start]) > top[n] * total:
            return f"top_{n}gram_fraction"
    if not pairs or len(words) <= pairs[0][0]:
        return None
    j = np.arange(len(words))
    for i, (n, max_frac) in enumerate(pairs):
        m = len(words) - n + 1
        frac = 0.0
        if m > 1:
            before = np.concatenate(([0], np.cumsum(firsts[n - 1] != np.arange(m))))
            covered = before[np.minimum(j, m - 1) + 1] - before[np.maximum(j - n + 1, 0)] > 0
            frac = float(lengths[covered].sum()) / max(float(total), 1.0)
        if frac > max_frac:
            return f"dup_{n}gram_fraction"
        if frac <= min(f for _, f in pairs[i:]):
            return None
    return None


# ---------------------------------------------------------------- batch screen for the n-gram rules
# Counting n-grams per document with Counter/dict costs ~100 ns per word and n. The screen instead hashes
# every n-gram of a chunk of documents into a bucket table (numpy bincount) whose counts can only be too
# high (collisions add, never remove). From them: an upper bound on each document's top n-gram score
# (count x characters); an n-gram occurs at most as often as its prefix, so the shorter n's counts bound
# the longer one's first. A document whose bounds stay under every threshold passes the n-gram rules for
# certain; the few others get the exact per-document computation. So the batch answer equals the
# per-document one. The repeated n-gram screen sorts 64-bit keys instead (see _covered_chars).

_MIX = np.uint64(0x9E3779B97F4A7C15)
_STEP = np.uint64(0xD6E8FEB86659FD93)
_CHUNK_WORDS = 1 << 17
_SLACK = 1.0 - 1e-9  # float rounding must never turn a failing document into a passing one


def _chunks(sizes: list[int]) -> list[tuple[int, int]]:
    """[lo, hi) ranges of documents holding about _CHUNK_WORDS words each (a huge document alone)."""
    out, lo, words = [], 0, 0
    for i, size in enumerate(sizes):
        if words and words + size > _CHUNK_WORDS:
            out.append((lo, i))
            lo, words = i, 0
        words += size
    out.append((lo, len(sizes)))
    return out


def _ngram_keys(word_hash: np.ndarray, doc: np.ndarray, max_n: int) -> Iterator[np.ndarray]:
    """For n = 1..max_n: the 64-bit key of every n-gram start (the document index is mixed in); each from
    the previous one."""
    key = word_hash + doc.astype(np.uint64) * _STEP
    yield key
    for n in range(2, max_n + 1):
        m = len(word_hash) - n + 1
        key = key[:m] * _STEP + word_hash[n - 1 :]
        yield key


def _bucket_counts(key: np.ndarray, valid: np.ndarray, bits: int) -> np.ndarray:
    """For every n-gram start: its bucket's count (0 where the n-gram crosses into the next document)."""
    bucket = np.where(valid, (key * _MIX) >> np.uint64(64 - bits), 1 << bits).astype(np.intp)
    counts = np.bincount(bucket, minlength=(1 << bits) + 1)
    counts[1 << bits] = 0
    return counts[bucket]


def _covered_chars(key: np.ndarray, valid: np.ndarray, doc: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per document: characters covered by n-gram occurrences repeating an earlier one.

    Buckets would not do here: one false "repeat" covers n words, so the table would need hundreds of
    slots per word. Instead the key's low bits are replaced by the position and the keys sorted: equal
    high bits then come in position order, and all but the first of each run repeat an earlier n-gram.
    """
    m = len(key)
    n = len(doc) - m + 1
    shift = np.uint64(max(m.bit_length(), 1))
    packed = np.sort(((key >> shift) << shift)[valid] | np.flatnonzero(valid).astype(np.uint64))
    later = packed[1:][(packed[1:] >> shift) == (packed[:-1] >> shift)]
    repeats = np.zeros(m, dtype=bool)
    repeats[(later & ((np.uint64(1) << shift) - np.uint64(1))).astype(np.intp)] = True
    before = np.concatenate(([0], np.cumsum(repeats)))
    j = np.arange(len(doc))
    covered = before[np.minimum(j, m - 1) + 1] - before[np.maximum(j - n + 1, 0)] > 0
    return np.bincount(doc, weights=lengths * covered, minlength=int(doc[-1]) + 1)


def _top_scores(counts: np.ndarray, cum: np.ndarray, n: int, starts: np.ndarray) -> np.ndarray:
    """Per document: the largest count x characters over its n-gram starts."""
    score = np.zeros(len(cum) - 1)
    score[: len(counts)] = counts * (cum[n:] - cum[:-n])
    return np.maximum.reduceat(score, starts)


def _screen_arrays(
    word_hash: np.ndarray, lengths: np.ndarray, doc: np.ndarray, n_docs: int, cfg: QualityConfig
) -> np.ndarray:
    """The screen of one chunk: words of documents 0..n_docs-1 in order (every document >= 2 words)."""
    total = len(word_hash)
    starts = np.flatnonzero(np.concatenate(([True], doc[1:] != doc[:-1])))
    doc_chars = np.bincount(doc, weights=lengths, minlength=n_docs) * _SLACK
    cum = np.concatenate(([0], np.cumsum(lengths)))
    bits = min(max((2 * total).bit_length(), 10), 24)  # ~2 buckets per n-gram: a table that stays in cache
    flagged = np.zeros(n_docs, dtype=bool)
    top = dict(cfg.top_ngram_max_fraction)
    pairs = cfg.dup_ngram_max_fraction
    dup_n = pairs[0][0] if pairs else 0
    max_n = min(max([dup_n, *top]), total)
    counts: np.ndarray | None = None  # bucket counts of the last top n-gram rule
    for n, key in enumerate(_ngram_keys(word_hash * _MIX, doc, max_n), start=1):
        valid = doc[: len(key)] == doc[n - 1 :]
        if n in top:
            # an n-gram occurs at most as often as its prefix: the shorter rule's counts bound it first
            over = (
                counts is None or _top_scores(counts[: len(key)] * valid, cum, n, starts) > top[n] * doc_chars
            )
            if np.any(over):
                exact = _bucket_counts(key, valid, bits)
                counts = exact if counts is None else np.minimum(counts[: len(key)], exact)
                flagged |= _top_scores(counts, cum, n, starts) > top[n] * doc_chars
        if n == dup_n:
            covered_chars = _covered_chars(key, valid, doc, lengths)
            flagged |= covered_chars > min(f for _, f in pairs) * doc_chars
    return flagged


def _screen_words(
    word_hash: np.ndarray, lengths: np.ndarray, sizes: np.ndarray, cfg: QualityConfig
) -> np.ndarray:
    """Chunked screen of documents given by their words' hashes and lengths, concatenated, and word counts."""
    out = np.zeros(len(sizes), dtype=bool)
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    for lo, hi in _chunks(sizes.tolist()):
        if hi == lo:
            continue
        doc = np.repeat(np.arange(hi - lo), sizes[lo:hi])
        part = slice(int(bounds[lo]), int(bounds[hi]))
        out[lo:hi] = _screen_arrays(word_hash[part], lengths[part], doc, hi - lo, cfg)
    return out


def screen_ngrams(word_lists: list[list[str]], cfg: QualityConfig) -> list[bool]:
    """For each document (>= 2 words): False when it certainly passes every n-gram rule."""
    sizes = np.fromiter(map(len, word_lists), dtype=np.int64, count=len(word_lists))
    total = int(sizes.sum())
    flat = list(chain.from_iterable(word_lists))
    # Python's str hash (colliding words only make the screen more cautious)
    word_hash = np.fromiter(map(hash, flat), dtype=np.int64, count=total).view(np.uint64)
    lengths = np.fromiter(map(len, flat), dtype=np.int64, count=total)
    return _screen_words(word_hash, lengths, sizes, cfg).tolist()


# ---------------------------------------------------------------- byte-level word scan
# ``text.split()`` builds a str object per word (~75 MB/s). The batch path instead finds the words of all its
# documents at once in their UTF-8 bytes: whitespace bytes come from one ``bytes.translate``, word bounds
# from where the mask flips, character lengths are byte lengths less the UTF-8 continuation bytes, and a
# word's hash mixes its byte length with its first and last 8 bytes (equal words hash equal; the rare long
# words that collide only make the n-gram screen more cautious). This gives exactly ``text.split()``'s words
# when the only whitespace is ASCII (str.split's ASCII whitespace: \t \n \v \f \r, \x1c-\x1f, space) and
# there is no CJK character; other documents take the per-document path.

_WS_TABLE = bytes(int(chr(b).isspace()) for b in range(128)) + bytes(128)
_NON_ASCII_SPACES = [c for c in range(0x80, 0x3001) if chr(c).isspace()]
_PER_DOC_RANGES = sorted([*((c, c) for c in _NON_ASCII_SPACES), (0xD800, 0xDFFF), *_CJK_RANGES])
_PER_DOC_RE = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in _PER_DOC_RANGES) + "]")
# code point c is one of them iff searchsorted(_PER_DOC_EDGES, c, "right") is odd
_PER_DOC_EDGES = np.array([e for a, b in _PER_DOC_RANGES for e in (a, b + 1)], dtype=np.int64)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)  # the first k bytes
_SCAN_BYTES = 1 << 19


def _fast_words(text: str) -> bool:
    """Whether the byte-level scan finds exactly ``text.split()`` (and the words are the n-gram words);
    the scan decides it for itself, from the code points it decodes (see ``_per_doc_flags``)."""
    return text.isascii() or _PER_DOC_RE.search(text) is None


def _word_hashes(buf: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each word ``buf[start:end]`` (buf ends with at least 8 padding bytes)."""
    blen = ends - starts
    mask = _BYTE_MASKS[np.minimum(blen, 8)]
    u64 = np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))  # unaligned view
    first = u64[starts] & mask
    last = u64[np.maximum(ends - 8, starts)] & mask
    return (first * _M1) ^ (last * _M2) ^ blen.astype(np.uint64)  # the screen mixes the bits further


def _per_doc_flags(buf: bytes, doc_start: np.ndarray, n_docs: int) -> np.ndarray:
    """Per document: whether it holds a character ``_PER_DOC_RE`` matches (decoded from the UTF-8 bytes)."""
    b = np.frombuffer(buf, dtype=np.uint8)
    lead = np.flatnonzero(b >= 0xC0)
    flags = np.zeros(n_docs, dtype=bool)
    if len(lead):
        b0 = b[lead].astype(np.int64)
        b1, b2, b3 = ((b[lead + k] & 0x3F).astype(np.int64) for k in (1, 2, 3))
        cp = np.where(
            b0 < 0xE0,
            ((b0 & 0x1F) << 6) | b1,
            np.where(
                b0 < 0xF0,
                ((b0 & 0x0F) << 12) | (b1 << 6) | b2,
                ((b0 & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3,
            ),
        )
        bad = lead[np.searchsorted(_PER_DOC_EDGES, cp, side="right") % 2 == 1]
        flags[np.searchsorted(doc_start, bad, side="right") - 1] = True
    return flags


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
    key = ((word_sum * _M2) ^ (e - s).astype(np.uint64)) * _MIX + doc.astype(np.uint64) * _STEP
    chars = e - s
    if cont is not None:
        chars = chars - (np.searchsorted(cont, e) - np.searchsorted(cont, s))
    order = np.argsort(key, kind="stable")  # equal keys stay in position order: the first is no repeat
    repeat = np.zeros(len(s), dtype=bool)
    sorted_key = key[order]
    repeat[order[1:][sorted_key[1:] == sorted_key[:-1]]] = True
    return doc, chars, repeat


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
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    buf = b"\n" + b"\n".join(encoded) + b"\n" * 9  # the padding lets every word read 8 bytes
    doc_start = np.cumsum([1] + [len(e) + 1 for e in encoded])[:-1]
    space = np.frombuffer(buf.translate(_WS_TABLE), dtype=np.bool_)
    edges = np.flatnonzero(space[1:] != space[:-1]) + 1
    starts, ends = edges[0::2], edges[1::2]
    lengths = ends - starts
    per_doc = np.zeros(len(encoded), dtype=bool)
    cont = None
    if not ascii_only:
        cont = np.flatnonzero((np.frombuffer(buf, dtype=np.uint8) & 0xC0) == 0x80)
        word = np.searchsorted(starts, cont, side="right") - 1
        lengths = lengths - np.bincount(word, minlength=len(starts))
        per_doc = _per_doc_flags(buf, doc_start, len(encoded))
    sizes = np.bincount(np.searchsorted(doc_start, starts, side="right") - 1, minlength=len(encoded))
    hashes = _word_hashes(buf, starts, ends)
    words = (starts, np.concatenate((np.zeros(1, dtype=np.uint64), np.cumsum(hashes))))
    return hashes, lengths, sizes, per_doc, _repetition_passes(buf, doc_start, words, cont, cfg)


def _scan_chunks(
    texts: list[str], cfg: QualityConfig
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Words of ``texts`` in chunks of ~0.5 MB, which keep numpy's temporaries in cache: ``(lo, hi, hashes,
    lengths, sizes, per_doc, repetition_ok)`` for texts lo..hi-1: per word its hash and character length
    (concatenated in order), per document its word count, whether it must take the per-document path
    instead (then its words here are not ``text.split()``'s) and whether it passes the repetition rules
    for certain (see ``_repetition_passes``)."""
    encoded: list[bytes] = []
    lo, size, ascii_only = 0, 0, True
    for i, text in enumerate(texts):
        encoded.append(text.encode("utf-8", "surrogatepass"))
        size += len(encoded[-1])
        ascii_only = ascii_only and len(encoded[-1]) == len(text)
        if size >= _SCAN_BYTES or i == len(texts) - 1:
            yield lo, i + 1, *_scan_chunk(encoded, ascii_only, cfg)
            encoded, lo, size, ascii_only = [], i + 1, 0, True


def _counted_reason(
    text: str, n_words: int, n_plain: int, plain_chars: int, cfg: QualityConfig, repetition_ok: bool = False
) -> str | None:
    """The word, symbol, line and repetition rules, given the word count, the number of non-CJK words and
    their characters (and whether the repetition rules are known to pass)."""
    if cfg.min_words is not None and n_words < cfg.min_words:
        return "too_few_words"
    if cfg.max_words is not None and n_words > cfg.max_words:
        return "too_many_words"
    if n_plain * 2 >= n_words and n_plain:
        mean = plain_chars / n_plain
        if cfg.min_mean_word_length is not None and mean < cfg.min_mean_word_length:
            return "mean_word_length"
        if cfg.max_mean_word_length is not None and mean > cfg.max_mean_word_length:
            return "mean_word_length"
    ellipses = None
    if cfg.max_symbol_word_ratio is not None and n_words:
        ellipses = (text.count(ELLIPSES[0]), text.count(ELLIPSES[1]))
        if (text.count("#") + ellipses[0] + ellipses[1]) / n_words > cfg.max_symbol_word_ratio:
            return "symbol_ratio"
    reason = _line_reason(text, cfg, ellipses)
    return reason if reason or repetition_ok else _repetition_reason(text, cfg)


def _word_reason(text: str, cfg: QualityConfig) -> tuple[str | None, list[str]]:
    """The per-document rules before the n-gram ones, from ``text.split()``; also the words for the n-gram
    rules (empty when they do not apply: a reason was found already, or the document is mostly CJK)."""
    words = text.split()
    n_words, n_cjk = count_words(text, words)
    if n_cjk:
        words = CJK_RE.sub(" ", text).split()
    reason = _counted_reason(text, n_words, len(words), len("".join(words)), cfg)
    if reason or n_cjk * 2 > n_words:
        # n-gram rules over CJK would need character n-grams; the line/paragraph rules cover CJK spam
        return reason, []
    return None, words


def _ngram_reason(words: list[str], cfg: QualityConfig) -> str | None:
    """The exact n-gram rules of one document (top n-grams, then duplicate n-grams)."""
    return _top_ngram_reason(words, len("".join(words)), cfg) or _dup_ngram_reason(words, cfg)


def _length_reason(text: str, cfg: QualityConfig) -> str | None:
    if cfg.min_chars is not None and len(text) < cfg.min_chars:
        return "too_short_chars"
    if cfg.max_chars is not None and len(text) > cfg.max_chars:
        return "too_long_chars"
    return None


def _fast_batch(texts: list[str], cfg: QualityConfig) -> tuple[list[str | None], list[int]]:
    """The rules of every document whose words the byte-level scan finds; also the indices of the others
    (their reasons are left None)."""
    reasons: list[str | None] = []
    others: list[int] = []
    for lo, hi, hashes, lengths, sizes, per_doc, rep_ok in _scan_chunks(texts, cfg):
        cum = np.concatenate(([0], np.cumsum(lengths)))
        bounds = np.concatenate(([0], np.cumsum(sizes)))
        chars = cum[bounds[1:]] - cum[bounds[:-1]]
        flags = zip(
            texts[lo:hi], sizes.tolist(), chars.tolist(), per_doc.tolist(), rep_ok.tolist(), strict=True
        )
        for text, n, c, other, ok in flags:
            ok = ok and text[:1] != "\n" and text[-1:] != "\n"  # else its paragraphs differ from the scan's
            reasons.append(None if other else _counted_reason(text, n, n, c, cfg, ok))
        others.extend((lo + np.flatnonzero(per_doc)).tolist())
        pending = np.array([r is None for r in reasons[lo:hi]], dtype=bool) & (sizes >= 2) & ~per_doc
        if pending.any():
            keep = np.repeat(pending, sizes)
            flagged = _screen_words(hashes[keep], lengths[keep], sizes[pending], cfg)
            for i in (lo + np.flatnonzero(pending)[flagged]).tolist():
                reasons[i] = _fast_ngram_reason(texts[i].split(), cfg)
    return reasons, others


def check_quality_batch(texts: list[str], cfg: QualityConfig) -> list[str | None]:
    """``check_quality`` of every text, with the words of most documents found in one byte-level scan and
    the n-gram rules screened for the whole batch at once."""
    if not cfg.enabled:
        return [None] * len(texts)
    reasons: list[str | None] = [_length_reason(text, cfg) for text in texts]
    todo = [i for i, reason in enumerate(reasons) if reason is None]
    fast_reasons, others = _fast_batch([texts[i] for i in todo], cfg)
    for i, reason in zip(todo, fast_reasons, strict=True):
        reasons[i] = reason
    pending: list[int] = []
    pending_words: list[list[str]] = []
    for i in (todo[k] for k in others):
        reasons[i], words = _word_reason(texts[i], cfg)
        if len(words) >= 2:
            pending.append(i)
            pending_words.append(words)
    flagged = screen_ngrams(pending_words, cfg) if pending_words else []
    for i, words, maybe in zip(pending, pending_words, flagged, strict=True):
        if maybe:
            reasons[i] = _fast_ngram_reason(words, cfg)
    return reasons


def check_quality(text: str, cfg: QualityConfig) -> str | None:
    """Name of the first rule ``text`` fails (cheapest first), or ``None`` when it passes."""
    return check_quality_batch([text], cfg)[0]
