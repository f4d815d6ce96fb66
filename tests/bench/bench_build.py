"""Whole-build benchmarks on the bundled sample corpus.

1. ``stages``: every stage run in this process, one part after another (no Prefect), timed with CPU time:
   MB/s of raw input per core and the share of time per stage.
2. ``rebuild``: ``build_corpus`` (Prefect, local runner) cold, then unchanged, then with one input file changed:
   wall time of each and how many units were reused.

    .venv/bin/python tests/bench/bench_build.py [stages|rebuild|all]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from pipeline.clean import boilerplate
from pipeline.clean import stage as clean
from pipeline.clean.normalize import normalizer
from pipeline.corpus_config import load_corpus_config
from pipeline.dedup import exact, near
from pipeline.ingest import stage as ingest
from pipeline.sample_corpus import sample_corpus_path
from pipeline.storage import open_store
from pipeline.tokenize import stage as tokenize
from pipeline.units.protocol import mark_stage_success, read_part_stats
from tests.fixtures.publish_steps import shard_and_publish


class Clock:
    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}

    def run(self, stage: str, fn, *args, **kwargs):
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn(*args, **kwargs)
        self.cpu[stage] = self.cpu.get(stage, 0.0) + time.process_time() - c0
        self.wall[stage] = self.wall.get(stage, 0.0) + time.perf_counter() - w0
        return out


def bench_stages(root: Path) -> None:
    cfg = load_corpus_config(output=str(root))
    store = open_store(cfg.output, cfg.s3)
    inputs = ingest.list_inputs(list(cfg.resolved_inputs()), cfg.s3)
    plans = ingest.plan_parts(inputs, cfg.ingest.target_part_bytes, cfg=cfg.ingest, s3=cfg.s3)
    raw_bytes = sum(i.size for i in inputs)
    n, w, clock = len(plans), "work/bench", Clock()
    for p in plans:
        clock.run(
            "ingest",
            ingest.run_ingest_part,
            store,
            f"{w}/ingest",
            p,
            cfg.ingest,
            cfg.s3,
            cfg.resolved_sources(),
            normalizer(cfg.clean),
        )
    text_mb = sum(read_part_stats(store, f"{w}/ingest", i).bytes_out for i in range(n)) / 1e6
    for i in range(n):
        clock.run(
            "clean", boilerplate.run_boilerplate_count_part, store, f"{w}/ingest", f"{w}/bp", i, cfg.clean
        )
    clock.run("clean", boilerplate.merge_boilerplate, store, f"{w}/bp", n, cfg.clean, f"{w}/bp/lines.npy")
    for i in range(n):
        clock.run(
            "clean",
            clean.run_clean_part,
            store,
            f"{w}/ingest",
            f"{w}/clean",
            i,
            cfg.clean,
            f"{w}/bp/lines.npy",
        )
    for i in range(n):
        clock.run("exact dedup", exact.run_exact_hash_part, store, f"{w}/clean", f"{w}/xh", i)
    clock.run("exact dedup", exact.resolve_exact_duplicates, store, f"{w}/xh", n, f"{w}/xd")
    for i in range(n):
        clock.run("exact dedup", exact.run_exact_filter_part, store, f"{w}/clean", f"{w}/xo", i, f"{w}/xd")
    clock.run(
        "near dedup", near.run_near_dedup, store, f"{w}/xo", f"{w}/near", f"{w}/dedup", n, cfg.dedup.near
    )
    tok = f"{w}/tokenizer.json"
    clock.run(
        "train tokenizer", tokenize.run_train_tokenizer, store, f"{w}/dedup", n, tok, cfg.tokenize, cfg.s3
    )
    for i in range(n):
        clock.run(
            "tokenize", tokenize.run_tokenize_part, store, f"{w}/dedup", f"{w}/tokens", i, tok, cfg.tokenize
        )
    mark_stage_success(store, f"{w}/tokens", n)
    clock.run("shard+publish", shard_and_publish, store, w, n, tok, cfg.tokenize, cfg.shard, "bench")
    total = sum(clock.cpu.values())
    print(f"sample corpus: {raw_bytes / 1e6:.1f} MB raw input ({text_mb:.1f} MB of text), {n} parts")
    print(f"{'stage':<16}{'cpu s':>8}{'wall s':>8}{'share':>8}{'text MB/s/core':>16}")
    for stage, cpu in clock.cpu.items():
        print(
            f"{stage:<16}{cpu:8.2f}{clock.wall[stage]:8.2f}{cpu / total:8.1%}{text_mb / cpu if cpu else 0:16.1f}"
        )
    print(f"{'total':<16}{total:8.2f}{sum(clock.wall.values()):8.2f}{'':>8}{text_mb / total:16.1f}")
    print(
        f"whole build: {raw_bytes / 1e6 / total:.2f} MB/s of raw (compressed) input per core, "
        f"{text_mb / total:.2f} MB/s of text per core"
    )


def bench_rebuild(root: Path) -> None:
    from flows.build.flow import build_corpus

    raw = root / "raw"
    shutil.copytree(sample_corpus_path(), raw, ignore=shutil.ignore_patterns("*.py", "*.md"))
    out = str(root / "store")
    rows = []
    for label in ("cold build", "no-change rebuild", "one file changed"):
        if label == "one file changed":
            target = sorted(raw.glob("licenses/*.txt"))[0]
            target.write_text(
                target.read_text() + "\nAn added closing paragraph for the rebuild benchmark.\n"
            )
        t0 = time.perf_counter()
        summary = build_corpus(inputs=[str(raw)], output=out)
        rows.append((label, time.perf_counter() - t0, summary["dataset_id"], summary["reused_units"]))
    for label, seconds, dataset_id, reuse in rows:
        reused = ", ".join(f"{k} {a}/{b}" for k, (a, b) in reuse.items())
        print(f"{label:<20}{seconds:8.1f} s  dataset {dataset_id}  reused units: {reused}")


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    with tempfile.TemporaryDirectory() as tmp:
        if what in ("stages", "all"):
            bench_stages(Path(tmp) / "stages")
        if what in ("rebuild", "all"):
            bench_rebuild(Path(tmp) / "rebuild")


if __name__ == "__main__":
    main()
