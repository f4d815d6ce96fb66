"""Gopher's stop-word rule (Rae et al. 2021, appendix A): a document must hold at least ``min_stop_words``
occurrences of its language's stop words (English by default: *the, be, to, of, and, that, have, with*).

The rule needs the document's language, so it runs apart from the other quality rules: the clean stage
applies :func:`stop_word_reason` to the documents that pass them, once language identification has run on
them (``pipeline.clean.stage``). A language is subject to the rule only when ``QualityConfig.stop_words``
has a list for it, or a ``"*"`` list for every language without its own; a document whose language has no
list (with the defaults: any language but English) passes it. With language identification off, a document's
language is unknown and only a ``"*"`` list applies.

Matching: a stop word occurs where a whitespace-separated token (``str.split``), stripped of the characters
at either end that are neither letters nor digits (``str.isalnum``: ``"The,"``, ``"(of"``, ``"--and--"``),
equals it case-insensitively (``re.IGNORECASE``: simple case folding). Each occurrence counts (``"the the"``
is two); ``"the's"`` or ``"to-do"`` hold none. One regular expression finds such tokens directly (a token start,
optional punctuation, a stop word, optional punctuation, a token end), and the search stops at the
``min_stop_words``-th: English prose has its first stop words within its first few words, so a kept document
costs a few microseconds whatever its length; only documents that fail are read to their end.
"""

from __future__ import annotations

import functools
import re

from pipeline.clean.config import QualityConfig

# characters stripped from a token's ends: neither a letter/digit (\w less "_") nor whitespace
_PUNCT = r"(?:[^\w\s]|_)*"


@functools.lru_cache(maxsize=64)
def stop_word_pattern(words: tuple[str, ...]) -> re.Pattern[str]:
    """One token that is a stop word once its leading and trailing punctuation are stripped."""
    alternatives = "|".join(map(re.escape, sorted(set(words), key=lambda w: (-len(w), w))))
    return re.compile(rf"(?<!\S){_PUNCT}(?:{alternatives}){_PUNCT}(?!\S)", re.IGNORECASE)


def stop_word_reason(text: str, language: str | None, cfg: QualityConfig) -> str | None:
    """``"stop_words"`` when ``text`` holds fewer than ``cfg.min_stop_words`` stop words of ``language``
    (None: not identified); None when it holds enough, or no list applies to its language."""
    need = cfg.min_stop_words
    if not cfg.enabled or not need:
        return None
    words = cfg.stop_word_list(language)
    if not words:
        return None
    for found, _ in enumerate(stop_word_pattern(words).finditer(text), start=1):
        if found >= need:
            return None
    return "stop_words"
