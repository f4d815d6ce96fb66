"""Near dedup, steps 2 and 3: the plan (bands, rows, bucket partitions), each signature part's band keys split
by partition, and the candidate pairs of each partition, verified by estimated Jaccard."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dedup.config import NearDedupConfig
from pipeline.dedup.graph import spanning_forest
from pipeline.dedup.lsh import band_keys, candidate_pairs, make_refs, partition_of, plan_partitions
from pipeline.dedup.minhash import estimated_jaccard
from pipeline.dedup.signatures import gather, index_store, load_signatures, open_index
from pipeline.storage import ObjectStore
from pipeline.units.protocol import (
    StageStats,
    done_stats_or_fail,
    finish_unit,
    folder_key,
    get_npz,
    part_name,
    put_npz,
    require_done,
    unit_stats,
)


def plan_near_dedup(
    store: ObjectStore, work: str, num_parts: int, cfg: NearDedupConfig, sig_stats: Sequence[StageStats] = ()
) -> dict[str, Any]:
    """Bands, rows and bucket partitions for this build, fixed once in ``plan.json`` so reruns agree.
    ``sig_stats``: every part's signature stats when the caller has them (else read from the store)."""
    key = folder_key(work, "plan.json")
    if store.exists(key):
        return json.loads(store.get_bytes(key))
    docs = sum(s.docs_out for s in signature_stats(store, work, num_parts, sig_stats))
    index = open_index(store, cfg)
    index_docs = 0
    if index is not None:
        index_docs = sum(done_stats_or_fail(index[0], part_name(i)).docs_out for i in range(index[1]))
    b, r = cfg.bands()
    bp = plan_partitions(docs + index_docs, b, cfg.memory_budget_mb)
    plan = {
        "bands": b,
        "rows": r,
        "num_parts": num_parts,
        "index_parts": index[1] if index else 0,
        "docs": docs,
        "index_docs": index_docs,
        "num_partitions": bp.num_partitions,
        "partition_bytes": bp.partition_bytes,
        "memory_budget_mb": cfg.memory_budget_mb,
    }
    store.put_bytes(key, json.dumps(plan, indent=1).encode())
    return plan


def signature_stats(
    store: ObjectStore, work: str, num_parts: int, known: Sequence[StageStats] = ()
) -> list[StageStats]:
    """Every part's signature unit stats: ``known`` when it has them all, else read from the store."""
    if len(known) == num_parts:
        return list(known)
    return store.map(
        lambda i: done_stats_or_fail(store, folder_key(work, f"signatures/{part_name(i)}")), range(num_parts)
    )


def run_bands_part(
    store: ObjectStore,
    work: str,
    index: int,
    cfg: NearDedupConfig,
    plan: dict[str, Any],
    *,
    from_index: bool = False,
) -> StageStats:
    """Band keys of one signature part, split into one file per bucket partition (keys + doc refs)."""
    unit = folder_key(work, f"bands/{'index' if from_index else 'part'}-{index:05d}")
    if (stats := unit_stats(store, unit)) is not None:
        return stats
    t0 = time.perf_counter()
    if from_index:
        sigs, docs = load_signatures(index_store(store, cfg), "", index)
    else:
        sigs, docs = load_signatures(store, folder_key(work, "signatures"), index)
    rows = np.flatnonzero(docs.column("shingles").to_numpy() > 0)  # empty docs would all share one bucket
    keys = band_keys(sigs[rows], plan["bands"], plan["rows"]).ravel()
    refs = np.repeat(make_refs(index, rows, index=from_index), plan["bands"])
    parts = partition_of(keys, plan["num_partitions"])
    order = np.argsort(parts, kind="stable")
    bounds = np.searchsorted(parts[order], np.arange(plan["num_partitions"] + 1))
    for p in range(plan["num_partitions"]):
        sel = order[bounds[p] : bounds[p + 1]]
        put_npz(store, f"{unit}/p-{p:05d}.npz", keys=keys[sel], refs=refs[sel])
    stats = StageStats(stage="near_bands", docs_in=len(docs), docs_out=len(rows))
    stats.extra = {"band_entries": len(keys), "seconds": round(time.perf_counter() - t0, 3)}
    return finish_unit(store, unit, stats)


def run_edges_part(
    store: ObjectStore, work: str, partition: int, cfg: NearDedupConfig, plan: dict[str, Any]
) -> StageStats:
    """Candidate pairs of one bucket partition, verified by estimated Jaccard when ``cfg.verify``."""
    unit = folder_key(work, f"edges/p-{partition:05d}")
    if (stats := unit_stats(store, unit)) is not None:
        return stats
    t0 = time.perf_counter()
    units = [f"part-{i:05d}" for i in range(plan["num_parts"])] + [
        f"index-{i:05d}" for i in range(plan["index_parts"])
    ]
    keys, refs = [], []
    for name in units:
        require_done(store, folder_key(work, f"bands/{name}"))
        data = get_npz(store, folder_key(work, f"bands/{name}/p-{partition:05d}.npz"))
        keys.append(data["keys"])
        refs.append(data["refs"])
    u, v, big = candidate_pairs(np.concatenate(keys), np.concatenate(refs), cfg.bucket_window)
    est = np.ones(len(u), dtype=np.float32)
    nodes = np.unique(np.concatenate((u, v)))
    sigs, info = gather(store, work, nodes, cfg, matrix=cfg.verify)
    if cfg.verify and len(u):
        est = estimated_jaccard(sigs[np.searchsorted(nodes, u)], sigs[np.searchsorted(nodes, v)]).astype(
            np.float32
        )
    ok = est >= cfg.threshold if cfg.verify else np.ones(len(u), dtype=bool)
    put_npz(store, f"{unit}.npz", u=u[ok], v=v[ok], est=est[ok])
    child, root = spanning_forest(u[ok], v[ok])  # this partition's share of the clustering, done here
    put_npz(store, f"{unit}.forest.npz", u=child, v=root)
    # The forest's documents (id, source, size), so that the clustering reads these, not every docs table.
    in_forest = np.isin(nodes, np.concatenate((child, root)))
    sink = io.BytesIO()
    pq.write_table(info.filter(pa.array(in_forest)), sink, compression="zstd")
    store.put_bytes(f"{unit}.nodes.parquet", sink.getvalue())
    stats = StageStats(stage="near_edges", docs_in=len(u), docs_out=int(ok.sum()))
    if not ok.all():
        stats.drop("unverified_pair", int((~ok).sum()))
    stats.extra = {
        "band_entries": int(sum(len(k) for k in keys)),
        "buckets_over_window": big,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    return finish_unit(store, unit, stats)
