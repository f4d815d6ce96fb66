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
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard

from pipeline.dedup.graph import choose_keepers, connected_labels
from pipeline.dedup.lsh import band_keys, candidate_pairs, make_refs, optimal_params
from pipeline.dedup.minhash import MinHasher

STEPS = ("signatures", "plan", "bands", "edges", "clusters", "filter")
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
    docs += [
        ("licenses", p.read_text(encoding="utf-8", errors="replace"))
        for p in sorted((SAMPLE / "licenses").glob("*.txt"))
    ]
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
    rows.append(
        ("datasketch MinHash.update loop (sha1, subset, shingling excluded)", sub_mb / dt, len(sub) / dt)
    )
    dt, _ = timed(lambda: MinHash.bulk(shingles))
    rows.append(("datasketch MinHash.bulk (sha1, subset, shingling excluded)", sub_mb / dt, len(sub) / dt))
    for name, h in (
        ("ours sha1 (bit-identical to MinHash())", hasher_sha1),
        ("ours xxh64 (== MinHash(hashfunc=))", hasher_fast),
    ):
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
    rows.append(
        ("ours xxh64, 2 processes (busier worker's CPU time)", 4 * size / max(cpu), len(work) / max(cpu))
    )
    print(
        f"\n== signatures ({size:.1f} MB, {len(texts)} docs, 5-word shingles, 128 perms; load avg "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
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
    print(
        f"  ours (numpy band keys, sort/group, union-find, keep rule)        {n_docs / dt:10.0f} docs/s "
        f"({len(cl.refs)} clustered, {len(cl.dropped_refs)} dropped)"
    )
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
    from pipeline.records import Record, write_part
    from pipeline.storage import FileStore
    from pipeline.units.protocol import StageStats

    rng = random.Random(1)
    store = FileStore(root)
    records = []
    for c in range(copies):
        for i, (src, text) in enumerate(docs):
            # copy 0 = the sample; later copies: 30% near-duplicates (1-3% words changed), 70% heavier edits (30%).
            body = (
                text if c == 0 else mutate(text, rng, rng.uniform(0.01, 0.03) if rng.random() < 0.3 else 0.3)
            )
            records.append(Record(f"{src}/{c}/{i}", body, src))
    per = -(-len(records) // parts)
    for p in range(parts):
        chunk = records[p * per : (p + 1) * per]
        write_part(store, "in", p, chunk, StageStats(stage="clean", docs_in=len(chunk)))


def _vm_hwm_mib() -> float:
    """Peak RSS of this process image. (ru_maxrss is no good here: Linux carries it across fork + exec.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_step(root: str, step: str, arg: int, parts: int) -> tuple[float, float]:
    """One step in a fresh process: (CPU seconds, peak RSS MiB, RSS MiB after imports, before the step)."""
    import pyarrow.parquet  # noqa: F401  (imported before the baseline, like every step does)

    from pipeline.dedup import candidates, clusters, near, signatures
    from pipeline.dedup.config import NearDedupConfig
    from pipeline.storage import FileStore

    store = FileStore(root)
    cfg = NearDedupConfig()
    base = _vm_hwm_mib()
    t0 = time.process_time()
    if step == "signatures":
        signatures.run_signatures_part(store, "in", "work/signatures", arg, cfg)
    elif step == "plan":  # datasketch's parameter search (scipy integration), once per build
        candidates.plan_near_dedup(store, "work", parts, cfg)
    elif step == "bands":
        candidates.run_bands_part(
            store, "work", arg, cfg, candidates.plan_near_dedup(store, "work", parts, cfg)
        )
    elif step == "edges":
        candidates.run_edges_part(
            store, "work", arg, cfg, candidates.plan_near_dedup(store, "work", parts, cfg)
        )
    elif step == "clusters":
        clusters.run_clusters(store, "in", "work", parts, cfg)
    else:
        near.run_near_filter_part(store, "in", "out", arg, "work/clusters")
    return time.process_time() - t0, _vm_hwm_mib(), base


def bench_pipeline(docs: list[tuple[str, str]], copies: int, parts: int) -> dict:
    root = tempfile.mkdtemp(prefix="pw-bench-near-")
    write_corpus(root, docs, copies, parts)
    result = {}
    for step in STEPS:
        units = 1 if step in ("plan", "clusters") else parts
        if step == "edges":
            units = json.loads(Path(root, "work/plan.json").read_text())["num_partitions"]
        times, rss, over = [], [], []
        for u in range(units):
            # A fresh interpreter per unit, as a worker would run it: its own peak RSS is the step's.
            cmd = [
                sys.executable,
                __file__,
                "--step",
                step,
                "--root",
                root,
                "--unit",
                str(u),
                "--parts",
                str(parts),
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            dt, peak, base = json.loads(out.strip().splitlines()[-1])
            times.append(dt)
            rss.append(peak)
            over.append(peak - base)
        result[step] = (sum(times), max(rss), max(over))
    report = json.loads(Path(root, "work/clusters/dedup_report.json").read_text())
    result["docs"] = report["docs_in"]
    result["removed"] = report["removed_near"]
    result["mb"] = sum(len(t.encode()) for _, t in docs) * copies / 1e6
    shutil.rmtree(root)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument("--scales", default="1,10", help="corpus multiples for the whole-run bench")
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--unit", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--parts", type=int, default=4, help="parts of the whole-run corpus")
    args = parser.parse_args()
    if args.step:  # child mode: one unit of one step
        print(json.dumps(_run_step(args.root, args.step, args.unit, args.parts)))
        return
    docs = load_sample()
    texts = [t for _, t in docs]
    bench_signatures(texts)
    bench_banding(50_000 if args.quick else 300_000)
    print(
        "\n== whole near-dedup (each unit in a fresh process; CPU seconds summed over units, peak RSS of the largest)"
    )
    scales = [int(x) for x in args.scales.split(",")]
    runs = {}
    for scale in scales:
        # A fixed part count, so per-unit time and memory show how they grow with the data.
        runs[scale] = r = bench_pipeline(docs, scale, parts=args.parts)
        print(
            f"  {scale:3d}x: {r['docs']} docs, {r['mb']:.1f} MB, {args.parts} parts, {r['removed']} near dups removed"
        )
        for step in STEPS:
            sec, rss, over = r[step]
            print(
                f"      {step:10s} {sec:7.2f} CPU s  {r['docs'] / max(sec, 1e-9):9.0f} docs/s   peak RSS {rss:7.1f} MiB "
                f"({over:6.1f} MiB above the imports)"
            )
    lo, hi = scales[0], scales[-1]
    for step in STEPS:
        ratio_t = runs[hi][step][0] / max(runs[lo][step][0], 1e-9)
        print(
            f"  {lo}x -> {hi}x {step:10s} time x{ratio_t:5.1f}  peak RSS {runs[lo][step][1]:6.1f} -> {runs[hi][step][1]:6.1f} MiB"
        )


if __name__ == "__main__":
    main()
