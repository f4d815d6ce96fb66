"""Near-duplicate removal as steps that hand off through files, each one resumable and able to fan out.

Layout under a work folder ``W`` (the input is a folder of docs parts, e.g. the exact-dedup output)::

    W/signatures/part-NNNNN.{sig.npz,docs.parquet,stats.json,done}   per input part   run_signatures_part
    W/plan.json                                                       once             plan_near_dedup
    W/bands/part-NNNNN/p-PPPPP.npz + part-NNNNN.{stats.json,done}     per input part   run_bands_part
    W/bands/index-NNNNN/...                                           per index part   (from_index=True)
    W/edges/p-PPPPP.{npz,forest.npz,nodes.parquet,stats.json,done}    per partition    run_edges_part
    W/clusters/{clusters.parquet,drop/part-NNNNN.npz,dedup_report.json,stats.json,_SUCCESS}   run_clusters
    <out>/part-NNNNN.{parquet,stats.json,done} + _SUCCESS             per input part   run_near_filter_part

Every unit writes its outputs, then its stats, then its marker, and reads only inputs whose marker exists; a
rerun skips marked units. Arrays are ``.npz`` loaded with ``allow_pickle=False`` (no pickle anywhere).
Peak memory per step: signatures, one part's matrix (docs x num_perm x 4 B for affine32) plus a shingle chunk of
at most 2**18 hashes; bands, one part's keys (docs x bands x 16 B); edges, one bucket partition, sized by the
planner to ``memory_budget_mb``; clusters, the verified edges and the clustered documents only; filter, one part.

The steps live in ``signatures`` (1), ``candidates`` (2, 3), ``clusters`` (4: the global union-find over
``graph``, and the ``audit`` report); this module holds the filter (5) and the order of the steps.
"""

from __future__ import annotations

import json

import numpy as np

from pipeline.dedup.candidates import plan_near_dedup, run_bands_part, run_edges_part
from pipeline.dedup.clusters import run_clusters
from pipeline.dedup.config import NearDedupConfig
from pipeline.dedup.signatures import run_signatures_part
from pipeline.records import Record, iter_part_batches, text_bytes, write_part
from pipeline.sources import tally_document
from pipeline.storage import ObjectStore
from pipeline.units.protocol import (
    StageStats,
    done_part_stats,
    folder_key,
    get_npz,
    mark_stage_success,
    part_name,
    require_success,
)


def run_near_filter_part(
    store: ObjectStore, in_folder: str, out_folder: str, index: int, clusters_folder: str
) -> StageStats:
    """Copy one docs part without its near-duplicates (the drop list of the clusters step)."""
    if (done := done_part_stats(store, out_folder, index)) is not None:
        return done
    require_success(store, clusters_folder, "run_clusters")
    drop = get_npz(store, f"{clusters_folder}/drop/{part_name(index)}.npz")
    kept, row = [], 0
    stats = StageStats(stage="near_dedup")
    of_index = dict(zip(drop["rows"].tolist(), drop["of_index"].tolist(), strict=True))
    for batch in iter_part_batches(store, in_folder, index):
        gone = np.isin(np.arange(row, row + len(batch)), drop["rows"])
        for k in np.flatnonzero(gone).tolist():
            _tally_drop(stats, batch[k], "near_duplicate_of_index" if of_index[row + k] else "near_duplicate")
        row += len(batch)
        kept += [r for r, g in zip(batch, gone.tolist(), strict=True) if not g]
        stats.docs_in += len(batch)
        stats.bytes_in += text_bytes(batch)
    stats.docs_out = len(kept)
    stats.bytes_out = text_bytes(kept)
    if stats.docs_in - stats.docs_out != len(drop["rows"]):
        raise RuntimeError(
            f"{in_folder}/{part_name(index)}: drop list does not match the part (input changed?)"
        )
    write_part(store, out_folder, index, kept, stats)
    return stats


def _tally_drop(stats: StageStats, rec: Record, reason: str) -> None:
    stats.drop(reason)
    tally_document(stats, reason, rec.id, rec.text, rec.source, rec.meta, text_bytes([rec]))


def run_near_dedup(
    store: ObjectStore,
    in_folder: str,
    work: str,
    out_folder: str,
    num_parts: int,
    cfg: NearDedupConfig,
    *,
    exact_stats: StageStats | None = None,
) -> StageStats:
    """Every step in order, in this process (flows fan the per-part/per-partition steps out instead)."""
    if not cfg.enabled:
        return _pass_through(store, in_folder, out_folder, num_parts)
    for i in range(num_parts):
        run_signatures_part(store, in_folder, folder_key(work, "signatures"), i, cfg)
    plan = plan_near_dedup(store, work, num_parts, cfg)
    for i in range(num_parts):
        run_bands_part(store, work, i, cfg, plan)
    for i in range(plan["index_parts"]):
        run_bands_part(store, work, i, cfg, plan, from_index=True)
    for p in range(plan["num_partitions"]):
        run_edges_part(store, work, p, cfg, plan)
    run_clusters(store, in_folder, work, num_parts, cfg, exact_stats=exact_stats)
    total = StageStats(stage="near_dedup")
    for i in range(num_parts):
        total.merge(run_near_filter_part(store, in_folder, out_folder, i, folder_key(work, "clusters")))
    mark_stage_success(store, out_folder, num_parts)
    report = json.loads(store.get_bytes(folder_key(work, "clusters/dedup_report.json")))
    total.extra["report"] = report
    return total


def _pass_through(store: ObjectStore, in_folder: str, out_folder: str, num_parts: int) -> StageStats:
    total = StageStats(stage="near_dedup")
    for i in range(num_parts):
        part_stats = done_part_stats(store, out_folder, i)
        if part_stats is None:
            records = [r for batch in iter_part_batches(store, in_folder, i) for r in batch]
            n, nbytes = len(records), text_bytes(records)
            part_stats = StageStats(
                stage="near_dedup", docs_in=n, docs_out=n, bytes_in=nbytes, bytes_out=nbytes
            )
            write_part(store, out_folder, i, records, part_stats)
        total.merge(part_stats)
    mark_stage_success(store, out_folder, num_parts)
    return total
