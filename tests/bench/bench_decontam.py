"""Decontamination throughput, MB/s per core (CPU time of this one process), against 1,000 evaluation texts.

Corpus: the bundled sample corpus (all languages, CJK included) repeated to ``--mb`` MB, and generated
English-like text. Evaluation set: ``--eval-texts`` passages of 20-120 words, half taken from generated text
(no match expected) and half cut from the sample corpus (so the corpus side has real hits, which go through
the report path). Times the index build once and the streamed per-document check (``decontam_batch``).
Run: ``.venv/bin/python tests/bench/bench_decontam.py [--mb 20] [--eval-texts 1000] [--mode remove|cut]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import time
from collections import Counter

import zstandard

from pipeline.decontam import DecontamConfig, UnitHasher, decontam_batch, index_texts
from pipeline.records import Record
from pipeline.sample_corpus import sample_corpus_path
from tests.bench.bench_clean import generated_english, repeat_to

BATCH = 2048


def sample_texts() -> list[str]:
    texts = []
    for path in sorted(glob.glob(str(sample_corpus_path() / "*.jsonl.zst"))):
        with open(path, "rb") as f:
            data = zstandard.ZstdDecompressor().stream_reader(f).read()
        texts += [json.loads(line)["text"] for line in data.splitlines()]
    return texts


def eval_texts(n: int, sample: list[str], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    generated = generated_english(n // 2 + 1, seed=seed + 1)
    out = []
    for i in range(n):
        source = (generated if i % 2 else sample)[rng.randrange(len(generated) if i % 2 else len(sample))]
        words = source.split()
        length = rng.randint(20, 120)
        start = rng.randrange(max(1, len(words) - length))
        out.append(" ".join(words[start : start + length]))
    return out


def run(name: str, corpus: list[str], evals: list[str], cfg: DecontamConfig) -> None:
    start = time.process_time()
    index = index_texts({"bench": evals}, cfg.ngram)
    build = time.process_time() - start
    records = [Record(f"d{i}", t, "src") for i, t in enumerate(corpus)]
    mb = sum(len(t.encode("utf-8")) for t in corpus) / 1e6
    hasher, matches, dropped = UnitHasher(), Counter[str](), 0
    start = time.process_time()
    for i in range(0, len(records), BATCH):
        _, stats = decontam_batch(records[i : i + BATCH], index, cfg, hasher, matches)
        dropped += stats.dropped["contaminated"] + (
            stats.docs_in - stats.docs_out if cfg.mode == "cut" else 0
        )
    seconds = time.process_time() - start
    print(
        f"{name}: {mb:.1f} MB, {len(records)} docs, {len(evals)} eval texts ({len(index.hashes)} n-grams, "
        f"index built in {build:.2f} s)"
    )
    print(
        f"  decontam ({cfg.mode}, {cfg.ngram}-grams): {mb / seconds:8.1f} MB/s per core ({seconds:.2f} s); "
        f"{dropped} docs contaminated, {len(matches)} distinct matched n-grams"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=20)
    parser.add_argument("--eval-texts", type=int, default=1000)
    parser.add_argument("--mode", choices=("remove", "cut"), default="remove")
    args = parser.parse_args()
    cfg = DecontamConfig(mode=args.mode, min_kept_chars=0)
    sample = sample_texts()
    evals = eval_texts(args.eval_texts, sample)
    run("sample corpus (11 languages), repeated", repeat_to(sample, args.mb), evals, cfg)
    run("generated English-like text", repeat_to(generated_english(4000, seed=7), args.mb), evals, cfg)


if __name__ == "__main__":
    main()
