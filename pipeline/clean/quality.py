"""Document quality filters: the Gopher rules (Rae et al. 2021, appendix A) and character-length bounds.

``check_quality(text, cfg)`` returns the name of the first rule a document fails (cheap rules first), or
``None`` when it passes. Every threshold is a field of :class:`QualityConfig`; ``None`` turns a rule off.

Words are whitespace-separated tokens, except that each CJK character (kana, CJK ideographs, Hangul
syllables, fullwidth forms) counts as one word: Chinese and Japanese use no spaces, so a whole paragraph would
otherwise be one "word" and every CJK document would fail the word-count and mean-length rules. The mean word
length rule is measured over the non-CJK words only, and skipped when fewer than half of the words are
non-CJK (a CJK "word" of one character says nothing about gibberish). Thai, Lao, Khmer and Myanmar, which
are also written without spaces, are not special-cased: documents in them look like few long words.

Rules, in the order checked (the reason is the drop counter of the clean stage; G = Rae et al. 2021, "Scaling
Language Models: Methods, Analysis & Insights from Training Gopher", appendix A, its "quality filtering" (QF) and
"repetition removal" (RR) steps; W = words as defined above, CJK characters included unless said):

=====================  ===============================  ==========  =========================================  =======
reason                 threshold field                  default     a document is dropped when                 source
=====================  ===============================  ==========  =========================================  =======
too_short_chars        min_chars                        100         characters < min                           ours
too_long_chars         max_chars                        5,000,000   characters > max                           ours
too_few_words          min_words                        50          W < min                                    G QF
too_many_words         max_words                        100,000     W > max                                    G QF
mean_word_length       min/max_mean_word_length         3, 10       mean characters per non-CJK word outside   G QF
                                                                    [min, max] (1)
hash_word_ratio        max_symbol_word_ratio            0.1         text.count("#") / W > max                  G QF
ellipsis_word_ratio    max_symbol_word_ratio            0.1         (count("...") + count("…")) / W > max (2)  G QF
bullet_lines           max_bullet_line_fraction         0.9         lines starting (after spaces/tabs) with    G QF
                                                                    one of ``BULLETS`` / lines > max (3)
ellipsis_lines         max_ellipsis_line_fraction       0.3         lines ending in "..." or "…" / lines > max  G QF
alpha_word_fraction    min_alpha_word_fraction          0.8         W with >= 1 ``str.isalpha`` character / W  G QF
                                                                    < min (4)
dup_line_fraction      max_dup_line_fraction            0.3         non-blank lines equal to an earlier one /  G RR
                                                                    non-blank lines > max
dup_line_char_fraction max_dup_line_char_fraction       0.2         characters of those lines / characters of  G RR
                                                                    non-blank lines > max
dup_para_fraction,     max_dup_para_fraction,           0.3, 0.2    the same over paragraphs (split on blank   G RR
dup_para_char_fraction max_dup_para_char_fraction                   lines)
top_{n}gram_fraction   top_ngram_max_fraction           n=2,3,4:    characters of the most frequent word       G RR
                                                        .20,.18,.16 n-gram x its count (when > 1) / word
                                                                    characters > max (5)
dup_{n}gram_fraction   dup_ngram_max_fraction           n=5..10:    word characters inside occurrences of an   G RR
                                                        .15 .. .10  n-gram repeating an earlier one, each
                                                                    counted once / word characters > max (5)
stop_words             min_stop_words, stop_words       2; en: the, occurrences of the language's stop words   G QF
                                                        be, to, of, < min (6)
                                                        and, that,
                                                        have, with
=====================  ===============================  ==========  =========================================  =======

Choices the paper leaves open, made here: a word is a whitespace token (``str.split``), each CJK character one
word (``CJK_RANGES``, whose CJK punctuation and ideographic space U+3000 count too); every ratio's denominator is W of the whole document (lines: all lines, ``text.count("\n") + 1``;
repetition: non-blank lines/paragraphs, word characters of non-CJK words). (1) skipped when fewer than half of
the words are non-CJK. (2) "...." holds one "...", "......" two (``str.count``); the paper's two ratios are
compared each on its own, not summed. (3) ``BULLETS``: • ‣ ◦ ⁃ ● ▪ - * · –. (4) a CJK character is a word with
a letter when it is one (ideographs, kana: yes; CJK punctuation, fullwidth digits: no); "1984", "—", "#" are
words without one. (5) skipped for mostly-CJK documents (the line and paragraph rules still apply); n-grams do
not cross documents; ties of the most frequent n-gram go to the earliest. (6) needs the document's language,
so the clean stage applies it after language identification (:mod:`pipeline.clean.stopwords`, which defines the
matching: a token stripped of non-alphanumeric ends, lowercased, each occurrence counted); ``stop_words`` maps a
language to its list, ``"*"`` to the list of any language without its own; a language without a list (with the
defaults, every language but English) is not subject to the rule. ``check_quality_batch`` applies it only when
given the languages. The paper gives neither the case nor the punctuation handling of its stop words.

Speed: ``check_quality_batch`` never builds a Python list of words for most documents. One numpy scan over
the UTF-8 bytes of ~0.5 MB of documents at a time gives every word's bounds, character length and a 64-bit
hash (see "byte-level word scan"), hence the word count and mean length, and upper bounds on the line and
paragraph repetition fractions. The n-gram rules are screened from the word hashes with sound upper
bounds (:func:`screen_ngrams`). Only documents that a bound cannot clear get the exact computation (the
repetition rules with ``set``; the n-gram rules from first-occurrence arrays, :func:`_fast_ngram_reason`),
and documents the scan cannot split like ``str.split`` (those with a lone surrogate) take the per-document
path; CJK characters and non-ASCII whitespace are separators in the scan, the CJK ones counted as words. The straightforward per-document rules are kept as a reference in
``tests/pipeline/clean/quality_oracle.py``; ``check_quality_batch`` gives exactly their answers on every document
(``tests/pipeline/clean/test_quality.py``). The scan itself lives in :mod:`pipeline.clean.wordscan`, the
thresholds in :class:`pipeline.clean.config.QualityConfig`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from itertools import chain

import numpy as np

from pipeline.clean import wordscan
from pipeline.clean.config import QualityConfig
from pipeline.clean.stopwords import stop_word_reason
from pipeline.clean.wordscan import CJK_RANGES, MIX, STEP, Mark, repeated_keys, scan_chunks
from pipeline.units.protocol import packed_ranges

CJK_RE = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in CJK_RANGES) + "]")
BULLETS = ("•", "‣", "◦", "⁃", "●", "▪", "-", "*", "·", "–")
# A literal "\n" prefix lets the regex engine skip ahead with a fast search (a ^/MULTILINE anchor does not).
BULLET_LINE_RE = re.compile(r"\n[ \t]*[•‣◦⁃●▪*·–-]")
ELLIPSES = ("...", "…")


def _split_cjk(text: str, words: list[str]) -> tuple[list[str], int]:
    """The whitespace tokens of ``text`` once every CJK character is taken out (``words``, its plain split, when
    it has none), and how many CJK characters it has: one substitution pass for both."""
    if text.isascii() or not CJK_RE.search(text):
        return words, 0
    spaced, cjk = CJK_RE.subn(" ", text)
    return spaced.split(), cjk


def count_words(text: str, words: list[str] | None = None) -> tuple[int, int]:
    """``(words, cjk_chars)``: whitespace tokens with every CJK character counted as one word."""
    plain, cjk = _split_cjk(text, text.split() if words is None else words)
    return len(plain) + cjk, cjk


def _line_reason(
    text: str, cfg: QualityConfig, ellipses: tuple[int, int] | None = None, marks: list[int] | None = None
) -> str | None:
    """Bullet and ellipsis line fractions (text is whitespace-normalised: lines carry no trailing spaces).
    ``ellipses``: the counts of "..." and "…" when known (a line cannot end in one that does not occur);
    ``marks``: the compiled scan's counts (indexed by ``wordscan.Mark``), which make every count here."""
    n_lines = (marks[Mark.NEWLINES] if marks else text.count("\n")) + 1
    if cfg.max_bullet_line_fraction is not None:
        if marks:
            bullets = marks[Mark.BULLET_LINES]
        else:
            bullets = len(BULLET_LINE_RE.findall(text)) + text.lstrip(" \t").startswith(BULLETS)
        if bullets / n_lines > cfg.max_bullet_line_fraction:
            return "bullet_lines"
    if cfg.max_ellipsis_line_fraction is not None:
        if marks:
            ends = marks[Mark.ELLIPSIS_ENDS]
        else:
            present = (
                ELLIPSES if ellipses is None else [e for e, k in zip(ELLIPSES, ellipses, strict=True) if k]
            )
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
        first = _first_equal(first[: w - n + 1] * w + word[n - 1 :], w * w)
        yield first


def _first_equal(values: np.ndarray, bound: int) -> np.ndarray:
    """Per position: the first position holding an equal value (``values`` in [0, bound)), as
    ``np.unique(values, return_index=True, return_inverse=True)`` gives it (``index[inverse]``), from one
    sort of the values with their positions packed in the low bits instead of its stable argsort."""
    m = len(values)
    shift = max(m.bit_length(), 1)
    if bound.bit_length() + shift > 63:
        _, index, inverse = np.unique(values, True, True)
        return index[inverse]
    packed = np.sort((values << shift) | np.arange(m))
    position = packed & ((1 << shift) - 1)
    starts = np.empty(m, dtype=bool)
    starts[0] = True
    np.not_equal(packed[1:] >> shift, packed[:-1] >> shift, out=starts[1:])
    first = np.empty(m, dtype=np.int64)
    first[position] = position[starts][np.cumsum(starts) - 1]
    return first


def _fast_ngram_reason(words: list[str], cfg: QualityConfig) -> str | None:
    """The answer of the reference n-gram rules (``tests/pipeline/clean/quality_oracle.py``), from first-occurrence
    arrays instead of Counters of tuples."""
    top = dict(cfg.top_ngram_max_fraction)
    pairs = cfg.dup_ngram_max_fraction
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    cum = np.concatenate(([0], np.cumsum(lengths)))
    total = int(cum[-1])
    levels = _first_occurrences(words, max([1, *top, *(n for n, _ in pairs)]))
    firsts: list[np.ndarray] = []

    def level(n: int) -> np.ndarray | None:
        """The first-occurrence array of the n-grams (computed up to n only when asked: most documents
        that reach this exact check are decided by the shorter n-grams), None past the document's length."""
        while len(firsts) < n and (nxt := next(levels, None)) is not None:
            firsts.append(nxt)
        return firsts[n - 1] if n <= len(firsts) else None

    for n in top:
        if (first := level(n)) is None:
            continue
        counts = np.bincount(first, minlength=len(first))
        count = int(counts.max())
        start = int(np.argmax(counts == count))  # Counter.most_common: ties go to the earliest n-gram
        if count > 1 and count * int(cum[start + n] - cum[start]) > top[n] * total:
            return f"top_{n}gram_fraction"
    if not pairs or len(words) <= pairs[0][0]:
        return None
    for i, (n, max_frac) in enumerate(pairs):
        m = len(words) - n + 1
        frac = 0.0
        if m > 1 and (first := level(n)) is not None:
            covered = _covered(first != np.arange(m), n)
            frac = float(lengths[covered].sum()) / max(float(total), 1.0)
        if frac > max_frac:
            return f"dup_{n}gram_fraction"
        if frac <= min(f for _, f in pairs[i:]):
            return None
    return None


def _covered(repeats: np.ndarray, n: int) -> np.ndarray:
    """Per word (``len(repeats) + n - 1`` words): whether one of the n-gram starts ``repeats`` marks, within
    the n words up to it, covers it. Word j is covered iff a marked start lies in [j - n + 1, j]: the count
    of marked starts before j + 1 (at most the last start) exceeds the count before j - n + 1 (at least 0);
    both from one cumulative sum, read as slices."""
    m = len(repeats)
    before = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(repeats, out=before[1:])
    upto = np.concatenate((before[1:], np.full(n - 1, before[m])))
    since = np.concatenate((np.zeros(n - 1, dtype=np.int64), before[:m]))
    return upto > since


# ---------------------------------------------------------------- batch screen for the n-gram rules
# Counting n-grams per document with Counter/dict costs ~100 ns per word and n. The screen instead hashes
# every n-gram of a chunk of documents into a bucket table (numpy bincount) whose counts can only be too
# high (collisions add, never remove). From them: an upper bound on each document's top n-gram score
# (count x characters); an n-gram occurs at most as often as its prefix, so the shorter n's counts bound
# the longer one's first. A document whose bounds stay under every threshold passes the n-gram rules for
# certain; the few others get the exact per-document computation. So the batch answer equals the
# per-document one. The repeated n-gram screen sorts 64-bit keys instead (see _covered_chars).

_CHUNK_WORDS = 1 << 17
_SLACK = 1.0 - 1e-9  # float rounding must never turn a failing document into a passing one


def _chunks(sizes: list[int]) -> list[tuple[int, int]]:
    """[lo, hi) ranges of documents holding about _CHUNK_WORDS words each (a huge document alone)."""
    return packed_ranges(sizes, _CHUNK_WORDS)


def _bucket_counts(key: np.ndarray, valid: np.ndarray, bits: int) -> np.ndarray:
    """For every n-gram start: its bucket's count (0 where the n-gram crosses into the next document)."""
    bucket = np.where(valid, (key * MIX) >> np.uint64(64 - bits), 1 << bits).astype(np.intp)
    counts = np.bincount(bucket, minlength=(1 << bits) + 1)
    counts[1 << bits] = 0
    return counts[bucket]


def _covered_chars(
    key: np.ndarray, valid: np.ndarray, doc: np.ndarray, lengths: np.ndarray, n_docs: int
) -> np.ndarray:
    """Per document: characters covered by n-gram occurrences repeating an earlier one.

    Buckets would not do here: one false "repeat" covers n words, so the table would need hundreds of
    slots per word. Instead the valid keys are sorted with their positions (``wordscan.repeated_keys``, which the
    line and paragraph bounds use too): all but the first of each run of equal keys repeat an earlier n-gram.
    """
    m = len(key)
    repeats = np.zeros(m, dtype=bool)
    starts = np.flatnonzero(valid)
    repeats[starts[repeated_keys(key[starts])]] = True
    covered = _covered(repeats, len(doc) - m + 1)
    return np.bincount(doc, weights=lengths * covered, minlength=n_docs)


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
    dup = {n: (frac, min(f for _, f in pairs[i:])) for i, (n, frac) in enumerate(pairs)}
    max_n = min(max([0, *dup, *top]), total)
    last_top = max([0, *top])
    counts: np.ndarray | None = None  # bucket counts of the last top n-gram rule
    undecided = np.ones(n_docs, dtype=bool)  # documents the repeated n-gram bounds have not settled yet
    word_hash = word_hash * MIX
    key = word_hash + doc.astype(np.uint64) * STEP  # the key of every n-gram start, n = 1 first
    for n in range(1, max_n + 1):
        if n > 1:  # each n-gram's key from its (n-1)-gram prefix's and its last word
            key = key[: len(word_hash) - n + 1] * STEP + word_hash[n - 1 :]
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
        if n in dup and undecided.any():
            # the rules in order, as the exact check runs them: a bound over this n's threshold flags the
            # document, a bound at most the smallest threshold still to come clears it (coverage can only
            # shrink as n grows), anything between is decided by the next n's bound
            frac, least = dup[n]
            covered_chars = _covered_chars(key, valid & undecided[doc[: len(key)]], doc, lengths, n_docs)
            over = covered_chars > frac * doc_chars
            flagged |= undecided & over
            undecided &= ~over & (covered_chars > least * doc_chars)
        if n >= last_top:  # only the repeated n-gram rules are left: they need the undecided documents only
            if not undecided.any():
                break
            keep = undecided[doc]
            if not keep.all():  # the n-gram keys of the others are dropped; a key past the end crosses it
                key = key[keep[: len(key)]][: max(int(keep.sum()) - n + 1, 0)]
                word_hash, lengths, doc = word_hash[keep], lengths[keep], doc[keep]
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


def _screen_pending(
    hashes: np.ndarray, lengths: np.ndarray, sizes: np.ndarray, pending: np.ndarray, cfg: QualityConfig
) -> np.ndarray:
    """The n-gram screen of the ``pending`` documents of a scanned chunk: compiled where built
    (``screen_ngrams`` of ``pipeline/clean/_wordscan.c``: the same sound bounds per document, from hash tables
    instead of bucket counts and sorts), else :func:`_screen_words`."""
    kernel = wordscan.scan_kernel
    if kernel is not None:
        found = kernel.screen_ngrams(
            hashes, lengths, sizes, pending, cfg.top_ngram_max_fraction, cfg.dup_ngram_max_fraction
        )
        return np.frombuffer(found, dtype=np.bool_)[pending]
    keep = np.repeat(pending, sizes)
    return _screen_words(hashes[keep], lengths[keep], sizes[pending], cfg)


def _counted_reason(
    text: str,
    n_words: int,
    n_plain: int,
    plain_chars: int,
    alpha_words: int,
    cfg: QualityConfig,
    repetition_ok: bool = False,
    marks: list[int] | None = None,
) -> str | None:
    """The word, symbol, line, alphabetic-word and repetition rules, given the word count, the number of
    non-CJK words and their characters, the number of words with an alphabetic character (and whether the
    repetition rules are known to pass, and the compiled scan's counts)."""
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
        # the paper's two ratios, each against the threshold on its own (not their sum)
        hashes = marks[Mark.HASH] if marks else text.count("#")
        if hashes / n_words > cfg.max_symbol_word_ratio:
            return "hash_word_ratio"
        ellipses = (
            (marks[Mark.DOTS], marks[Mark.ELLIPSIS])
            if marks
            else (text.count(ELLIPSES[0]), text.count(ELLIPSES[1]))
        )
        if (ellipses[0] + ellipses[1]) / n_words > cfg.max_symbol_word_ratio:
            return "ellipsis_word_ratio"
    reason = _line_reason(text, cfg, ellipses, marks)
    if reason:
        return reason
    if (
        cfg.min_alpha_word_fraction is not None
        and n_words
        and alpha_words / n_words < cfg.min_alpha_word_fraction
    ):
        return "alpha_word_fraction"
    return None if repetition_ok else _repetition_reason(text, cfg)


def alpha_words(text: str, words: list[str], n_cjk: int) -> int:
    """Words with at least one alphabetic character (``str.isalpha``): of the non-CJK ``words``, and of the
    ``n_cjk`` CJK characters of ``text`` (each one a word: an ideograph or kana is alphabetic, CJK
    punctuation and fullwidth digits are not)."""
    found = sum(1 for w in words if any(map(str.isalpha, w)))
    return found + (sum(map(str.isalpha, CJK_RE.findall(text))) if n_cjk else 0)


def _word_reason(text: str, cfg: QualityConfig) -> tuple[str | None, list[str]]:
    """The per-document rules before the n-gram ones, from ``text.split()``; also the words for the n-gram
    rules (empty when they do not apply: a reason was found already, or the document is mostly CJK)."""
    words, n_cjk = _split_cjk(text, text.split())
    n_words = len(words) + n_cjk
    alpha = alpha_words(text, words, n_cjk) if cfg.min_alpha_word_fraction is not None else 0
    reason = _counted_reason(text, n_words, len(words), len("".join(words)), alpha, cfg)
    if reason or n_cjk * 2 > n_words:
        # n-gram rules over CJK would need character n-grams; the line/paragraph rules cover CJK spam
        return reason, []
    return None, words


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
    for lo, hi, hashes, lengths, sizes, per_doc, rep_ok, cjk, alpha, marks in scan_chunks(texts, cfg):
        cum = np.concatenate(([0], np.cumsum(lengths)))
        bounds = np.concatenate(([0], np.cumsum(sizes)))
        chars = cum[bounds[1:]] - cum[bounds[:-1]]
        flags = zip(
            texts[lo:hi],
            sizes.tolist(),
            chars.tolist(),
            per_doc.tolist(),
            rep_ok.tolist(),
            cjk.tolist(),
            alpha.tolist(),
            marks.tolist() if marks is not None else [None] * (hi - lo),
            strict=True,
        )
        for text, n, c, other, ok, k, a, m in flags:
            ok = ok and text[:1] != "\n" and text[-1:] != "\n"  # else its paragraphs differ from the scan's
            reasons.append(None if other else _counted_reason(text, n + k, n, c, a, cfg, ok, m))
        others.extend((lo + np.flatnonzero(per_doc)).tolist())
        # the n-gram rules: documents with at least two non-CJK words, and not mostly CJK (see _word_reason)
        ngrams = (sizes >= 2) & ~per_doc & (cjk <= sizes)
        pending = np.array([r is None for r in reasons[lo:hi]], dtype=bool) & ngrams
        if pending.any():
            flagged = _screen_pending(hashes, lengths, sizes, pending, cfg)
            for i in (lo + np.flatnonzero(pending)[flagged]).tolist():
                text = texts[i]
                reasons[i] = _fast_ngram_reason(_split_cjk(text, text.split())[0], cfg)
    return reasons, others


def check_quality_batch(
    texts: list[str], cfg: QualityConfig, languages: Sequence[str | None] | None = None
) -> list[str | None]:
    """``check_quality`` of every text, with the words of most documents found in one byte-level scan and
    the n-gram rules screened for the whole batch at once. ``languages``: each document's language (None:
    not identified), for the stop-word rule; without them that rule is left out (the clean stage applies
    :func:`pipeline.clean.stopwords.stop_word_reason` to the documents that pass, once their language is
    known)."""
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
    if languages is not None:
        reasons = [
            reason or stop_word_reason(text, language, cfg)
            for text, language, reason in zip(texts, languages, reasons, strict=True)
        ]
    return reasons


def check_quality(text: str, cfg: QualityConfig, language: str | None = None) -> str | None:
    """Name of the first rule ``text`` fails (cheapest first), or ``None`` when it passes; the stop-word rule
    with the list of ``language`` (None: not identified, the ``"*"`` list if one is configured)."""
    return check_quality_batch([text], cfg, [language])[0]
