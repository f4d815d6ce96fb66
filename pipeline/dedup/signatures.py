"""Near dedup, step 1: a MinHash signature per document, one unit per input part; and the persisted index.

A signature unit ``U`` is ``U.sig.npz`` (the docs x num_perm matrix), ``U.docs.parquet`` (id, source, bytes,
shingle count per document), ``U.stats.json``, ``U.done``. A persisted index (``save_index``) is a folder of
such units plus ``index.json`` with the signature parameters a later build must match.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dedup.config import NearDedupConfig
from pipeline.dedup.lsh import split_refs
from pipeline.records import iter_part_batches
from pipeline.storage import ObjectStore, open_store
from pipeline.units.protocol import (
    StageStats,
    checked_bytes,
    finish_unit,
    folder_key,
    get_npz,
    part_name,
    put_npz,
    require_done,
    require_success,
    unit_stats,
)

DOCS_SCHEMA = pa.schema(
    [("id", pa.string()), ("source", pa.string()), ("nbytes", pa.int64()), ("shingles", pa.int64())]
)


def load_signatures(
    store: ObjectStore, sig_folder: str, index: int, *, matrix: bool = True, checked: bool = False
) -> tuple[np.ndarray, pa.Table]:
    """One completed signature unit: the (docs, num_perm) matrix (empty unless ``matrix``) and its docs table
    (id, source, nbytes, shingles). ``checked``: the caller knows the unit is done (a build's flow, from its
    tasks' results), so its marker is not looked up (one call less per part on S3)."""
    unit = folder_key(sig_folder, part_name(index))
    if not checked:
        require_done(store, unit)
    sigs = get_npz(store, f"{unit}.sig.npz")["sig"] if matrix else np.zeros((0, 0), dtype=np.uint32)
    return sigs, pq.ParquetFile(io.BytesIO(checked_bytes(store, f"{unit}.docs.parquet"))).read()


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
    stats.extra = {
        "no_shingles": cols["shingles"].count(0),
        "seconds": round(time.perf_counter() - t0, 3),
        "docs_per_source": dict(Counter(cols["source"])),
    }
    return finish_unit(store, unit, stats)


# ---------------------------------------------------------------- the persisted index


def open_index(store: ObjectStore, cfg: NearDedupConfig) -> tuple[ObjectStore, int] | None:
    """The persisted index named by ``cfg.index_uri`` and its part count; refuses incompatible signatures."""
    if not cfg.index_uri:
        return None
    istore = open_store(cfg.index_uri, store.s3)  # with the build store's configuration
    if not istore.exists("index.json"):
        raise FileNotFoundError(f"{cfg.index_uri}: no index.json (write one with save_index)")
    meta = json.loads(istore.get_bytes("index.json"))
    if meta["params"] != cfg.signature_params():
        raise ValueError(
            f"index {cfg.index_uri} was built with {meta['params']}, this build uses {cfg.signature_params()}: "
            "signatures are not comparable; rebuild the index or match the near-dedup settings"
        )
    return istore, int(meta["num_parts"])


def index_store(store: ObjectStore, cfg: NearDedupConfig) -> ObjectStore:
    opened = open_index(store, cfg)
    if opened is None:
        raise ValueError("doc refs name persisted-index documents but NearDedupConfig.index_uri is not set")
    return opened[0]


def by_part(
    store: ObjectStore,
    work: str,
    refs: np.ndarray,
    cfg: NearDedupConfig,
    *,
    matrix: bool = True,
    checked: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, pa.Table]]:
    """For each part the refs point into: (positions in refs, rows, signature matrix, docs table).

    Each part (index parts from the index store) is loaded once, a few at a time (as many as the store keeps
    calls in flight), so memory holds that many parts. ``checked``: this build's signature units are known to
    be done (see :func:`load_signatures`).
    """
    is_index, part, row = split_refs(refs)
    istore = index_store(store, cfg) if is_index.any() else None

    def load(key: tuple[bool, int]) -> tuple[np.ndarray, pa.Table]:
        flag, p = key
        if flag and istore is not None:
            return load_signatures(istore, "", p, matrix=matrix)
        return load_signatures(store, folder_key(work, "signatures"), p, matrix=matrix, checked=checked)

    keys = sorted(set(zip(is_index.tolist(), part.tolist(), strict=True)))
    step = max(1, store.io_threads)
    for lo in range(0, len(keys), step):
        for (flag, p), (sigs, docs) in zip(
            keys[lo : lo + step], store.map(load, keys[lo : lo + step]), strict=True
        ):
            sel = np.flatnonzero((is_index == flag) & (part == p))
            yield sel, row[sel], sigs, docs


INFO_SCHEMA = pa.schema(
    [("ref", pa.uint64()), ("id", pa.string()), ("source", pa.string()), ("nbytes", pa.int64())]
)


def gather(
    store: ObjectStore,
    work: str,
    refs: np.ndarray,
    cfg: NearDedupConfig,
    *,
    matrix: bool = True,
    checked: bool = False,
) -> tuple[np.ndarray, pa.Table]:
    """Signature rows of ``refs`` (empty unless ``matrix``) and their ref, id, source and nbytes (index
    documents' from the persisted index), reading each part once."""
    out = np.zeros((len(refs) if matrix else 0, cfg.num_perm), dtype=cfg.hasher().dtype)
    ids = np.empty(len(refs), dtype=object)
    sources = np.empty(len(refs), dtype=object)
    nbytes = np.zeros(len(refs), dtype=np.int64)
    for sel, rows, sigs, docs in by_part(store, work, refs, cfg, matrix=matrix, checked=checked):
        if matrix:
            out[sel] = sigs[rows]
        taken = docs.take(pa.array(rows))
        ids[sel] = taken.column("id").to_pylist()
        sources[sel] = taken.column("source").to_pylist()
        nbytes[sel] = taken.column("nbytes").to_numpy()
    info = pa.table(
        {"ref": refs, "id": ids.tolist(), "source": sources.tolist(), "nbytes": nbytes}, schema=INFO_SCHEMA
    )
    return out, info


def gather_signatures(
    store: ObjectStore, work: str, refs: np.ndarray, cfg: NearDedupConfig, *, checked: bool = False
) -> np.ndarray:
    """Signature rows of ``refs`` (index documents' from the persisted index)."""
    return gather(store, work, refs, cfg, checked=checked)[0]


def doc_info(
    store: ObjectStore, work: str, refs: np.ndarray, cfg: NearDedupConfig, *, checked: bool = False
) -> pa.Table:
    """ref, id, source, nbytes of each ref, reading each part's docs table once (``checked``: see
    :func:`load_signatures`)."""
    return gather(store, work, refs, cfg, matrix=False, checked=checked)[1]


def save_index(store: ObjectStore, work: str, num_parts: int, cfg: NearDedupConfig, index_uri: str) -> int:
    """Persist this build's kept documents (signatures + ids, no pickle) for a later build's ``index_uri``.

    The index is a folder of signature units (the layout of ``W/signatures``) plus ``index.json`` with the
    signature parameters, which a later build must match. Returns the number of indexed documents. A build's
    flow writes the parts on its workers (:func:`save_index_parts`), then the meta (:func:`write_index_meta`);
    this is the two in one process.
    """
    require_success(store, folder_key(work, "clusters"), "run_clusters before save_index")
    kept = save_index_parts(store, work, range(num_parts), cfg, index_uri)
    return write_index_meta(store, num_parts, cfg, index_uri, sum(kept))


def save_index_parts(
    store: ObjectStore, work: str, indices: Iterable[int], cfg: NearDedupConfig, index_uri: str
) -> list[int]:
    """The index units of parts ``indices`` (each: its kept documents' signature rows and docs table), as many
    at a time as the store keeps calls in flight; how many documents each keeps. A part whose unit is done
    (an earlier, interrupted save) is read back, not written again."""
    folder = folder_key(work, "clusters")
    istore = open_store(index_uri, store.s3)  # the build store's s3 settings, never boto3's defaults

    def save_part(i: int) -> int:
        if (done := unit_stats(istore, part_name(i))) is not None:
            return done.docs_out
        sigs, docs = load_signatures(store, folder_key(work, "signatures"), i)
        keep = docs.column("shingles").to_numpy() > 0
        keep[get_npz(store, f"{folder}/drop/{part_name(i)}.npz")["rows"]] = False
        rows = np.flatnonzero(keep)
        put_npz(istore, f"{part_name(i)}.sig.npz", sig=sigs[rows])
        sink = io.BytesIO()
        pq.write_table(docs.take(pa.array(rows)), sink, compression="zstd")
        istore.put_bytes(f"{part_name(i)}.docs.parquet", sink.getvalue())
        finish_unit(
            istore, part_name(i), StageStats(stage="near_index", docs_in=len(docs), docs_out=len(rows))
        )
        return len(rows)

    return store.map(save_part, list(indices))


def write_index_meta(
    store: ObjectStore, num_parts: int, cfg: NearDedupConfig, index_uri: str, docs: int
) -> int:
    """``index.json``, written after every part's unit: an index without it is not an index (``open_index``)."""
    meta = {"params": cfg.signature_params(), "num_parts": num_parts, "docs": docs}
    open_store(index_uri, store.s3).put_bytes("index.json", json.dumps(meta, indent=1).encode())
    return docs
