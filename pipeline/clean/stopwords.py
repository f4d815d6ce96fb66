"""Gopher's stop-word rule (Rae et al. 2021, appendix A): a document must hold at least ``min_stop_words``
occurrences of its language's stop words (English by default: *the, be, to, of, and, that, have, with*).

The rule needs the document's language, so it runs apart from the other quality rules: the clean stage
applies :func:`stop_word_reason` to the documents that pass them, once language identification has run on
them (``pipeline.clean.stage``). A language is subject to the rule only when ``QualityConfig.stop_words``
has a list for it, or a ``"*"`` list for every language without its own; a document whose language has no
list (with the defaults: any language but English) passes it. With language identification off, a document's
language is unknown and only a ``"*"`` list applies.

Matching: a token of ``text.split()``, stripped of the characters at either end that are not letters or digits
(``str.isalnum``: ``"The,"``, ``"(of"``, ``"--and--"``), is a stop word when its ``str.lower()`` equals one
lowercased. Each occurrence counts (``"the the"`` is two); ``"the's"`` or ``"to-do"`` hold none. The count stops
at the ``min_stop_words``-th: English prose has its first stop words within its first words, so a kept
document costs a few microseconds whatever its length; only the documents that fail are read to their end. For
lists of ASCII words (the default) the compiled scan (``count_stop_words`` of ``pipeline/clean/_wordscan.c``)
counts, several hundred MB/s; other lists, and installs without the compiled scan, count token by token in
Python.
"""

from __future__ import annotations

import functools
import re

from pipeline.clean import wordscan
from pipeline.clean.config import QualityConfig

_TOKEN = re.compile(r"\S+")


@functools.lru_cache(maxsize=64)
def _lowered(words: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """The distinct lowercased words, and whether they are all ASCII (then the compiled count applies)."""
    lowered = tuple(sorted({w.lower() for w in words}))
    return lowered, all(w.isascii() for w in lowered)


def _core(token: str) -> str:
    """``token`` without the characters at either end that are not letters or digits."""
    start, end = 0, len(token)
    while start < end and not token[start].isalnum():
        start += 1
    while end > start and not token[end - 1].isalnum():
        end -= 1
    return token[start:end]


def count_stop_words(text: str, words: tuple[str, ...], need: int) -> int:
    """The tokens of ``text`` that are stop words (see the module notes), counted up to ``need``."""
    lowered, ascii_only = _lowered(words)
    kernel = wordscan.scan_kernel
    if kernel is not None and ascii_only:
        found = kernel.count_stop_words(text, lowered, need)
        if found >= 0:  # -1: a lone surrogate, counted below
            return int(found)
    wanted = frozenset(lowered)
    found = 0
    for token in _TOKEN.finditer(text):
        if _core(token.group()).lower() in wanted:
            found += 1
            if found >= need:
                break
    return found


def stop_word_reason(text: str, language: str | None, cfg: QualityConfig) -> str | None:
    """``"stop_words"`` when ``text`` holds fewer than ``cfg.min_stop_words`` stop words of ``language``
    (None: not identified); None when it holds enough, or no list applies to its language."""
    need = cfg.min_stop_words
    if not cfg.enabled or not need:
        return None
    words = cfg.stop_word_list(language)
    if not words or count_stop_words(text, words, need) >= need:
        return None
    return "stop_words"
