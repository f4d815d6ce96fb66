"""UTF-8 with a few invalid bytes: every valid character kept, only the bad bytes replaced (or the line
quarantined by option); whole files in a legacy codec are still detected, never "repaired"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from pipeline.ingest.config import IngestConfig
from pipeline.ingest.encoding import looks_utf8, repair_utf8
from tests.pipeline.ingest.test_encoding import CHINESE, FRENCH, JAPANESE, RUSSIAN
from tests.pipeline.ingest.test_ingest import ingest_all

# Each line: valid UTF-8 text on both sides of a few stray bytes (a cp1252 byte, a lone continuation byte,
# a truncated 3-byte sequence, bytes never valid in UTF-8).
LATIN = ("naïve café, déjà vu: par", b"\xff\xfe\xc3", " la crème brûlée")
CYRILLIC = ("Привет, мир! Это строка", b"\xe9", " с одним плохим байтом — ёж")
CJK = ("中文的句子", b"\xe4\xb8", "然后继续。日本語のテキスト", b"\x80\xc0", "も続きます")
SHORT_ASCII = ("ok ", b"\x92", " bye")  # no non-ASCII of its own: repaired because the file is UTF-8


def _line(parts: tuple) -> tuple[bytes, str]:
    """(raw JSONL line, the text expected after repair: U+FFFD for each maximal invalid subsequence, as the
    Unicode standard recommends: a truncated 3-byte sequence is one, two unrelated bad bytes are two)."""
    raw = b"".join(p if isinstance(p, bytes) else p.encode() for p in parts)
    expected = "".join(p.decode("utf-8", "replace") if isinstance(p, bytes) else p for p in parts)
    assert all(set(p.decode("utf-8", "replace")) == {"\ufffd"} for p in parts if isinstance(p, bytes))
    return b'{"text": "' + raw + b'"}\n', expected


def _file(lines: list[tuple]) -> tuple[bytes, list[str]]:
    raws, texts = zip(*(_line(p) for p in lines), strict=True)
    return b"".join(raws), list(texts)


@pytest.mark.parametrize("parts", [LATIN, CYRILLIC, CJK])
def test_repair_keeps_every_valid_character(parts: tuple) -> None:
    raw, expected = _line(parts)
    text, bad = repair_utf8(raw) or ("", 0)
    assert json.loads(text)["text"] == expected
    assert bad == sum(len(p) for p in parts if isinstance(p, bytes))


@pytest.mark.parametrize(
    ("text", "codec"),
    [
        (FRENCH, "cp1252"),
        (RUSSIAN, "cp1251"),
        (CHINESE, "gb18030"),
        (JAPANESE, "shift_jis"),
        (JAPANESE, "euc_jp"),
    ],
)
def test_legacy_codecs_are_not_mistaken_for_broken_utf8(text: str, codec: str) -> None:
    data = text.encode(codec)
    assert repair_utf8(data) is None
    assert not looks_utf8(data)


@pytest.mark.parametrize("compressed", [False, True])
def test_jsonl_lines_with_invalid_bytes_are_repaired(tmp_path: Path, compressed: bool) -> None:
    clean = (json.dumps({"text": FRENCH}, ensure_ascii=False) + "\n").encode()
    bad, expected = _file([LATIN, CYRILLIC, CJK, SHORT_ASCII])
    data = bad + clean  # the broken lines first: the file's head says it is UTF-8
    name = "mixed.jsonl.zst" if compressed else "mixed.jsonl"
    (tmp_path / name).write_bytes(zstandard.compress(data) if compressed else data)
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert quarantined == []
    assert [r.text for r in records] == [*expected, FRENCH]
    assert {r.meta_dict()["encoding"] for r in records} == {"utf-8"}
    assert stats.extra["repaired_invalid_utf8"] == 4
    assert stats.extra["invalid_utf8_bytes"] == 3 + 1 + 4 + 1
    assert not any(k.startswith("encoding.") and k != "encoding.utf-8" for k in stats.extra)


def test_invalid_utf8_lines_can_be_quarantined_instead(tmp_path: Path) -> None:
    data, _ = _file([LATIN, ("all good ünïcode",), CJK])
    (tmp_path / "mixed.jsonl").write_bytes(data)
    records, quarantined, stats = ingest_all([str(tmp_path)], IngestConfig(invalid_utf8="quarantine"))
    assert [r.text for r in records] == ["all good ünïcode"]
    assert [q.reason for q in quarantined] == ["invalid_utf8", "invalid_utf8"]
    assert stats.dropped["invalid_utf8"] == 2 and "repaired_invalid_utf8" not in stats.extra


def test_txt_paragraphs_are_repaired_too(tmp_path: Path) -> None:
    raw = "Привет мир, первый абзац.\n\n".encode() + b"second \xff paragraph, ok\n"
    (tmp_path / "a.txt").write_bytes(raw)
    records, quarantined, stats = ingest_all([str(tmp_path)], IngestConfig(txt_mode="paragraph"))
    assert quarantined == []
    assert [r.text for r in records] == ["Привет мир, первый абзац.", "second \ufffd paragraph, ok"]
    assert stats.extra["repaired_invalid_utf8"] == 1


def test_a_legacy_jsonl_file_is_still_detected_not_repaired(tmp_path: Path) -> None:
    lines = [json.dumps({"text": RUSSIAN + str(i)}, ensure_ascii=False) for i in range(3)]
    (tmp_path / "cp1251.jsonl").write_bytes("\n".join(lines).encode("cp1251") + b"\n")
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert quarantined == [] and [r.text for r in records] == [RUSSIAN + str(i) for i in range(3)]
    assert "repaired_invalid_utf8" not in stats.extra


def test_invalid_utf8_option_is_validated() -> None:
    with pytest.raises(ValueError, match="invalid_utf8"):
        IngestConfig(invalid_utf8="drop")
