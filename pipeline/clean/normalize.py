"""Text normalisation of the clean stage (the stage itself is ``pipeline.clean.stage``).

Per document, in order (steps 0-4 here; 5 and 6 in the stage):

0. **Surrogates** (always: the output must be valid UTF-8): a UTF-16 surrogate pair is joined into its
   character, a lone surrogate is removed.
1. **Mojibake** (``fix_mojibake``): ftfy's encoding repair only (``SchÃ¶n`` -> ``Schön``; C1 controls read
   as Windows-1252). The other ftfy steps are turned off (:data:`FTFY_CONFIG`): HTML unescaping and quote
   uncurling change legitimate text, and line breaks, control characters and Unicode normalisation are
   done below, once, by us.
2. **Control characters** (``strip_control``): C0/C1 controls except ``\\n``, ``\\t`` (and ``\\r``, which step 4
   turns into ``\\n``), NUL, zero-width characters (U+200B-U+200D, U+2060, U+FEFF), ANSI terminal escape
   sequences.
3. **Unicode normalisation** (``normalization``): NFC or NFKC.
4. **Whitespace** (``normalize_whitespace``): CRLF/CR -> LF, Unicode spaces -> ``' '``, no trailing spaces,
   at most ``max_blank_lines`` blank lines in a row, no leading blank lines or trailing whitespace.
5. **Boilerplate**: lines whose hash is in the corpus-wide boilerplate set (see ``pipeline.clean.boilerplate``).
6. **Quality**: ``pipeline.clean.quality.check_quality_batch``; a failing document is dropped, counted by rule.

Speed: the expensive repairs run only where they can change something, and give exactly the output of
running them everywhere. Pure ASCII text cannot be mojibake, is NFC/NFKC-invariant and has no Unicode
spaces or zero-width characters; with :data:`FTFY_CONFIG`, ``ftfy.fix_text`` changes text only where its
badness heuristic (which includes C1 controls) matches, which :func:`needs_ftfy` decides with a one-class
character scan plus ftfy's own regex on short windows (see "ftfy pre-check" below). Non-ASCII text is
scanned once for the characters steps 0, 2 and 4 act on. ``tests/pipeline/clean/test_clean.py`` proves that the
fast path gives the output of every repair run on every document (sample corpus + synthetic mixed text).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from types import ModuleType

import ftfy
import numpy as np
import xxhash
from ftfy.badness import BADNESS_RE

try:  # the regex parser that re itself uses, to read ftfy's BADNESS_RE (see needs_ftfy)
    from re import _constants as sre_constants  # type: ignore[attr-defined]
    from re import _parser as sre_parser  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants
    import sre_parse as sre_parser

from pipeline.clean.config import CleanConfig

lines_kernel: ModuleType | None
try:  # the compiled line keys and removal (pipeline/clean/_lines.c), built at install where a compiler is found
    import pipeline.clean._lines as lines_kernel
except ImportError:  # pragma: no cover - exercised by the tests through monkeypatch
    lines_kernel = None

FTFY_CONFIG = ftfy.TextFixerConfig(
    unescape_html=False,
    remove_terminal_escapes=False,
    fix_encoding=True,
    restore_byte_a0=True,
    replace_lossy_sequences=True,
    decode_inconsistent_utf8=True,
    fix_c1_controls=True,
    fix_latin_ligatures=False,
    fix_character_width=False,
    uncurl_quotes=False,
    fix_line_breaks=False,
    fix_surrogates=False,  # done before ftfy, see repair_surrogates
    remove_control_chars=False,
    normalization=None,
    explain=False,
)
# ftfy fixes text line by line; BADNESS_RE has one `^` anchor, which matches at every line start there.
_FTFY_LINE_START_RE = re.compile("^[ÃÂ] ", re.MULTILINE)
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_SURROGATE_PAIR_RE = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_ANSI_ESCAPE_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
_ASCII_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# every byte _ASCII_CONTROL_RE does not match: deleting them leaves the control characters
_NOT_ASCII_CONTROL = bytes(b for b in range(256) if not _ASCII_CONTROL_RE.match(chr(b)))
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200d\u2060\ufeff]")
# Unicode space separators (Zs other than U+0020) -> ' '; line/paragraph separators -> '\n'.
_UNICODE_SPACE_RE = re.compile("[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]")
_UNICODE_LINE_RE = re.compile("[\u2028\u2029\x85]")
_TRAILING_SPACE_RE = re.compile(r"[ \t]+(?=\n)")
# Every non-ASCII character that surrogate repair, control stripping or Unicode-space mapping acts on.
_SPECIAL_RE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200d\u2060\ufeff\ud800-\udfff"
    "\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000\u2028\u2029]"
)


# ---------------------------------------------------------------- ftfy pre-check
# BADNESS_RE is an alternation of ~40 short sequences; Python's regex engine tries every branch at every
# position (~1.5 MB/s). Each branch has at least one element made only of non-ASCII characters, so every
# match contains a character of the union of one such element per branch (the rarest one). Searching that
# character class is C-speed; BADNESS_RE then runs only on short windows around the hits. A window that
# reaches max-match-width - 1 characters either side holds every match that contains its hit, so the
# result can only err towards calling ftfy (never skipping a needed repair).


def _element_chars(op: object, av: object) -> set[str] | None:
    if op is sre_constants.LITERAL:
        return {chr(av)}  # type: ignore[arg-type]
    if op is not sre_constants.IN:
        return None
    chars: set[str] = set()
    for item_op, item in av:  # type: ignore[attr-defined]
        if item_op is sre_constants.LITERAL:
            chars.add(chr(item))
        elif item_op is sre_constants.RANGE:
            chars.update(map(chr, range(item[0], item[1] + 1)))
        else:  # NEGATE or a category such as \s: not a usable requirement
            return None
    return chars


def _commonness(chars: AbstractSet[str]) -> int:
    """Rough cost of searching for a character set: letters of Latin-1/Greek/Cyrillic are frequent."""
    alphabet = ("\u00c0" <= c <= "\u00ff" or "\u0370" <= c <= "\u04ff" for c in chars)
    return sum(
        (100 if c.islower() else 10) if common else 1 for c, common in zip(chars, alphabet, strict=True)
    )


def _badness_prefilter() -> tuple[re.Pattern[str], int]:
    tree = sre_parser.parse(BADNESS_RE.pattern, BADNESS_RE.flags)
    ((op, av),) = tree.data
    if op is not sre_constants.BRANCH:
        raise RuntimeError("ftfy.badness.BADNESS_RE is no longer one alternation; update needs_ftfy")
    required: set[str] = set()
    for branch in av[1]:
        elements = (_element_chars(o, a) for o, a in branch.data)
        options: list[set[str]] = [c for c in elements if c and min(c) > "\x7f"]
        if not options:
            raise RuntimeError("a BADNESS_RE branch has no non-ASCII element; update needs_ftfy")
        required |= min(options, key=_commonness)
    width = tree.getwidth()[1]
    cls = "[" + "".join(re.escape(c) for c in sorted(required)) + "]"
    return re.compile(f"{cls}(?:.{{0,{2 * width}}}{cls})*", re.DOTALL), width


_BADNESS_HITS_RE, _BADNESS_WIDTH = _badness_prefilter()


def _looks_bad(text: str) -> bool:
    """Same answer as ``BADNESS_RE.search`` on any line of ``text`` or a superset of it (see above)."""
    for hit in _BADNESS_HITS_RE.finditer(text):
        window = text[max(0, hit.start() - _BADNESS_WIDTH + 1) : hit.end() + _BADNESS_WIDTH - 1]
        if BADNESS_RE.search(window) or _FTFY_LINE_START_RE.search(window):
            return True
    return False


# ---------------------------------------------------------------- normalisation


def needs_ftfy(text: str) -> bool:
    """True unless ``ftfy.fix_text(text, FTFY_CONFIG)`` is certain to return ``text`` unchanged.

    With FTFY_CONFIG, fix_text changes a line only if ftfy's badness regex matches it (its encoding step
    returns ASCII and not-bad text untouched; BADNESS_RE matches every C1 control, so its C1 fixer has
    nothing to do either). Documents longer than ftfy's segment limit may be cut at arbitrary points, so
    they always go through ftfy.
    """
    if text.isascii():
        return False
    return len(text) > FTFY_CONFIG.max_decode_length or _looks_bad(text)


def _join_surrogates(match: re.Match[str]) -> str:
    return match.group(0).encode("utf-16-le", "surrogatepass").decode("utf-16-le")


def repair_surrogates(text: str, counts: Counter[str]) -> str:
    """Join surrogate pairs (JSON ``"\\ud83d\\ude00"``) into their character; remove lone surrogates."""
    if text.isascii() or not _SURROGATE_RE.search(text):
        return text
    text = _SURROGATE_PAIR_RE.sub(_join_surrogates, text)
    fixed = _SURROGATE_RE.sub("", text)
    counts["lone_surrogates_removed"] += len(text) - len(fixed)
    return fixed


def strip_controls(text: str, counts: Counter[str]) -> str:
    if "\x1b" in text:
        text = _ANSI_ESCAPE_RE.sub("", text)
    if text.isascii():
        if not text.encode("ascii").translate(None, _NOT_ASCII_CONTROL):  # ~4x faster than the regex
            return text
        pattern = _ASCII_CONTROL_RE
    else:
        if not _CONTROL_RE.search(text):
            return text
        pattern = _CONTROL_RE
    if "\x00" in text:
        counts["nul_removed"] += text.count("\x00")
    return pattern.sub("", text)


def normalize_whitespace(text: str, max_blank_lines: int, unicode_spaces: bool = True) -> str:
    """Step 4; ``unicode_spaces=False`` skips the Unicode space/separator scan (the caller knows there are
    none)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if unicode_spaces and not text.isascii():
        if _UNICODE_LINE_RE.search(text):
            text = _UNICODE_LINE_RE.sub("\n", text)
        if _UNICODE_SPACE_RE.search(text):
            text = _UNICODE_SPACE_RE.sub(" ", text)
    if " \n" in text or "\t\n" in text:
        text = _TRAILING_SPACE_RE.sub("", text)
    run = "\n" * (max_blank_lines + 2)
    if run in text:
        text = re.sub(f"\n{{{max_blank_lines + 2},}}", run[:-1], text)
    return text.lstrip("\n").rstrip()


def normalize_text(text: str, cfg: CleanConfig, counts: Counter[str]) -> str:
    """Steps 0-4 of the module docstring (everything before boilerplate and quality).

    Non-ASCII text is scanned once for every character steps 0, 2 and 4 act on; when there is none (most
    documents), those steps are skipped, unless ftfy or the normalisation changed the text.
    """
    if text.isascii():
        special = False
    else:
        special = _SPECIAL_RE.search(text) is not None
        if special:
            text = repair_surrogates(text, counts)
        if cfg.fix_mojibake and needs_ftfy(text):
            fixed = ftfy.fix_text(text, FTFY_CONFIG)
            if fixed != text:
                counts["mojibake_fixed"] += 1
                text, special = fixed, True
    if cfg.strip_control and (special or text.isascii()):
        text = strip_controls(text, counts)
    if not text.isascii():
        normalized = unicodedata.normalize(cfg.normalization, text)
        if normalized is not text:
            text, special = normalized, True
    if cfg.normalize_whitespace:
        text = normalize_whitespace(text, cfg.max_blank_lines, unicode_spaces=special)
    return text


def normalizer(cfg: CleanConfig) -> Callable[[str, Counter[str]], str]:
    """:func:`normalize_text` with ``cfg``, as ``(text, counts) -> text``: what a build's ingest applies to every
    document, so the boilerplate count and the clean stage read normalised text and do not normalise again."""
    return functools.partial(_normalize_with, cfg)


def _normalize_with(cfg: CleanConfig, text: str, counts: Counter[str]) -> str:
    return normalize_text(text, cfg, counts)


# ---------------------------------------------------------------- boilerplate lines


def line_hash(line: str) -> int:
    """xxhash64 of the stripped line: the key both the boilerplate count and its removal use."""
    return xxhash.xxh64_intdigest(line.strip().encode("utf-8", "surrogatepass"))


_last_keys: tuple[frozenset[int], np.ndarray] | None = None


def sorted_keys(boilerplate: frozenset[int]) -> np.ndarray:
    """The boilerplate set as the sorted uint64 array the compiled removal searches, made once per set object.
    Cached by identity, not equality: every part loads its own (equal) set, and comparing two sets of
    thousands of hashes on every document cost more than the removal itself (an lru_cache did that)."""
    global _last_keys
    last = _last_keys
    if last is not None and last[0] is boilerplate:
        return last[1]
    keys = np.array(sorted(boilerplate), dtype=np.uint64)
    _last_keys = (boilerplate, keys)
    return keys


def remember_sorted_keys(boilerplate: frozenset[int], keys: np.ndarray) -> None:
    """Give :func:`sorted_keys` the array of ``boilerplate`` a loader already has (sorted, distinct): the set
    grows with the corpus (tens of thousands of lines at 4 GB), and sorting it again for every part cost more
    than its removal."""
    global _last_keys
    _last_keys = (boilerplate, np.ascontiguousarray(keys, dtype=np.uint64))


def remove_boilerplate(text: str, boilerplate: frozenset[int], min_line_chars: int) -> tuple[str, int]:
    """Drop the lines of ``text`` whose hash is in ``boilerplate``; returns (text, lines removed). Compiled
    where built (``lines_kernel.remove_lines``, the same lines out: tested); a text with a lone surrogate, or
    no kernel, takes the Python lines below."""
    if lines_kernel is not None and boilerplate:
        done = lines_kernel.remove_lines(text, sorted_keys(boilerplate), min_line_chars)
        if done is not None:
            return done
    lines = text.split("\n")
    kept = [line for line in lines if len(line) < min_line_chars or line_hash(line) not in boilerplate]
    removed = len(lines) - len(kept)
    return ("\n".join(kept) if removed else text), removed
