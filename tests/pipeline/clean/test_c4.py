"""C4's rules: each on hand-made pages at both sides of its threshold, each switch turning its rule off, the
counts through clean_batch, the bad-words file (local and s3://), the sentence splitter and the config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.clean.c4 import BadWords, c4_page, count_sentences, load_bad_words, sentence_spans
from pipeline.clean.config import C4Config, CleanConfig, QualityConfig
from pipeline.clean.stage import clean_batch
from pipeline.config import parse_overrides
from pipeline.corpus_config import load_corpus_config
from pipeline.records import Record
from pipeline.storage import open_store

ON = C4Config(enabled=True)
# Three kept lines of 1, 2 and 1 sentences: 4 sentences, 5+ words each.
GOOD = [
    "The river ran past the old mill every morning.",
    "Children walked to school along its bank. They stopped to watch the boats!",
    "Nobody remembers when the mill last turned its wheel?",
]
PAGE = "\n".join(GOOD)


def run(text: str, cfg: C4Config = ON, bad: BadWords | None = None) -> tuple[str, str | None, dict[str, int]]:
    out, reason, removed = c4_page(text, cfg, bad)
    return out, reason, dict(removed)


def with_line(line: str) -> str:
    return PAGE + "\n" + line


def test_good_page_is_kept_as_is() -> None:
    assert run(PAGE) == (PAGE, None, {})


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("A line that has a proper ending.", True),
        ('She said it was "a proper ending."', True),
        ("Is this a proper question here?", True),
        ("A line without any ending at all", False),
        ("A line that trails off into nothing...", False),
        ("A line that ends in a colon like this:", False),
    ],
)
def test_terminal_punctuation(line: str, kept: bool) -> None:
    out, reason, removed = run(with_line(line))
    assert reason is None
    assert (line in out) is kept
    assert removed == ({} if kept else {"no_terminal_punct": 1})
    off = replace(ON, require_terminal_punct=False)
    assert line in run(with_line(line), off)[0]


def test_end_marks_are_configurable() -> None:
    line = "The owner called it 'the best mill around'"
    assert line not in run(with_line(line))[0]
    assert line in run(with_line(line), replace(ON, end_marks=(".", "?", "!", '"', "'")))[0]


@pytest.mark.parametrize(
    ("line", "kept"), [("One two three four five.", True), ("One two three four.", False)]
)
def test_min_words_per_line(line: str, kept: bool) -> None:
    out, _, removed = run(with_line(line))
    assert (line in out) is kept
    assert removed == ({} if kept else {"too_few_words": 1})
    assert line in run(with_line(line), replace(ON, min_words_per_line=None))[0]
    assert line in run(with_line(line), replace(ON, min_words_per_line=4))[0]


def test_words_are_counted_after_the_citations_are_cut() -> None:
    line = "One two three [1] [2] [3]."  # 7 words before the cut, 4 after (the "." is one)
    assert run(with_line(line))[2] == {"too_few_words": 1}


@pytest.mark.parametrize(("length", "kept"), [(1000, True), (1001, False)])
def test_max_word_length(length: int, kept: bool) -> None:
    line = "This line holds a long word " + "x" * length + " here."
    out, _, removed = run(with_line(line))
    assert (line in out) is kept
    assert removed == ({} if kept else {"too_long_word": 1})
    assert line in run(with_line(line), replace(ON, max_word_length=None))[0]


def test_citations_are_cut() -> None:
    line = "The mill was built in 1820.[3] It burnt down[citation needed] in 1901.[edit]"
    out, _, _ = run(with_line(line))
    assert out.endswith("The mill was built in 1820. It burnt down in 1901.")
    kept = run(with_line(line), replace(ON, remove_citations=False, require_terminal_punct=False))[0]
    assert kept.endswith(line)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("Please enable JavaScript to view this page now.", "javascript"),
        ("Read our Privacy Policy for more.", "policy"),
    ],
)
def test_javascript_and_policy_lines(line: str, reason: str) -> None:
    out, drop, removed = run(with_line(line))
    assert (out, drop, removed) == (PAGE, None, {reason: 1})
    switch = "remove_javascript_lines" if reason == "javascript" else "remove_policy_lines"
    assert line in run(with_line(line), replace(ON, **{switch: False}))[0]
    assert (
        run(with_line(line.replace("JavaScript", "Java").replace("Privacy Policy", "privacy notes")))[2] == {}
    )


@pytest.mark.parametrize(
    ("line", "reason", "switch"),
    [
        ("Lorem ipsum dolor sit amet, consectetur.", "c4_lorem_ipsum", "drop_lorem_ipsum"),
        ("The code reads if (x) { return y; } here.", "c4_curly_bracket", "drop_curly_bracket"),
    ],
)
def test_page_drops(line: str, reason: str, switch: str) -> None:
    assert run(with_line(line)) == ("", reason, {})
    assert run(with_line(line), replace(ON, **{switch: False}))[1] is None
    # as in TFDS and datatrove, only a line that survived the line rules drops the page
    assert run(with_line(line.rstrip(".")))[1] is None


def test_javascript_line_is_removed_before_its_bracket_is_seen() -> None:
    line = "Your browser has javascript { disabled } right now."
    assert run(with_line(line))[1:] == (None, {"javascript": 1})


@pytest.mark.parametrize(("min_sentences", "reason"), [(4, None), (5, "c4_too_few_sentences")])
def test_min_sentences(min_sentences: int, reason: str | None) -> None:
    assert run(PAGE, replace(ON, min_sentences=min_sentences))[1] == reason  # PAGE has 4 sentences
    assert run(PAGE, replace(ON, min_sentences=None))[1] is None


def test_removed_lines_do_not_count_as_sentences() -> None:
    page = PAGE + "\nA short one. And another"  # no end mark: removed, its sentence not counted
    assert run(page, replace(ON, min_sentences=5))[1] == "c4_too_few_sentences"


def test_bad_words_match_whole_words_and_phrases_in_kept_lines() -> None:
    bad = BadWords(["mill", "old boat", ""])
    assert bad.words == ("mill", "old boat")
    assert run(PAGE, ON, bad)[1] == "c4_bad_words"  # "mill" at a word boundary (any case)
    assert run(PAGE.replace("mill", "miller"), ON, bad)[1] is None  # inside a word: not a match
    assert run(PAGE.replace("mill", "Old  boat"), ON, bad)[1] is None  # a phrase matches as written
    assert run(PAGE.replace("mill", "OLD BOAT"), ON, bad)[1] == "c4_bad_words"
    removed_line = PAGE.replace("mill", "miller") + "\nthe mill"  # too short: removed, so not searched
    assert run(removed_line, ON, bad)[1] is None


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("", 0),
        ("One sentence here.", 1),
        ("It works. Really.", 2),
        ("Dr. Smith went to Washington. He left.", 2),
        ("See e.g. the U.S. manual. Done!", 2),
        ("J. R. R. Tolkien wrote it.", 1),
        ('He asked "why?" Then he left.', 2),
        ("Wait... what? Yes.", 2),
        ("Wait... Then it came.", 2),
        ("Version 2.38.1 is out. Update now!", 2),
    ],
)
def test_sentence_splitter(text: str, n: int) -> None:
    assert len(sentence_spans(text)) == n
    assert count_sentences(text) == n


def test_sentence_spans_cover_the_text() -> None:
    text = "First one.  Second one! Third?"
    assert [text[a:b] for a, b in sentence_spans(text)] == ["First one.", "Second one!", "Third?"]


def records(*texts: str) -> list[Record]:
    return [Record(id=f"d#{i}", text=t, source="d") for i, t in enumerate(texts)]


def test_clean_batch_counts_line_removals_and_page_drops(tmp_path: Path) -> None:
    words = tmp_path / "bad.txt"
    words.write_text("grumpy\n")
    cfg = CleanConfig(quality=QualityConfig(enabled=False), c4=replace(ON, bad_words_file=str(words)))
    docs = records(
        PAGE + "\nMenu\nPlease enable JavaScript to read this page.\nRead our privacy policy before you go.",
        with_line("Lorem ipsum dolor sit amet, consectetur."),
        with_line("The code reads if (x) { return y; } here."),
        "Just one sentence in this short page.",
        with_line("A grumpy miller lived by the river."),
    )
    kept, stats = clean_batch(docs, cfg)
    assert [r.text for r in kept] == [PAGE]
    assert stats.dropped == {
        "c4_lorem_ipsum": 1,
        "c4_curly_bracket": 1,
        "c4_too_few_sentences": 1,
        "c4_bad_words": 1,
    }
    assert {k: v for k, v in stats.extra.items() if k.startswith("c4.")} == {
        "c4.lines_removed.no_terminal_punct": 1,
        "c4.lines_removed.javascript": 1,
        "c4.lines_removed.policy": 1,
    }
    kept, stats = clean_batch(docs, replace(cfg, c4=C4Config()))  # off by default: nothing changes
    assert len(kept) == 5 and not stats.dropped and not any(k.startswith("c4.") for k in stats.extra)


def test_c4_runs_before_the_quality_rules() -> None:
    """The quality rules see the text C4 left: a page C4 cut under 100 characters is then too short."""
    cfg = CleanConfig(c4=ON)
    text = "\n".join(["one two three four five six"] * 30) + "\n" + PAGE
    kept, stats = clean_batch(records(text), cfg)
    assert kept == [] and stats.dropped == {"too_few_words": 1}


def test_bad_words_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"bad_words_file: .* is not a file"):
        load_bad_words(str(tmp_path / "missing.txt"), None)
    assert load_bad_words(None, None) is None


def test_a_bad_words_file_on_each_cloud_store(cloud_bucket) -> None:
    open_store(cloud_bucket.uri, cloud_bucket.options).put_bytes("lists/bad.txt", b"Mill\nold boat\n")
    bad = load_bad_words(f"{cloud_bucket.uri}/lists/bad.txt", cloud_bucket.options)
    assert bad is not None and bad.words == ("mill", "old boat")
    assert run(PAGE, ON, bad)[1] == "c4_bad_words"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_words_per_line": 0}, "min_words_per_line"),
        ({"min_sentences": -1}, "min_sentences"),
        ({"max_word_length": True}, "max_word_length"),
        ({"end_marks": ()}, "end_marks"),
        ({"bad_words_file": "https://example.org/list"}, "bad_words_file"),
    ],
)
def test_config_refuses(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"C4Config.{field}"):
        C4Config(**kwargs)  # type: ignore[arg-type]


def test_config_from_yaml_and_set(tmp_path: Path) -> None:
    default = load_corpus_config(Path("pipeline/configs/corpus.yaml"))
    assert default.clean.c4 == C4Config()  # the documented section holds the defaults
    on = load_corpus_config(
        None, overrides=parse_overrides(["clean.c4.enabled=true", "clean.c4.min_sentences=null"])
    )
    assert on.clean.c4 == replace(C4Config(), enabled=True, min_sentences=None)
    path = tmp_path / "corpus.yaml"
    path.write_text(
        "clean:\n  c4:\n    enabled: true\n    end_marks: ['.', \"'\"]\n    bad_words_file: s3://b/k\n"
    )
    c4 = load_corpus_config(path).clean.c4
    assert (c4.enabled, c4.end_marks, c4.bad_words_file) == (True, (".", "'"), "s3://b/k")


def test_a_bad_words_list_has_a_digest_of_what_it_decides_with() -> None:
    """A build keys clean's units with the list's digest, so a new list at the same URI redoes clean."""
    same = BadWords(["Foo", "bar baz", ""]), BadWords(["bar baz", "foo", "foo"])
    assert same[0].digest == same[1].digest
    assert BadWords(["foo"]).digest != same[0].digest
