"""What near-dedup removed and why: the dedup report, and a cluster printed with its documents side by side.

The report (``W/clusters/dedup_report.json`` and ``stats.extra["report"]``) holds: documents in, removed as exact
and as near duplicates, the removal rate per source, the cluster-size histogram, the largest clusters, sampled
duplicate pairs with their estimated (signature) and true (shingle set) Jaccard, the S-curve of the chosen bands
and rows, and warnings when the removal rate is 0% or implausibly high.
"""

from __future__ import annotations

import io
import json
import textwrap
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dedup.config import NearDedupConfig
from pipeline.dedup.graph import Clusters, size_histogram
from pipeline.dedup.lsh import s_curve, split_refs
from pipeline.dedup.minhash import estimated_jaccard, set_jaccard
from pipeline.dedup.signatures import gather_signatures, load_signatures
from pipeline.storage import ObjectStore
from pipeline.units.protocol import StageStats, checked_bytes, folder_key, part_name, part_unit, require_done

HIGH_REMOVAL_RATE = 0.5


def read_texts(store: ObjectStore, in_folder: str, refs: np.ndarray) -> dict[int, str]:
    """Texts of (non-index) refs: only the text column of each needed input part, one part at a time."""
    is_index, part, row = split_refs(refs)
    out: dict[int, str] = {}
    for p in sorted(set(part[~is_index].tolist())):
        require_done(store, part_unit(in_folder, p))
        wanted = dict(
            zip(row[(part == p) & ~is_index].tolist(), refs[(part == p) & ~is_index].tolist(), strict=True)
        )
        data = checked_bytes(store, f"{in_folder}/{part_name(p)}.parquet")
        start = 0
        # Small batches of the text column only: memory stays near one batch, not the part's whole text.
        for batch in pq.ParquetFile(io.BytesIO(data)).iter_batches(batch_size=64, columns=["text"]):
            hits = [i for i in range(start, start + batch.num_rows) if i in wanted]
            if hits:
                texts = batch.column(0).take(pa.array(np.array(hits) - start)).to_pylist()
                out.update({wanted[i]: t for i, t in zip(hits, texts, strict=True)})
            start += batch.num_rows
    return out


def _per_source(
    store: ObjectStore,
    work: str,
    num_parts: int,
    table: pa.Table,
    dropped: np.ndarray,
    sig_stats: list[StageStats],
    checked: bool = False,
) -> dict:
    """Per source: its documents, how many near dedup removed, and the rate. The document counts come from the
    signature units' stats (``docs_per_source``); a unit written by an older version has none, and then every
    part's docs table is read."""
    docs: Counter[str] = Counter()
    if len(sig_stats) == num_parts and all("docs_per_source" in s.extra for s in sig_stats):
        for s in sig_stats:
            docs.update(s.extra["docs_per_source"])
    else:
        for sources in store.map(
            lambda i: load_signatures(
                store, folder_key(work, "signatures"), i, matrix=False, checked=checked
            )[1].column("source"),
            range(num_parts),
        ):
            docs.update(sources.to_pylist())
    removed = Counter(np.array(table.column("source").to_pylist(), dtype=object)[dropped].tolist())
    return {
        src: {"docs": n, "removed_near": removed.get(src, 0), "rate": round(removed.get(src, 0) / n, 6)}
        for src, n in sorted(docs.items())
    }


def _sample_pairs(
    store, in_folder, work, table, clusters: Clusters, cfg: NearDedupConfig, checked: bool = False
) -> list[dict]:
    """Dropped documents (seeded sample) with the kept document of their cluster: estimated vs true Jaccard."""
    dropped = np.flatnonzero(~clusters.keep & ((clusters.refs >> np.uint64(63)) == 0))
    if not len(dropped) or not cfg.pair_samples:
        return []
    rng = np.random.default_rng(cfg.seed)
    picks = np.sort(rng.choice(dropped, size=min(cfg.pair_samples, len(dropped)), replace=False))
    keeper_of = {int(c): i for i, c in enumerate(clusters.cluster) if clusters.keep[i]}
    kept = np.array([keeper_of[int(clusters.cluster[i])] for i in picks], dtype=np.int64)
    refs = np.unique(np.concatenate((clusters.refs[picks], clusters.refs[kept])))
    sigs = gather_signatures(store, work, refs, cfg, checked=checked)
    texts = read_texts(store, in_folder, refs)
    hasher = cfg.hasher()
    ids = table.column("id").to_pylist()
    pairs = []
    for d, k in zip(picks.tolist(), kept.tolist(), strict=True):
        rd, rk = clusters.refs[d], clusters.refs[k]
        est = estimated_jaccard(sigs[np.searchsorted(refs, rd)], sigs[np.searchsorted(refs, rk)])
        true = None
        if int(rk) in texts:
            true = round(
                set_jaccard(set(hasher.shingles(texts[int(rd)])), set(hasher.shingles(texts[int(rk)]))), 4
            )
        pairs.append(
            {
                "dropped": ids[d],
                "kept": ids[k],
                "cluster": int(clusters.cluster[d]),
                "estimated_jaccard": round(float(est), 4),
                "true_jaccard": true,
            }
        )
    return pairs


def build_report(
    store: ObjectStore,
    in_folder: str,
    work: str,
    table: pa.Table,
    clusters: Clusters,
    plan: dict[str, Any],
    cfg: NearDedupConfig,
    sig_stats: list[StageStats],
    exact_stats: StageStats | None,
    *,
    checked: bool = False,
) -> dict[str, Any]:
    """The near-dedup report (``checked``: the signature units are known to be done, see
    ``signatures.load_signatures``)."""
    is_index = (clusters.refs >> np.uint64(63)) == 1
    dropped = ~clusters.keep & ~is_index
    has_index = np.zeros(len(clusters.sizes), dtype=bool)
    has_index[clusters.cluster[is_index]] = True
    docs_in = sum(s.docs_in for s in sig_stats)
    removed = int(dropped.sum())
    ids = np.array(table.column("id").to_pylist(), dtype=object)
    largest = []
    for c in range(min(cfg.max_clusters_in_report, len(clusters.sizes))):
        members = np.flatnonzero(clusters.cluster == c)
        largest.append(
            {
                "cluster": c,
                "size": int(clusters.sizes[c]),
                "kept": ids[members[clusters.keep[members]]].tolist(),
                "members": ids[members[:20]].tolist(),
                "with_index": bool(has_index[c]),
            }
        )
    report: dict[str, Any] = {
        "input_folder": in_folder,
        "docs_in": docs_in,
        "docs_before_exact": exact_stats.docs_in if exact_stats else None,
        "removed_exact": sum(exact_stats.dropped.values()) if exact_stats else None,
        "removed_near": removed,
        "removed_near_of_index": int((dropped & has_index[clusters.cluster]).sum()),
        "removal_rate_near": round(removed / docs_in, 6) if docs_in else 0.0,
        "no_shingle_docs": sum(int(s.extra.get("no_shingles", 0)) for s in sig_stats),
        "clusters": len(clusters.sizes),
        "per_source": _per_source(store, work, plan["num_parts"], table, dropped, sig_stats, checked),
        "cluster_size_histogram": size_histogram(clusters.sizes),
        "largest_clusters": largest,
        "sampled_pairs": _sample_pairs(store, in_folder, work, table, clusters, cfg, checked),
        "params": {
            "threshold": cfg.threshold,
            "num_perm": cfg.num_perm,
            "bands": plan["bands"],
            "rows": plan["rows"],
            "shingle": cfg.shingle,
            "ngram": cfg.ngram,
            "hash": cfg.hash,
            "scheme": cfg.scheme,
            "verify": cfg.verify,
            "num_partitions": plan["num_partitions"],
            "index_docs": plan["index_docs"],
        },
        "s_curve": s_curve(plan["bands"], plan["rows"]),
    }
    report["warnings"] = _warnings(report)
    return report


def _warnings(report: dict[str, Any]) -> list[str]:
    rate = report["removal_rate_near"]
    out = []
    if report["docs_in"] and rate == 0.0:
        out.append(
            "removal rate is 0%: no near duplicates found (expected some in web-scale text; check ngram/threshold)"
        )
    if rate > HIGH_REMOVAL_RATE:
        out.append(
            f"removal rate {rate:.1%} is implausibly high (> {HIGH_REMOVAL_RATE:.0%}): check shingling and threshold"
        )
    return out


def cluster_documents(
    store: ObjectStore, run_folder: str, cluster_id: int | None = None, max_docs: int = 3
) -> tuple[int, int, list[dict[str, Any]]]:
    """A cluster (default 0: the largest): its id, its size and up to ``max_docs`` of its documents, kept first.

    Each document is its clusters.parquet row (``id``, ``source``, ``nbytes``, ``keep``, ...) plus ``text``
    (None for a document of a persisted index, whose text is not stored).
    """
    table = pq.ParquetFile(io.BytesIO(store.get_bytes(f"{run_folder}/clusters/clusters.parquet"))).read()
    report = json.loads(store.get_bytes(f"{run_folder}/clusters/dedup_report.json"))
    cid = 0 if cluster_id is None else cluster_id
    rows = [r for r in table.to_pylist() if r["cluster"] == cid]
    if not rows:
        if table.num_rows == 0:
            return cid, 0, []
        raise ValueError(
            f"cluster {cid} does not exist (this run has {report['clusters']} clusters, 0 = largest)"
        )
    rows.sort(key=lambda r: (not r["keep"], -r["nbytes"], r["id"]))
    shown = rows[:max_docs]
    texts = read_texts(store, report["input_folder"], np.array([r["ref"] for r in shown], dtype=np.uint64))
    return cid, len(rows), [r | {"text": texts.get(r["ref"])} for r in shown]


def format_cluster(
    store: ObjectStore,
    run_folder: str,
    cluster_id: int | None = None,
    width: int = 160,
    max_docs: int = 3,
    max_lines: int = 40,
) -> str:
    """A cluster (default: the largest) with its documents side by side, kept document first."""
    cid, size, shown = cluster_documents(store, run_folder, cluster_id, max_docs)
    if not shown:
        return "no near-duplicate clusters in this run"
    col = max(20, (width - 3 * (len(shown) - 1)) // len(shown))
    columns = []
    for r in shown:
        head = [
            f"{'KEPT' if r['keep'] else 'dropped'} {r['id']}"[:col],
            f"{r['source']} {r['nbytes']} B"[:col],
            "-" * col,
        ]
        body = r["text"] if r["text"] is not None else "(document of the persisted index; text not stored)"
        lines = [seg for para in body.splitlines() for seg in (textwrap.wrap(para, col) or [""])]
        columns.append(head + lines[:max_lines])
    height = max(len(c) for c in columns)
    out = [f"cluster {cid}: {size} documents ({size - len(shown)} not shown)"]
    for i in range(height):
        out.append(" | ".join((c[i] if i < len(c) else "").ljust(col) for c in columns).rstrip())
    return "\n".join(out)


__all__ = ["build_report", "cluster_documents", "format_cluster", "read_texts"]
