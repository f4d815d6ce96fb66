"""Near-duplicate removal as steps that hand off through files, each one resumable and able to fan out.

Layout under a work folder ``W`` (the input is a folder of docs parts, e.g. the exact-dedup output)::

    W/signatures/part-NNNNN.{sig.npz,docs.parquet,stats.json,done}   per input part   run_signatures_part
    W/plan.json                                                       once             plan_near_dedup
    W/bands/part-NNNNN/p-PPPPP.npz + part-NNNNN.{stats.json,done}     per input part   run_bands_part
    W/bands/index-NNNNN/...                                           per index part   (from_index=True)
    W/edges/p-PPPPP.{npz,stats.json,done}                             per partition    run_edges_part
    W/clusters/{clusters.parquet,drop/part-NNNNN.npz,dedup_report.json,stats.json,_SUCCESS}   run_clusters
    <out>/part-NNNNN.{parquet,stats.json,done} + _SUCCESS             per input part   run_near_filter_part

Every unit writes its outputs, then its stats, then its marker, and reads only inputs whose marker exists; a
rerun skips marked units. Arrays are ``.npz`` loaded with ``allow_pickle=False`` (no pickle anywhere).
Peak memory per step: signatures, one part's matrix (docs x num_perm x 4 B for affine32) plus a shingle chunk of
at most 2**18 hashes; bands, one part's keys (docs x bands x 16 B); edges, one bucket partition, sized by the
planner to ``memory_budget_mb``; clusters, the verified edges and the clustered documents only; filter, one part.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dedup.clusters import run_clusters
from pipeline.dedup.lsh import (
    band_keys,
    candidate_pairs,
    make_refs,
    optimal_params,
    partition_of,
    plan_partitions,
    split_refs,
)
from pipeline.dedup.minhash import HASHES, SCHEMES, SHINGLES, MinHasher, estimated_jaccard
from pipeline.records import (
    StageStats,
    iter_part_batches,
    mark_stage_success,
    part_done,
    part_name,
    read_part_stats,
    text_bytes,
    write_part,
)
from pipeline.storage import ObjectStore, open_store

log = logging.getLogger(__name__)
DOCS_SCHEMA = pa.schema(
    [("id", pa.string()), ("source", pa.string()), ("nbytes", pa.int64()), ("shingles", pa.int64())]
)


@dataclass(frozen=True, kw_only=True)
class NearDedupConfig:
    """MinHash LSH near-dedup. Signatures equal ``datasketch.MinHash(num_perm, seed, hashfunc, scheme)``."""

    enabled: bool = True
    threshold: float = 0.8
    num_perm: int = 128
    seed: int = 1
    ngram: int = 5
    shingle: str = "word"  # "char" for CJK text (use ngram ~5 characters)
    hash: str = "xxh64"  # "sha1": datasketch's default hash, bit-identical to MinHash() but ~4x slower
    scheme: str = "affine32"  # datasketch >= 2.0 default; "legacy" for sketches of datasketch < 2.0
    fp_weight: float = 0.5
    fn_weight: float = 0.5
    verify: bool = True  # keep only candidate pairs whose estimated Jaccard >= threshold
    memory_budget_mb: int = 1024
    bucket_window: int = 64
    max_clusters_in_report: int = 20
    pair_samples: int = 20
    batch_docs: int = 2048
    index_uri: str | None = None

    def __post_init__(self) -> None:
        checks = {
            "threshold": 0.0 < self.threshold <= 1.0,
            "num_perm": 2 <= self.num_perm <= 1024,
            "ngram": 1 <= self.ngram <= 64,
            "shingle": self.shingle in SHINGLES,
            "hash": self.hash in HASHES,
            "scheme": self.scheme in SCHEMES,
            "fp_weight": 0.0 <= self.fp_weight <= 1.0 and abs(self.fp_weight + self.fn_weight - 1.0) < 1e-9,
            "fn_weight": 0.0 <= self.fn_weight <= 1.0,
            "memory_budget_mb": self.memory_budget_mb >= 16,
            "bucket_window": self.bucket_window >= 1,
            "max_clusters_in_report": self.max_clusters_in_report >= 0,
            "pair_samples": self.pair_samples >= 0,
            "batch_docs": self.batch_docs >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"NearDedupConfig: invalid {bad[0]}={getattr(self, bad[0])!r} (threshold in (0,1], num_perm "
                f"2..1024, shingle {SHINGLES}, hash {HASHES}, scheme {SCHEMES}, fp_weight+fn_weight == 1, "
                "memory_budget_mb >= 16)"
            )

    def hasher(self) -> MinHasher:
        return MinHasher(
            num_perm=self.num_perm, seed=self.seed, ngram=self.ngram, shingle=self.shingle, hash=self.hash,
            scheme=self.scheme,
        )  # fmt: skip

    def bands(self) -> tuple[int, int]:
        return optimal_params(self.threshold, self.num_perm, self.fp_weight, self.fn_weight)

    def signature_params(self) -> dict[str, Any]:
        """What must match for two signature sets to be comparable (checked against a persisted index)."""
        keys = ("num_perm", "seed", "ngram", "shingle", "hash", "scheme")
        return {k: v for k, v in asdict(self).items() if k in keys}


# ---------------------------------------------------------------- unit files


def put_npz(store: ObjectStore, key: str, **arrays: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    store.put_bytes(key, buf.getvalue())


def get_npz(store: ObjectStore, key: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(store.get_bytes(key)), allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def _finish(store: ObjectStore, unit: str, stats: StageStats) -> StageStats:
    """Stats, then the marker: a unit without its marker is never read and is redone by a rerun."""
    store.put_bytes(f"{unit}.stats.json", json.dumps(stats.to_json(), indent=1).encode())
    store.put_bytes(f"{unit}.done", b"")
    return stats


def unit_stats(store: ObjectStore, unit: str) -> StageStats | None:
    if not store.exists(f"{unit}.done"):
        return None
    return StageStats.from_json(json.loads(store.get_bytes(f"{unit}.stats.json")))


def require_done(store: ObjectStore, unit: str) -> None:
    if not store.exists(f"{unit}.done"):
        raise FileNotFoundError(
            f"{store.uri_of(unit)} has no .done marker: run the step that writes it first"
        )


def folder_key(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def load_signatures(
    store: ObjectStore, sig_folder: str, index: int, *, matrix: bool = True
) -> tuple[np.ndarray, pa.Table]:
    """One completed signature unit: the (docs, num_perm) matrix (empty unless ``matrix``) and its docs table
    (id, source, nbytes, shingles)."""
    unit = folder_key(sig_folder, part_name(index))
    require_done(store, unit)
    sigs = get_npz(store, f"{unit}.sig.npz")["sig"] if matrix else np.zeros((0, 0), dtype=np.uint32)
    return sigs, pq.ParquetFile(io.BytesIO(store.get_bytes(f"{unit}.docs.parquet"))).read()


# ---------------------------------------------------------------- step 1: signatures


def run_signatures_part(
    store: ObjectStore, in_folder: str, out_folder: str, index: int, cfg: NearDedupConfig
) -> StageStats:
    """Signatures of one docs part: ``sig.npz`` (matrix), ``docs.parquet`` (id, source, bytes), stats, marker."""
    unit = folder_key(out_folder, part_name(index))
    if (stats := unit_stats(store, unit)) is not None:
        return stats
    t0 = time.perf_counter()
    hasher = cfg.hasher()
    sigs: list[np.ndarray] = []
    cols: dict[str, list[Any]] = {"id": [], "source": [], "nbytes": [], "shingles": []}
    for batch in iter_part_batches(store, in_folder, index, cfg.batch_docs):
        sig, counts = hasher.signatures([r.text for r in batch])
        sigs.append(sig)
        cols["id"] += [r.id for r in batch]
        cols["source"] += [r.source for r in batch]
        cols["nbytes"] += [len(r.text.encode("utf-8", "surrogatepass")) for r in batch]
        cols["shingles"] += counts.tolist()
    matrix = np.concatenate(sigs) if sigs else np.zeros((0, cfg.num_perm), dtype=hasher.dtype)
    put_npz(store, f"{unit}.sig.npz", sig=matrix)
    sink = io.BytesIO()
    pq.write_table(pa.table(cols, schema=DOCS_SCHEMA), sink, compression="zstd")
    store.put_bytes(f"{unit}.docs.parquet", sink.getvalue())
    n = len(cols["id"])
    stats = StageStats(stage="near_signatures", docs_in=n, docs_out=n, bytes_in=sum(cols["nbytes"]))
    stats.extra = {"no_shingles": cols["shingles"].count(0), "seconds": round(time.perf_counter() - t0, 3)}
    return _finish(store, unit, stats)


# ---------------------------------------------------------------- plan


def open_index(store: ObjectStore, cfg: NearDedupConfig) -> tuple[ObjectStore, int] | None:
    """The persisted index named by ``cfg.index_uri`` (opened with ``store``'s configuration) and its part
    count; refuses incompatible signatures."""
    if not cfg.index_uri:
        return None
    istore = open_store(cfg.index_uri, store.s3)
    if not istore.exists("index.json"):
        raise FileNotFoundError(f"{cfg.index_uri}: no index.json (write one with save_index)")
    meta = json.loads(istore.get_bytes("index.json"))
    if meta["params"] != cfg.signature_params():
        raise ValueError(
            f"index {cfg.index_uri} was built with {meta['params']}, this build uses {cfg.signature_params()}: "
            "signatures are not comparable; rebuild the index or match the near-dedup settings"
        )
    return istore, int(meta["num_parts"])


def plan_near_dedup(store: ObjectStore, work: str, num_parts: int, cfg: NearDedupConfig) -> dict[str, Any]:
    """Bands, rows and bucket partitions for this build, fixed once in ``plan.json`` so reruns agree."""
    key = folder_key(work, "plan.json")
    if store.exists(key):
        return json.loads(store.get_bytes(key))
    docs = sum(
        done_stats_or_fail(store, folder_key(work, f"signatures/{part_name(i)}")).docs_out
        for i in range(num_parts)
    )
    index = open_index(store, cfg)
    index_docs = 0
    if index is not None:
        index_docs = sum(done_stats_or_fail(index[0], part_name(i)).docs_out for i in range(index[1]))
    b, r = cfg.bands()
    bp = plan_partitions(docs + index_docs, b, cfg.memory_budget_mb)
    plan = {
        "bands": b, "rows": r, "num_parts": num_parts, "index_parts": index[1] if index else 0,
        "docs": docs, "index_docs": index_docs, "num_partitions": bp.num_partitions,
        "partition_bytes": bp.partition_bytes, "memory_budget_mb": cfg.memory_budget_mb,
    }  # fmt: skip
    store.put_bytes(key, json.dumps(plan, indent=1).encode())
    return plan


def done_stats_or_fail(store: ObjectStore, unit: str) -> StageStats:
    stats = unit_stats(store, unit)
    if stats is None:
        raise FileNotFoundError(f"{store.uri_of(unit)} is not done: run the previous step first")
    return stats


# ---------------------------------------------------------------- step 2: band buckets


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
        sigs, docs = load_signatures(_index_store(store, cfg), "", index)
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
    return _finish(store, unit, stats)


# ---------------------------------------------------------------- step 3: candidate edges per partition


def _index_store(store: ObjectStore, cfg: NearDedupConfig) -> ObjectStore:
    opened = open_index(store, cfg)
    if opened is None:
        raise ValueError("doc refs name persisted-index documents but NearDedupConfig.index_uri is not set")
    return opened[0]


def by_part(
    store: ObjectStore, work: str, refs: np.ndarray, cfg: NearDedupConfig, *, matrix: bool = True
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, pa.Table]]:
    """For each part the refs point into: (positions in refs, rows, signature matrix, docs table).

    Each part (index parts from the index store) is loaded once, so memory holds one part at a time.
    """
    is_index, part, row = split_refs(refs)
    istore = None
    for flag, p in sorted(set(zip(is_index.tolist(), part.tolist(), strict=True))):
        sel = np.flatnonzero((is_index == flag) & (part == p))
        if flag:
            istore = istore or _index_store(store, cfg)
            sigs, docs = load_signatures(istore, "", p, matrix=matrix)
        else:
            sigs, docs = load_signatures(store, folder_key(work, "signatures"), p, matrix=matrix)
        yield sel, row[sel], sigs, docs


def gather_signatures(store: ObjectStore, work: str, refs: np.ndarray, cfg: NearDedupConfig) -> np.ndarray:
    """Signature rows of ``refs`` (index documents' from the persisted index)."""
    out = np.zeros((len(refs), cfg.num_perm), dtype=cfg.hasher().dtype)
    for sel, rows, sigs, _ in by_part(store, work, refs, cfg):
        out[sel] = sigs[rows]
    return out


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
    if cfg.verify and len(u):
        nodes = np.unique(np.concatenate((u, v)))
        sigs = gather_signatures(store, work, nodes, cfg)
        est = estimated_jaccard(sigs[np.searchsorted(nodes, u)], sigs[np.searchsorted(nodes, v)]).astype(
            np.float32
        )
    ok = est >= cfg.threshold if cfg.verify else np.ones(len(u), dtype=bool)
    put_npz(store, f"{unit}.npz", u=u[ok], v=v[ok], est=est[ok])
    stats = StageStats(stage="near_edges", docs_in=len(u), docs_out=int(ok.sum()))
    if not ok.all():
        stats.drop("unverified_pair", int((~ok).sum()))
    stats.extra = {"band_entries": int(sum(len(k) for k in keys)), "buckets_over_window": big,
                   "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip
    return _finish(store, unit, stats)


# ---------------------------------------------------------------- step 5: filter


def run_near_filter_part(
    store: ObjectStore, in_folder: str, out_folder: str, index: int, clusters_folder: str
) -> StageStats:
    """Copy one docs part without its near-duplicates (the drop list of the clusters step)."""
    if part_done(store, out_folder, index):
        return read_part_stats(store, out_folder, index)
    if not store.exists(f"{clusters_folder}/_SUCCESS"):
        raise FileNotFoundError(f"{store.uri_of(clusters_folder)} has no _SUCCESS: run run_clusters first")
    drop = get_npz(store, f"{clusters_folder}/drop/{part_name(index)}.npz")
    kept, row = [], 0
    stats = StageStats(stage="near_dedup")
    for batch in iter_part_batches(store, in_folder, index):
        gone = np.isin(np.arange(row, row + len(batch)), drop["rows"])
        row += len(batch)
        kept += [r for r, g in zip(batch, gone.tolist(), strict=True) if not g]
        stats.docs_in += len(batch)
        stats.bytes_in += text_bytes(batch)
    stats.docs_out = len(kept)
    stats.bytes_out = text_bytes(kept)
    of_index = int(drop["of_index"].sum())
    for reason, n in (
        ("near_duplicate", len(drop["rows"]) - of_index),
        ("near_duplicate_of_index", of_index),
    ):
        if n:
            stats.drop(reason, n)
    if stats.docs_in - stats.docs_out != len(drop["rows"]):
        raise RuntimeError(
            f"{in_folder}/{part_name(index)}: drop list does not match the part (input changed?)"
        )
    write_part(store, out_folder, index, kept, stats)
    return stats


# ---------------------------------------------------------------- whole run and the persisted index


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
        if not part_done(store, out_folder, i):
            records = [r for batch in iter_part_batches(store, in_folder, i) for r in batch]
            n, nbytes = len(records), text_bytes(records)
            part_stats = StageStats(
                stage="near_dedup", docs_in=n, docs_out=n, bytes_in=nbytes, bytes_out=nbytes
            )
            write_part(store, out_folder, i, records, part_stats)
        total.merge(read_part_stats(store, out_folder, i))
    mark_stage_success(store, out_folder, num_parts)
    return total


def save_index(store: ObjectStore, work: str, num_parts: int, cfg: NearDedupConfig, index_uri: str) -> int:
    """Persist this build's kept documents (signatures + ids, no pickle) for a later build's ``index_uri``.

    The index is a folder of signature units (the layout of ``W/signatures``) plus ``index.json`` with the
    signature parameters, which a later build must match. Returns the number of indexed documents.
    """
    folder = folder_key(work, "clusters")
    if not store.exists(f"{folder}/_SUCCESS"):
        raise FileNotFoundError(f"{store.uri_of(folder)} has no _SUCCESS: run run_clusters before save_index")
    istore = open_store(index_uri, store.s3)
    total = 0
    for i in range(num_parts):
        sigs, docs = load_signatures(store, folder_key(work, "signatures"), i)
        keep = docs.column("shingles").to_numpy() > 0
        keep[get_npz(store, f"{folder}/drop/{part_name(i)}.npz")["rows"]] = False
        rows = np.flatnonzero(keep)
        put_npz(istore, f"{part_name(i)}.sig.npz", sig=sigs[rows])
        sink = io.BytesIO()
        pq.write_table(docs.take(pa.array(rows)), sink, compression="zstd")
        istore.put_bytes(f"{part_name(i)}.docs.parquet", sink.getvalue())
        _finish(istore, part_name(i), StageStats(stage="near_index", docs_in=len(docs), docs_out=len(rows)))
        total += len(rows)
    meta = {"params": cfg.signature_params(), "num_parts": num_parts, "docs": total}
    istore.put_bytes("index.json", json.dumps(meta, indent=1).encode())
    return total
