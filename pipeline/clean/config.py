"""The clean stage's configs: text normalisation, boilerplate lines, the quality rules (``quality.py``),
language identification (``pipeline.langid``) and PII redaction (``pii.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.langid import LangIdConfig

NORMALIZATIONS = ("NFC", "NFKC")
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


@dataclass(frozen=True, kw_only=True)
class BoilerplateConfig:
    """A line is boilerplate when at least ``max(min_docs, ceil(min_fraction * docs))`` documents contain it
    (after stripping) and it has at least ``min_line_chars`` characters (short lines such as "Contents" or
    "Thanks!" repeat legitimately)."""

    enabled: bool = True
    min_docs: int = 10
    min_fraction: float = 0.0
    min_line_chars: int = 20

    def __post_init__(self) -> None:
        if self.min_docs < 2:
            raise ValueError(
                f"BoilerplateConfig.min_docs must be >= 2 (a line in one doc is unique), got {self.min_docs}"
            )
        if not 0.0 <= self.min_fraction <= 1.0:
            raise ValueError(f"BoilerplateConfig.min_fraction must be in [0, 1], got {self.min_fraction}")
        if self.min_line_chars < 1:
            raise ValueError(f"BoilerplateConfig.min_line_chars must be >= 1, got {self.min_line_chars}")


@dataclass(frozen=True, kw_only=True)
class PiiConfig:
    """Redaction of email addresses and publicly routable IP addresses (``pii.py``).

    ``enabled``: ``"auto"`` redacts the documents of web inputs (a source URI ending in ``.warc``,
    ``.warc.gz``, ``.wet``, ``.wet.gz``, ``.html`` or ``.htm``) and leaves the others alone: code, documentation
    and changelogs carry maintainers' addresses on purpose (they are attribution, not leaked PII) and version
    strings that look like IPs. ``True``/``False`` redact every document / none. A placeholder may be ``""``
    (the address is deleted)."""

    enabled: bool | Literal["auto"] = "auto"
    emails: bool = True
    ips: bool = True
    email_placeholder: str = "email@example.com"
    ip_placeholder: str = "192.0.2.1"
    ipv6_placeholder: str = "2001:db8::1"

    def __post_init__(self) -> None:
        if not (isinstance(self.enabled, bool) or self.enabled == "auto"):
            raise ValueError(f"PiiConfig.enabled must be true, false or 'auto', got {self.enabled!r}")
        for name in ("emails", "ips"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"PiiConfig.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("email_placeholder", "ip_placeholder", "ipv6_placeholder"):
            value = getattr(self, name)
            if not isinstance(value, str) or "\n" in value:
                raise ValueError(f"PiiConfig.{name} must be a one-line string, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class CleanConfig:
    normalization: Literal["NFC", "NFKC"] = "NFC"
    fix_mojibake: bool = True
    strip_control: bool = True
    normalize_whitespace: bool = True
    max_blank_lines: int = 2
    boilerplate: BoilerplateConfig = field(default_factory=BoilerplateConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    langid: LangIdConfig = field(default_factory=LangIdConfig)
    pii: PiiConfig = field(default_factory=PiiConfig)

    def __post_init__(self) -> None:
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"CleanConfig.normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}"
            )
        if self.max_blank_lines < 0:
            raise ValueError(f"CleanConfig.max_blank_lines must be >= 0, got {self.max_blank_lines}")
        if not isinstance(self.boilerplate, BoilerplateConfig):
            raise ValueError("CleanConfig.boilerplate must be a BoilerplateConfig")
        if not isinstance(self.quality, QualityConfig):
            raise ValueError("CleanConfig.quality must be a QualityConfig")
        if not isinstance(self.pii, PiiConfig):
            raise ValueError("CleanConfig.pii must be a PiiConfig")
