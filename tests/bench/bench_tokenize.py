"""Tokenizer throughput on the bundled sample corpus: ``tokenizers`` encode_batch vs the tiktoken fast path.

Trains a byte-level BPE (vocab 8k and 32k) on the sample corpus with the real ``train_tokenizer``, checks that
both encoders give identical ids on every document, and prints MB/s of wall time and MB/s per core measured
as MB per process CPU-second (all threads), which holds on a shared, loaded machine. Run: ``.venv/bin/python tests/bench/bench_tokenize.py [--vocab 8192 32768] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import zstandard

from pipeline.sample_corpus import sample_corpus_path
from pipeline.tokenize.fast_bpe import tiktoken_from_tokenizer
from pipeline.tokenize.stage import Encoder, TokenizeConfig, train_tokenizer


def sample_texts() -> list[str]:
    texts = []
    for path in sorted(glob.glob(str(sample_corpus_path() / "*.jsonl.zst"))):
        with open(path, "rb") as f:
            data = zstandard.ZstdDecompressor().stream_reader(f).read()
        texts += [json.loads(line)["text"] for line in data.splitlines() if line.strip()]
    return texts


def best_seconds(fn, repeat: int) -> tuple[float, float]:
    """Best (wall seconds, process CPU seconds over all threads) of ``repeat`` runs.

    CPU seconds give MB/s per core that hold on a shared, loaded machine; wall seconds give the total rate.
    """
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best


def bench(texts: list[str], vocab_size: int, threads: int, repeat: int) -> None:
    cfg = TokenizeConfig(vocab_size=vocab_size, num_threads=threads)
    start = time.perf_counter()
    tok = train_tokenizer(texts, cfg)
    train_s = time.perf_counter() - start
    encoder = Encoder(tok, cfg, sample=texts)  # verifies the fast path on every document
    fast = tiktoken_from_tokenizer(tok)
    ref_ids = [e.ids for e in encoder.reference.encode_batch(texts, add_special_tokens=False)]
    fast_ids = fast.encode_ordinary_batch(texts, num_threads=threads)
    same = sum(a == b for a, b in zip(ref_ids, fast_ids, strict=True))
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    ref = encoder.reference
    rates = {
        "tokenizers encode, 1 thread": best_seconds(
            lambda: [ref.encode(t, add_special_tokens=False) for t in texts], repeat
        ),
        "tiktoken encode_ordinary, 1 thread": best_seconds(
            lambda: [fast.encode_ordinary(t) for t in texts], repeat
        ),
        f"tokenizers encode_batch, {threads} threads": best_seconds(
            lambda: ref.encode_batch(texts, add_special_tokens=False), repeat
        ),
        f"tiktoken encode_ordinary_batch, {threads} threads": best_seconds(
            lambda: fast.encode_ordinary_batch(texts, num_threads=threads), repeat
        ),
        f"pipeline Encoder.encode ({encoder.name}, +EOS, numpy), {threads} threads": best_seconds(
            lambda: encoder.encode(texts), repeat
        ),
    }
    print(
        f"vocab {tok.get_vocab_size():>6} (trained in {train_s:.1f}s), {mb:.2f} MB, {len(texts)} docs; "
        f"ids identical on {same}/{len(texts)} docs; encoder chosen: {encoder.name}"
    )
    for label, (wall, cpu) in rates.items():
        print(f"  {label:<58}: {mb / wall:6.2f} MB/s wall, {mb / cpu:5.2f} MB/s per core (per CPU-second)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    texts = sample_texts()
    for vocab in args.vocab:
        bench(texts, vocab, args.threads, args.repeat)


if __name__ == "__main__":
    main()
