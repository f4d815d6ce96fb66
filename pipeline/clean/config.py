"""The clean stage's configs: text normalisation, boilerplate lines, the quality rules (``quality.py``), C4's
rules (``c4.py``), language identification (``pipeline.clean.langid``) and PII redaction (``pii.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.clean.langid import LangIdConfig
from pipeline.clean.url import UrlConfig
from pipeline.storage import STORE_URI_HELP, is_store_uri

NORMALIZATIONS = ("NFC", "NFKC")
DEFAULT_TOP_NGRAM = ((2, 0.20), (3, 0.18), (4, 0.16))
DEFAULT_DUP_NGRAM = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
# Gopher's stop words (Rae et al. 2021, appendix A), for documents identified as English
DEFAULT_STOP_WORDS = (("en", ("the", "be", "to", "of", "and", "that", "have", "with")),)
ANY_LANGUAGE = "*"  # the key of the stop-word list for every language without its own

_FRACTION_FIELDS = (
    "min_alpha_word_fraction",
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
    # ``#`` per word, and ``...`` + ``…`` per word: each ratio on its own
    max_symbol_word_ratio: float | None = 0.1
    max_bullet_line_fraction: float | None = 0.9
    max_ellipsis_line_fraction: float | None = 0.3
    # words with at least one alphabetic character, over all words
    min_alpha_word_fraction: float | None = 0.8
    max_dup_line_fraction: float | None = 0.3
    max_dup_line_char_fraction: float | None = 0.2
    max_dup_para_fraction: float | None = 0.3
    max_dup_para_char_fraction: float | None = 0.2
    # (n, max fraction of word characters in the most frequent n-gram)
    top_ngram_max_fraction: tuple[tuple[int, float], ...] = DEFAULT_TOP_NGRAM
    # (n, max fraction of word characters inside repeated occurrences of n-grams)
    dup_ngram_max_fraction: tuple[tuple[int, float], ...] = DEFAULT_DUP_NGRAM
    # occurrences of the document's language's stop words it must hold (applied once its language is known)
    min_stop_words: int | None = 2
    # (language code, its stop words); "*": the list of every language without its own (none: no rule)
    stop_words: tuple[tuple[str, tuple[str, ...]], ...] = DEFAULT_STOP_WORDS

    def __post_init__(self) -> None:
        for name in ("min_chars", "max_chars", "min_words", "max_words", "min_stop_words"):
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
        _check_stop_words(self.stop_words)

    def stop_word_list(self, language: str | None) -> tuple[str, ...]:
        """The stop words of documents in ``language`` (None: not identified): its own list, else the
        ``"*"`` list, else none (the stop-word rule does not apply)."""
        lists = dict(self.stop_words)
        found = lists.get(language) if language is not None else None
        return found if found is not None else lists.get(ANY_LANGUAGE, ())


def _check_stop_words(stop_words: tuple[tuple[str, tuple[str, ...]], ...]) -> None:
    """Each language once, each stop word a single token whose ends are letters or digits (a token is matched
    with its leading and trailing punctuation stripped, so a word ending in punctuation could never match)."""
    fix = "write stop_words as {language: [word, ...]}, e.g. {en: [the, be, to], '*': [...]}"
    languages = [language for language, _ in stop_words]
    if len(set(languages)) != len(languages):
        raise ValueError(f"QualityConfig.stop_words lists a language twice: {languages}; {fix}")
    for language, words in stop_words:
        if not isinstance(language, str) or not language or not isinstance(words, tuple):
            raise ValueError(f"QualityConfig.stop_words: bad entry {language!r}: {words!r}; {fix}")
        for word in words:
            if not isinstance(word, str) or not word or not word[0].isalnum() or not word[-1].isalnum():
                raise ValueError(
                    f"QualityConfig.stop_words[{language!r}]: {word!r} must be a word that starts and ends "
                    f"with a letter or digit (punctuation around a word is stripped before matching)"
                )
            if any(c.isspace() for c in word):
                raise ValueError(f"QualityConfig.stop_words[{language!r}]: {word!r} must be one word")


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


C4_END_MARKS = (".", "?", "!", '"')  # TFDS c4_utils._END_MARKS (datatrove adds "'")


@dataclass(frozen=True, kw_only=True)
class C4Config:
    """C4's rules (Raffel et al. 2020, section 2.2; ``pipeline/clean/c4.py`` has the table). Off by default:
    they are made for web pages and remove most code and documentation. Each sub-rule has its switch (a bool,
    or ``None`` for a threshold)."""

    enabled: bool = False
    require_terminal_punct: bool = True  # keep only lines ending in one of end_marks (and not in "...")
    end_marks: tuple[str, ...] = C4_END_MARKS
    min_words_per_line: int | None = 5  # the paper (JMLR version) and TFDS: 5; datatrove: 3
    max_word_length: int | None = 1000  # a line holding a longer whitespace word is removed
    remove_citations: bool = True  # "[1]", "[edit]", "[citation needed]" cut out of every line
    remove_javascript_lines: bool = True
    remove_policy_lines: bool = True  # "terms of use", "privacy policy", cookie notices
    drop_lorem_ipsum: bool = True
    drop_curly_bracket: bool = True
    min_sentences: int | None = 3  # the paper (JMLR version) and TFDS: 3; datatrove: 5
    # a local path or store URI (s3://, gs://, az://), one word or phrase a line; none bundled
    bad_words_file: str | None = None

    def __post_init__(self) -> None:
        for name in ("min_words_per_line", "max_word_length", "min_sentences"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"C4Config.{name} must be an int >= 1 or None (off), got {value!r}")
        if not self.end_marks or not all(isinstance(m, str) and m for m in self.end_marks):
            raise ValueError(f"C4Config.end_marks must list non-empty strings, got {self.end_marks!r}")
        path = self.bad_words_file
        if path is not None and (not path.strip() or not is_store_uri(path)):
            raise ValueError(f"C4Config.bad_words_file must be {STORE_URI_HELP} URI (or null), got {path!r}")


@dataclass(frozen=True, kw_only=True)
class PiiConfig:
    """Redaction of email addresses and publicly routable IP addresses (``pii.py``).

    ``enabled``: ``"auto"`` redacts the documents of web inputs (a source URI ending in ``.warc``,
    ``.warc.gz``, ``.wet``, ``.wet.gz``, ``.arc``, ``.arc.gz``, ``.html`` or ``.htm``) and leaves the others alone: code, documentation
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


LABEL_PREFIX = "__label__"  # fastText's default label prefix


@dataclass(frozen=True, kw_only=True)
class ClassifierConfig:
    """``model``: a fastText supervised ``.bin`` (local path, ``file://``, ``s3://``, ``gs://`` or ``az://``);
    ``label``: the class
    whose probability is the score (``hq`` or ``__label__hq``); exactly one of ``min_score`` and
    ``keep_fraction``; ``sha256``: the model's hash (set when a build starts; give it to insist on one model)."""

    model: str
    label: str = "hq"
    min_score: float | None = None
    keep_fraction: float | None = None
    # score the first max_chars characters (null: the whole document): fastText's cost grows with the text; a
    # prefix of 1,000 (FineWeb-Edu's classifier reads 512 tokens, ~2,000) keeps it a small share of clean's CPU
    max_chars: int | None = 1000
    sha256: str | None = None

    def __post_init__(self) -> None:
        m = self.model
        if not isinstance(m, str) or not m.strip() or not is_store_uri(m):
            raise ValueError(f"clean.classifier.model: {m!r} must be {STORE_URI_HELP} URI")
        if not isinstance(self.label, str) or not self.label or any(c.isspace() for c in self.label):
            raise ValueError(f"clean.classifier.label: {self.label!r} must be one label without spaces")
        if (self.min_score is None) == (self.keep_fraction is None):
            raise ValueError("clean.classifier: give exactly one of min_score and keep_fraction")
        if self.min_score is not None and not 0.0 <= self.min_score <= 1.0:
            raise ValueError(f"clean.classifier.min_score must be in [0, 1], got {self.min_score}")
        if self.keep_fraction is not None and not 0.0 < self.keep_fraction <= 1.0:
            raise ValueError(f"clean.classifier.keep_fraction must be in (0, 1], got {self.keep_fraction}")
        if self.max_chars is not None and (isinstance(self.max_chars, bool) or self.max_chars < 1):
            raise ValueError(f"clean.classifier.max_chars must be >= 1 or null, got {self.max_chars!r}")
        if self.sha256 is not None and (len(self.sha256) != 64 or not _is_hex(self.sha256)):
            raise ValueError(f"clean.classifier.sha256 must be 64 hex digits, got {self.sha256!r}")

    @property
    def fasttext_label(self) -> str:
        return self.label if self.label.startswith(LABEL_PREFIX) else LABEL_PREFIX + self.label


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text.lower())


@dataclass(frozen=True, kw_only=True)
class CleanConfig:
    normalization: Literal["NFC", "NFKC"] = "NFC"
    fix_mojibake: bool = True
    strip_control: bool = True
    normalize_whitespace: bool = True
    max_blank_lines: int = 2
    boilerplate: BoilerplateConfig = field(default_factory=BoilerplateConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    c4: C4Config = field(default_factory=C4Config)
    langid: LangIdConfig = field(default_factory=LangIdConfig)
    pii: PiiConfig = field(default_factory=PiiConfig)
    url: UrlConfig = field(default_factory=UrlConfig)  # blocklists and banned words (``url.py``)
    # a fastText quality classifier (``classifier.py``); None: off, and out of the config's dict and keys
    classifier: ClassifierConfig | None = None

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
        if not isinstance(self.c4, C4Config):
            raise ValueError("CleanConfig.c4 must be a C4Config")
        if not isinstance(self.pii, PiiConfig):
            raise ValueError("CleanConfig.pii must be a PiiConfig")
        if not isinstance(self.url, UrlConfig):
            raise ValueError("CleanConfig.url must be a UrlConfig")
        if self.classifier is not None and not isinstance(self.classifier, ClassifierConfig):
            raise ValueError("CleanConfig.classifier must be a ClassifierConfig or null")
