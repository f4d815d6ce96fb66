"""Raw bytes -> ``str``: BOMs, a strict UTF-8 fast path, then charset detection (charset-normalizer).

Most corpus files are UTF-8, so strict UTF-8 is tried first and detection (slow: it scores every candidate
codec) runs only on bytes that fail it. Detection is never trusted blindly: a guess whose "mess" ratio is above
``1 - min_confidence`` is refused and the caller quarantines the bytes as ``undecodable``.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

import charset_normalizer

# Longest BOM first: the UTF-32-LE BOM starts with the UTF-16-LE one.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# Codecs whose newline is the single byte 0x0A and never occurs inside a multi-byte character, so a file in
# them can be split into lines (and byte ranges) without decoding. UTF-16/32 are the exceptions.
_NOT_LINE_SAFE = ("utf-16", "utf-32", "utf_16", "utf_32")
# The codecs most text on the web is in (WHATWG/W3Techs usage), most common first. charset-normalizer often
# scores several single-byte codecs almost equally on short text (French CP1252 can come out as CP1257); among
# guesses within PREFER_MARGIN of the best mess ratio, the most common codec wins.
COMMON_CODECS = (
    "utf_8",
    "cp1252",
    "latin_1",
    "gb18030",
    "gbk",
    "cp932",
    "shift_jis",
    "euc_kr",
    "cp1251",
    "euc_jp",
    "big5",
    "cp1250",
    "iso8859_2",
    "koi8_r",
    "cp1256",
    "cp1253",
    "cp1254",
    "cp874",
)
PREFER_MARGIN = 0.05


# A decode error handler for streams decoded as text (UTF-16/32 files): it marks each bad sequence with a
# Unicode noncharacter (reserved for internal use, never in interchanged text) and goes on, so one bad
# sequence costs its paragraph, not the rest of the file.
MARK_ERRORS = "pileworks.mark"
UNDECODABLE_MARK = "\ufdd0"


def _mark_undecodable(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return UNDECODABLE_MARK, error.end


codecs.register_error(MARK_ERRORS, _mark_undecodable)


class UndecodableError(ValueError):
    """The bytes are not valid in any codec with enough confidence; the message says what was tried."""

    code = "undecodable"  # the quarantine reason


@dataclass(frozen=True, slots=True)
class Decoded:
    text: str
    encoding: str  # canonical Python codec name, e.g. "utf-8", "gb18030", "shift_jis", "cp1252"
    confidence: float  # 1.0 for BOM/strict UTF-8, else 1 - charset-normalizer's mess ratio


def bom_encoding(head: bytes) -> str | None:
    """The codec named by a byte-order mark at the start of ``head``, or None."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    return None


def is_line_safe(encoding: str) -> bool:
    """True when the byte 0x0A is always a newline in this codec (so byte-level line splitting is correct)."""
    return (
        not encoding.lower().replace("-", "_").startswith(tuple(n.replace("-", "_") for n in _NOT_LINE_SAFE))
    )


def _canonical(name: str) -> str:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return name


def decode_bytes(data: bytes, *, min_confidence: float = 0.8, hint: str | None = None) -> Decoded:
    """Decode ``data`` (a whole document): BOM, then strict UTF-8, then ``hint``, then detection.

    ``hint`` is the codec already detected for other chunks of the same file; trying it strictly before
    detecting again keeps one file in one codec and is much faster than re-detecting every line.
    """
    bom = bom_encoding(data)
    if bom is not None:
        try:
            return Decoded(data.decode(bom), _canonical(bom.removesuffix("-sig")), 1.0)
        except UnicodeDecodeError as e:
            raise UndecodableError(
                f"byte-order mark says {bom} but the bytes are invalid: {e.reason}"
            ) from None
    try:
        return Decoded(data.decode("utf-8"), "utf-8", 1.0)
    except UnicodeDecodeError:
        pass
    if hint is not None:
        try:
            return Decoded(data.decode(hint), hint, min_confidence)
        except UnicodeDecodeError:
            pass
    return detect(data, min_confidence=min_confidence)


def detect(data: bytes, *, min_confidence: float = 0.8) -> Decoded:
    """charset-normalizer's best guess, refused below ``min_confidence``."""
    if not 0.0 <= min_confidence <= 1.0:
        raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
    results = charset_normalizer.from_bytes(data, threshold=max(1.0 - min_confidence, 0.01))
    if not len(results):
        raise UndecodableError(
            f"no codec decodes these {len(data)} bytes with confidence >= {min_confidence}"
        )
    best = _prefer_common(list(results))
    confidence = 1.0 - float(best.chaos)
    if confidence < min_confidence:
        raise UndecodableError(
            f"best guess {best.encoding} has confidence {confidence:.2f} < {min_confidence}"
        )
    encoding = _canonical(best.encoding)
    if encoding == "cp932" and _decodes(data, "shift_jis"):
        # Standard Shift_JIS (and WHATWG) maps 0x8160 to U+301C WAVE DASH, CP932 to U+FF5E; prefer the
        # standard mapping whenever the bytes hold no CP932-only (NEC/IBM) characters.
        encoding = "shift_jis"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as e:  # charset-normalizer can pick a codec from a sample of the bytes
        raise UndecodableError(f"detected {encoding} but the bytes are invalid in it: {e.reason}") from None
    return Decoded(text, encoding, confidence)


def _decodes(data: bytes, encoding: str) -> bool:
    try:
        data.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


def _prefer_common(matches: list) -> charset_normalizer.CharsetMatch:
    """The most common codec among the guesses nearly as clean as the best one (see COMMON_CODECS)."""
    best = min(matches, key=lambda m: m.chaos)
    close = [m for m in matches if m.chaos <= best.chaos + PREFER_MARGIN and m.encoding in COMMON_CODECS]
    if not close:
        return best
    return min(close, key=lambda m: (COMMON_CODECS.index(m.encoding), m.chaos))


_BAD_BYTE = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of a byte that is not UTF-8
_NON_ASCII = re.compile("[^\x00-\x7f]")
# UTF-8 with a few stray bytes vs. a legacy codec: in text that really is UTF-8 the valid multi-byte
# characters far outweigh the bad bytes; legacy single-byte text almost never forms a valid sequence and
# double-byte text (GB18030, Shift_JIS) does only by accident, for about a quarter of its bytes at most.
UTF8_MIN_VALID_PER_BAD = 4
# In a file known to be UTF-8, a chunk is repaired if at most this share of its bytes is invalid.
UTF8_MAX_BAD_SHARE = 0.1


class InvalidUtf8Error(UndecodableError):
    """UTF-8 with invalid bytes, and the caller asked to quarantine such chunks instead of repairing them."""

    code = "invalid_utf8"


def utf8_counts(data: bytes) -> tuple[int, int]:
    """(bytes in valid multi-byte UTF-8 characters, invalid bytes) of ``data``."""
    text = data.decode("utf-8", "surrogateescape")
    bad = len(_BAD_BYTE.findall(text))
    non_ascii_chars = len(_NON_ASCII.findall(text))
    ascii_bytes = len(text) - non_ascii_chars
    return len(data) - ascii_bytes - bad, bad


def looks_utf8(data: bytes) -> bool:
    """True when ``data`` holds non-ASCII UTF-8 and its invalid bytes (if any) are few (a file-head sniff).

    The last three bytes are ignored: a sniffed head may end inside a character.
    """
    valid, bad = utf8_counts(data[:-3] if len(data) > 3 else data)
    return valid > 0 and valid >= UTF8_MIN_VALID_PER_BAD * bad


def repair_utf8(data: bytes, *, file_is_utf8: bool = False) -> tuple[str, int] | None:
    """(text, invalid byte count) when ``data`` is UTF-8 with some invalid bytes, else None (not UTF-8).

    Each invalid byte becomes U+FFFD and every valid character around it is kept exactly (decoding the whole
    chunk in a legacy codec would garble them: "naïve" -> "naГЇve"). The chunk counts as UTF-8 when its
    valid multi-byte characters outweigh its bad bytes (UTF8_MIN_VALID_PER_BAD), or when ``file_is_utf8``
    and at most UTF8_MAX_BAD_SHARE of its bytes are bad.
    """
    valid, bad = utf8_counts(data)
    if bad == 0:
        return data.decode("utf-8"), 0
    if (valid > 0 and valid >= UTF8_MIN_VALID_PER_BAD * bad) or (
        file_is_utf8 and bad <= UTF8_MAX_BAD_SHARE * len(data)
    ):
        return data.decode("utf-8", "replace"), bad
    return None


class FileDecoder:
    """Decodes the chunks (lines, paragraphs) of one file, remembering the codec detected for earlier ones."""

    def __init__(self, *, min_confidence: float = 0.8):
        self.min_confidence = min_confidence
        self.fallback: str | None = None

    def decode(self, data: bytes) -> Decoded:
        decoded = decode_bytes(data, min_confidence=self.min_confidence, hint=self.fallback)
        if decoded.encoding != "utf-8":
            self.fallback = decoded.encoding
        return decoded
