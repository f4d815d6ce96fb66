"""Ingest throughput, MB/s per core: the bundled sample (.jsonl.zst) and larger generated .jsonl files.

    .venv/bin/python tests/bench/bench_ingest.py [--mb 200] [--workers 2]

Figures: "raw" = bytes read from the store (compressed bytes for .zst), "text" = UTF-8 bytes of the
documents produced. Generated files reuse the sample corpus text (real prose in 9 languages), so JSON escaping
and UTF-8 validation cost what they cost on a real corpus. A GB18030 copy measures the detection slow path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import zstandard

from pipeline.ingest.config import IngestConfig, PartPlan
from pipeline.ingest.stage import ingest_part, list_inputs, plan_parts
from pipeline.sample_corpus import sample_corpus_path
from pipeline.units.protocol import StageStats

MB = 1024 * 1024


def sample_texts() -> list[str]:
    texts = []
    for path in sorted(sample_corpus_path().glob("*.jsonl.zst")):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
        texts += [json.loads(line)["text"] for line in data.splitlines()]
    return texts


def generate_jsonl(path: Path, target_bytes: int, codec: str = "utf-8") -> None:
    """Lines of real text: each sample chapter cut into ~4 KiB documents, repeated up to the target size."""
    docs = [t[i : i + 4096] for t in sample_texts() for i in range(0, len(t), 4096)]
    if codec != "utf-8":
        docs = [d for d in docs if _encodable(d, codec)]
    written = 0
    with open(path, "wb") as f:
        while written < target_bytes:
            for i, doc in enumerate(docs):
                line = json.dumps({"text": doc, "meta": {"n": i}}, ensure_ascii=False) + "\n"
                data = line.encode(codec)
                f.write(data)
                written += len(data)
                if written >= target_bytes:
                    break


def _encodable(text: str, codec: str) -> bool:
    try:
        text.encode(codec)
    except UnicodeEncodeError:
        return False
    return True


def _run(plan_json: dict) -> dict:
    _, _, stats = ingest_part(PartPlan.from_json(plan_json), IngestConfig(), None)
    return stats.to_json()


def measure(label: str, sources: list[str], workers: int, target: int = 32 * MB) -> None:
    plans = plan_parts(list_inputs(sources), target, s3=None)
    start = time.perf_counter()
    cpu_start = _cpu_seconds()
    total = StageStats(stage="ingest")
    if workers == 1:
        for plan in plans:
            total.merge(StageStats.from_json(_run(plan.to_json())))
    else:
        with ProcessPoolExecutor(workers) as pool:
            for stats in pool.map(_run, [p.to_json() for p in plans]):
                total.merge(StageStats.from_json(stats))
    seconds = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu_start
    raw, text = total.bytes_in / MB, total.bytes_out / MB
    print(
        f"{label:<34} workers={workers} parts={len(plans):<3} docs={total.docs_out:<6} raw={raw:6.1f} MB "
        f"text={text:6.1f} MB | wall {seconds:5.2f} s: raw {raw / seconds:5.1f} MB/s | cpu {cpu:5.2f} s: "
        f"raw {raw / cpu:5.1f} MB/s/core, text {text / cpu:5.1f} MB/s/core | dropped={dict(total.dropped)}"
    )


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children: MB/s per core that does not depend on how busy
    the machine is (wall-clock figures on a shared machine mostly measure the neighbours)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="size of the generated .jsonl")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    zst = [str(p) for p in sorted(sample_corpus_path().glob("*.jsonl.zst"))]
    measure("sample corpus (.jsonl.zst)", zst, 1)
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.jsonl"
        generate_jsonl(big, args.mb * MB)
        measure(f"generated .jsonl ({args.mb} MB)", [str(big)], 1)
        if args.workers > 1:
            measure(f"generated .jsonl ({args.mb} MB)", [str(big)], args.workers)
        legacy = Path(tmp) / "gb18030.jsonl"
        generate_jsonl(legacy, 20 * MB, codec="gb18030")
        measure("generated GB18030 .jsonl (20 MB)", [str(legacy)], 1)


if __name__ == "__main__":
    main()
