"""The clean stage: normalise each document (``normalize.py``), remove the corpus-wide boilerplate lines
(``boilerplate.py``), identify its language (``pipeline.clean.langid``: ``language`` and ``language_score`` in the
meta; a language outside ``langid.allow`` or a score under ``langid.min_score`` drops it), drop the documents
that fail a quality rule (``quality.py``; before langid, C4's rules when enabled: ``c4.py``; the stop-word
rule, ``stopwords.py``, once the language is known), redact the kept ones' email and public IP addresses
(``pii.py``; web inputs only by default), score them with a fastText quality classifier when one is configured
(``classifier.py``: ``quality_score`` in the meta, a drop under ``min_score``), count every drop, repair and
replacement. Each document is cleaned
with its source's overrides (``pipeline.sources``: language filter, quality thresholds).

A build normalises once: its ingest writes each part normalised (``run_ingest_part(normalize=normalizer(cfg))``,
counting the repairs in the ingest stats), and the boilerplate count and this stage read such a part as it is
(``pipeline.clean.boilerplate.input_normalized``), with the same output as normalising here.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from pipeline.clean import langid, normalize, wordscan
from pipeline.clean.boilerplate import input_normalized, load_boilerplate
from pipeline.clean.c4 import BadWords, apply_c4, load_bad_words
from pipeline.clean.classifier import QualityModel, load_classifier
from pipeline.clean.config import CleanConfig, QualityConfig
from pipeline.clean.langid import LangIdConfig, identify_batch, language_verdict
from pipeline.clean.normalize import normalize_text, normalize_whitespace, remove_boilerplate
from pipeline.clean.pii import redact_document
from pipeline.clean.quality import check_quality_batch
from pipeline.clean.scores import DROP_REASON, add_histogram
from pipeline.clean.stopwords import stop_word_reason
from pipeline.clean.url import UrlRules, load_url_rules
from pipeline.records import QUALITY_SCORE, Record, iter_part_batches, web_fields, write_part
from pipeline.sources import SOURCE_NAME, SourceConfig, provenance, tally_document
from pipeline.storage import ObjectStore
from pipeline.units.protocol import StageStats, done_part_stats


def missing_kernels() -> list[str]:
    """The compiled kernels of the clean stage that this install lacks (built by ``pip install`` where a C
    compiler is found): without them clean takes its numpy and Python paths, same output, about 1.7x the CPU."""
    kernels = {
        "pipeline.clean._langid_walk": langid.walk_kernel,
        "pipeline.clean._lines": normalize.lines_kernel,
        "pipeline.clean._wordscan": wordscan.scan_kernel,
    }
    return [name for name, module in kernels.items() if module is None]


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def clean_text(
    text: str, cfg: CleanConfig, boilerplate: frozenset[int], counts: Counter[str], normalized: bool = False
) -> str:
    """Normalise one document (unless ``normalized``: ingest did) and remove its boilerplate lines (steps 0-5
    of ``pipeline.clean.normalize``)."""
    if not normalized:
        text = normalize_text(text, cfg, counts)
    if boilerplate and cfg.boilerplate.enabled and text:
        text, removed = remove_boilerplate(text, boilerplate, cfg.boilerplate.min_line_chars)
        if removed:
            counts["boilerplate_lines_removed"] += removed
            counts["docs_with_boilerplate"] += 1
            if cfg.normalize_whitespace:  # normalised text with whole lines out: only blank-line runs and
                # the ends can need it again (no Unicode space, carriage return or trailing space appears)
                text = normalize_whitespace(text, cfg.max_blank_lines, unicode_spaces=False)
    return text


def _url_reasons(records: list[Record], rules: UrlRules | None) -> list[str | None]:
    """The URL rules' drop reason of each document (None: kept, or no URL, or no rules)."""
    if rules is None:
        return [None] * len(records)
    return [(rules.reason(url) if (url := web_fields(rec.meta)[0]) else None) for rec in records]


def _blank(text: str) -> bool:
    return not text or text.isspace()  # ``not text.strip()`` without copying the text


def _languages(texts: list[str], cfg: LangIdConfig, wanted: list[bool]) -> list[tuple[str, float] | None]:
    todo = [
        i for i, (t, w) in enumerate(zip(texts, wanted, strict=True)) if cfg.enabled and w and not _blank(t)
    ]
    found: list[tuple[str, float] | None] = [None] * len(texts)
    for i, lang in zip(todo, identify_batch([texts[i] for i in todo], cfg.sample_chars), strict=True):
        found[i] = lang
    return found


def _langid_drops(cfg: LangIdConfig) -> bool:
    """Whether the language check can drop a document (an allow-list or a minimum score)."""
    return cfg.enabled and (bool(cfg.allow) or cfg.min_score > 0.0)


def _stop_word_reasons(
    texts: list[str], langs: list[tuple[str, float] | None], reasons: list[str | None], cfg: QualityConfig
) -> list[str | None]:
    """The stop-word rule on the documents that pass the other rules, now that their language is known (None
    where language identification is off: only a ``"*"`` list applies)."""
    return [
        reason or stop_word_reason(text, lang[0] if lang else None, cfg)
        for text, lang, reason in zip(texts, langs, reasons, strict=True)
    ]


def _with_language(
    meta: str, found: tuple[str, float] | None, counts: Counter[str], score: float | None = None
) -> str:
    """``meta`` with the language (and the quality score) set; counts the kept document under its source."""
    data = json.loads(meta) if meta else {}
    if isinstance(data, dict) and SOURCE_NAME in data:
        counts[f"source.{data[SOURCE_NAME]}"] += 1
    if (found is None and score is None) or not isinstance(data, dict):
        return meta
    if found is not None:
        data["language"], data["language_score"] = found
    if score is not None:
        data[QUALITY_SCORE] = score
    return json.dumps(data, ensure_ascii=False)


def _classify(
    records: list[Record],
    texts: list[str],
    reasons: list[str | None],
    cfg: CleanConfig,
    model: QualityModel,
    counts: Counter[str],
) -> tuple[list[str], list[str | None], list[float | None], dict[str, int]]:
    """Redact the documents the rules keep, score the redacted text (what is published), drop those under
    ``min_score``; the texts, reasons, scores and the histogram counts of the scores per source."""
    todo = [i for i, r in enumerate(reasons) if r is None]
    texts, reasons, found = list(texts), list(reasons), {}
    for i in todo:  # redaction counts only for the documents kept in the end
        found[i] = Counter[str]()
        texts[i] = redact_document(texts[i], records[i].source, records[i].meta, cfg.pii, found[i])
    scores: list[float | None] = [None] * len(texts)
    by_source: dict[str, list[float]] = {}
    low = cfg.classifier.min_score if cfg.classifier else None
    cut = cfg.classifier.max_chars if cfg.classifier else None
    for i, score in zip(todo, model.score([texts[i] for i in todo], cut), strict=True):
        scores[i] = score
        by_source.setdefault(provenance(records[i].meta)[0], []).append(score)
        if low is not None and score < low:
            reasons[i] = DROP_REASON
        else:
            counts.update(found[i])
    hist: dict[str, int] = {}
    for source, values in by_source.items():
        add_histogram(hist, source, values)
    return texts, reasons, scores, hist


def clean_batch(
    records: list[Record],
    cfg: CleanConfig,
    boilerplate: frozenset[int] = frozenset(),
    normalized: bool = False,
    bad_words: BadWords | None = None,
    url_rules: UrlRules | None = None,
    classifier: QualityModel | None = None,
) -> tuple[list[Record], StageStats]:
    """Clean a batch; every dropped document is counted by reason, every repair in ``stats.extra``.
    ``normalized``: the texts are already normalised with ``cfg`` (a build's ingest does it), so steps 0-4 are
    skipped. ``bad_words``: C4's list when loaded already (else read from ``cfg.c4.bad_words_file``);
    ``url_rules``: the URL rules when loaded already (else read from ``cfg.url``); ``classifier``: the model of
    ``cfg.classifier`` when loaded already."""
    kept, stats = _clean_indexed(records, cfg, boilerplate, normalized, bad_words, url_rules, classifier)
    return [r for _, r in kept], stats


def clean_batch_by_source(
    records: list[Record],
    cfg: CleanConfig,
    boilerplate: frozenset[int] = frozenset(),
    per_source: Sequence[CleanConfig] = (),
    normalized: bool = False,
    bad_words: BadWords | None = None,
    url_rules: UrlRules | None = None,
    classifier: QualityModel | None = None,
) -> tuple[list[Record], StageStats]:
    """:func:`clean_batch` with the config of each document's source entry (``per_source[entry]``, from
    :func:`source_clean_configs`), in the batch's order."""
    if len(set(per_source)) <= 1:
        only = per_source[0] if per_source else cfg
        return clean_batch(records, only, boilerplate, normalized, bad_words, url_rules, classifier)
    groups: dict[int, list[int]] = {}
    for i, rec in enumerate(records):
        entry = provenance(rec.meta)[1]
        groups.setdefault(entry if entry < len(per_source) else -1, []).append(i)
    kept: list[tuple[int, Record]] = []
    stats = StageStats(stage="clean")
    for entry, members in groups.items():
        group_cfg = per_source[entry] if entry >= 0 else cfg
        group = [records[i] for i in members]
        out, group_stats = _clean_indexed(
            group, group_cfg, boilerplate, normalized, bad_words, url_rules, classifier
        )
        kept += [(members[j], r) for j, r in out]
        stats.merge(group_stats)
    return [r for _, r in sorted(kept, key=lambda x: x[0])], stats


def source_clean_configs(cfg: CleanConfig, sources: Sequence[SourceConfig]) -> list[CleanConfig]:
    """The clean config of each source entry: the corpus-wide one with the source's overrides."""
    return [replace(cfg, langid=s.langid or cfg.langid, quality=s.quality or cfg.quality) for s in sources]


def _clean_indexed(
    records: list[Record],
    cfg: CleanConfig,
    boilerplate: frozenset[int],
    normalized: bool = False,
    bad_words: BadWords | None = None,
    url_rules: UrlRules | None = None,
    classifier: QualityModel | None = None,
) -> tuple[list[tuple[int, Record]], StageStats]:
    stats = StageStats(stage="clean", docs_in=len(records))
    counts: Counter[str] = Counter()
    texts = [clean_text(rec.text, cfg, boilerplate, counts, normalized) for rec in records]
    early = _url_reasons(records, url_rules or load_url_rules(cfg.url, None))
    early = [e or ("empty_after_clean" if _blank(t) else None) for e, t in zip(early, texts, strict=True)]
    if cfg.c4.enabled:  # C4 removes lines and drops pages before langid and the quality rules see the text
        words = bad_words or load_bad_words(cfg.c4.bad_words_file, None)
        texts, early = apply_c4(texts, early, cfg.c4, counts, words)
    if _langid_drops(cfg.langid):  # the language check first: what it drops is not scored for quality
        langs = _languages(texts, cfg.langid, [e is None for e in early])
        early = [
            e or (language_verdict(*lang, cfg.langid) if lang else None)
            for e, lang in zip(early, langs, strict=True)
        ]
    quality = iter(
        check_quality_batch([t for t, e in zip(texts, early, strict=True) if e is None], cfg.quality)
    )
    reasons = [e or next(quality) for e in early]
    if not _langid_drops(cfg.langid):  # it only annotates: identify the documents that are kept, no others
        langs = _languages(texts, cfg.langid, [r is None for r in reasons])
    reasons = _stop_word_reasons(texts, langs, reasons, cfg.quality)
    scores: list[float | None] = [None] * len(records)
    hist: dict[str, int] = {}
    cleaned = texts  # chars_removed counts clean's removals, not the redactions
    if cfg.classifier is not None:
        model = classifier or load_classifier(cfg.classifier, None)
        texts, reasons, scores, hist = _classify(records, texts, reasons, cfg, model, counts)
    out: list[tuple[int, Record]] = []
    for i, (rec, text, lang, reason, score) in enumerate(
        zip(records, texts, langs, reasons, scores, strict=True)
    ):
        stats.bytes_in += (nbytes := _utf8_len(rec.text))
        if reason is not None:
            stats.drop(reason)
            tally_document(
                stats, reason, rec.id, rec.text, rec.source, rec.meta, nbytes, language=lang and lang[0]
            )
            continue
        if cfg.classifier is None:  # else redacted before scoring
            text = redact_document(text, rec.source, rec.meta, cfg.pii, counts)  # kept documents only
        out.append((i, Record(rec.id, text, rec.source, _with_language(rec.meta, lang, counts, score))))
        stats.bytes_out += (kept_bytes := _utf8_len(text))
        tally_document(stats, None, rec.id, text, rec.source, rec.meta, nbytes, kept_bytes, lang and lang[0])
        if lang is not None:
            counts[f"language.{lang[0]}"] += 1
    stats.docs_out = len(out)
    chars_removed = sum(map(len, (r.text for r in records))) - sum(map(len, cleaned))
    stats.extra = {"chars_removed": chars_removed, **{k: counts[k] for k in sorted(counts)}, **hist}
    repairs = () if normalized else ("mojibake_fixed", "nul_removed")  # else counted by ingest
    for key in (*repairs, "boilerplate_lines_removed", "docs_with_boilerplate"):
        stats.extra.setdefault(key, 0)
    return out, stats


def run_clean_part(
    store: ObjectStore,
    in_folder: str,
    out_folder: str,
    index: int,
    cfg: CleanConfig,
    boilerplate_key: str | None = None,
    sources: Sequence[SourceConfig] = (),
) -> StageStats:
    """Clean one part (each document with its source's overrides); a rerun returns the stored stats. A part
    that ingest wrote normalised (its stats say ``normalized_parts``; a build's ingest normalises with the same
    ``cfg``, and the unit keys chain so) is not normalised again."""
    if (done := done_part_stats(store, out_folder, index)) is not None:
        return done
    normalized = input_normalized(store, in_folder, index)
    boilerplate = load_boilerplate(store, boilerplate_key) if boilerplate_key else frozenset()
    bad_words = load_bad_words(cfg.c4.bad_words_file, store.s3) if cfg.c4.enabled else None
    url_rules = load_url_rules(cfg.url, store.s3)
    classifier = load_classifier(cfg.classifier, store.s3) if cfg.classifier else None
    stats = StageStats(stage="clean")
    per_source = source_clean_configs(cfg, sources)
    kept: list[Record] = []
    for batch in iter_part_batches(store, in_folder, index):
        out, batch_stats = clean_batch_by_source(
            batch, cfg, boilerplate, per_source, normalized, bad_words, url_rules, classifier
        )
        kept.extend(out)
        stats.merge(batch_stats)
    stats.extra.setdefault("chars_removed", 0)
    stats.extra["boilerplate_set_size"] = len(boilerplate)
    write_part(store, out_folder, index, kept, stats)
    return stats
