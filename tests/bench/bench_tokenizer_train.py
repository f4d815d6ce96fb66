"""Tokenizer training, candidate by candidate, on one sample: wall, CPU and bytes per token on held-out text.

The sample is ``bench_scale.py``'s corpus (``--mb``, cached under its folder), every 20th document held out.
Each candidate trains a byte-level BPE of ``--vocab`` tokens (2 special tokens included) in a fresh process,
at 1 and 2 threads or worker processes; wall and CPU (its threads' and its worker processes') cover the training
from the texts in memory to the merges, not the reading of the corpus:

- ``hf``: ``tokenizers``' ``BpeTrainer`` over the texts (``tokenize.trainer: hf``; threads: ``RAYON_NUM_THREADS``);
- ``counts``: ours (``tokenize.trainer: counts``): the texts cut into contiguous runs as a build's parts are,
  each run's words counted in a worker process (``pipeline/tokenize/bpe_train.py``, the compiled kernel), the
  counts merged and the merges learnt in the parent, as a build's training step does;
- ``rustbpe`` and ``bpeasy``, when installed (not dependencies: ``pip install rustbpe bpeasy``): their trainers
  over the texts, with the GPT-2 pattern; they count and merge in one call, so their words cannot be counted
  where the parts are.

Bytes per token: UTF-8 bytes of the held-out documents over their tokens, per held-out group (``real``: the
corpus's first copy, real text; ``perturbed``: its word-permuted copies; and each bundled sample source, whose
text the corpus's pool also holds, so it is not unseen).

    .venv/bin/python tests/bench/bench_tokenizer_train.py [--mb 150] [--vocab 8192] [--only hf counts]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench.bench_scale import corpus_for  # noqa: E402  (the script runs from anywhere)

SPECIALS = ["<|endoftext|>", "<|pad|>"]
HELD_OUT_EVERY = 20


def load(folder: Path) -> tuple[list[str], dict[str, list[str]]]:
    """The training texts and the held-out texts by group."""
    import glob

    import zstandard

    from pipeline.sample_corpus import sample_corpus_path
    from pipeline.tokenize.stage import safe_texts

    train: list[str]
    held: dict[str, list[str]]
    train, held = [], {"real": [], "perturbed": []}
    k = 0
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.open(encoding="utf-8"):
            text = json.loads(line)["text"]
            k += 1
            if k % HELD_OUT_EVERY:
                train.append(text)
            else:
                held["real" if path.name.endswith("0000.jsonl") else "perturbed"].append(text)
    for path in sorted(glob.glob(str(sample_corpus_path() / "*.jsonl.zst"))):
        with open(path, "rb") as fh:
            data = zstandard.ZstdDecompressor().stream_reader(fh).read()
        name = Path(path).name.removesuffix(".jsonl.zst") + " (in pool)"
        held[name] = [json.loads(x)["text"] for x in data.splitlines() if x.strip()]
    return safe_texts(train), held


def _count(texts: list[str]) -> Any:
    from pipeline.tokenize import bpe_train

    return bpe_train.merge_counts(
        [bpe_train.count_words(texts[k : k + 1024]) for k in range(0, len(texts), 1024)]
    )


def train(name: str, texts: list[str], vocab: int, threads: int) -> Any:
    """The candidate's tokenizer as a tiktoken Encoding (for bytes per token) and its tokenizer.json, if any."""
    import tiktoken

    from pipeline.tokenize import bpe_train
    from pipeline.tokenize.fast_bpe import GPT2_PATTERN, tiktoken_from_tokenizer
    from pipeline.tokenize.stage import TokenizeConfig, train_tokenizer

    if name == "hf":
        tok = train_tokenizer(
            texts, TokenizeConfig(vocab_size=vocab, trainer="hf", train_sample_bytes=1 << 62)
        )
        return tiktoken_from_tokenizer(tok), tok.to_str()
    if name == "counts":
        runs = [
            texts[k * len(texts) // (4 * threads) : (k + 1) * len(texts) // (4 * threads)]
            for k in range(4 * threads)
        ]
        with multiprocessing.get_context("fork").Pool(threads) as pool:
            tables = pool.map(_count, runs)
        tok = bpe_train.train_from_counts(bpe_train.merge_counts(tables), vocab, 2, SPECIALS)
        return tiktoken_from_tokenizer(tok), tok.to_str()
    if name == "rustbpe":
        import rustbpe

        trainer = rustbpe.Tokenizer()
        trainer.train_from_iterator(iter(texts), vocab - len(SPECIALS), pattern=GPT2_PATTERN)
        ranks = dict(trainer.get_mergeable_ranks())
    else:  # bpeasy
        import bpeasy

        ranks = bpeasy.train_bpe_stream(iter(texts), GPT2_PATTERN, 64, vocab - len(SPECIALS), 1024)
    enc = tiktoken.Encoding(name=name, pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    return enc, None


def child(args: argparse.Namespace) -> None:
    """One candidate at one thread count, in this fresh process: its figures as one JSON line."""
    texts, held = load(Path(args.corpus))
    import tiktoken  # noqa: F401  (imports are not training: every candidate starts with them loaded)

    from pipeline.tokenize import bpe_train, stage  # noqa: F401

    cpu0 = time.process_time()
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.perf_counter()
    enc, spec = train(args.child, texts, args.vocab, args.threads[0])
    wall = time.perf_counter() - wall0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu0 + (kids.ru_utime - kids0.ru_utime) + (kids.ru_stime - kids0.ru_stime)
    bpt = {}
    for group, docs in held.items():
        if not docs:
            continue
        tokens = sum(len(ids) for ids in enc.encode_ordinary_batch(docs, num_threads=1))
        bpt[group] = sum(len(d.encode("utf-8")) for d in docs) / tokens
    out = {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "bytes_per_token": bpt,
        "sample_mb": sum(len(t.encode()) for t in texts) / 1e6,
    }
    if spec is not None:
        digest = __import__("hashlib").sha256(spec.encode()).hexdigest()[:12]
        out["tokenizer_sha256"] = digest
    print(json.dumps(out))


def run(corpus: Path, name: str, threads: int, vocab: int) -> dict[str, Any]:
    extra = os.environ.get("PYTHONPATH", "")
    env = os.environ | {
        "RAYON_NUM_THREADS": str(threads),
        "PYTHONPATH": f"{REPO}:{extra}" if extra else str(REPO),
    }
    cmd = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--threads",
        str(threads),
        "--vocab",
        str(vocab),
        "--corpus",
        str(corpus),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=150.0)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--only", nargs="*", default=["hf", "counts", "rustbpe", "bpeasy"])
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "pileworks-bench-scale"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    corpus, _ = corpus_for(Path(args.cache), args.mb)
    print(f"load at start: {os.getloadavg()}; corpus {corpus}; vocab {args.vocab}")
    results = {}
    for name in args.only:
        for threads in args.threads:
            results[(name, threads)] = r = run(corpus, name, threads, args.vocab)
            print(
                f"{name:8s} {threads} thread(s): {json.dumps(r)}  load {os.getloadavg()[0]:.2f}", flush=True
            )
    print("\n| trainer | threads/workers | wall s | CPU s | tokenizer sha256 |\n|---|---|---|---|---|")
    for (name, threads), r in results.items():
        print(
            f"| {name} | {threads} | {r.get('wall_s')} | {r.get('cpu_s')} | {r.get('tokenizer_sha256', '-')} |"
        )
    groups = next((list(r["bytes_per_token"]) for r in results.values() if "bytes_per_token" in r), [])
    print("\n| held-out group | " + " | ".join(f"{n}" for n, t in results if t == args.threads[0]) + " |")
    print("|---|" + "---|" * sum(1 for _, t in results if t == args.threads[0]))
    for group in groups:
        cells = [
            f"{r['bytes_per_token'][group]:.4f}" if "bytes_per_token" in r else "-"
            for (n, t), r in results.items()
            if t == args.threads[0]
        ]
        print(f"| {group} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
