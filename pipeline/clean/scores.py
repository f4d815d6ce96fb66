"""The arithmetic of a classifier's scores (no model needed): ``keep_fraction``'s cut per source, the filter step
that applies it to a part, and the per-source histogram of scores that the data card shows.

``keep_fraction`` keeps the best-scored ``round(keep_fraction * n)`` documents of each source of ``n`` scored
documents (at least one): clean writes every part with each kept document's ``quality_score`` in its meta, then
one global step (:func:`write_cuts`) reads only the ``id`` and ``meta`` columns of every part, ranks each source's
documents by score (highest first), then by id, and writes the last kept ``[score, id]`` per source; the filter
(:func:`run_classifier_filter_part`) keeps a document when it ranks at or before that cut. Ties are broken by id,
so the count kept is exact and the same on every run and for every part order.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from pipeline.records import Record, iter_part_batches, quality_score, write_part
from pipeline.sources import provenance, tally_document
from pipeline.storage import ObjectStore
from pipeline.units.protocol import StageStats, checked_bytes, part_done, part_name, read_part_stats

DROP_REASON = "classifier_low"
STAGE = "classifier"  # the stats of the keep_fraction filter (a stage of the data card's waterfall)
HIST_BINS = 10  # the data card's histogram of scores per source: bins of width 0.1 over [0, 1]
HIST_KEY = "quality_score_hist"  # stats.extra keys "quality_score_hist.<source>.<bin>" (summed across parts)


def keep_count(total: int, keep_fraction: float) -> int:
    """How many of a source's ``total`` scored documents ``keep_fraction`` keeps (rounded half up, at least one
    of a non-empty source)."""
    return 0 if total == 0 else max(1, min(total, math.floor(keep_fraction * total + 0.5)))


def source_cuts(
    scored: Mapping[str, Iterable[tuple[float, str]]], keep_fraction: float
) -> dict[str, list[Any]]:
    """Per source, the last kept ``[score, doc_id]`` when its documents are ranked by score (highest first),
    then by id: a document is kept when it ranks at or before it (:func:`kept_by_cut`)."""
    cuts: dict[str, list[Any]] = {}
    for source, pairs in sorted(scored.items()):
        ranked = sorted(pairs, key=lambda p: (-p[0], p[1]))
        if ranked:
            score, doc_id = ranked[keep_count(len(ranked), keep_fraction) - 1]
            cuts[source] = [score, doc_id]
    return cuts


def kept_by_cut(score: float | None, doc_id: str, cut: Sequence[Any] | None) -> bool:
    if score is None or cut is None:  # not scored, or a source the global step saw no document of
        return True
    return score > cut[0] or (score == cut[0] and doc_id <= cut[1])


def write_cuts(store: ObjectStore, folder: str, num_parts: int, keep_fraction: float, key: str) -> str:
    """The global step of ``keep_fraction``: each source's cut over the scores of every part of ``folder``,
    written to ``key`` (JSON); returns ``key``."""
    scored: dict[str, list[tuple[float, str]]] = {}
    for index in range(num_parts):
        data = checked_bytes(store, f"{folder}/{part_name(index)}.parquet")
        table = pq.read_table(io.BytesIO(data), columns=["id", "meta"])
        for doc_id, meta in zip(
            table.column("id").to_pylist(), table.column("meta").to_pylist(), strict=True
        ):
            if (score := quality_score(meta)) is not None:
                scored.setdefault(provenance(meta)[0], []).append((score, doc_id))
    cuts = source_cuts(scored, keep_fraction)
    body = {
        "keep_fraction": keep_fraction,
        "cuts": cuts,
        "scored": {k: len(v) for k, v in sorted(scored.items())},
    }
    store.put_bytes(key, json.dumps(body, sort_keys=True).encode())
    return key


def run_classifier_filter_part(
    store: ObjectStore, in_folder: str, out_folder: str, index: int, cuts_key: str
) -> StageStats:
    """Keep the documents of one part that rank at or before their source's cut; the others are counted under
    ``classifier_low`` per source. A rerun returns the stored stats."""
    if part_done(store, out_folder, index):
        return read_part_stats(store, out_folder, index)
    cuts = json.loads(store.get_bytes(cuts_key))["cuts"]
    stats, kept = StageStats(stage=STAGE), []
    for batch in iter_part_batches(store, in_folder, index):
        kept.extend(_filter_batch(batch, cuts, stats))
    write_part(store, out_folder, index, kept, stats)
    return stats


def _filter_batch(batch: list[Record], cuts: Mapping[str, Sequence[Any]], stats: StageStats) -> list[Record]:
    kept = []
    for rec in batch:
        nbytes = len(rec.text.encode("utf-8", "surrogatepass"))
        stats.docs_in += 1
        stats.bytes_in += nbytes
        if kept_by_cut(quality_score(rec.meta), rec.id, cuts.get(provenance(rec.meta)[0])):
            kept.append(rec)
            stats.docs_out += 1
            stats.bytes_out += nbytes
            tally_document(stats, None, rec.id, rec.text, rec.source, rec.meta, nbytes, nbytes)
        else:
            stats.drop(DROP_REASON)
            tally_document(stats, DROP_REASON, rec.id, rec.text, rec.source, rec.meta, nbytes)
    return kept


def add_histogram(extra: dict[str, Any], source: str, scores: Iterable[float]) -> None:
    """Count ``scores`` into ``extra`` as ``quality_score_hist.<source>.<bin>`` (bins of width 1/HIST_BINS)."""
    values = np.fromiter(scores, dtype=np.float64)
    if not len(values):
        return
    bins = np.minimum((values * HIST_BINS).astype(np.int64), HIST_BINS - 1)
    for b, count in zip(*np.unique(bins, return_counts=True), strict=True):
        key = f"{HIST_KEY}.{source}.{int(b)}"
        extra[key] = extra.get(key, 0) + int(count)


def histograms(extra: Mapping[str, Any]) -> dict[str, list[int]]:
    """The per-source histograms counted by :func:`add_histogram` (HIST_BINS counts each)."""
    out: dict[str, list[int]] = {}
    for key, value in extra.items():
        if key.startswith(HIST_KEY + ".") and isinstance(value, int):
            source, _, b = key[len(HIST_KEY) + 1 :].rpartition(".")
            out.setdefault(source, [0] * HIST_BINS)[int(b)] += value
    return dict(sorted(out.items()))
