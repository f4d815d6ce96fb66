"""The reference quality rules: the straightforward per-document computation that production never runs.

``pipeline.clean.quality.check_quality_batch`` must give exactly these answers on every document; the fast paths
(byte-level word scan, n-gram screen, first-occurrence arrays) are tested against them in ``test_quality.py``.
"""

from __future__ import annotations

from collections import Counter
from operator import mul

import numpy as np

from pipeline.clean import quality
from pipeline.clean.config import QualityConfig


def ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return list(zip(*(words[i:] for i in range(n)), strict=False))  # shorter tails end it


def top_ngram_reason(words: list[str], total_chars: int, cfg: QualityConfig) -> str | None:
    """Most frequent n-gram's characters (count x length) over all word characters.

    Bound first: an n-gram's count times its length is at most n times the largest count x length of a
    single word, so the n-gram counting runs only for documents where that bound can exceed the threshold.
    """
    unigrams = Counter(words)
    top_word = max(map(mul, unigrams.values(), map(len, unigrams)), default=0)
    for n, max_frac in cfg.top_ngram_max_fraction:
        if n * top_word <= max_frac * total_chars or len(words) < n:
            continue
        counts = Counter(ngrams(words, n))
        gram, count = counts.most_common(1)[0]
        if count > 1 and count * sum(map(len, gram)) > max_frac * total_chars:
            return f"top_{n}gram_fraction"
    return None


def dup_ngram_fraction(words: list[str], lengths: np.ndarray, n: int) -> float:
    """Fraction of word characters covered by n-gram occurrences that repeat an earlier occurrence."""
    m = len(words) - n + 1
    if m <= 1:
        return 0.0
    grams = ngrams(words, n)
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


def dup_ngram_reason(words: list[str], cfg: QualityConfig) -> str | None:
    """Duplicate n-gram character fractions. Covered(n+1) is a subset of covered(n), so the fraction can
    only fall as n grows: stop as soon as it is at or below every remaining threshold."""
    pairs = cfg.dup_ngram_max_fraction
    if not pairs or len(words) <= pairs[0][0]:
        return None
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    for i, (n, max_frac) in enumerate(pairs):
        frac = dup_ngram_fraction(words, lengths, n)
        if frac > max_frac:
            return f"dup_{n}gram_fraction"
        if frac <= min(f for _, f in pairs[i:]):
            return None
    return None


def ngram_reason(words: list[str], cfg: QualityConfig) -> str | None:
    """The exact n-gram rules of one document (top n-grams, then duplicate n-grams)."""
    return top_ngram_reason(words, len("".join(words)), cfg) or dup_ngram_reason(words, cfg)


def reference_reason(text: str, cfg: QualityConfig) -> str | None:
    """The first rule ``text`` fails, computed document by document (the oracle for ``check_quality_batch``)."""
    if not cfg.enabled:
        return None
    reason = quality._length_reason(text, cfg)
    if reason:
        return reason
    reason, words = quality._word_reason(text, cfg)
    return reason if reason or len(words) < 2 else ngram_reason(words, cfg)


def words_of(text: str) -> list[str]:
    """The words as pileworks defines them, character by character: runs of non-whitespace, every CJK
    character (``quality.CJK_RE``, U+3000 included though it is whitespace too) a word of its own."""
    words: list[str] = []
    current: list[str] = []
    for c in text:
        cjk = quality.CJK_RE.match(c) is not None
        if (cjk or c.isspace()) and current:
            words.append("".join(current))
            current = []
        if cjk:
            words.append(c)
        elif not c.isspace():
            current.append(c)
    return [*words, "".join(current)] if current else words


def alpha_word_fraction(text: str) -> float | None:
    """Gopher's alphabetic-word fraction: words with at least one ``str.isalpha`` character over all words
    (None without words)."""
    words = words_of(text)
    return sum(any(c.isalpha() for c in w) for w in words) / len(words) if words else None


def _strip_punctuation(token: str) -> str:
    start, end = 0, len(token)
    while start < end and not token[start].isalnum():
        start += 1
    while end > start and not token[end - 1].isalnum():
        end -= 1
    return token[start:end]


def stop_word_count(text: str, stop_words: tuple[str, ...]) -> int:
    """Tokens of ``text.split()`` that, stripped of non-alphanumeric characters at both ends and lowercased,
    equal a lowercased stop word."""
    wanted = {w.lower() for w in stop_words}
    return sum(_strip_punctuation(token).lower() in wanted for token in text.split())


def reference_stop_word_reason(text: str, language: str | None, cfg: QualityConfig) -> str | None:
    """The stop-word rule, by counting every token (the oracle for ``stopwords.stop_word_reason``)."""
    if not cfg.enabled or not cfg.min_stop_words:
        return None
    lists = dict(cfg.stop_words)
    words = lists.get(language) if language in lists else lists.get("*")
    if not words:
        return None
    return "stop_words" if stop_word_count(text, words) < cfg.min_stop_words else None


def fast_words(text: str) -> bool:
    """Whether the byte-level scan finds the document's words (``quality._split_cjk``'s: ``text.split()`` with
    every CJK character taken out, each counted as a word): everywhere but in a text with a lone surrogate."""
    return text.isascii() or not any("\ud800" <= c <= "\udfff" for c in text)
