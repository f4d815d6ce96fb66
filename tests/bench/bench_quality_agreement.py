"""Agreement of our quality rules with datatrove 0.10.1's filters, document by document, on real text from this
machine (a benchmark-only dependency: ``pip install 'pileworks[bench]'``).

Documents (deterministic: sorted paths, every k-th one up to a cap per kind, each cut to its first 100,000
characters at a line end, normalised as the clean stage does, then the same text given to both sides): Debian
changelogs (``/usr/share/doc/*/changelog*.gz``), READMEs and copyright files from ``/usr/share/doc``, man pages
read raw (groff source, decompressed: rendering thousands with ``man`` would take minutes, and the markup is what
a corpus builder ingesting the files sees), and the docstrings of each stdlib module (``ast``, no import).

- **Words and sentences.** By default datatrove runs as it ships: its English word and sentence splitter is
  spaCy's blank English tokenizer with the ``sentencizer`` (``spacy.blank("en")``, no model to download; ``pip
  install spacy``), memoised per text here so that each document is split once (the same tokens, faster).
  ``--words whitespace`` gives datatrove whitespace words and our sentence splitter instead (a ``WordTokenizer``
  passed as ``language``, which ``load_word_tokenizer`` accepts "for custom tokenizers"): an **adjusted**
  comparison that isolates the rules from the definition of a word, reported under ``"words": "whitespace"``.
- **C4**: our ``c4_page`` against ``C4QualityFilter`` configured alike (datatrove's end marks, thresholds and
  switches given to ours). Line decisions (page rules off on both sides, so every page's kept lines compare):
  lines kept by one side only. Page decisions (every rule on): dropped or not, and by which reason. Both sides
  count a line's words on whitespace (datatrove's ``line.split()``); sentences are where the word setting
  matters (spaCy's sentencizer as shipped, or our splitter adjusted).
- **Gopher**: per rule, a confusion matrix of our decision (``QualityConfig`` with only that rule on) against
  datatrove's ``GopherQualityFilter`` / ``GopherRepetitionFilter`` with only the matching rule on; then every
  rule at once (``all``: our defaults without our character bounds, against both datatrove filters at their
  defaults). Rules are rows of :data:`GOPHER_ROWS`; a row whose ``QualityConfig`` field does not exist in this
  checkout is skipped with a message.

Prints the matrices, agreement per rule and up to 3 example ids per kind of disagreement, and writes the figures
to ``/tmp/quality_agreement.json``. Run: ``.venv/bin/python tests/bench/bench_quality_agreement.py [--words
whitespace]``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import glob
import gzip
import inspect
import json
import os
import sysconfig
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from datatrove.data import Document
from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
from datatrove.pipeline.filters.c4_filters import C4QualityFilter
from datatrove.utils.word_tokenizers import WordTokenizer, load_word_tokenizer

from pipeline.clean.c4 import c4_page, sentence_spans
from pipeline.clean.config import C4Config, CleanConfig, QualityConfig
from pipeline.clean.normalize import normalize_text
from pipeline.clean.quality import check_quality_batch

MAX_CHARS = 100_000
CAPS = {"changelog": 1000, "readme": 400, "copyright": 700, "man": 1000, "docstring": 700}
OUT = "/tmp/quality_agreement.json"


# ---------------------------------------------------------------- documents


def _read(path: str) -> str:
    opener: Callable[..., Any] = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data: bytes = f.read(4 * MAX_CHARS)
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= MAX_CHARS else text[: text.rfind("\n", 0, MAX_CHARS) + 1]


def _every_kth(paths: list[str], cap: int) -> list[str]:
    paths = sorted(paths)
    step = max(1, len(paths) // cap)
    return paths[::step][:cap]


def _docstrings(path: str) -> str:
    try:
        tree = ast.parse(_read(path))
    except (SyntaxError, ValueError):
        return ""
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef))]
    return "\n\n".join(d for n in nodes if (d := ast.get_docstring(n)))


def documents() -> list[tuple[str, str]]:
    """``(id, text)`` of every document, in a fixed order."""
    stdlib = sysconfig.get_paths()["stdlib"]
    kinds: dict[str, tuple[list[str], Callable[[str], str]]] = {
        "changelog": (glob.glob("/usr/share/doc/*/changelog*.gz"), _read),
        "readme": ([p for p in glob.glob("/usr/share/doc/*/README*") if os.path.isfile(p)], _read),
        "copyright": (glob.glob("/usr/share/doc/*/copyright"), _read),
        "man": (glob.glob("/usr/share/man/man[1-8]/*.gz"), _read),
        "docstring": (
            [p for p in glob.glob(f"{stdlib}/**/*.py", recursive=True) if "/test" not in p[len(stdlib) :]],
            _docstrings,
        ),
    }
    docs = []
    cfg = CleanConfig()
    for kind, (paths, read) in kinds.items():
        for path in _every_kth(paths, CAPS[kind]):
            text = normalize_text(read(path), cfg, Counter())
            if len(text.split()) >= 1:
                docs.append((f"{kind}:{path}", text))
    return docs


# ---------------------------------------------------------------- datatrove's word and sentence splits


class WhitespaceWords(WordTokenizer):
    """Words are whitespace-separated tokens (the Gopher paper's definition); sentences from our splitter."""

    def __init__(self) -> None:
        super().__init__("en")

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()

    def sent_tokenize(self, text: str) -> list[str]:
        return [text[a:b] for a, b in sentence_spans(text)]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return sentence_spans(text)


class ShippedWords(WordTokenizer):
    """datatrove's own English splitter (``load_word_tokenizer("en")``: spaCy), each text split once."""

    def __init__(self) -> None:
        super().__init__("en")
        self._inner = load_word_tokenizer("en")
        self._words: dict[str, list[str]] = {}
        self._spans: dict[str, list[tuple[int, int]]] = {}

    def word_tokenize(self, text: str) -> list[str]:
        if text not in self._words:
            self._words[text] = self._inner.word_tokenize(text)
        return list(self._words[text])

    def sent_tokenize(self, text: str) -> list[str]:
        return [text[a:b] for a, b in self.span_tokenize(text)]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        if text not in self._spans:
            self._spans[text] = self._inner.span_tokenize(text)
        return list(self._spans[text])


WORDS: WordTokenizer = ShippedWords()  # main() swaps in WhitespaceWords() for --words whitespace


def _dt_verdict(flt: Any, text: str) -> tuple[str | None, str]:
    """datatrove's drop reason (None: kept) and the text it leaves."""
    doc = Document(text=text, id="x")
    result = flt.filter(doc)
    if result is True:
        return None, doc.text
    return (result[1] if isinstance(result, tuple) else "dropped"), doc.text


# ---------------------------------------------------------------- C4


def c4_pair(words: int, sentences: int, page_rules: bool) -> tuple[C4Config, C4QualityFilter]:
    ours = C4Config(
        enabled=True,
        end_marks=(".", "?", "!", '"', "'"),  # datatrove's END_PUNCTUATION
        min_words_per_line=words,
        min_sentences=sentences if page_rules else None,
        drop_lorem_ipsum=page_rules,
        drop_curly_bracket=page_rules,
    )
    theirs = C4QualityFilter(
        min_words_per_line=words,
        min_num_sentences=sentences if page_rules else -1,
        filter_lorem_ipsum=page_rules,
        filter_curly_bracket=page_rules,
        language=WORDS,  # type: ignore[arg-type]  # a WordTokenizer is accepted for custom tokenizers
    )
    return ours, theirs


def compare_c4(docs: list[tuple[str, str]], words: int, sentences: int) -> dict[str, Any]:
    ours, theirs = c4_pair(words, sentences, page_rules=False)
    lines_total = only_ours = only_theirs = 0
    line_examples: dict[str, list[str]] = {"kept_by_ours_only": [], "kept_by_datatrove_only": []}
    for doc_id, text in docs:
        a = Counter(c4_page(text, ours)[0].split("\n"))
        b = Counter(_dt_verdict(theirs, text)[1].split("\n"))
        a.pop("", None), b.pop("", None)
        lines_total += sum(1 for line in text.splitlines() if line.strip())
        for side, diff in (("kept_by_ours_only", a - b), ("kept_by_datatrove_only", b - a)):
            n = sum(diff.values())
            if n and len(line_examples[side]) < 3:
                line_examples[side].append(f"{doc_id}: {next(iter(diff))[:100]!r}")
            if side == "kept_by_ours_only":
                only_ours += n
            else:
                only_theirs += n
    ours, theirs = c4_pair(words, sentences, page_rules=True)
    matrix: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    seconds = [0.0, 0.0]
    for doc_id, text in docs:
        t0 = time.process_time()
        mine = c4_page(text, ours)[1]
        t1 = time.process_time()
        their = _dt_verdict(theirs, text)[0]
        seconds[0] += t1 - t0
        seconds[1] += time.process_time() - t1
        key = f"ours={'drop' if mine else 'keep'} datatrove={'drop' if their else 'keep'}"
        matrix[key] += 1
        if bool(mine) != bool(their) or (mine and their and mine.removeprefix("c4_") != their):
            kind = f"ours={mine} datatrove={their}"
            examples.setdefault(kind, [])
            if len(examples[kind]) < 3:
                examples[kind].append(doc_id)
    agree = sum(v for k, v in matrix.items() if k.split()[0][5:] == k.split()[1][10:])
    return {
        "min_words_per_line": words,
        "min_sentences": sentences,
        "lines": {
            "total_nonblank": lines_total,
            "kept_by_ours_only": only_ours,
            "kept_by_datatrove_only": only_theirs,
            "agreement": 1 - (only_ours + only_theirs) / max(lines_total, 1),
            "examples": line_examples,
        },
        "pages": {"matrix": dict(matrix), "agreement": agree / len(docs), "disagreements": examples},
        "cpu_s": {"ours": round(seconds[0], 3), "datatrove": round(seconds[1], 3)},
    }


# ---------------------------------------------------------------- Gopher

OFF: dict[str, Any] = {  # every rule off (the stop-word lists stay: min_stop_words=None turns the rule off)
    **{f.name: None for f in dataclasses.fields(QualityConfig) if f.name not in ("enabled", "stop_words")},
    "top_ngram_max_fraction": (),
    "dup_ngram_max_fraction": (),
}
GQ_OFF = dict(
    min_doc_words=None,
    max_doc_words=None,
    min_avg_word_length=None,
    max_avg_word_length=None,
    max_symbol_word_ratio=None,
    max_bullet_lines_ratio=None,
    max_ellipsis_lines_ratio=None,
    max_non_alpha_words_ratio=None,
    min_stop_words=None,
)
GR_OFF = dict(
    dup_line_frac=None,
    dup_para_frac=None,
    dup_line_char_frac=None,
    dup_para_char_frac=None,
    top_n_grams=(),
    dup_n_grams=(),
)
Q, R = GopherQualityFilter, GopherRepetitionFilter
SPLIT_SYMBOL = {
    "hash_word_ratio": "gopher_too_many_hashes",
    "ellipsis_word_ratio": "gopher_too_many_ellipsis",
}
# (our rule, our QualityConfig kwargs with only it on, datatrove filter, its kwargs with only the matching rule on)
GOPHER_ROWS: list[tuple[str, dict[str, Any], type, dict[str, Any]]] = [
    ("too_few_words", {"min_words": 50}, Q, {"min_doc_words": 50}),
    ("too_many_words", {"max_words": 100_000}, Q, {"max_doc_words": 100_000}),
    (
        "mean_word_length",
        {"min_mean_word_length": 3.0, "max_mean_word_length": 10.0},
        Q,
        {"min_avg_word_length": 3, "max_avg_word_length": 10},
    ),
    ("symbol_ratio", {"max_symbol_word_ratio": 0.1}, Q, {"max_symbol_word_ratio": 0.1}),
    ("hash_word_ratio", {"max_symbol_word_ratio": 0.1}, Q, {"max_symbol_word_ratio": 0.1}),
    ("ellipsis_word_ratio", {"max_symbol_word_ratio": 0.1}, Q, {"max_symbol_word_ratio": 0.1}),
    ("bullet_lines", {"max_bullet_line_fraction": 0.9}, Q, {"max_bullet_lines_ratio": 0.9}),
    ("ellipsis_lines", {"max_ellipsis_line_fraction": 0.3}, Q, {"max_ellipsis_lines_ratio": 0.3}),
    ("alpha_word_fraction", {"min_alpha_word_fraction": 0.8}, Q, {"max_non_alpha_words_ratio": 0.8}),
    ("stop_words", {"min_stop_words": 2}, Q, {"min_stop_words": 2}),
    ("dup_line_fraction", {"max_dup_line_fraction": 0.3}, R, {"dup_line_frac": 0.3}),
    ("dup_line_char_fraction", {"max_dup_line_char_fraction": 0.2}, R, {"dup_line_char_frac": 0.2}),
    ("dup_para_fraction", {"max_dup_para_fraction": 0.3}, R, {"dup_para_frac": 0.3}),
    ("dup_para_char_fraction", {"max_dup_para_char_fraction": 0.2}, R, {"dup_para_char_frac": 0.2}),
    (
        "top_ngram_fraction",
        {"top_ngram_max_fraction": ((2, 0.2), (3, 0.18), (4, 0.16))},
        R,
        {"top_n_grams": ((2, 0.2), (3, 0.18), (4, 0.16))},
    ),
    (
        "dup_ngram_fraction",
        {"dup_ngram_max_fraction": tuple((n, round(0.2 - n / 100, 2)) for n in range(5, 11))},
        R,
        {"dup_n_grams": tuple((n, round(0.2 - n / 100, 2)) for n in range(5, 11))},
    ),
]


def _our_reasons(texts: list[str], cfg: QualityConfig) -> list[str | None]:
    """Our decisions; a rule that needs the document's language (stop words) is told English."""
    if "languages" in inspect.signature(check_quality_batch).parameters:
        return check_quality_batch(texts, cfg, languages=["en"] * len(texts))  # type: ignore[call-arg]
    return check_quality_batch(texts, cfg)


def _symbol_reason() -> str | None:
    """The reason our symbol rule gives a document full of ``#``: ``symbol_ratio`` (one rule over the sum of
    ``#`` and ellipses) or ``hash_word_ratio`` (the paper's two ratios, once split)."""
    fields = {f.name for f in dataclasses.fields(QualityConfig)}
    cfg = QualityConfig(**{**{k: v for k, v in OFF.items() if k in fields}, "max_symbol_word_ratio": 0.1})
    return _our_reasons(["# word " * 30], cfg)[0]


def _skip_reason(rule: str, kwargs: dict[str, Any], fields: set[str], symbol: str | None) -> str | None:
    missing = sorted(set(kwargs) - fields)
    if missing:
        return f"QualityConfig has no {', '.join(missing)} in this checkout"
    if rule in ("hash_word_ratio", "ellipsis_word_ratio", "symbol_ratio") and (rule == "symbol_ratio") != (
        symbol == "symbol_ratio"
    ):
        return f"our symbol rule reports {symbol!r} in this checkout"
    return None


def compare_gopher(docs: list[tuple[str, str]]) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(QualityConfig)}
    symbol = _symbol_reason()
    out: dict[str, Any] = {}
    texts = [t for _, t in docs]
    for rule, kwargs, cls, dt_kwargs in GOPHER_ROWS:
        skip = _skip_reason(rule, kwargs, fields, symbol)
        if skip:
            print(f"gopher {rule}: skipped ({skip})")
            continue
        cfg = QualityConfig(**{**{k: v for k, v in OFF.items() if k in fields}, **kwargs})
        theirs = cls(**{**(GQ_OFF if cls is Q else GR_OFF), **dt_kwargs}, language=WORDS)
        t0 = time.process_time()
        mine = _our_reasons(texts, cfg)
        t1 = time.process_time()
        their = [_dt_verdict(theirs, t)[0] for t in texts]
        t2 = time.process_time()
        if (
            rule in SPLIT_SYMBOL
        ):  # one ratio of the paper's symbol rule: only that ratio's drops on both sides
            their = [r if r == SPLIT_SYMBOL[rule] else None for r in their]
            mine = [r if r == rule else None for r in mine]
        cpu = {"cpu_s": {"ours": round(t1 - t0, 3), "datatrove": round(t2 - t1, 3)}}
        out[rule] = _matrix(docs, mine, their) | cpu
    out["all"] = _compare_all(docs)
    return out


def _compare_all(docs: list[tuple[str, str]]) -> dict[str, Any]:
    """Every Gopher rule at once: our defaults (without our character bounds, which datatrove lacks) against
    ``GopherQualityFilter`` then ``GopherRepetitionFilter`` at their defaults: kept or dropped."""
    cfg = QualityConfig(min_chars=None, max_chars=None)
    quality, repetition = Q(language=WORDS), R(language=WORDS)  # type: ignore[arg-type]
    mine = _our_reasons([t for _, t in docs], cfg)
    their = [_dt_verdict(quality, t)[0] or _dt_verdict(repetition, t)[0] for _, t in docs]
    return _matrix(docs, mine, their)


def _matrix(docs: list[tuple[str, str]], mine: list[str | None], their: list[str | None]) -> dict[str, Any]:
    matrix: Counter[str] = Counter()
    examples: dict[str, list[str]] = {"ours_drop_datatrove_keep": [], "ours_keep_datatrove_drop": []}
    for (doc_id, _), a, b in zip(docs, mine, their, strict=True):
        matrix[f"ours={'drop' if a else 'keep'} datatrove={'drop' if b else 'keep'}"] += 1
        if bool(a) != bool(b):
            kind = "ours_drop_datatrove_keep" if a else "ours_keep_datatrove_drop"
            if len(examples[kind]) < 3:
                examples[kind].append(doc_id)
    agree = sum(1 for a, b in zip(mine, their, strict=True) if bool(a) == bool(b))
    # per kind of document (changelog, man, ...): the figure depends on the machine's mix of them
    by_kind: dict[str, list[int]] = {}
    for (doc_id, _), a, b in zip(docs, mine, their, strict=True):
        counts = by_kind.setdefault(doc_id.split(":")[0], [0, 0])
        counts[0] += bool(a) == bool(b)
        counts[1] += 1
    return {
        "matrix": dict(matrix),
        "agreement": agree / len(docs),
        "agreement_by_kind": {kind: round(n / total, 4) for kind, (n, total) in sorted(by_kind.items())},
        "disagreements": examples,
    }


# ---------------------------------------------------------------- report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=OUT)
    parser.add_argument(
        "--words",
        choices=("datatrove", "whitespace"),
        default="datatrove",
        help="datatrove's words and sentences: as it ships (spaCy, default) or whitespace (adjusted)",
    )
    args = parser.parse_args()
    global WORDS
    if args.words == "whitespace":
        WORDS = WhitespaceWords()
    docs = documents()
    mb = sum(len(t.encode()) for _, t in docs) / 1e6
    print(f"{len(docs)} documents, {mb:.1f} MB: {dict(Counter(d.split(':')[0] for d, _ in docs))}")
    t0 = time.process_time()
    for _, text in docs:
        c4_page(text, C4Config(enabled=True))
    c4_mbs = mb / (time.process_time() - t0)
    print(f"our C4 (defaults): {c4_mbs:.1f} MB/s per core")
    report: dict[str, Any] = {
        "documents": len(docs),
        "mb": round(mb, 2),
        "c4_mb_per_s": round(c4_mbs, 1),
        "words": args.words,
        "c4": [],
    }
    for words, sentences in ((5, 3), (3, 5)):  # ours (the JMLR paper, TFDS) and datatrove's defaults
        c4 = compare_c4(docs, words, sentences)
        report["c4"].append(c4)
        print(f"\nC4 min_words_per_line={words} min_sentences={sentences}")
        print(f"  lines: {json.dumps(c4['lines'], indent=None)}")
        print(f"  pages: agreement {c4['pages']['agreement']:.4f} {c4['pages']['matrix']}")
        for kind, ids in c4["pages"]["disagreements"].items():
            print(f"    {kind}: {ids}")
        print(f"  cpu s: {c4['cpu_s']}")
    report["gopher"] = compare_gopher(docs)
    print("\nGopher, one rule at a time")
    for rule, row in report["gopher"].items():
        print(f"  {rule:24s} agreement {row['agreement']:.4f} {row['matrix']}")
        print(f"    by kind: {row['agreement_by_kind']}")
        for kind, ids in row["disagreements"].items():
            if ids:
                print(f"    {kind}: {ids}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nfigures in {args.out}")


if __name__ == "__main__":
    main()
