"""Near dedup, step 4 (global): clusters from the verified candidate edges (``graph``), the document each
keeps, a drop list per part, ``clusters.parquet`` and the dedup report (``audit``).

The step holds the edges and the clustered documents only, and reads only what grows with them: each bucket
partition's spanning forest and the table of its documents (ref, id, source, size: ``edges/p-PPPPP.nodes.parquet``,
written by ``candidates.run_edges_part`` on the workers), not every part's docs table. It also writes a drop list
per part (one small object each) and reads a fixed number of parts for the report's sampled pairs.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dedup import audit
from pipeline.dedup.candidates import plan_near_dedup, signature_stats
from pipeline.dedup.config import NearDedupConfig
from pipeline.dedup.graph import Clusters, choose_keepers, connected_labels
from pipeline.dedup.lsh import split_refs, unique_pairs
from pipeline.dedup.signatures import INFO_SCHEMA, doc_info
from pipeline.storage import ObjectStore
from pipeline.units.protocol import (
    StageStats,
    finish_folder,
    folder_key,
    folder_stats,
    get_npz,
    part_name,
    put_npz,
    require_done,
)

log = logging.getLogger(__name__)


def _node_info(store: ObjectStore, work: str, num_partitions: int, nodes: np.ndarray) -> pa.Table | None:
    """ref, id, source, nbytes of the clustered ``nodes``, from the node tables the edges units wrote beside their
    forests: what grows with the duplicated documents only, where every docs table would grow with the corpus.
    None when a partition has none (an edges unit written before they were)."""
    keys = [folder_key(work, f"edges/p-{p:05d}.nodes.parquet") for p in range(num_partitions)]
    try:
        tables = store.map(lambda k: pq.ParquetFile(io.BytesIO(store.get_bytes(k))).read(), keys)
    except FileNotFoundError:
        return None
    if not tables:
        return None
    found = pa.concat_tables(tables)
    unique, first = np.unique(found.column("ref").to_numpy(), return_index=True)
    taken = found.take(pa.array(first[np.searchsorted(unique, nodes)], type=pa.int64()))
    return pa.table(
        {
            "ref": nodes,
            "id": taken.column("id").to_pylist(),
            "source": taken.column("source").to_pylist(),
            "nbytes": taken.column("nbytes").to_numpy(),
        },
        schema=INFO_SCHEMA,
    )


def _load_edges(store: ObjectStore, work: str, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Every partition's spanning forest (its edges, from an edges unit written before forests were), all
    together with the components of all the verified edges."""
    us, vs = [], []
    for p in range(num_partitions):
        unit = folder_key(work, f"edges/p-{p:05d}")
        require_done(store, unit)
        forest = f"{unit}.forest.npz"
        data = get_npz(store, forest if store.exists(forest) else f"{unit}.npz")
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
    known_sig_stats: Sequence[StageStats] = (),
) -> StageStats:
    """Union-find over the verified edges, the keep rule, a drop list per part, clusters.parquet and the audit.

    Outputs, then ``stats.json``, then ``_SUCCESS``; a rerun after ``_SUCCESS`` only reads the stats back.
    ``known_sig_stats``: every part's signature stats when the caller has them (a build's flow).
    """
    folder = folder_key(work, "clusters")
    if (done := folder_stats(store, folder)) is not None:
        return done
    t0 = time.perf_counter()
    plan = plan_near_dedup(store, work, num_parts, cfg, known_sig_stats)
    nodes, labels = connected_labels(*_load_edges(store, work, plan["num_partitions"]))
    checked = len(known_sig_stats) == num_parts  # every signature unit came back to the caller: done
    info = _node_info(store, work, plan["num_partitions"], nodes)
    if info is None:  # an edges unit of an older version: the clustered documents' rows of every docs table
        info = doc_info(store, work, nodes, cfg, checked=checked)
    ids = np.array(info.column("id").to_pylist(), dtype=str)
    clusters = choose_keepers(nodes, labels, info.column("nbytes").to_numpy(), ids)
    table = info.append_column("cluster", pa.array(clusters.cluster)).append_column(
        "keep", pa.array(clusters.keep)
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    store.put_bytes(f"{folder}/clusters.parquet", sink.getvalue())
    _write_drop_lists(store, folder, clusters, num_parts)
    sig_stats = signature_stats(store, work, num_parts, known_sig_stats)
    report = audit.build_report(
        store, in_folder, work, table, clusters, plan, cfg, sig_stats, exact_stats, checked=checked
    )
    store.put_bytes(f"{folder}/dedup_report.json", json.dumps(report, indent=1).encode())
    stats = StageStats(
        stage="near_dedup", docs_in=report["docs_in"], docs_out=report["docs_in"] - report["removed_near"]
    )
    for reason, n in (
        ("near_duplicate", report["removed_near"] - report["removed_near_of_index"]),
        ("near_duplicate_of_index", report["removed_near_of_index"]),
    ):
        if n:
            stats.drop(reason, n)
    stats.extra = {"report": report, "seconds": round(time.perf_counter() - t0, 3)}
    for warning in report["warnings"]:
        log.warning("near dedup: %s", warning)
    return finish_folder(store, folder, stats)


def _write_drop_lists(store: ObjectStore, folder: str, clusters: Clusters, num_parts: int) -> None:
    """Per part: the dropped rows (sorted), and whether each one duplicates a persisted-index document."""
    is_index, part, row = split_refs(clusters.refs)
    has_index = np.zeros(len(clusters.sizes), dtype=bool)
    has_index[clusters.cluster[is_index]] = True
    of_index = has_index[clusters.cluster]
    drop = np.flatnonzero(~clusters.keep & ~is_index)
    drop = drop[np.lexsort((row[drop], part[drop]))]  # by part, then row
    bounds = np.searchsorted(part[drop], np.arange(num_parts + 1))

    def put(i: int) -> None:
        sel = drop[bounds[i] : bounds[i + 1]]
        put_npz(store, f"{folder}/drop/{part_name(i)}.npz", rows=row[sel], of_index=of_index[sel])

    store.map(put, range(num_parts))
