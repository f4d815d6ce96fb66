"""Clusters from candidate edges (a vectorized union-find), the rule that picks the document to keep, and the
global clusters step that applies them.

The union-find and keep rule are pure numpy over doc refs (see ``lsh.make_refs``), so they can be tested over
grids of graphs and are cheap enough for the global step: the work is O(edges * log) and the edges are only the
duplicate pairs; the step holds the edges and the clustered documents only.
"""

from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dedup.lsh import INDEX_FLAG, split_refs, unique_pairs
from pipeline.records import StageStats, part_name
from pipeline.storage import ObjectStore

if TYPE_CHECKING:
    from pipeline.dedup.near import NearDedupConfig

log = logging.getLogger(__name__)


def connected_labels(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nodes (sorted unique refs of the edges) and each node's component label (the smallest node position).

    Union-find done as min-label propagation with pointer jumping: every round hooks each edge's larger root
    under the smaller one, then compresses paths by jumping; it stops when no label changes (a few rounds for
    the shallow, star-like graphs LSH produces; O(log diameter) rounds in general).
    """
    nodes, inv = np.unique(np.concatenate((u, v)), return_inverse=True)
    a, b = inv[: len(u)], inv[len(u) :]
    labels = np.arange(len(nodes), dtype=np.int64)
    while True:
        la, lb = labels[a], labels[b]
        lo, hi = np.minimum(la, lb), np.maximum(la, lb)
        changed = lo != hi
        if not changed.any():
            break
        np.minimum.at(labels, hi[changed], lo[changed])
        while True:  # pointer jumping until every node points at a root
            jumped = labels[labels]
            if np.array_equal(jumped, labels):
                break
            labels = jumped
    return nodes, labels


@dataclass(frozen=True)
class Clusters:
    """Every clustered document: its ref, cluster number (0 = largest), and whether it is kept."""

    refs: np.ndarray  # uint64
    cluster: np.ndarray  # int64, clusters numbered by size (desc) then smallest member
    keep: np.ndarray  # bool; a document of a persisted index is always "kept" (it is not ours to drop)
    sizes: np.ndarray  # int64 size of each cluster, by cluster number

    @property
    def dropped_refs(self) -> np.ndarray:
        return self.refs[~self.keep & ((self.refs & INDEX_FLAG) == 0)]


def choose_keepers(nodes: np.ndarray, labels: np.ndarray, nbytes: np.ndarray, ids: np.ndarray) -> Clusters:
    """Keep one document per cluster: the longest (bytes), ties broken by the smallest id.

    A cluster holding a document of a persisted index keeps only that (those) index documents: everything new
    in it duplicates something already published.
    """
    is_index = (nodes & INDEX_FLAG) != 0
    # Sort members of each cluster: index docs first, then longest, then smallest id.
    order = np.lexsort((ids, -nbytes.astype(np.int64), ~is_index, labels))
    lab = labels[order]
    first = np.ones(len(lab), dtype=bool)
    first[1:] = lab[1:] != lab[:-1]
    keep_sorted = first.copy()
    leader_index = np.maximum.accumulate(np.where(first, np.arange(len(lab)), 0))
    keep_sorted |= is_index[order]  # every index doc stays (it was already published)
    keep_sorted &= ~(is_index[order][leader_index] & ~is_index[order])  # new docs next to an index doc go
    keep = np.empty_like(keep_sorted)
    keep[order] = keep_sorted
    return _number_clusters(nodes, labels, keep)


def _number_clusters(nodes: np.ndarray, labels: np.ndarray, keep: np.ndarray) -> Clusters:
    uniq, inv, counts = np.unique(labels, return_inverse=True, return_counts=True)
    # Number clusters by size descending, then by smallest member ref (labels are the smallest node position).
    rank_order = np.lexsort((uniq, -counts))
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[rank_order] = np.arange(len(uniq))
    return Clusters(refs=nodes, cluster=rank[inv], keep=keep, sizes=counts[rank_order].astype(np.int64))


def size_histogram(sizes: np.ndarray) -> dict[str, int]:
    values, counts = np.unique(sizes, return_counts=True)
    return {str(int(s)): int(c) for s, c in zip(values, counts, strict=True)}


# ---------------------------------------------------------------- the global clusters step


def doc_info(store: ObjectStore, work: str, refs: np.ndarray, cfg: NearDedupConfig) -> pa.Table:
    """ref, id, source, nbytes of each ref, reading each part's docs table once."""
    from pipeline.dedup.near import by_part

    ids = np.empty(len(refs), dtype=object)
    sources = np.empty(len(refs), dtype=object)
    nbytes = np.zeros(len(refs), dtype=np.int64)
    for sel, rows, _, docs in by_part(store, work, refs, cfg, matrix=False):
        taken = docs.take(pa.array(rows))
        ids[sel] = taken.column("id").to_pylist()
        sources[sel] = taken.column("source").to_pylist()
        nbytes[sel] = taken.column("nbytes").to_numpy()
    return pa.table({"ref": refs, "id": ids.tolist(), "source": sources.tolist(), "nbytes": nbytes})


def _load_edges(store: ObjectStore, work: str, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    from pipeline.dedup.near import folder_key, get_npz, require_done

    us, vs = [], []
    for p in range(num_partitions):
        require_done(store, folder_key(work, f"edges/p-{p:05d}"))
        data = get_npz(store, folder_key(work, f"edges/p-{p:05d}.npz"))
        us.append(data["u"])
        vs.append(data["v"])
    return unique_pairs(np.concatenate(us), np.concatenate(vs))


def run_clusters(
    store: ObjectStore,
    in_folder: str,
    work: str,
    num_parts: int,
    cfg: NearDedupConfig,
    *,
    exact_stats: StageStats | None = None,
) -> StageStats:
    """Union-find over the verified edges, the keep rule, a drop list per part, clusters.parquet and the audit.

    Outputs, then ``stats.json``, then ``_SUCCESS``; a rerun after ``_SUCCESS`` only reads the stats back.
    """
    from pipeline.dedup import audit
    from pipeline.dedup.near import done_stats_or_fail, folder_key, plan_near_dedup

    folder = folder_key(work, "clusters")
    if store.exists(f"{folder}/_SUCCESS"):
        return StageStats.from_json(json.loads(store.get_bytes(f"{folder}/stats.json")))
    t0 = time.perf_counter()
    plan = plan_near_dedup(store, work, num_parts, cfg)
    nodes, labels = connected_labels(*_load_edges(store, work, plan["num_partitions"]))
    info = doc_info(store, work, nodes, cfg)
    ids = np.array(info.column("id").to_pylist(), dtype=str)
    clusters = choose_keepers(nodes, labels, info.column("nbytes").to_numpy(), ids)
    table = info.append_column("cluster", pa.array(clusters.cluster)).append_column(
        "keep", pa.array(clusters.keep)
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    store.put_bytes(f"{folder}/clusters.parquet", sink.getvalue())
    _write_drop_lists(store, folder, clusters, num_parts)
    sig_stats = [
        done_stats_or_fail(store, folder_key(work, f"signatures/{part_name(i)}")) for i in range(num_parts)
    ]
    report = audit.build_report(store, in_folder, work, table, clusters, plan, cfg, sig_stats, exact_stats)
    store.put_bytes(f"{folder}/dedup_report.json", json.dumps(report, indent=1).encode())
    stats = StageStats(
        stage="near_dedup", docs_in=report["docs_in"], docs_out=report["docs_in"] - report["removed_near"]
    )
    for reason, n in (("near_duplicate", report["removed_near"] - report["removed_near_of_index"]),
                      ("near_duplicate_of_index", report["removed_near_of_index"])):  # fmt: skip
        if n:
            stats.drop(reason, n)
    stats.extra = {"report": report, "seconds": round(time.perf_counter() - t0, 3)}
    for warning in report["warnings"]:
        log.warning("near dedup: %s", warning)
    store.put_bytes(f"{folder}/stats.json", json.dumps(stats.to_json(), indent=1).encode())
    store.put_bytes(f"{folder}/_SUCCESS", b"")
    return stats


def _write_drop_lists(store: ObjectStore, folder: str, clusters: Clusters, num_parts: int) -> None:
    """Per part: the dropped rows (sorted), and whether each one duplicates a persisted-index document."""
    from pipeline.dedup.near import put_npz

    is_index, part, row = split_refs(clusters.refs)
    has_index = np.zeros(len(clusters.sizes), dtype=bool)
    has_index[clusters.cluster[is_index]] = True
    of_index = has_index[clusters.cluster]
    drop = ~clusters.keep & ~is_index
    for i in range(num_parts):
        sel = np.flatnonzero(drop & (part == i))
        sel = sel[np.argsort(row[sel])]
        put_npz(store, f"{folder}/drop/{part_name(i)}.npz", rows=row[sel], of_index=of_index[sel])
