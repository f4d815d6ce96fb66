"""Clean-stage throughput, MB/s per core (CPU time of this one process), split into its parts.

Two mostly-ASCII corpora of ~40 MB each: the English documents and licences of the bundled sample corpus
repeated, and generated English-like text (Zipf vocabulary, sentences, paragraphs; one document in five
carries curly quotes or an accented word, one in fifty a mojibake word). For each it times:
normalisation only (ftfy pre-check, controls, NFC, whitespace), the quality rules only (on normalised text),
the whole ``clean_batch`` without and with a boilerplate set, ``clean_batch`` on text already normalised (as
in a build, whose ingest normalises), and the reference of running ftfy on every
non-ASCII document. Run: ``.venv/bin/python tests/bench/bench_clean.py [--mb 40] [--profile]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import time
from collections import Counter
from dataclasses import replace

import ftfy
import zstandard

from pipeline.clean.config import CleanConfig
from pipeline.clean.langid import LangIdConfig, identify
from pipeline.clean.normalize import FTFY_CONFIG, line_hash, normalize_text
from pipeline.clean.quality import check_quality_batch
from pipeline.clean.stage import clean_batch
from pipeline.records import Record
from pipeline.sample_corpus import sample_corpus_path

BATCH = 2048


def sample_english() -> list[str]:
    texts = []
    for path in sorted(glob.glob(str(sample_corpus_path() / "*.jsonl.zst"))):
        with open(path, "rb") as f:
            data = zstandard.ZstdDecompressor().stream_reader(f).read()
        for line in data.splitlines():
            doc = json.loads(line)
            if doc["meta"].get("lang", "en") == "en":
                texts.append(doc["text"])
    for path in sorted(glob.glob(str(sample_corpus_path() / "licenses" / "*.txt"))):
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    return texts


def generated_english(n_docs: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    vocab = [
        "".join(rng.choice("etaoinshrdlcumwfgypbvk") for _ in range(rng.randint(1, 11))) for _ in range(20000)
    ]
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]
    extras = ["“quoted”", "naïve", "café", "—", "it’s"]
    docs = []
    for d in range(n_docs):
        words = rng.choices(vocab, weights, k=rng.randint(80, 1200))
        if d % 5 == 0:
            words[rng.randrange(len(words))] = rng.choice(extras)
        sentences = [" ".join(words[i : i + 15]).capitalize() + "." for i in range(0, len(words), 15)]
        if d % 50 == 0:
            sentences[rng.randrange(len(sentences))] += " SchÃ¶n, nicht wahr?"
        paragraphs = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)]
        docs.append("\n\n".join(paragraphs))
    return docs


def repeat_to(texts: list[str], mb: float) -> list[str]:
    out, size = [], 0
    while size < mb * 1e6:
        for t in texts:
            out.append(t)
            size += len(t.encode("utf-8"))
    return out


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def batches(texts: list[str]) -> list[list[Record]]:
    recs = [Record(str(i), t, "bench") for i, t in enumerate(texts)]
    return [recs[i : i + BATCH] for i in range(0, len(recs), BATCH)]


def bench(name: str, texts: list[str]) -> None:
    cfg = CleanConfig()
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    ascii_share = sum(t.isascii() for t in texts) / len(texts)
    counts: Counter[str] = Counter()
    normalized: list[str] = []
    t_norm = cpu_seconds(lambda: normalized.extend(normalize_text(t, cfg, counts) for t in texts))
    t_quality = cpu_seconds(
        lambda: [
            check_quality_batch(normalized[i : i + BATCH], cfg.quality)
            for i in range(0, len(normalized), BATCH)
        ]
    )
    recs = batches(texts)
    no_langid = replace(cfg, langid=LangIdConfig(enabled=False))
    t_no_lid = cpu_seconds(lambda: [clean_batch(b, no_langid) for b in recs])
    t_clean = cpu_seconds(lambda: [clean_batch(b, cfg) for b in recs])
    normalized_recs = batches(normalized)  # a build's ingest normalises: clean reads the text as it is
    t_build = cpu_seconds(lambda: [clean_batch(b, cfg, normalized=True) for b in normalized_recs])
    some_lines = {line_hash(line) for t in texts[:50] for line in t.split("\n")[:3] if len(line) > 20}
    boilerplate = frozenset(some_lines)
    t_bp = cpu_seconds(lambda: [clean_batch(b, cfg, boilerplate) for b in recs])
    non_ascii = [t for t in texts[: max(1, len(texts) // 20)] if not t.isascii()]
    na_mb = sum(len(t.encode("utf-8")) for t in non_ascii) / 1e6
    t_ftfy = cpu_seconds(lambda: [ftfy.fix_text(t, FTFY_CONFIG) for t in non_ascii]) if non_ascii else 0.0
    print(
        f"{name}: {mb:.1f} MB, {len(texts)} docs, {ascii_share:.0%} pure ASCII; "
        f"mojibake fixed in {counts['mojibake_fixed']} docs"
    )
    print(f"  normalise only            : {mb / t_norm:8.1f} MB/s per core ({t_norm:.2f} s)")
    print(f"  quality rules only        : {mb / t_quality:8.1f} MB/s per core ({t_quality:.2f} s)")
    print(f"  clean_batch (no langid)   : {mb / t_no_lid:8.1f} MB/s per core ({t_no_lid:.2f} s)")
    print(f"  clean_batch (no bp)       : {mb / t_clean:8.1f} MB/s per core ({t_clean:.2f} s)")
    print(f"  clean_batch on normalised : {mb / t_build:8.1f} MB/s per core ({t_build:.2f} s; as in a build)")
    print(f"  clean_batch ({len(boilerplate):3d} bp lines): {mb / t_bp:8.1f} MB/s per core ({t_bp:.2f} s)")
    if t_ftfy:
        print(f"  reference: ftfy.fix_text on every non-ASCII doc: {na_mb / t_ftfy:.2f} MB/s per core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=40.0)
    parser.add_argument("--profile", action="store_true", help="pyinstrument profile of clean_batch")
    args = parser.parse_args()
    identify("warm-up: the language model loads once per process")  # not in the first timed clean_batch
    sample = repeat_to(sample_english(), args.mb)
    generated = repeat_to(generated_english(4000), args.mb)
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler()
        profiler.start()
        for b in batches(sample[: len(sample) // 4]):
            clean_batch(b, CleanConfig())
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False))
        return
    bench("sample corpus (en + licences), repeated", sample)
    bench("generated English-like text", generated)


if __name__ == "__main__":
    main()
