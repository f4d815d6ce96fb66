"""The clean stage: repairs with known answers, the fast path proven equal to running every repair on every
document (sample corpus + synthetic mixed text), drop accounting, and the part runner."""

from __future__ import annotations

import glob
import json
import random
import unicodedata
from collections import Counter

import ftfy
import pytest
import zstandard
from ftfy.badness import BADNESS_RE

from pipeline.clean import normalize as clean
from pipeline.clean.config import BoilerplateConfig, CleanConfig, QualityConfig
from pipeline.clean.normalize import FTFY_CONFIG, needs_ftfy, normalize_text
from pipeline.clean.stage import clean_batch, run_clean_part
from pipeline.records import Record, read_part, write_part
from pipeline.sample_corpus import sample_corpus_path
from pipeline.storage import FileStore
from pipeline.units.protocol import StageStats, part_done, read_part_stats

NO_QUALITY = CleanConfig(quality=QualityConfig(enabled=False))
WORD_TEXT = (
    "the of and to in is was that for on with as by at from his her which an have are were this be had "
    "not river garden morning village teacher window market winter summer letter evening station "
    "mountain forest carefully slowly quietly walked opened painted carried noticed remembered gathered "
    "travelled explained bright narrow ancient gentle heavy yellow silent distant crowded familiar"
)
WORDS = WORD_TEXT.split()


def prose(seed: int, n_words: int = 120) -> str:
    """Varied English-like sentences (passes every quality rule)."""
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    sentences = [" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, n_words, 12)]
    return " ".join(sentences)


def norm(text: str, cfg: CleanConfig = NO_QUALITY) -> tuple[str, Counter[str]]:
    counts: Counter[str] = Counter()
    return normalize_text(text, cfg, counts), counts


def sample_texts() -> list[str]:
    texts = []
    for path in sorted(glob.glob(str(sample_corpus_path() / "*.jsonl.zst"))):
        with open(path, "rb") as f:
            data = zstandard.ZstdDecompressor().stream_reader(f).read()
        texts += [json.loads(line)["text"] for line in data.splitlines() if line.strip()]
    for path in sorted(glob.glob(str(sample_corpus_path() / "licenses" / "*.txt"))):
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    return texts


# ---------------------------------------------------------------- repairs with known answers


def test_control_zero_width_nul_and_ansi_are_removed():
    text, counts = norm("a\x00b\x01c\x7fd\u200be\u200cf\u200dg\u2060h\ufeffi\tj\x1b[1;31mred\x1b[0m k")
    assert text == "abcdefghi\tjred k"
    assert counts["nul_removed"] == 1


def test_ascii_controls_only():
    text, counts = norm("x\x00\x00y\x08z")
    assert text == "xyz"
    assert counts["nul_removed"] == 2


def test_surrogates_pairs_joined_and_lone_removed():
    text, counts = norm("smile \ud83d\ude00 lone \ud800 end \udfff")
    assert text == "smile 😀 lone  end"
    assert counts["lone_surrogates_removed"] == 2
    text.encode("utf-8")  # valid UTF-8 now


def test_c1_controls_are_read_as_windows_1252_by_ftfy():
    # U+0093/U+0094 are CP1252 curly quotes decoded as Latin-1
    assert norm("he said \x93hi\x94 there")[0] == "he said “hi” there"
    assert (
        norm("he said \x93hi\x94", CleanConfig(fix_mojibake=False, quality=QualityConfig(enabled=False)))[0]
        == "he said hi"
    )


def test_whitespace_normalisation():
    raw = "\n\n  first  \r\nsecond\t\rthird\u00a0x\u3000y\u2028z\n\n\n\n\n\nlast   \n\n"
    assert norm(raw)[0] == "  first\nsecond\nthird x y\nz\n\n\nlast"
    one_blank = CleanConfig(max_blank_lines=1, quality=QualityConfig(enabled=False))
    assert norm("a\n\n\n\nb\n\nc", one_blank)[0] == "a\n\nb\n\nc"


def test_nfc_default_and_nfkc_option():
    decomposed = "cafe\u0301 ﬁne ｆｕｌｌ ①"
    assert norm(decomposed)[0] == "café ﬁne ｆｕｌｌ ①"
    nfkc = CleanConfig(normalization="NFKC", quality=QualityConfig(enabled=False))
    assert norm(decomposed, nfkc)[0] == "café fine full 1"


def test_mojibake_repaired_and_counted():
    text, counts = norm("SchÃ¶n, dass Sie da sind. CafÃ© au lait.")
    assert text == "Schön, dass Sie da sind. Café au lait."
    assert counts["mojibake_fixed"] == 1
    off = CleanConfig(fix_mojibake=False, quality=QualityConfig(enabled=False))
    assert norm("SchÃ¶n", off)[0] == "SchÃ¶n"


def test_html_entities_and_quotes_are_left_alone():
    # ftfy's unescape_html and uncurl_quotes are off: both change legitimate text
    assert norm("a &amp; b < c — “quoted”")[0] == "a &amp; b < c — “quoted”"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"normalization": "NFD"}, "normalization"),
        ({"max_blank_lines": -1}, "max_blank_lines"),
        ({"boilerplate": "x"}, "boilerplate"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CleanConfig(**kwargs)


def test_boilerplate_config_validation():
    with pytest.raises(ValueError, match="min_docs"):
        BoilerplateConfig(min_docs=1)
    with pytest.raises(ValueError, match="min_fraction"):
        BoilerplateConfig(min_fraction=1.5)


# ---------------------------------------------------------------- fast path == slow path


def slow_normalize(text: str, cfg: CleanConfig) -> str:
    """Every repair on every document, no shortcuts: the reference the fast path must equal."""
    counts: Counter[str] = Counter()
    text = clean.repair_surrogates(text, counts)
    if cfg.fix_mojibake:
        text = ftfy.fix_text(text, FTFY_CONFIG)
    text = clean._ANSI_ESCAPE_RE.sub("", text)
    text = clean._CONTROL_RE.sub("", text)
    text = unicodedata.normalize(cfg.normalization, text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = clean._UNICODE_LINE_RE.sub("\n", clean._UNICODE_SPACE_RE.sub(" ", text))
    text = clean._TRAILING_SPACE_RE.sub("", text)
    run = "\n" * (cfg.max_blank_lines + 2)
    while run in text:
        text = text.replace(run, run[:-1])
    return text.lstrip("\n").rstrip()


MOJIBAKE = ["SchÃ¶n", "cafÃ©", "â€œquotedâ€\x9d", "Ã\xa0 la", "Ã  la", "ã\x83\x84", "Ð¿Ñ€Ð¸Ð²ÐµÑ‚", "вЂ™s"]
PIECES = [
    "The quick brown fox jumps over the lazy dog.",
    "Größe und Übermaß; naïve café.",
    "今日は良い天気です。中文字符测试。",
    "Привет, мир! Добрый день.",
    "x\x00y",
    "\r\n",
    "  \n",
    "\n\n\n\n\n",
    "\u200b\ufeff",
    "\x1b[32mok\x1b[0m",
    "\x93q\x94",
    "a\u00a0b\u3000c",
    "— “quote” ‘single’ • bullet … ½ ° € ™",
    "cafe\u0301",
    "\ud83d\ude00",
    "Â ",
    "\n",
    " ",
]


def synthetic_mixed(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = PIECES + MOJIBAKE
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(n)]


@pytest.mark.parametrize("normalization", ["NFC", "NFKC"])
def test_fast_path_equals_slow_path_on_synthetic_mixed_text(normalization):
    cfg = CleanConfig(normalization=normalization, quality=QualityConfig(enabled=False))
    texts = synthetic_mixed(1500, seed=7) + MOJIBAKE + PIECES
    mismatches = [t for t in texts if norm(t, cfg)[0] != slow_normalize(t, cfg)]
    assert mismatches == []
    # the shortcuts were really taken on some of them, and mojibake was really repaired
    assert sum(not needs_ftfy(t) for t in texts) > 100
    assert sum(norm(t, cfg)[1]["mojibake_fixed"] for t in texts) > 100


def test_fast_path_equals_slow_path_on_sample_corpus():
    texts = sample_texts()
    assert len(texts) > 200
    cfg = NO_QUALITY
    assert [norm(t, cfg)[0] for t in texts] == [slow_normalize(t, cfg) for t in texts]


def test_ftfy_precheck_never_misses_a_badness_match():
    """needs_ftfy replaces BADNESS_RE.search with a character-class scan + windows; it may only err
    towards True. Fuzz with strings built from every character BADNESS_RE mentions."""
    rng = random.Random(3)
    chars = sorted({c for c in BADNESS_RE.pattern if ord(c) > 127}) + list("aZ .,!?\n\t°")
    checked = 0
    for _ in range(10000):
        text = "".join(rng.choice(chars) for _ in range(rng.randint(1, 12)))
        if BADNESS_RE.search(text):
            checked += 1
            assert needs_ftfy(text), text
    assert checked > 500
    for text in synthetic_mixed(500, seed=11):
        if not needs_ftfy(text):
            assert ftfy.fix_text(text, FTFY_CONFIG) == text


def test_ascii_is_a_fixed_point_of_ftfy_with_our_config():
    text = "a &amp; b &lt; c\r\n\tx\x00\x1b[31m y  \n"
    assert not needs_ftfy(text)
    assert ftfy.fix_text(text, FTFY_CONFIG) == text


# ---------------------------------------------------------------- batch and runner


def test_clean_batch_counts_drops_and_repairs():
    good = prose(1)
    records = [
        Record("a", "SchÃ¶n " + good, "src"),
        Record("b", " \x00\u200b \r\n ", "src"),
        Record("c", "short", "src"),
        Record("d", good + "\x00", "src", '{"k": 1}'),
    ]
    out, stats = clean_batch(records, CleanConfig())
    assert [r.id for r in out] == ["a", "d"]
    assert out[0].text == "Schön " + good
    assert out[1].meta_dict() == {
        "k": 1,
        "language": "en",
        "language_score": out[1].meta_dict()["language_score"],
    }
    assert "\x00" not in out[1].text
    assert stats.docs_in == 4 and stats.docs_out == 2
    assert stats.dropped == Counter({"empty_after_clean": 1, "too_short_chars": 1})
    assert stats.extra["mojibake_fixed"] == 1
    assert stats.extra["nul_removed"] == 2
    assert stats.extra["chars_removed"] > 0
    assert stats.bytes_out == sum(len(r.text.encode()) for r in out)


def test_run_clean_part_writes_and_reruns_skip(tmp_path):
    store = FileStore(tmp_path)
    recs = [Record(f"id{i}", prose(i), "src") for i in range(5)]
    recs.append(Record("bad", "tiny", "src"))
    write_part(store, "ingest", 0, recs, StageStats(stage="ingest"))
    stats = run_clean_part(store, "ingest", "clean", 0, CleanConfig())
    assert part_done(store, "clean", 0)
    assert [r.id for r in read_part(store, "clean", 0)] == [f"id{i}" for i in range(5)]
    assert stats.dropped == Counter({"too_short_chars": 1})
    assert read_part_stats(store, "clean", 0).to_json() == stats.to_json()
    store.delete("ingest/part-00000.parquet")  # a rerun must not read its input again
    again = run_clean_part(store, "ingest", "clean", 0, CleanConfig())
    assert again.to_json() == stats.to_json()


def test_missing_kernels_names_what_the_install_lacks(monkeypatch):
    """The build warns when a compiled kernel is missing; under CI (a C compiler present) none is."""
    import os

    from pipeline.clean import stage, wordscan

    if os.environ.get("CI"):
        assert stage.missing_kernels() == []
    monkeypatch.setattr(wordscan, "scan_kernel", None)
    assert "pipeline.clean._wordscan" in stage.missing_kernels()
