"""C4's rules (Raffel et al. 2020, "Exploring the Limits of Transfer Learning ...", JMLR 21, section 2.2), as
the code that built C4 applies them (TFDS ``c4_utils.clean_page`` and its bad-words filter) and as datatrove
0.10.1's ``C4QualityFilter`` re-implements them. Off by default (``clean.c4.enabled``): they are made for web
pages and remove most code and documentation.

The page is split with ``str.splitlines``, each line is stripped, then the line rules run in this order; the
first that fires decides (a removed line is counted as ``c4.lines_removed.<reason>`` in the stage's ``extra``;
blank lines are removed without being counted, and the removals of a page that is dropped are not counted).
A page drop is counted as the drop reason of the clean stage. The kept lines are joined with ``\\n``.

| rule | reason | field (default) | definition | source |
|---|---|---|---|---|
| long word | line `too_long_word` | `max_word_length` (1000) | a line holding a whitespace word longer than this is removed (checked before citations are cut) | TFDS code (not in the paper) |
| citations | (text edit) | `remove_citations` (true) | `[digits]`, `[]`, `[edit]`, `[citation needed]` are cut out of the line | TFDS code |
| terminal punctuation | line `no_terminal_punct` | `require_terminal_punct` (true), `end_marks` (`. ? ! "`) | a line not ending in an end mark, or ending in `...`, is removed | paper, TFDS `_END_MARKS` |
| words per line | line `too_few_words` | `min_words_per_line` (5) | a line with fewer whitespace words (after the citations are cut) is removed | paper, TFDS |
| lorem ipsum | page `c4_lorem_ipsum` | `drop_lorem_ipsum` (true) | a line still kept that contains "lorem ipsum" (any case) drops the page | paper, TFDS |
| javascript | line `javascript` | `remove_javascript_lines` (true) | a line containing "javascript" (any case) is removed | paper, TFDS |
| curly bracket | page `c4_curly_bracket` | `drop_curly_bracket` (true) | a line still kept that contains `{` drops the page | paper, TFDS |
| policy | line `policy` | `remove_policy_lines` (true) | a line containing one of :data:`POLICY_SUBSTRINGS` (any case) is removed | TFDS `_POLICY_SUBSTRINGS` (paper: "boilerplate policy notices") |
| sentences | page `c4_too_few_sentences` | `min_sentences` (3) | fewer sentences than this in the kept lines (:func:`count_sentences`, per line) drops the page | paper, TFDS |
| bad words | page `c4_bad_words` | `bad_words_file` (none) | a word or phrase of the user's list, flanked by non-word characters or the text's ends, in the lowercased kept text drops the page | paper (the LDNOOBW list), TFDS / datatrove `C4BadWordsFilter` |

Choices left open, and what we chose:

- **Thresholds.** The JMLR paper and TFDS: lines of at least 5 words, pages of at least 3 sentences. datatrove's
  defaults are the other way round (3 words, 5 sentences), as in the paper's first arXiv version. We follow the
  JMLR paper and the code that built C4.
- **End marks.** The paper: "a period, exclamation mark, question mark, or end quotation mark"; TFDS: ``. ? ! "``;
  datatrove adds ``'``. We follow TFDS; ``end_marks`` can add ``'`` or typographic quotes.
- **Page rules see only kept lines.** "lorem ipsum" and ``{`` drop a page only from a line that passed the long
  word, punctuation and word-count rules, and a line holding "javascript" is removed before its ``{`` is seen
  (TFDS and datatrove do the same; the paper says "any page").
- **Words per line** are counted after the citations are cut, as TFDS does; datatrove counts them before.
- **Bad words** are matched on the kept text after the sentence rule (TFDS's and datatrove's separate bad-words
  filter, not the in-loop regex of TFDS's first version), all of them (no keep fraction, no per-language
  lists: the file is the list). None is bundled; the file is read through ``pipeline.storage``.
- **Sentences.** TFDS counts them with nltk's punkt model, which must be downloaded; datatrove 0.10.1 (English)
  with spaCy's rule-based ``sentencizer``. We cannot download at run time, so :func:`sentence_spans` is a small
  rule-based splitter (see there for how it differs from punkt).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from pipeline.clean.config import C4Config
from pipeline.storage import S3Options, read_object

POLICY_SUBSTRINGS = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)
CITATION_RE = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
ELLIPSIS = "..."
LINE_REASONS = ("too_long_word", "no_terminal_punct", "too_few_words", "javascript", "policy")
PAGE_REASONS = ("c4_lorem_ipsum", "c4_curly_bracket", "c4_too_few_sentences", "c4_bad_words")

# ---------------------------------------------------------------- sentences

# Abbreviations after which a period does not end a sentence (a short list of punkt's English ones).
ABBREVIATIONS = frozenset(
    (  # noqa: SIM905
        "mr mrs ms dr prof sr jr st vs etc cf al fig figs vol vols inc ltd corp dept approx "
        "jan feb apr jun jul aug sep sept oct nov dec gov lt sgt capt pp"
    ).split()
)
# A run of end marks, the closing quotes/brackets after it, then whitespace and more text.
_BOUNDARY_RE = re.compile(r"[.?!]+[\"'\u201d\u2019)\]]*(?=\s+\S)")
_NEXT_RE = re.compile(r"\s+(\S)")


def _ends_sentence(text: str, start: int, end: int) -> bool:
    """Whether the end-mark run ``text[start:end]`` (closers included) ends a sentence."""
    marks = text[start:end].rstrip("\"'\u201d\u2019)]")
    nxt = _NEXT_RE.match(text, end)
    next_lower = nxt is not None and nxt.group(1).islower()
    if marks.startswith(".."):  # an ellipsis ends a sentence only before a capital
        return nxt is not None and nxt.group(1).isupper()
    if marks != ".":  # ? and ! (and mixes such as ?!) always end one
        return True
    word = (
        text[max(text.rfind(" ", 0, start), text.rfind("\t", 0, start)) + 1 : start]
        .lstrip("\"'(\u201c\u2018[")
        .lower()
    )
    if word in ABBREVIATIONS or "." in word:  # "Dr.", "e.g.", "U.S."
        return False
    if len(word) == 1 and word.isalpha():  # an initial: "J. Smith"
        return False
    if word.isdigit():  # "3. item" numbering inside a line: not before lowercase
        return not next_lower
    return True


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence of ``text`` (one line), in order; blank text has none.

    A sentence ends at a run of ``.``, ``?`` or ``!`` (with the closing quotes and brackets after it) that is
    followed by whitespace and more text, and at the end of the text. How this differs from nltk's punkt
    (English), which TFDS uses: punkt learnt its abbreviations, initials and sentence starters
    from a corpus and weighs the next word's case by how often that word is capitalised elsewhere; here a
    fixed list of common abbreviations, any word with an inner period ("e.g.", "U.S."), a single letter
    (an initial) and a number before a lowercase word do not end a sentence, an ellipsis ends one only before
    a capital, and ``?``/``!`` always do. Both split "It works. Really." into 2; they differ on rarer cases
    ("in the U.S. The next", where punkt may split, or an unlisted abbreviation such as "Blvd.", where punkt
    may not). Lines C4 keeps end in an end mark, so a line counts at least 1.
    """
    spans: list[tuple[int, int]] = []
    begin = len(text) - len(text.lstrip())
    for m in _BOUNDARY_RE.finditer(text):
        if m.end() > begin and _ends_sentence(text, m.start(), m.end()):
            spans.append((begin, m.end()))
            nxt = _NEXT_RE.match(text, m.end())
            begin = nxt.start(1) if nxt else len(text)
    end = len(text.rstrip())
    if end > begin:
        spans.append((begin, end))
    return spans


def count_sentences(line: str) -> int:
    if len(line) < 40 and "." not in line[:-1] and "?" not in line[:-1] and "!" not in line[:-1]:
        return 1 if line.strip() else 0  # one end mark at most, at the end: one sentence (the common case)
    return len(sentence_spans(line))


# ---------------------------------------------------------------- bad words


class BadWords:
    """A user's bad-words list compiled to one regex: a word or phrase flanked by non-word characters or the
    text's ends (TFDS's and datatrove's pattern), searched in lowercased text."""

    def __init__(self, words: Iterable[str]):
        self.words = tuple(sorted({w.strip().lower() for w in words if w.strip()}))
        alternatives = "|".join(map(re.escape, self.words))
        self.pattern = re.compile(rf"(?:\W|^)(?:{alternatives})(?:\W|$)") if self.words else None
        # what the list decides with, for a build's unit keys: a new list at the same URI redoes clean
        self.digest = hashlib.sha256("\n".join(self.words).encode("utf-8")).hexdigest()

    def found_in(self, text: str) -> bool:
        return self.pattern is not None and self.pattern.search(text.lower()) is not None


@functools.lru_cache(maxsize=4)
def _compiled(data: bytes) -> BadWords:
    return BadWords(data.decode("utf-8").splitlines())


def load_bad_words(uri: str | None, s3: S3Options | None) -> BadWords | None:
    """The list at ``uri`` (a local path, ``file://``, ``s3://``, ``gs://`` or ``az://``; ``None``: no list),
    read through ``pipeline.storage`` (run_clean_part reads it once per part) and compiled once per distinct
    content."""
    if uri is None:
        return None
    data = read_object(uri, s3, "clean.c4.bad_words_file")
    return _compiled(data)


# ---------------------------------------------------------------- the page


class _Flags:
    """Which rules can fire anywhere on a page (one pass over it instead of one per line)."""

    def __init__(self, text: str, cfg: C4Config):
        cut, cited = CITATION_RE.subn("", text) if cfg.remove_citations and "[" in text else (text, 0)
        self.citations = cited > 0
        lower = cut.lower()
        n = self.max_word_length = cfg.max_word_length or 0
        # (a regex such as \S{1001} restarts at every character of every word: 3x the time of this split)
        self.long_word = bool(n) and len(text) > n and max(map(len, text.split()), default=0) > n
        self.lorem = cfg.drop_lorem_ipsum and "lorem ipsum" in lower
        self.javascript = cfg.remove_javascript_lines and "javascript" in lower
        self.curly = cfg.drop_curly_bracket and "{" in cut
        self.policy = cfg.remove_policy_lines and any(p in lower for p in POLICY_SUBSTRINGS)
        self.lowered = self.lorem or self.javascript or self.policy


def _line_verdict(line: str, cfg: C4Config, flags: _Flags) -> tuple[str, str | None]:
    """``(line after the citation cut, reason)``: a line reason (removed), a page reason, or None (kept)."""
    if flags.long_word and any(len(w) > flags.max_word_length for w in line.split()):
        return line, "too_long_word"
    if flags.citations:
        line = CITATION_RE.sub("", line)
    if cfg.require_terminal_punct and (not line.endswith(cfg.end_marks) or line.endswith(ELLIPSIS)):
        return line, "no_terminal_punct"
    if cfg.min_words_per_line is not None and len(line.split()) < cfg.min_words_per_line:
        return line, "too_few_words"
    lower = line.lower() if flags.lowered else ""
    if flags.lorem and "lorem ipsum" in lower:
        return line, "c4_lorem_ipsum"
    if flags.javascript and "javascript" in lower:
        return line, "javascript"
    if flags.curly and "{" in line:
        return line, "c4_curly_bracket"
    if flags.policy and any(p in lower for p in POLICY_SUBSTRINGS):
        return line, "policy"
    return line, None


def c4_page(
    text: str, cfg: C4Config, bad_words: BadWords | None = None
) -> tuple[str, str | None, Counter[str]]:
    """``(kept text, page drop reason or None, lines removed by reason)`` of one page under ``cfg``'s rules."""
    flags = _Flags(text, cfg)
    kept: list[str] = []
    removed: Counter[str] = Counter()
    sentences = 0
    # Most lines of most pages lack an end mark: reject them here, without a call, unless a rule that comes
    # first (long words, citation cut) can apply on this page.
    quick = cfg.require_terminal_punct and not flags.long_word and not flags.citations
    for raw in text.splitlines():
        if quick:
            line = raw.strip()
            if not line.endswith(cfg.end_marks) or line.endswith(ELLIPSIS):
                if line:
                    removed["no_terminal_punct"] += 1
                continue
        line, reason = _line_verdict(raw.strip(), cfg, flags)
        if reason is None:
            kept.append(line)
            if cfg.min_sentences is not None:
                sentences += count_sentences(line)
        elif reason.startswith("c4_"):
            return "", reason, Counter()
        elif line:
            removed[reason] += 1
    if cfg.min_sentences is not None and sentences < cfg.min_sentences:
        return "", "c4_too_few_sentences", Counter()
    out = "\n".join(kept).strip()
    if bad_words is not None and bad_words.found_in(out):
        return "", "c4_bad_words", Counter()
    return out, None, removed


def apply_c4(
    texts: Sequence[str],
    early: Sequence[str | None],
    cfg: C4Config,
    counts: Counter[str],
    bad_words: BadWords | None,
) -> tuple[list[str], list[str | None]]:
    """C4 on every text not dropped yet (``early`` None): the texts with their lines removed and the drop
    reasons; line removals counted in ``counts`` as ``c4.lines_removed.<reason>``. A page left empty (only
    possible with ``min_sentences`` off) is dropped as ``empty_after_clean``."""
    out, reasons = list(texts), list(early)
    for i, (text, reason) in enumerate(zip(texts, early, strict=True)):
        if reason is not None:
            continue
        out[i], reasons[i], removed = c4_page(text, cfg, bad_words)
        if reasons[i] is None and not out[i]:
            reasons[i] = "empty_after_clean"
        for name, n in removed.items():
            counts[f"c4.lines_removed.{name}"] += n
    return out, reasons
