"""The clean stage: normalise each document (``normalize.py``), remove the corpus-wide boilerplate lines
(``boilerplate.py``), drop the documents that fail a quality rule (``quality.py``), count every drop and repair.
"""

from __future__ import annotations

from collections import Counter

from pipeline.clean.boilerplate import load_boilerplate
from pipeline.clean.config import CleanConfig
from pipeline.clean.normalize import normalize_text, normalize_whitespace, remove_boilerplate
from pipeline.clean.quality import check_quality_batch
from pipeline.records import Record, iter_part_batches, write_part
from pipeline.storage import ObjectStore
from pipeline.units import StageStats, part_done, read_part_stats


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def clean_text(text: str, cfg: CleanConfig, boilerplate: frozenset[int], counts: Counter[str]) -> str:
    """Normalise one document and remove its boilerplate lines (steps 0-5 of ``pipeline.clean.normalize``)."""
    text = normalize_text(text, cfg, counts)
    if boilerplate and cfg.boilerplate.enabled and text:
        text, removed = remove_boilerplate(text, boilerplate, cfg.boilerplate.min_line_chars)
        if removed:
            counts["boilerplate_lines_removed"] += removed
            counts["docs_with_boilerplate"] += 1
            if cfg.normalize_whitespace:
                text = normalize_whitespace(text, cfg.max_blank_lines)
    return text


def clean_batch(
    records: list[Record], cfg: CleanConfig, boilerplate: frozenset[int] = frozenset()
) -> tuple[list[Record], StageStats]:
    """Clean a batch; every dropped document is counted by reason, every repair in ``stats.extra``."""
    stats = StageStats(stage="clean", docs_in=len(records))
    counts: Counter[str] = Counter()
    texts = [clean_text(rec.text, cfg, boilerplate, counts) for rec in records]
    empty = [not text.strip() for text in texts]
    reasons = iter(check_quality_batch([t for t, e in zip(texts, empty, strict=True) if not e], cfg.quality))
    out: list[Record] = []
    for rec, text, is_empty in zip(records, texts, empty, strict=True):
        stats.bytes_in += _utf8_len(rec.text)
        reason = "empty_after_clean" if is_empty else next(reasons)
        if reason is not None:
            stats.drop(reason)
            continue
        out.append(Record(rec.id, text, rec.source, rec.meta))
        stats.bytes_out += _utf8_len(text)
    stats.docs_out = len(out)
    chars_removed = sum(map(len, (r.text for r in records))) - sum(map(len, texts))
    stats.extra = {"chars_removed": chars_removed, **{k: counts[k] for k in sorted(counts)}}
    for key in ("mojibake_fixed", "nul_removed", "boilerplate_lines_removed", "docs_with_boilerplate"):
        stats.extra.setdefault(key, 0)
    return out, stats


def run_clean_part(
    store: ObjectStore,
    in_folder: str,
    out_folder: str,
    index: int,
    cfg: CleanConfig,
    boilerplate_key: str | None = None,
) -> StageStats:
    """Clean one part; a rerun returns the stored stats of a part already done."""
    if part_done(store, out_folder, index):
        return read_part_stats(store, out_folder, index)
    boilerplate = load_boilerplate(store, boilerplate_key) if boilerplate_key else frozenset()
    stats = StageStats(stage="clean")
    kept: list[Record] = []
    for batch in iter_part_batches(store, in_folder, index):
        out, batch_stats = clean_batch(batch, cfg, boilerplate)
        kept.extend(out)
        stats.merge(batch_stats)
    stats.extra.setdefault("chars_removed", 0)
    stats.extra["boilerplate_set_size"] = len(boilerplate)
    write_part(store, out_folder, index, kept, stats)
    return stats
