"""Quality rules: every rule drops exactly the document planted for it (with the reason), normal English,
German, Chinese and Japanese paragraphs pass, and the sample corpus' CJK documents are kept."""

from __future__ import annotations

import glob
import json
import random
import string
from collections import Counter

import numpy as np
import pytest
import zstandard

from pipeline.clean import quality, wordscan
from pipeline.clean.config import CleanConfig, QualityConfig
from pipeline.clean.quality import check_quality, check_quality_batch, count_words
from pipeline.clean.stage import clean_batch
from pipeline.records import Record
from pipeline.sample_corpus import sample_corpus_path
from tests.kernels import needs_wordscan, require
from tests.pipeline.clean.quality_oracle import (
    alpha_word_fraction,
    fast_words,
    ngram_reason,
    reference_reason,
    reference_stop_word_reason,
    words_of,
)

WORD_TEXT = (
    "the of and to in is was that for on with as by at from his her which an have are were this be had "
    "not river garden morning village teacher window market winter summer letter evening station "
    "mountain forest carefully slowly quietly walked opened painted carried noticed remembered gathered "
    "travelled explained bright narrow ancient gentle heavy yellow silent distant crowded familiar"
)
WORDS = WORD_TEXT.split()
GERMAN = (
    "Der Fluss fließt langsam durch das kleine Dorf, in dem meine Großmutter seit über sechzig Jahren lebt. "
    "Jeden Morgen geht sie zum Markt, kauft frisches Brot und Gemüse und spricht mit den Nachbarn über das "
    "Wetter, die Ernte und die Neuigkeiten aus der Stadt. Im Sommer sitzen die Kinder am Ufer, werfen Steine "
    "ins Wasser und zählen die Wellen, bis die Sonne hinter den Hügeln verschwindet. Im Winter wird es still, "
    "und nur der Rauch aus den Schornsteinen verrät, dass hier Menschen wohnen."
)
CHINESE = (
    "河水缓缓流过小村庄，我的祖母在这里已经生活了六十多年。每天早上她都去市场买新鲜的面包和蔬菜，"
    "和邻居们聊天气、收成和城里的新闻。夏天孩子们坐在河边，往水里扔石头，数着波纹，直到太阳落到山后。"
    "冬天村子变得很安静，只有烟囱里冒出的炊烟告诉人们这里有人居住。"
)
JAPANESE = (
    "川は小さな村の中をゆっくりと流れていて、私の祖母はそこに六十年以上住んでいます。毎朝、祖母は市場へ"
    "行き、新しいパンと野菜を買って、近所の人たちと天気や収穫や町の出来事について話します。夏になると"
    "子どもたちは川岸に座り、水に石を投げて波の数を数えます。"
)
# small length caps so the planted "too long" documents stay small
CFG = QualityConfig(max_chars=20_000, max_words=2_000)


def prose(seed: int, n_words: int = 120, per_line: int = 0) -> str:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    sentences = [" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, n_words, 12)]
    return ("\n" if per_line else " ").join(sentences)


def unique_words(n: int, seed: int, length: int = 8) -> list[str]:
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        out["".join(rng.choice(string.ascii_lowercase) for _ in range(length))] = None
    return list(out)


def lines_of(seed: int, n: int, words_per_line: int = 12, end: str = ".") -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words_per_line)).capitalize() + end for _ in range(n)]


def planted_top_ngram(n: int) -> str:
    """A repeated n-gram of 4-letter-ish words: over the n-gram threshold, under the (n-1)-gram one."""
    gram = {2: ["aaaaaa", "bbbbbb"], 3: ["aaaa", "bbbb", "cccc"], 4: ["aaa", "bbb", "ccc", "ddd"]}[n]
    fillers = {2: 1, 3: 5, 4: 6}[n]
    filler = iter(unique_words(30 * fillers, seed=n))
    words: list[str] = []
    for _ in range(30):
        words += gram + [next(filler) for _ in range(fillers)]
    return " ".join(words)


def planted_dup_ngram(repeat: int, total: int) -> str:
    words = unique_words(total - repeat, seed=99)
    return " ".join(words + words[:repeat])


def planted_dup_paragraphs() -> str:
    big = "\n".join(lines_of(5, 30))
    small = "Tiny repeated paragraph line here."
    return "\n\n".join([big, small, small, small])


PLANTED: dict[str, list[str]] = {
    "too_short_chars": ["Too short to keep."],
    "too_long_chars": [prose(1, 4000)],
    "too_few_words": [" ".join(unique_words(30, seed=2))],
    "too_many_words": [" ".join(["ab", "cd", "efg", "hij"] * 650)],
    "mean_word_length": [
        " ".join(random.Random(3).choice(["a", "i", "o", "to", "we"]) for _ in range(200)),
        " ".join(unique_words(80, seed=4, length=14)),
    ],
    "hash_word_ratio": [" ".join(w + (" #" if i % 5 == 0 else "") for i, w in enumerate(prose(5).split()))],
    "ellipsis_word_ratio": [
        " ".join(w + ("..." if i % 5 == 0 else "") for i, w in enumerate(prose(5).split()))
    ],
    "bullet_lines": ["\n".join("- " + line for line in lines_of(6, 20))],
    "ellipsis_lines": ["\n".join(lines_of(7, 20, end="..."))],
    "alpha_word_fraction": [
        " ".join(w + (" 1984" if i % 3 == 0 else "") for i, w in enumerate(prose(6).split()))
    ],
    "dup_line_fraction": ["\n".join(lines_of(8, 10) + ["The same line, again and again."] * 10)],
    "dup_line_char_fraction": ["\n".join(lines_of(9, 20, words_per_line=6) + [prose(10, 100)] * 2)],
    "dup_para_fraction": [planted_dup_paragraphs()],
    "top_2gram_fraction": [planted_top_ngram(2)],
    "top_3gram_fraction": [planted_top_ngram(3)],
    "top_4gram_fraction": [planted_top_ngram(4)],
    "dup_5gram_fraction": [planted_dup_ngram(60, 120)],
    "dup_10gram_fraction": [planted_dup_ngram(21, 200)],  # fraction 0.105: under 0.11 (n=9), over 0.10
}
NORMAL = [prose(11), prose(12, 300, per_line=1), GERMAN, CHINESE, JAPANESE]


@pytest.mark.parametrize("reason", sorted(PLANTED))
def test_each_rule_catches_its_planted_document(reason):
    for text in PLANTED[reason]:
        assert check_quality(text, CFG) == reason


@pytest.mark.parametrize("text", NORMAL, ids=["english", "english-lines", "german", "chinese", "japanese"])
def test_normal_paragraphs_pass(text):
    assert check_quality(text, CFG) is None


def test_clean_batch_drops_exactly_the_planted_documents():
    records = [
        Record(f"{reason}-{i}", t, "src") for reason, texts in PLANTED.items() for i, t in enumerate(texts)
    ]
    records += [Record(f"normal-{i}", t, "src") for i, t in enumerate(NORMAL)]
    out, stats = clean_batch(records, CleanConfig(quality=CFG))
    assert [r.id for r in out] == [f"normal-{i}" for i in range(len(NORMAL))]
    assert stats.dropped == Counter({reason: len(texts) for reason, texts in PLANTED.items()})


def test_paragraph_char_fraction_rule():
    cfg = QualityConfig(
        max_dup_line_fraction=None, max_dup_line_char_fraction=None, max_dup_para_fraction=None
    )
    text = "\n\n".join([prose(20, 60), prose(21, 60), prose(21, 60)])
    assert check_quality(text, cfg) == "dup_para_char_fraction"
    assert check_quality(prose(20, 180), cfg) is None


def test_rules_can_be_turned_off():
    text = PLANTED["bullet_lines"][0]
    assert check_quality(text, QualityConfig(max_bullet_line_fraction=None)) is None
    assert check_quality("x", QualityConfig(enabled=False)) is None


def test_cjk_characters_count_as_words():
    assert count_words("hello world") == (2, 0)
    assert count_words("我们 today 去学校") == (6, 5)  # 5 CJK characters + "today"
    n_words, n_cjk = count_words(CHINESE)
    assert n_cjk == n_words > 100


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_words": -1}, "min_words"),
        ({"max_symbol_word_ratio": 1.5}, "max_symbol_word_ratio"),
        ({"min_chars": 10, "max_chars": 5}, "min_chars"),
        ({"min_mean_word_length": 5, "max_mean_word_length": 4}, "mean word length"),
        ({"top_ngram_max_fraction": ((3, 0.1), (2, 0.1))}, "top_ngram_max_fraction"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        QualityConfig(**kwargs)


def borderline_docs(n_docs: int, seed: int) -> list[str]:
    """Random docs with repeated spans and frequent n-grams of random size: many sit near a threshold."""
    rng = random.Random(seed)
    vocab = [*unique_words(400, seed=seed, length=5), "the", "of", "a"]
    docs = []
    for _ in range(n_docs):
        words = [rng.choice(vocab) for _ in range(rng.randint(50, 700))]
        for _ in range(rng.randint(0, 4)):  # paste a copy of an earlier span somewhere later
            span = rng.randint(5, 40)
            src = rng.randrange(max(1, len(words) - span))
            dst = rng.randrange(len(words))
            words[dst:dst] = words[src : src + span]
        if rng.random() < 0.3:
            gram = rng.sample(vocab, rng.randint(2, 4))
            for _ in range(rng.randint(5, 60)):
                words[rng.randrange(len(words)) : 0] = gram
        docs.append(" ".join(words))
    return docs


def test_batch_screen_gives_the_exact_per_document_answers(monkeypatch, scan_path):
    monkeypatch.setattr(quality, "_CHUNK_WORDS", 3000)  # several chunks per batch
    docs = borderline_docs(600, seed=1) + [t for texts in PLANTED.values() for t in texts] + NORMAL
    cfg = QualityConfig(max_words=None, max_chars=None)
    expected = [reference_reason(t, cfg) for t in docs]
    assert check_quality_batch(docs, cfg) == expected
    reasons = Counter(expected)
    assert reasons[None] > 50 and sum(v for k, v in reasons.items() if k and "gram" in k) > 50
    # and the screen really spares most passing documents the exact n-gram counting
    words = [t.split() for t, r in zip(docs, expected, strict=True) if r is None]
    assert sum(quality.screen_ngrams(words, cfg)) < len(words) // 2


def sample_documents() -> list[tuple[str, list[dict]]]:
    """The bundled sample corpus: per file, its documents (``text``, ``meta``)."""
    out = []
    for path in sorted(glob.glob(str(sample_corpus_path() / "*.jsonl.zst"))):
        with open(path, "rb") as f:
            data = zstandard.ZstdDecompressor().stream_reader(f).read()
        out.append((path, [json.loads(line) for line in data.splitlines()]))
    return out


def test_sample_corpus_cjk_and_european_documents_are_kept():
    records = [
        Record(f"{doc['meta'].get('lang')}-{path}-{k}", doc["text"], "sample")
        for path, docs in sample_documents()
        for k, doc in enumerate(docs)
    ]
    out, stats = clean_batch(records, CleanConfig())
    kept = Counter(r.id.split("-")[0] for r in out)
    total = Counter(r.id.split("-")[0] for r in records)
    for lang in ("ja", "zh", "ru"):
        assert kept[lang] == total[lang] > 10, lang
    # the German and French title pages of the Debian developer's reference (as the English one) are mostly
    # years, dashes and "©": under 80% of their words hold a letter; no document goes for its stop words
    for lang in ("de", "fr"):
        assert kept[lang] == total[lang] - 1 > 10, lang
    assert stats.dropped == Counter({"alpha_word_fraction": 4, "dup_line_fraction": 1})
    assert stats.docs_out >= 0.97 * stats.docs_in


def mixed_script_docs(n_docs: int, seed: int) -> list[str]:
    """Borderline docs with non-ASCII words, odd whitespace (str.split's \\x1c-\\x1f, NBSP, U+3000), CJK, long
    words differing only in the middle, blank-line runs and leading/trailing newlines: every routing of the
    byte-level word scan (fast path, per-document path) and its character lengths."""
    rng = random.Random(seed)
    extras = [
        "naïve",
        "café",
        "“quoted”",
        "—",
        "Straße",
        "ÅÄÖ",
        "x\x1cy",
        "a\xa0b",
        "中文",
        "日本語",
        "\u3000",
        "\ud83dx",  # a lone surrogate
        "𠀀字",
        "a\u1680b",
        "c\u2028d",
        "e\x85f",
        "ｆｕｌｌ",
        "ḁ̈",
        "“the”",  # stop words behind punctuation, in capitals, and tokens that only contain one
        "(Of,",
        "THE",
        "the's",
        "_the_",
        "to-do",
        "２０２４",  # fullwidth digits: CJK words without a letter
        "、",
        "x1",
    ]
    numbers = ["1984", "3.14", "—", "+=", "42", "½", "٣"]  # words without a letter
    symbols = (["#", "#...", "C#"], ["...", "…", "a…"])  # one kind per document
    longs = ["https://example.org/" + "".join(rng.choice("ab") for _ in range(12)) + "/index.html"] * 3
    longs += [f"prefix-{c}-suffix-0123456789" for c in "abc"]
    docs = []
    for text in borderline_docs(n_docs, seed):
        words = text.split()
        for _ in range(rng.randint(0, 6)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(extras + longs))
        # near the thresholds of the alphabetic-word fraction (0.8) and the symbol ratios (0.1)
        for tokens, share, rate in ((numbers, 0.4, (0.1, 0.3)), (rng.choice(symbols), 0.3, (0.04, 0.16))):
            if rng.random() < share:
                for _ in range(int(rng.uniform(*rate) * len(words))):
                    words.insert(rng.randrange(len(words) + 1), rng.choice(tokens))
        seps = [rng.choice([" ", " ", " ", "\n", "\n\n", "\n\n\n", "\t", "  "]) for _ in words]
        doc = "".join(w + s for w, s in zip(words, seps, strict=True))
        docs.append(rng.choice(["", "\n", " "]) + doc.rstrip() + rng.choice(["", "\n", "  "]))
    return docs


@pytest.fixture(params=[pytest.param("compiled", marks=needs_wordscan), "numpy"])
def scan_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The word scan under test: the compiled one (pipeline/clean/_wordscan.c) or the numpy one."""
    if request.param == "numpy":
        monkeypatch.setattr(wordscan, "scan_kernel", None)
    else:
        require(wordscan.scan_kernel, "pipeline.clean._wordscan")
    return str(request.param)


def test_byte_level_word_scan_gives_the_exact_per_document_answers(monkeypatch, scan_path):
    monkeypatch.setattr(wordscan, "SCAN_BYTES", 4000)  # several scan chunks per batch
    monkeypatch.setattr(quality, "_CHUNK_WORDS", 3000)
    docs = [*mixed_script_docs(500, seed=7), CHINESE * 3, JAPANESE * 3, GERMAN * 2]
    cfg = QualityConfig(max_words=None, max_chars=None, stop_words=(("en", ("the", "of")), ("*", ("a",))))
    rng = random.Random(8)
    languages = [rng.choice(["en", "en", "de", None]) for _ in docs]
    expected = [
        reference_reason(t, cfg) or reference_stop_word_reason(t, lang, cfg)
        for t, lang in zip(docs, languages, strict=True)
    ]
    assert check_quality_batch(docs, cfg, languages) == expected
    assert check_quality_batch(docs, cfg) == [reference_reason(t, cfg) for t in docs]
    reasons = Counter(expected)
    assert reasons[None] > 30 and sum(v for k, v in reasons.items() if k and "gram" in k) > 30
    for rule in ("alpha_word_fraction", "hash_word_ratio", "ellipsis_word_ratio", "stop_words"):
        assert reasons[rule] >= 5, (rule, reasons)
    fractions = [alpha_word_fraction(t) or 0.0 for t in docs]
    assert sum(0.75 < f < 0.8 for f in fractions) >= 5 and sum(0.8 <= f < 0.85 for f in fractions) >= 5
    assert sum(not fast_words(t) for t in docs) > 10  # the per-document path is exercised too
    assert sum(bool(quality.CJK_RE.search(t)) and fast_words(t) for t in docs) > 30  # and CJK in the scan
    for text in docs[:200]:  # and so is the word scan itself
        words, n_cjk = quality._split_cjk(text, text.split())
        ((_, _, _, lengths, sizes, per_doc, _, cjk, alpha, _),) = wordscan.scan_chunks([text], cfg)
        assert per_doc.tolist() == [not fast_words(text)]
        if not per_doc[0]:
            assert sizes.tolist() == [len(words)] and lengths.tolist() == [len(w) for w in words]
            assert cjk.tolist() == [n_cjk]
            all_words = words_of(text)
            assert alpha.tolist() == [sum(any(c.isalpha() for c in w) for w in all_words)], text
        assert quality.alpha_words(text, words, n_cjk) == sum(
            any(c.isalpha() for c in w) for w in words_of(text)
        )


def test_sample_corpus_batch_equals_per_document_rules(scan_path):
    docs = [doc for _, docs in sample_documents() for doc in docs]
    texts = [doc["text"] for doc in docs]
    languages = [doc["meta"].get("lang", "en") for doc in docs]
    for cfg in (QualityConfig(), CFG):
        assert check_quality_batch(texts, cfg) == [reference_reason(t, cfg) for t in texts]
        expected = [
            reference_reason(t, cfg) or reference_stop_word_reason(t, lang, cfg)
            for t, lang in zip(texts, languages, strict=True)
        ]
        assert check_quality_batch(texts, cfg, languages) == expected
    # and the scan's repetition bounds spare nearly every passing document the exact set-based rules
    cfg = QualityConfig()
    proven = [ok for chunk in wordscan.scan_chunks(texts, cfg) for ok in chunk[6].tolist()]
    passing = [quality._repetition_reason(t, cfg) is None for t in texts]
    assert sum(p and not ok for p, ok in zip(passing, proven, strict=True)) <= 0.05 * len(texts)


def test_fast_exact_ngram_rules_equal_the_counter_based_ones():
    """The first-occurrence arrays give the Counter answers, ties of the most frequent n-gram included,
    over random thresholds (every rule gets to decide)."""
    rng = random.Random(5)
    docs = borderline_docs(150, seed=3) + [
        " ".join(rng.choice(["a", "bb", "ccc"]) for _ in range(rng.randint(1, 40))) for _ in range(150)
    ]
    for text in docs:
        words = text.split()
        cfg = QualityConfig(
            top_ngram_max_fraction=tuple(
                (n, rng.uniform(0.0, 0.5)) for n in sorted(rng.sample(range(1, 6), 3))
            ),
            dup_ngram_max_fraction=tuple(
                (n, rng.uniform(0.0, 0.5)) for n in sorted(rng.sample(range(2, 12), 4))
            ),
        )
        assert quality._fast_ngram_reason(words, cfg) == ngram_reason(words, cfg), (text, cfg)


def test_screen_with_varied_rule_sets_gives_the_exact_answers(monkeypatch):
    """The screen drops the documents the repeated n-gram bounds settled once only those rules are left;
    over rule sets where they start before, between or after the top n-gram rules (or there are none of
    those), the batch answers stay the per-document ones."""
    monkeypatch.setattr(quality, "_CHUNK_WORDS", 3000)
    docs = borderline_docs(300, seed=11)
    rng = random.Random(13)
    rule_sets = [((), ((5, 0.15), (8, 0.1))), (((2, 0.2),), ((2, 0.3), (3, 0.2), (9, 0.05)))]
    rule_sets += [
        (
            tuple((n, rng.uniform(0.05, 0.4)) for n in sorted(rng.sample(range(1, 7), rng.randint(0, 3)))),
            tuple((n, rng.uniform(0.02, 0.4)) for n in sorted(rng.sample(range(2, 12), rng.randint(1, 5)))),
        )
        for _ in range(6)
    ]
    for top, dup in rule_sets:
        cfg = QualityConfig(
            max_words=None, max_chars=None, top_ngram_max_fraction=top, dup_ngram_max_fraction=dup
        )
        assert check_quality_batch(docs, cfg) == [reference_reason(t, cfg) for t in docs], (top, dup)


def test_sorted_packing_helpers_equal_their_definitions():
    rng = np.random.default_rng(3)
    for m, high in ((1, 5), (50, 3), (2000, 40), (2000, 1 << 40)):
        values = rng.integers(0, high, size=m)
        _, index, inverse = np.unique(values, return_index=True, return_inverse=True)
        assert quality._first_equal(values, high).tolist() == index[inverse].tolist()
        assert quality._first_equal(values, 1 << 62).tolist() == index[inverse].tolist()  # the fallback
        keys = values.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        seen: set[int] = set()
        expected = []
        for k in keys.tolist():
            expected.append(k in seen)
            seen.add(k)
        assert wordscan.repeated_keys(keys).tolist() == expected
    for n in (1, 2, 5):
        repeats = rng.random(40) < 0.1
        covered = [any(repeats[max(j - n + 1, 0) : j + 1]) for j in range(40 + n - 1)]
        assert quality._covered(repeats, n).tolist() == covered


@needs_wordscan
def test_the_compiled_scan_finds_the_numpy_scans_words_and_bounds_no_looser(monkeypatch):
    """Document by document, the compiled scan gives the numpy scan's routing, word hashes, lengths, word and
    CJK counts; its repetition bounds (exact keys) prove at least every document the numpy ones prove, and
    only documents that pass the exact rules."""
    require(wordscan.scan_kernel, "pipeline.clean._wordscan")
    cfg = QualityConfig()
    docs = [
        *mixed_script_docs(300, seed=11),
        CHINESE * 3,
        JAPANESE * 3,
        GERMAN * 2,
        "",
        "\n",
        "a\n\nb\n\n\na",
    ]
    docs += ["\n".join(["same line here"] * k + ["other words"] * j) for k in range(4) for j in range(3)]
    docs += ["\n\n".join(["a paragraph of words"] * k + ["x y"]) for k in range(4)]
    marked = [
        "....",
        "......\n",
        "…\n",
        "\n  - item",
        "\t• x\n\n\t\t· y\n*z",
        "text...   ",
        "a…\u3000",
        "##",
        "ab...",
    ]
    marked += [
        "- a\n\n\n– b\n‣c\n◦ d\n⁃e\n●f\n▪g\n.\n..\n...\n....\n…\n……\n",
        "x\n \t\n-",
        "\n",
        "…",
        "#.#..#...",
    ]
    docs += [*marked, "\n".join(marked)]
    compiled = [next(wordscan.scan_chunks([t], cfg))[2:] for t in docs]
    monkeypatch.setattr(wordscan, "scan_kernel", None)
    proven = 0
    for text, got in zip(docs, compiled, strict=True):
        want = next(wordscan.scan_chunks([text], cfg))[2:]
        assert got[3].tolist() == want[3].tolist(), text  # routing
        if want[3][0]:
            continue  # a lone surrogate: the per-document path, whatever the scans found
        for k in (0, 1, 2, 5, 6):  # hashes, lengths, word count, CJK count, alphabetic words
            assert got[k].tolist() == want[k].tolist(), (k, text)
        bullets = len(quality.BULLET_LINE_RE.findall(text)) + text.lstrip(" \t").startswith(quality.BULLETS)
        ends = text.count("...\n") + text.count("…\n") + text.rstrip().endswith(quality.ELLIPSES)
        counts = {
            wordscan.Mark.HASH: text.count("#"),
            wordscan.Mark.DOTS: text.count("..."),
            wordscan.Mark.ELLIPSIS: text.count("…"),
            wordscan.Mark.NEWLINES: text.count("\n"),
            wordscan.Mark.BULLET_LINES: bullets,
            wordscan.Mark.ELLIPSIS_ENDS: ends,
        }
        assert got[7].tolist() == [[counts[mark] for mark in wordscan.Mark]], text
        trusted = text[:1] != "\n" and text[-1:] != "\n"
        if trusted:
            assert got[4][0] or not want[4][0], text
            if got[4][0]:
                proven += 1
                assert quality._repetition_reason(text, cfg) is None, text
    assert proven > 100


@needs_wordscan
def test_the_compiled_ngram_screen_flags_every_failing_document_and_spares_most_others():
    """``screen_ngrams`` (pipeline/clean/_wordscan.c) over the borderline documents and varied rule sets: every
    document that the exact n-gram rules fail is flagged, and most that pass are proven (not flagged)."""
    require(wordscan.scan_kernel, "pipeline.clean._wordscan")
    docs = borderline_docs(400, seed=3)
    rules = [
        QualityConfig(),
        QualityConfig(
            top_ngram_max_fraction=((1, 0.05), (3, 0.1)), dup_ngram_max_fraction=((2, 0.3), (6, 0.05))
        ),
        QualityConfig(top_ngram_max_fraction=(), dup_ngram_max_fraction=((5, 0.01),)),
        QualityConfig(top_ngram_max_fraction=((2, 0.02),), dup_ngram_max_fraction=()),
    ]
    for cfg in rules:
        words = [d.split() for d in docs]
        flagged = np.concatenate(
            [
                quality._screen_pending(hashes, lengths, sizes, np.ones(hi - lo, dtype=bool), cfg)
                for lo, hi, hashes, lengths, sizes, *_ in wordscan.scan_chunks(docs, cfg)
            ]
        )
        fails = [quality._fast_ngram_reason(w, cfg) is not None for w in words]
        assert all(f <= g for f, g in zip(fails, flagged.tolist(), strict=True)), cfg
        passing = [not f for f in fails]
        assert sum(g for g, p in zip(flagged.tolist(), passing, strict=True) if p) < sum(passing) // 2, cfg
        assert sum(fails) > 20 or cfg.dup_ngram_max_fraction == (), cfg


def with_symbols(n_words: int, hashes: int, ellipses: int) -> str:
    """``n_words`` words of prose, ``hashes`` of them starting with "#", ``ellipses`` ending with "..."."""
    words = prose(31, n_words).split()
    for i in range(hashes):
        words[2 * i] = "#" + words[2 * i]
    for i in range(ellipses):
        words[2 * i + 1] += "..."
    return " ".join(words)


def test_symbol_rule_compares_each_ratio_on_its_own(scan_path):
    cases = {
        with_symbols(90, 4, 7): None,  # 4.4% "#" and 7.7% ellipses (the README case): neither is over 0.1
        with_symbols(100, 10, 10): None,  # 0.1 each: not over; their sum (0.2) is no rule
        with_symbols(100, 11, 0): "hash_word_ratio",
        with_symbols(100, 0, 11): "ellipsis_word_ratio",
        with_symbols(100, 11, 11): "hash_word_ratio",  # the "#" ratio is checked first
    }
    texts = list(cases)
    assert (
        check_quality_batch(texts, CFG) == list(cases.values()) == [reference_reason(t, CFG) for t in texts]
    )


def test_alpha_word_fraction_at_its_threshold(scan_path):
    words = prose(30, 100).split()
    numbers = [str(1000 + i) for i in range(25)]  # words without a letter
    at = " ".join(words[:80] + numbers[:20])  # 80 of 100 words hold a letter: at least 80%, kept
    below = " ".join(words[:79] + numbers[:21])  # 79%: dropped
    above = " ".join(words[:81] + numbers[:19])
    cjk = "河水缓缓流过小村庄，" * 6 + " ".join(words[:40])  # 10 CJK words of which 1 ("，") without a letter
    texts = [at, below, above, cjk]
    expected = [None, "alpha_word_fraction", None, None]
    assert check_quality_batch(texts, CFG) == expected == [reference_reason(t, CFG) for t in texts]
    assert alpha_word_fraction(cjk) == (54 + 40) / 100
    assert check_quality(below, QualityConfig(max_chars=20_000, min_alpha_word_fraction=None)) is None
