"""Data-loader and sampler benchmark.

1. Samples/s of ShardDataset + DataLoader at seq_len 2048 from cached shards (random tokens written with
   pipeline.dataset.shards' ShardWriter, so the shards are the real format), for several worker counts.
2. ResumableDistributedSampler at 10^9 samples: indices/s and the memory it holds (tracemalloc peak and RSS
   growth), next to what torch.randperm costs.

Run: ``.venv/bin/python tests/bench/bench_dataloader.py [--tokens 134217728] [--json out.json]``
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import logging
import tempfile
import time
import tracemalloc
from collections import deque
from pathlib import Path

import psutil
import torch
from random_dataset import build_random_dataset

from training.cache import ShardCache
from training.data import ShardDataset, build_dataloader
from training.sampler import EpochPermutation, ResumableDistributedSampler

VOCAB = 50_257


def bench_loader(ds: ShardDataset, workers: int, micro_batch: int, samples: int) -> float:
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, seed=0)
    loader = build_dataloader(
        ds, sampler, micro_batch=micro_batch, num_workers=workers, persistent_workers=False
    )
    it = iter(loader)
    for _ in range(max(2, 2 * workers)):  # warm-up: worker start-up and first maps
        next(it)
    n, t0 = 0, time.perf_counter()
    while n < samples:
        batch = next(it)
        n += batch["input_ids"].shape[0]
    rate = n / (time.perf_counter() - t0)
    del it
    return rate


def bench_getitem(ds: ShardDataset, samples: int) -> float:
    order = EpochPermutation(len(ds), seed=1, epoch=0)[: min(samples, len(ds))]
    t0 = time.perf_counter()
    for i in order.tolist():
        ds[i]
    return len(order) / (time.perf_counter() - t0)


def bench_sampler(n: int, count: int) -> dict[str, float]:
    """Index rate over ``count`` indices (no tracing), then memory: RSS growth and a traced shorter run."""
    sampler = ResumableDistributedSampler(n, num_replicas=8, rank=3, seed=0)
    sampler.set_epoch(1)
    sampler.set_start(n // 3)
    proc = psutil.Process()
    gc.collect()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    deque(itertools.islice(iter(sampler), count), maxlen=0)
    iter_s = time.perf_counter() - t0
    rss_growth = proc.memory_info().rss - rss0
    t0 = time.perf_counter()
    got = 0
    for block in sampler.iter_blocks():
        got += len(block)
        if got >= count:
            break
    block_s = time.perf_counter() - t0
    tracemalloc.start()
    deque(itertools.islice(iter(sampler), min(count, 10**6)), maxlen=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "n": n,
        "indices": count,
        "python_iter_indices_per_s": count / iter_s,
        "numpy_block_indices_per_s": got / block_s,
        "tracemalloc_peak_bytes": peak,
        "rss_growth_bytes": rss_growth,
        "randperm_bytes_at_n": 8 * n,
    }


def bench_randperm(n: int) -> dict[str, float]:
    t0 = time.perf_counter()
    perm = torch.randperm(n)
    return {"n": n, "seconds": time.perf_counter() - t0, "bytes": perm.numel() * perm.element_size()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128 << 20, help="tokens in the random dataset")
    parser.add_argument("--shard-tokens", type=int, default=16 << 20)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4000, help="samples timed per loader configuration")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--sampler-n", type=int, default=10**9)
    parser.add_argument("--sampler-count", type=int, default=10**7)
    parser.add_argument("--randperm-n", type=int, default=10**8, help="0 skips the torch.randperm reference")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per figure; the best is reported (noisy hosts)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict = {"seq_len": args.seq_len, "micro_batch": args.micro_batch}
    with tempfile.TemporaryDirectory(prefix="pw-bench-") as tmp:
        t0 = time.perf_counter()
        manifest, store = build_random_dataset(Path(tmp) / "ds", args.tokens, args.shard_tokens, VOCAB)
        results["build_s"] = time.perf_counter() - t0
        cache = ShardCache(store, Path(tmp) / "cache", 4 * args.tokens * 2)
        ds = ShardDataset(manifest, store, args.seq_len, "train", cache)
        t0 = time.perf_counter()
        for f in ds.cache.prefetch([(s.key, s.sha256, s.bytes) for s in ds.shards]):
            f.result()
        results["cache_fill_s"] = time.perf_counter() - t0
        results["dataset_samples"] = len(ds)
        best = lambda fn: max(fn() for _ in range(args.repeat))  # noqa: E731
        results["getitem_samples_per_s"] = best(lambda: bench_getitem(ds, args.samples))
        results["loader_samples_per_s"] = {
            w: best(lambda w=w: bench_loader(ds, w, args.micro_batch, args.samples)) for w in args.workers
        }
        ds.close()
        cache.close()
    runs = [bench_sampler(args.sampler_n, args.sampler_count) for _ in range(args.repeat)]
    results["sampler"] = max(runs, key=lambda r: r["python_iter_indices_per_s"])
    if args.randperm_n:
        results["torch_randperm"] = bench_randperm(args.randperm_n)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def report(r: dict) -> None:
    tokens_per_sample = r["seq_len"]
    print(
        f"dataset: {r['dataset_samples']} samples of {r['seq_len']} tokens; built in {r['build_s']:.1f} s, "
        f"cache filled (copy + sha256) in {r['cache_fill_s']:.1f} s"
    )
    print(
        f"ShardDataset[i] random order: {r['getitem_samples_per_s']:,.0f} samples/s "
        f"({r['getitem_samples_per_s'] * tokens_per_sample / 1e6:,.1f} M tokens/s)"
    )
    for workers, rate in r["loader_samples_per_s"].items():
        print(
            f"DataLoader micro_batch={r['micro_batch']} workers={workers}: {rate:,.0f} samples/s "
            f"({rate * tokens_per_sample / 1e6:,.1f} M tokens/s)"
        )
    s = r["sampler"]
    print(
        f"sampler n={s['n']:.0e}: {s['python_iter_indices_per_s'] / 1e6:.2f} M indices/s as Python ints, "
        f"{s['numpy_block_indices_per_s'] / 1e6:.1f} M/s in numpy blocks; {s['indices']:.0e} indices took "
        f"{s['indices'] / s['python_iter_indices_per_s']:.2f} s; tracemalloc peak "
        f"{s['tracemalloc_peak_bytes'] / 2**20:.2f} MiB, RSS growth {s['rss_growth_bytes'] / 2**20:.1f} MiB "
        f"(torch.randperm would hold {s['randperm_bytes_at_n'] / 1e9:.0f} GB per rank)"
    )
    if "torch_randperm" in r:
        p = r["torch_randperm"]
        print(f"torch.randperm({p['n']:.0e}): {p['seconds']:.2f} s, {p['bytes'] / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
