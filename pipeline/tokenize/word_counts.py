"""The ``counts`` trainer's per-part step: a docs part's word counts, a unit like every pass's output.

A part of the tokenizer's training sample gets a *budget*, the sample's bytes not taken by the sample's parts
before it (:func:`pipeline.tokenize.stage.sample_budgets`): its documents are counted, in order, while the bytes
counted so far are below the budget, so the parts' counts add up to the words of exactly the sample the ``hf``
trainer reads (the first ``train_sample_bytes`` of the sample parts' documents, the last one whole). A unit is
``part-NNNNN.parquet`` (``word: binary, count: int64``, sorted by word), then its stats, then ``.done``. A build
counts on the workers (``flows/build/steps.py``); the training step reads the units, and counts any part it
finds without one itself (a caller outside a build).
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.records import iter_part_batches
from pipeline.storage import ObjectStore
from pipeline.tokenize.bpe_train import count_words, merge_counts, safe_texts
from pipeline.units.protocol import StageStats, done_part_stats, finish_unit, part_unit


def budget_texts(
    store: ObjectStore, in_folder: str, index: int, budget: int, seen: StageStats
) -> Iterator[list[str]]:
    """Batches of part ``index``'s texts while the bytes before each are below ``budget`` (documents and bytes
    counted into ``seen``); lone surrogates replaced, as the encoder replaces them."""
    for batch in iter_part_batches(store, in_folder, index):
        texts = []
        for record in batch:
            if seen.bytes_in >= budget:
                break
            seen.docs_in += 1
            seen.bytes_in += len(record.text.encode("utf-8", "replace"))
            texts.append(record.text)
        if texts:
            yield safe_texts(texts)
        if seen.bytes_in >= budget:
            return


def count_part(store: ObjectStore, in_folder: str, index: int, budget: int) -> tuple[pa.Table, StageStats]:
    """Part ``index``'s word counts within ``budget`` bytes (sorted by word) and their stats."""
    stats = StageStats(stage="word_count")
    table = merge_counts(count_words(texts) for texts in budget_texts(store, in_folder, index, budget, stats))
    stats.docs_out, stats.bytes_out = stats.docs_in, stats.bytes_in
    stats.extra = {"words": int(pc.sum(table.column("count")).as_py() or 0), "distinct": table.num_rows}
    return table, stats


def run_word_count_part(
    store: ObjectStore, in_folder: str, out_folder: str, index: int, budget: int
) -> StageStats:
    """The word-count unit of part ``index`` (skipped when its ``.done`` marker exists)."""
    if (done := done_part_stats(store, out_folder, index)) is not None:
        return done
    table, stats = count_part(store, in_folder, index, budget)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    unit = part_unit(out_folder, index)
    store.put_bytes(f"{unit}.parquet", sink.getvalue())
    return finish_unit(store, unit, stats)


def sample_counts(
    store: ObjectStore, in_folder: str, counts_folder: str | None, budgets: dict[int, int]
) -> tuple[pa.Table, StageStats]:
    """The training sample's merged word counts: each part's unit from ``counts_folder`` when it is done, else
    counted here; and the sample's documents and bytes. Units are read several at a time (``store.map``)."""

    def one(item: tuple[int, int]) -> tuple[pa.Table, StageStats]:
        index, budget = item
        if counts_folder is not None and (done := done_part_stats(store, counts_folder, index)) is not None:
            data = store.get_bytes(f"{part_unit(counts_folder, index)}.parquet")
            return pq.read_table(io.BytesIO(data)), done
        return count_part(store, in_folder, index, budget)

    parts = store.map(one, sorted(budgets.items()))
    total = StageStats(stage="word_count")
    for _, stats in parts:
        total.merge(stats)
    return merge_counts(table for table, _ in parts), total
