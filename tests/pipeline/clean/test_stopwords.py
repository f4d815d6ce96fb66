"""Gopher's stop-word rule: English documents need two of the paper's stop words, a language without a list is
not subject to it, a "*" list covers the others (and documents of unknown language), a source can override it, and
the one-regex search gives the token-by-token count's answers."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from pipeline.clean import wordscan
from pipeline.clean.config import CleanConfig, QualityConfig
from pipeline.clean.langid import LangIdConfig
from pipeline.clean.quality import check_quality, check_quality_batch
from pipeline.clean.stage import clean_batch, clean_batch_by_source, source_clean_configs
from pipeline.clean.stopwords import stop_word_reason
from pipeline.config import build_config
from pipeline.records import Record
from pipeline.sources import SOURCE_ENTRY, SOURCE_NAME, SourceConfig
from tests.kernels import needs_wordscan, require
from tests.pipeline.clean.quality_oracle import reference_stop_word_reason, stop_word_count
from tests.pipeline.clean.test_quality import GERMAN

GOPHER = ("the", "be", "to", "of", "and", "that", "have", "with")
# English words, none of them a Gopher stop word
PLAIN = [
    *[
        "river",
        "garden",
        "morning",
        "village",
        "teacher",
        "window",
        "market",
        "winter",
        "summer",
        "letter",
        "evening",
        "station",
        "mountain",
    ],
    *[
        "forest",
        "carefully",
        "slowly",
        "quietly",
        "walked",
        "opened",
        "painted",
        "carried",
        "noticed",
        "remembered",
        "gathered",
    ],
    *[
        "travelled",
        "explained",
        "bright",
        "narrow",
        "ancient",
        "gentle",
        "heavy",
        "yellow",
        "silent",
        "distant",
        "crowded",
        "familiar",
    ],
]


def english(stop_words: list[str], n_words: int = 80, seed: int = 0) -> str:
    """Plain English-like words with ``stop_words`` spread through them (a sentence every 10 words)."""
    rng = random.Random(seed)
    words = [rng.choice(PLAIN) for _ in range(n_words)]
    for k, word in enumerate(stop_words):
        words.insert(k * 7 + 3, word)
    return " ".join(" ".join(words[i : i + 10]).capitalize() + "." for i in range(0, len(words), 10))


def test_english_needs_two_stop_words():
    cfg = QualityConfig()
    assert stop_word_reason(english(["the"]), "en", cfg) == "stop_words"
    assert stop_word_reason(english(["the", "with"]), "en", cfg) is None
    assert stop_word_reason(english(["the", "the"]), "en", cfg) is None  # occurrences are counted
    assert stop_word_reason(english([]), "en", cfg) == "stop_words"
    # and as a rule of check_quality: the document passes every other rule
    assert check_quality(english(["of"]), cfg) is None  # language unknown, no "*" list: not subject
    assert check_quality(english(["of"]), cfg, "en") == "stop_words"
    assert check_quality(english(["of", "and"]), cfg, "en") is None


def test_punctuation_around_a_word_and_case_are_ignored():
    cfg = QualityConfig()
    for pair in (["The,", "(OF)"], ["“that”", "--and--"], ["Have.", "With!"]):
        assert stop_word_reason(english(pair), "en", cfg) is None, pair
    for pair in (["the's", "to-do"], ["they", "other"], ["#the", "be2"], ["_to_", "ofand"]):
        # "#" and "_" are stripped like any character that is neither a letter nor a digit: "#the" counts
        count = stop_word_count(english(pair), GOPHER)
        assert count == sum(p in ("#the", "_to_") for p in pair), pair


def test_a_language_without_a_list_is_not_subject_to_the_rule():
    cfg = QualityConfig()
    assert stop_word_count(GERMAN, GOPHER) == 0
    assert stop_word_reason(GERMAN, "de", cfg) is None
    assert stop_word_reason(GERMAN, None, cfg) is None  # langid off: only a "*" list would apply
    assert stop_word_reason(english([]), "fr", cfg) is None  # the language decides, not the words


def test_a_star_list_covers_every_language_without_its_own():
    cfg = QualityConfig(stop_words=(("en", GOPHER), ("*", ("und", "der", "die"))))
    assert stop_word_reason(GERMAN, "de", cfg) is None  # "und", "der", "die" occur
    assert stop_word_reason(english(["the", "of"]), "de", cfg) == "stop_words"
    assert stop_word_reason(english(["the", "of"]), "en", cfg) is None  # English keeps its own list
    assert stop_word_reason(english(["und", "der"]), None, cfg) is None  # unknown language: the "*" list
    assert stop_word_reason(english(["und"]), None, cfg) == "stop_words"


def test_thresholds_and_switches():
    text = english(["the", "of"])
    assert stop_word_reason(text, "en", QualityConfig(min_stop_words=3)) == "stop_words"
    assert stop_word_reason(text, "en", QualityConfig(min_stop_words=None)) is None
    assert stop_word_reason(text, "en", QualityConfig(min_stop_words=0)) is None
    assert stop_word_reason(english([]), "en", QualityConfig(enabled=False)) is None
    assert stop_word_reason(english([]), "en", QualityConfig(stop_words=())) is None


@pytest.mark.parametrize(
    "compiled", [pytest.param(True, marks=needs_wordscan), False], ids=["compiled", "python"]
)
def test_the_counts_give_the_token_by_token_answers(monkeypatch, compiled):
    if not compiled:
        monkeypatch.setattr(wordscan, "scan_kernel", None)
    else:
        require(wordscan.scan_kernel, "pipeline.clean._wordscan")
    rng = random.Random(3)
    tokens = [
        *PLAIN[:8],
        *GOPHER,
        "The",
        "THE,",
        "(of",
        "to-do",
        "the's",
        "_and_",
        "«with»",
        "théâtre",
        "...",
        "#",
    ]
    tokens += [
        "A",
        "X1",
        "Über,",
        "a.",
        "ÜBER",
        "\u212a",
        "\u0130",
        "o\u0130f",
        "¡to!",
        "and\u0301",
        "\ud800the",
        "ÉTÉ",
    ]
    ascii_lists = (("en", GOPHER), ("*", ("a", "x1", "k")))
    other_lists = (("en", ("the", "of")), ("*", ("a", "über", "été")))  # non-ASCII: counted in Python
    for _ in range(300):
        words = [rng.choice(tokens) for _ in range(rng.randint(0, 30))]
        seps = [rng.choice([" ", "\n", "\t", "  ", "\u3000", "\xa0", "\x1c"]) for _ in words]
        text = "".join(w + s for w, s in zip(words, seps, strict=True))
        for need in (1, 2, 3, 5):
            for lists in (ascii_lists, other_lists):
                cfg = QualityConfig(min_stop_words=need, stop_words=lists)
                for language in ("en", "de", None):
                    want = reference_stop_word_reason(text, language, cfg)
                    assert stop_word_reason(text, language, cfg) == want, (text, need, language)


@pytest.mark.parametrize(
    ("stop_words", "message"),
    [
        ((("en", ("the,",)),), "starts and ends with a letter or digit"),
        ((("en", ("of the",)),), "must be one word"),
        ((("en", ("the",)), ("en", ("of",))), "lists a language twice"),
        ((("", ("the",)),), "bad entry"),
    ],
)
def test_config_refuses_stop_words_that_could_never_match(stop_words, message):
    with pytest.raises(ValueError, match=f"stop_words.*{message}"):
        QualityConfig(stop_words=stop_words)
    with pytest.raises(ValueError, match="min_stop_words"):
        QualityConfig(min_stop_words=-1)


def test_users_write_the_lists_as_a_mapping():
    cfg = build_config(CleanConfig, {"quality": {"stop_words": {"en": ["the", "of"], "de": ["und", "der"]}}})
    assert cfg.quality.stop_words == (("en", ("the", "of")), ("de", ("und", "der")))
    assert cfg.quality.stop_word_list("de") == ("und", "der") and cfg.quality.stop_word_list("fr") == ()


def test_clean_stage_applies_the_rule_once_the_language_is_known():
    records = [
        Record("en-none", english([]), "src"),
        Record("en-one", english(["the"]), "src"),
        Record("en-two", english(["the", "with"]), "src"),
        Record("de", GERMAN, "src"),
    ]
    for langid in (LangIdConfig(), LangIdConfig(allow=("en", "de"))):  # langid after quality, and before it
        out, stats = clean_batch(records, CleanConfig(langid=langid))
        assert [r.id for r in out] == ["en-two", "de"]
        assert stats.dropped == Counter({"stop_words": 2})
        assert json.loads(out[0].meta)["language"] == "en"
    # language identification off: no language, so only a "*" list applies
    off = LangIdConfig(enabled=False)
    out, _ = clean_batch(records, CleanConfig(langid=off))
    assert len(out) == 4
    star = QualityConfig(stop_words=(("*", GOPHER),))
    out, stats = clean_batch(records, CleanConfig(langid=off, quality=star))
    assert [r.id for r in out] == ["en-two"] and stats.dropped == Counter({"stop_words": 3})


def test_a_source_overrides_the_stop_word_lists():
    german = QualityConfig(stop_words=(("de", ("zwischen", "obwohl")),))  # neither occurs in GERMAN
    sources = [
        SourceConfig(name="web", inputs=("web/",)),
        SourceConfig(name="code", inputs=("code/",), quality=QualityConfig(min_stop_words=None)),
        SourceConfig(name="de", inputs=("de/",), quality=german),
    ]
    texts = {"none": english([]), "two": english(["the", "of"]), "german": GERMAN}
    records = [
        Record(f"{s.name}-{key}", text, "src", json.dumps({SOURCE_NAME: s.name, SOURCE_ENTRY: entry}))
        for entry, s in enumerate(sources)
        for key, text in texts.items()
    ]
    cfg = CleanConfig()
    out, stats = clean_batch_by_source(records, cfg, per_source=source_clean_configs(cfg, sources))
    # web: English needs its stop words; code: no rule; de: German needs its own, English has no list there
    kept = ["web-two", "web-german", "code-none", "code-two", "code-german", "de-none", "de-two"]
    assert [r.id for r in out] == kept
    assert stats.dropped == Counter({"stop_words": 2})


def test_check_quality_batch_with_languages_adds_the_rule_to_the_others():
    texts = [english([]), english(["the", "of"]), "too short", GERMAN]
    cfg = QualityConfig()
    assert check_quality_batch(texts, cfg) == [None, None, "too_short_chars", None]
    assert check_quality_batch(texts, cfg, ["en", "en", "en", "de"]) == [
        "stop_words",
        None,
        "too_short_chars",
        None,
    ]
