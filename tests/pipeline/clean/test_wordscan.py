"""The word-scan marks: one record (``wordscan.Mark``) that the C enum of ``pipeline/clean/_wordscan.c`` spells
in the same names and order (the kernel fills each document's row by the C names, quality reads it by the
Python ones)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.clean import wordscan

KERNEL_SOURCE = Path(wordscan.__file__).with_name("_wordscan.c")


def c_marks(source: str) -> list[str]:
    """The names of the C enum that ends in ``MARKS`` (its count), without their ``MARK_`` prefix, in order;
    ValueError when it is missing or gives a name a value of its own (then order would not be the index)."""
    found = re.search(r"enum\s*\{([^}]*)\bMARKS\s*\}", source)
    if found is None:
        raise ValueError("no `enum { MARK_..., MARKS }` in the kernel source")
    names = [n.strip() for n in found.group(1).split(",") if n.strip()]
    if not all(re.fullmatch(r"MARK_[A-Z_]+", n) for n in names):
        raise ValueError(f"the marks enum holds more than plain MARK_ names: {names}")
    return [n.removeprefix("MARK_") for n in names]


def test_the_c_enum_of_marks_is_the_python_record():
    source = KERNEL_SOURCE.read_text()
    assert c_marks(source) == [mark.name for mark in wordscan.Mark]
    assert [mark.value for mark in wordscan.Mark] == list(range(len(wordscan.Mark)))
    assert len(wordscan.Mark) == wordscan.MARKS


def test_the_marks_check_fails_on_a_planted_change():
    """The check above is not vacuous: a swap, a new C mark or a value set by hand is seen."""
    source = KERNEL_SOURCE.read_text()
    python = [mark.name for mark in wordscan.Mark]
    assert "MARK_HASH, MARK_DOTS" in source
    assert c_marks(source.replace("MARK_HASH, MARK_DOTS", "MARK_DOTS, MARK_HASH")) != python
    assert c_marks(source.replace("MARK_HASH,", "MARK_HASH, MARK_TILDE,")) != python
    with pytest.raises(ValueError, match="plain"):
        c_marks(source.replace("MARK_HASH,", "MARK_HASH = 1,"))
    with pytest.raises(ValueError, match="no `enum"):
        c_marks(source.replace("MARKS }", "MARK_COUNT }"))


def test_the_non_ascii_spaces_are_every_code_point_python_calls_a_space() -> None:
    """The table is written out (computing it cost every importing process 90 ms): it must stay what
    ``str.isspace`` says over the whole code space, for this Python's Unicode version."""
    spaces = [c for c in range(0x80, 0x110000) if chr(c).isspace()]
    assert wordscan._NON_ASCII_SPACES.tolist() == spaces
