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

Speed: the per-document rules use C-level ``str`` methods and ``set``/``map`` built-ins, no Python loop over
characters or words. The n-gram rules, the costly ones, are screened for a whole batch at once with numpy
(:func:`screen_ngrams`, sound upper bounds); only documents that might fail get the exact per-document
count. ``check_quality_batch`` gives exactly the answers of ``check_quality`` on each document.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from itertools import chain
from operator import mul

import numpy as np

# Kana, CJK symbols/punctuation, CJK ideographs (+ ext. A), Yi, Hangul syllables, compatibility ideographs,
# halfwidth/fullwidth forms and the CJK ideograph extensions in the supplementary planes.
CJK_RE = re.compile(
    "[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\ua000-\ua4cf\uac00-\ud7a3"
    "\uf900-\ufaff\uff00-\uffef\U00020000-\U0003134f]"
)
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


def _line_reason(text: str, cfg: QualityConfig) -> str | None:
    """Bullet and ellipsis line fractions (text is whitespace-normalised: lines carry no trailing spaces)."""
    n_lines = text.count("\n") + 1
    if cfg.max_bullet_line_fraction is not None:
        bullets = len(BULLET_LINE_RE.findall(text)) + text.lstrip(" \t").startswith(BULLETS)
        if bullets / n_lines > cfg.max_bullet_line_fraction:
            return "bullet_lines"
    if cfg.max_ellipsis_line_fraction is not None:
        ends = sum(text.count(e + "\n") for e in ELLIPSES) + text.rstrip().endswith(ELLIPSES)
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


# ---------------------------------------------------------------- batch screen for the n-gram rules
# Counting n-grams per document with Counter/dict costs ~100 ns per word and n. The screen instead hashes
# every n-gram of a chunk of documents into a bucket table (numpy bincount) whose counts can only be too
# high (collisions add, never remove). From them: an upper bound on each document's top n-gram score
# (count x characters). A
# document whose bounds stay under every threshold passes the n-gram rules for certain; the few others get
# the exact per-document computation. So the batch answer equals the per-document one. The repeated
# n-gram screen sorts 64-bit keys instead (see _covered_chars).

_MIX = np.uint64(0x9E3779B97F4A7C15)
_STEP = np.uint64(0xD6E8FEB86659FD93)
_CHUNK_WORDS = 1 << 16
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


def _ngram_keys(word_hash: np.ndarray, doc: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """64-bit keys of every n-gram start (the document index is mixed in), and whether the n-gram stays
    inside one document."""
    m = len(word_hash) - n + 1
    key = word_hash[:m] + doc[:m].astype(np.uint64) * _STEP
    for j in range(1, n):
        key = key * _STEP + word_hash[j : j + m]
    return key, doc[:m] == doc[n - 1 :]


def _bucket_counts(word_hash: np.ndarray, doc: np.ndarray, n: int, bits: int) -> np.ndarray:
    """For every n-gram start: its bucket's count (0 where the n-gram crosses into the next document)."""
    key, valid = _ngram_keys(word_hash, doc, n)
    bucket = np.where(valid, (key * _MIX) >> np.uint64(64 - bits), 1 << bits).astype(np.intp)
    counts = np.bincount(bucket, minlength=(1 << bits) + 1)
    counts[1 << bits] = 0
    return counts[bucket]


def _covered_chars(word_hash: np.ndarray, doc: np.ndarray, lengths: np.ndarray, n: int) -> np.ndarray:
    """Per document: characters covered by n-gram occurrences repeating an earlier one.

    Buckets would not do here: one false "repeat" covers n words, so the table would need hundreds of
    slots per word. Instead the key's low bits are replaced by the position and the keys sorted: equal
    high bits then come in position order, and all but the first of each run repeat an earlier n-gram.
    """
    key, valid = _ngram_keys(word_hash, doc, n)
    m = len(key)
    shift = np.uint64(max(m.bit_length(), 1))
    packed = np.sort(((key >> shift) << shift)[valid] | np.flatnonzero(valid).astype(np.uint64))
    later = packed[1:][(packed[1:] >> shift) == (packed[:-1] >> shift)]
    repeats = np.zeros(m, dtype=bool)
    repeats[(later & ((np.uint64(1) << shift) - np.uint64(1))).astype(np.intp)] = True
    before = np.concatenate(([0], np.cumsum(repeats)))
    j = np.arange(len(word_hash))
    covered = before[np.minimum(j, m - 1) + 1] - before[np.maximum(j - n + 1, 0)] > 0
    return np.bincount(doc, weights=lengths * covered, minlength=int(doc[-1]) + 1)


def _screen_arrays(word_hash: np.ndarray, lengths: np.ndarray, doc: np.ndarray, n_docs: int, cfg: QualityConfig) -> np.ndarray:
    """The screen of one chunk: words of documents 0..n_docs-1 in order (every document >= 2 words)."""
    total = len(word_hash)
    word_hash = word_hash * _MIX
    starts = np.flatnonzero(np.concatenate(([True], doc[1:] != doc[:-1])))
    doc_chars = np.bincount(doc, weights=lengths, minlength=n_docs) * _SLACK
    cum = np.concatenate(([0], np.cumsum(lengths)))
    bits = min(max((2 * total).bit_length(), 10), 24)  # ~2 buckets per n-gram: a table that stays in cache
    flagged = np.zeros(n_docs, dtype=bool)
    for n, max_frac in cfg.top_ngram_max_fraction:
        if total >= n:
            counts = _bucket_counts(word_hash, doc, n, bits)
            score = np.zeros(total)
            score[: len(counts)] = counts * (cum[n:] - cum[:-n])
            flagged |= np.maximum.reduceat(score, starts) > max_frac * doc_chars
    pairs = cfg.dup_ngram_max_fraction
    if pairs and total >= pairs[0][0]:
        covered_chars = _covered_chars(word_hash, doc, lengths, pairs[0][0])
        flagged |= covered_chars > min(f for _, f in pairs) * doc_chars
    return flagged


def _screen_words(word_hash: np.ndarray, lengths: np.ndarray, sizes: np.ndarray, cfg: QualityConfig) -> np.ndarray:
    """Chunked screen of documents given by their words' hashes and lengths, concatenated, and word counts."""
    out = np.zeros(len(sizes), dtype=bool)
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    for lo, hi in _chunks(sizes.tolist()):
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


def _word_reason(text: str, cfg: QualityConfig) -> tuple[str | None, list[str]]:
    """The word, symbol, line and repetition rules; also the words for the n-gram rules (empty when the
    n-gram rules do not apply: a reason was found already, or the document is mostly CJK)."""
    words = text.split()
    n_words, n_cjk = count_words(text, words)
    if cfg.min_words is not None and n_words < cfg.min_words:
        return "too_few_words", []
    if cfg.max_words is not None and n_words > cfg.max_words:
        return "too_many_words", []
    if n_cjk:
        words = CJK_RE.sub(" ", text).split()
    if len(words) * 2 >= n_words and words:
        mean = len("".join(words)) / len(words)
        if cfg.min_mean_word_length is not None and mean < cfg.min_mean_word_length:
            return "mean_word_length", []
        if cfg.max_mean_word_length is not None and mean > cfg.max_mean_word_length:
            return "mean_word_length", []
    if cfg.max_symbol_word_ratio is not None and n_words:
        symbols = text.count("#") + sum(text.count(e) for e in ELLIPSES)
        if symbols / n_words > cfg.max_symbol_word_ratio:
            return "symbol_ratio", []
    reason = _line_reason(text, cfg) or _repetition_reason(text, cfg)
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


def check_quality_batch(texts: list[str], cfg: QualityConfig) -> list[str | None]:
    """``check_quality`` of every text, with the n-gram rules screened for the whole batch at once."""
    if not cfg.enabled:
        return [None] * len(texts)
    reasons: list[str | None] = []
    pending: list[int] = []
    pending_words: list[list[str]] = []
    for i, text in enumerate(texts):
        reason = _length_reason(text, cfg)
        words: list[str] = []
        if reason is None:
            reason, words = _word_reason(text, cfg)
        reasons.append(reason)
        if len(words) >= 2:
            pending.append(i)
            pending_words.append(words)
    flagged = screen_ngrams(pending_words, cfg) if pending_words else []
    for i, words, maybe in zip(pending, pending_words, flagged, strict=True):
        if maybe:
            reasons[i] = _ngram_reason(words, cfg)
    return reasons


def check_quality(text: str, cfg: QualityConfig) -> str | None:
    """Name of the first rule ``text`` fails (cheapest first), or ``None`` when it passes."""
    return check_quality_batch([text], cfg)[0]
