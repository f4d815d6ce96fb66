"""Near-dedup benchmark: signature MB/s and docs/s (datasketch baselines vs ours, 1 and 2 processes), banding +
clustering docs/s, and the whole near-dedup on the sample corpus and a 10x mutated copy (time, peak RSS per step).

Run: ``.venv/bin/python tests/bench/bench_minhash.py [--quick]``. Uses the bundled sample corpus
(``pipeline/sample_corpus/*.jsonl.zst``, English documents) and the licence texts.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard

from pipeline.dedup.clusters import choose_keepers, connected_labels
from pipeline.dedup.lsh import band_keys, candidate_pairs, make_refs, optimal_params
from pipeline.dedup.minhash import MinHasher

SAMPLE = Path(__file__).resolve().parents[2] / "pipeline" / "sample_corpus"


def load_sample() -> list[tuple[str, str]]:
    """(source, text) of the sample corpus's English documents plus the licence texts."""
    docs = []
    for path in sorted(SAMPLE.glob("*.jsonl.zst")):
        with zstandard.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                if row.get("meta", {}).get("lang", "en") == "en":
                    docs.append((path.name.split(".")[0], row["text"]))
    docs += [("licenses", p.read_text(encoding="utf-8", errors="replace")) for p in sorted((SAMPLE / "licenses").glob("*.txt"))]
    if not docs:
        raise SystemExit(f"no sample corpus under {SAMPLE}")
    return docs


def mb(texts: list[str]) -> float:
    return sum(len(t.encode("utf-8")) for t in texts) / 1e6


def timed(fn, *args):
    """CPU seconds of this process (the bench machine is shared: wall time would measure the neighbours)."""
    t0 = time.process_time()
    out = fn(*args)
    return time.process_time() - t0, out


def bench_signatures(texts: list[str]) -> None:
    from datasketch import MinHash

    size = mb(texts)
    hasher_fast, hasher_sha1 = MinHasher(), MinHasher(hash="sha1")
    sub = texts[: max(1, len(texts) // 8)]
    sub_mb = mb(sub)
    shingles = [hasher_sha1.shingles(t) for t in sub]

    def update_loop():
        for sh in shingles:
            m = MinHash()
            for s in sh:
                m.update(s)

    rows = []
    dt, _ = timed(update_loop)
    rows.append(("datasketch MinHash.update loop (sha1, subset, shingling excluded)", sub_mb / dt, len(sub) / dt))
    dt, _ = timed(lambda: MinHash.bulk(shingles))
    rows.append(("datasketch MinHash.bulk (sha1, subset, shingling excluded)", sub_mb / dt, len(sub) / dt))
    for name, h in (("ours sha1 (bit-identical to MinHash())", hasher_sha1), ("ours xxh64 (== MinHash(hashfunc=))", hasher_fast)):
        dt, _ = timed(h.signatures, texts)
        rows.append((name + ", 1 process, shingling included", size / dt, len(texts) / dt))
    # 2 processes: each takes every other document (balanced bytes); the corpus is repeated 4x so the run is
    # long enough to time. Wall time (needs 2 idle cores) and the busier worker's CPU time are both reported.
    work = texts * 4
    with mp.get_context("fork").Pool(2) as pool:
        pool.map(_sig_worker, [texts[:2], texts[2:4]])  # warm the workers
        t0 = time.perf_counter()
        cpu = pool.map(_sig_worker, [work[0::2], work[1::2]])
        wall = time.perf_counter() - t0
    rows.append(("ours xxh64, 2 processes (wall clock)", 4 * size / wall, len(work) / wall))
    rows.append(("ours xxh64, 2 processes (busier worker's CPU time)", 4 * size / max(cpu), len(work) / max(cpu)))
    print(f"\n== signatures ({size:.1f} MB, {len(texts)} docs, 5-word shingles, 128 perms; load avg "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")  # fmt: skip
    for name, mbs, dps in rows:
        print(f"  {name:72s} {mbs:7.2f} MB/s {dps:9.0f} docs/s")


def _sig_worker(texts: list[str]) -> float:
    t0 = time.process_time()
    MinHasher().signatures(texts)
    return time.process_time() - t0


def bench_banding(n_docs: int) -> None:
    """Banding + candidate pairs + union-find + keep rule on synthetic signatures with 10% planted duplicates."""
    from datasketch import MinHash, MinHashLSH

    rng = np.random.default_rng(0)
    sigs = rng.integers(0, 2**32, size=(n_docs, 128), dtype=np.uint64).astype(np.uint32)
    dup = rng.choice(n_docs, size=n_docs // 5, replace=False)
    half = len(dup) // 2
    sigs[dup[half:]] = sigs[dup[:half]]  # 10% of docs are near copies of another 10%
    sigs[dup[half:], ::37] ^= 1  # not identical: 4 of 128 values differ (estimated Jaccard 0.97)
    b, r = optimal_params(0.8, 128, 0.5, 0.5)

    def ours():
        keys = band_keys(sigs, b, r).ravel()
        refs = np.repeat(make_refs(0, np.arange(n_docs)), b)
        u, v, _ = candidate_pairs(keys, refs, 64)
        nodes, labels = connected_labels(u, v)
        return choose_keepers(nodes, labels, np.ones(len(nodes), dtype=np.int64), nodes.astype(str))

    dt, cl = timed(ours)
    print(f"\n== banding + clustering ({n_docs} docs, b={b} r={r})")
    print(f"  ours (numpy band keys, sort/group, union-find, keep rule)        {n_docs / dt:10.0f} docs/s "
          f"({len(cl.refs)} clustered, {len(cl.dropped_refs)} dropped)")  # fmt: skip
    m = min(n_docs, 10000)

    def datasketch_lsh():
        lsh = MinHashLSH(threshold=0.8, num_perm=128)
        hs = [MinHash(hashvalues=sigs[i], scheme="affine32") for i in range(m)]
        for i, h in enumerate(hs):
            lsh.insert(i, h)
        for h in hs:
            lsh.query(h)

    dt, _ = timed(datasketch_lsh)
    print(f"  datasketch MinHashLSH insert + query ({m} docs)                 {m / dt:10.0f} docs/s")


def mutate(text: str, rng: random.Random, rate: float) -> str:
    words = text.split()
    for _ in range(int(len(words) * rate)):
        i = rng.randrange(len(words)) if words else 0
        if words:
            words[i] = rng.choice(words)
    return " ".join(words)


def write_corpus(root: str, docs: list[tuple[str, str]], copies: int, parts: int) -> None:
    from pipeline.records import Record, StageStats, write_part
    from pipeline.storage import FileStore

    rng = random.Random(1)
    store = FileStore(root)
    records = []
    for c in range(copies):
        for i, (src, text) in enumerate(docs):
            # copy 0 = the sample; later copies: 30% near-duplicates (1-3% words changed), 70% heavier edits (30%).
            body = text if c == 0 else mutate(text, rng, rng.uniform(0.01, 0.03) if rng.random() < 0.3 else 0.3)
            records.append(Record(f"{src}/{c}/{i}", body, src))
    per = -(-len(records) // parts)
    for p in range(parts):
        chunk = records[p * per : (p + 1) * per]
        write_part(store, "in", p, chunk, StageStats(stage="clean", docs_in=len(chunk)))


def _run_step(root: str, step: str, arg: int, parts: int) -> tuple[float, float]:
    """One step in a fresh process: (CPU seconds, peak RSS MiB, RSS MiB after imports, before the step)."""
    import pyarrow.parquet  # noqa: F401  (imported before the baseline, like every step does)

    from pipeline.dedup import near
    from pipeline.storage import FileStore

    store = FileStore(root)
    cfg = near.NearDedupConfig()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.process_time()
    if step == "signatures":
        near.run_signatures_part(store, "in", "work/signatures", arg, cfg)
    elif step == "bands":
        near.run_bands_part(store, "work", arg, cfg, near.plan_near_dedup(store, "work", parts, cfg))
    elif step == "edges":
        near.run_edges_part(store, "work", arg, cfg, near.plan_near_dedup(store, "work", parts, cfg))
    elif step == "clusters":
        near.run_clusters(store, "in", "work", parts, cfg)
    else:
        near.run_near_filter_part(store, "in", "out", arg, "work/clusters")
    return time.process_time() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, base


def bench_pipeline(docs: list[tuple[str, str]], copies: int, parts: int) -> dict:
    root = tempfile.mkdtemp(prefix="pw-bench-near-")
    write_corpus(root, docs, copies, parts)
    ctx = mp.get_context("spawn")
    result = {}
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        for step in ("signatures", "bands", "edges", "clusters", "filter"):
            units = 1 if step == "clusters" else parts
            if step == "edges":
                units = json.loads(Path(root, "work/plan.json").read_text())["num_partitions"]
            times, rss, over = [], [], []
            for u in range(units):
                dt, peak, base = pool.apply(_run_step, (root, step, u, parts))
                times.append(dt)
                rss.append(peak)
                over.append(peak - base)
            result[step] = (sum(times), max(rss), max(over))
    report = json.loads(Path(root, "work/clusters/dedup_report.json").read_text())
    result["docs"] = report["docs_in"]
    result["removed"] = report["removed_near"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    args = parser.parse_args()
    docs = load_sample()
    texts = [t for _, t in docs]
    bench_signatures(texts)
    bench_banding(50_000 if args.quick else 300_000)
    print("\n== whole near-dedup (each step in a fresh process; seconds summed over units, peak RSS of the largest)")
    runs = {}
    for scale in (1, 10):
        runs[scale] = bench_pipeline(docs, scale, parts=2 * scale if scale > 1 else 2)
        r = runs[scale]
        print(f"  {scale:2d}x: {r['docs']} docs, {r['removed']} near duplicates removed")
        for step in ("signatures", "bands", "edges", "clusters", "filter"):
            sec, rss, over = r[step]
            print(f"      {step:10s} {sec:7.2f} CPU s   peak RSS {rss:7.1f} MiB ({over:6.1f} MiB above the imports)")
    for step in ("signatures", "bands", "edges", "clusters", "filter"):
        ratio_t = runs[10][step][0] / max(runs[1][step][0], 1e-9)
        ratio_m = runs[10][step][2] / max(runs[1][step][2], 1e-9)
        print(f"  1x -> 10x {step:10s} time x{ratio_t:5.1f}  RSS above imports x{ratio_m:5.2f}")


if __name__ == "__main__":
    main()
