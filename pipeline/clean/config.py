"""The clean stage's configs: text normalisation, boilerplate lines, the quality rules (``quality.py``) and
language identification (``pipeline.langid``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.clean.quality import QualityConfig
from pipeline.langid import LangIdConfig

NORMALIZATIONS = ("NFC", "NFKC")


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
class CleanConfig:
    normalization: Literal["NFC", "NFKC"] = "NFC"
    fix_mojibake: bool = True
    strip_control: bool = True
    normalize_whitespace: bool = True
    max_blank_lines: int = 2
    boilerplate: BoilerplateConfig = field(default_factory=BoilerplateConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    langid: LangIdConfig = field(default_factory=LangIdConfig)

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
