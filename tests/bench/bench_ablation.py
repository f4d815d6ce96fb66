"""A real ablation on this machine: does filtering make a better small model, on held-out clean text?

The corpus: documents of the bundled sample corpus (Debian documentation, ~200 words each) with a realistic share
of low-quality documents mixed in: machine-generated word lists, navigation-menu text, and license boilerplate
repeated with small changes. The evaluation set: held-out documentation the corpus does not contain. A classifier
is trained first as the README's recipe says: a reference set (other Debian manuals, as "your own
documentation") as positives against a random sample of the corpus (``negative_sample``). Variants:

- ``base`` (no filters): quality rules, boilerplate removal and dedup off;
- ``rules``: Gopher's quality rules, boilerplate lines, exact and near dedup;
- ``rules_clf``: the same plus the classifier keeping ``--keep`` of each source.

Each trains the tiny preset on one CPU rank for ``--tokens`` tokens with ``--seeds`` seeds and the base's
tokenizer, then is evaluated on the held-out file. Run:
``.venv/bin/python tests/bench/bench_ablation.py [--tokens 16384] [--seeds 2] [--keep 0.6]``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from prefect.testing.utilities import prefect_test_harness

from flows.train.ablate import ablate
from flows.train.ablate_plan import format_table
from pipeline.clean.classifier_train import ClassifierTrainConfig, train_classifier
from tests.fixtures.quality_texts import documentation_texts, license_texts

DOC_WORDS = 200
MENU = [
    "Home",
    "About us",
    "Products",
    "Services",
    "Blog",
    "Contact",
    "Login",
    "Sign up",
    "Cart",
    "Help",
    "Careers",
    "Press",
    "Privacy",
    "Terms",
    "Sitemap",
    "Newsletter",
    "Support",
    "FAQ",
    "Shop",
    "Deals",
]


def _docs(name: str, limit: int) -> list[str]:
    words = " ".join(documentation_texts(10_000, name)).split()
    return [" ".join(words[i : i + DOC_WORDS]) for i in range(0, len(words) - DOC_WORDS, DOC_WORDS)][:limit]


def _word_list(rng: random.Random, vocab: list[str]) -> str:
    return ", ".join(rng.choice(vocab) for _ in range(rng.randint(120, 220)))


def _menu(rng: random.Random) -> str:
    lines = [" | ".join(rng.sample(MENU, rng.randint(4, 8))) for _ in range(rng.randint(15, 30))]
    return "\n".join([*lines, f"Copyright {rng.randint(2000, 2025)} Example Corp. All rights reserved."])


def _license(rng: random.Random, texts: list[str]) -> str:
    text = " ".join(rng.sample(texts, 3))
    who = rng.choice(["Example Corp", "ACME Inc", "J. Random Hacker", "The Authors"])
    return f"Copyright (C) {rng.randint(1990, 2025)} {who}. " + text


def write_corpus(folder: Path, junk_share: float, seed: int = 0) -> dict[str, int]:
    """The corpus as one jsonl file; returns its documents by kind."""
    rng = random.Random(seed)
    good = _docs("debian-reference", 700)[:-150] + _docs("developers-reference", 250)
    vocab = sorted({w.strip(".,;:()").lower() for t in good for w in t.split() if w.isalpha()})
    lic = license_texts(400)
    n_junk = round(len(good) * junk_share / (1 - junk_share))
    junk = [[_word_list, _menu, _license][i % 3] for i in range(n_junk)]
    junk_texts = [f(rng, vocab) if f is _word_list else f(rng) if f is _menu else f(rng, lic) for f in junk]
    rows = [{"text": t} for t in good + junk_texts]
    rng.shuffle(rows)
    folder.mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return {"documentation": len(good), "low_quality": n_junk}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16_384)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--keep", type=float, default=0.6)
    ap.add_argument("--junk-share", type=float, default=0.3)
    args = ap.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        kinds = write_corpus(root / "corpus", args.junk_share)
        held_out = _docs("debian-reference", 700)[-150:]  # documentation the corpus does not hold
        (root / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in held_out))
        corpus_texts = [json.loads(line)["text"] for line in (root / "corpus" / "corpus.jsonl").open()]
        reference = _docs("maint-guide", 400) + _docs("debian-faq", 400) + _docs("doc-debian", 200)
        metrics = train_classifier(
            reference, corpus_texts, root / "q.bin", ClassifierTrainConfig(negative_sample=len(reference))
        )
        rules = "clean.quality.enabled=true,clean.boilerplate.enabled=true,dedup.exact.enabled=true,dedup.near.enabled=true"
        clf = f"clean.classifier.model={root / 'q.bin'},clean.classifier.keep_fraction={args.keep}"
        with prefect_test_harness():
            result = ablate(
                eval_data=str(root / "eval.jsonl"),
                tokens=args.tokens,
                variants=[f"rules={rules}", f"rules_clf={rules},{clf}"],
                base_overrides={
                    "name": "ablation-bench",
                    "clean.quality.enabled": False,
                    "clean.boilerplate.enabled": False,
                    "dedup.exact.enabled": False,
                    "dedup.near.enabled": False,
                    "tokenize.vocab_size": 2000,
                    "shard.valid_fraction": 0.02,
                },
                inputs=[str(root / "corpus")],
                output=str(root / "store"),
                seeds=args.seeds,
                train_overrides={
                    "seq_len": 64,
                    "micro_batch_size": 8,
                    "eval_batches": 1,
                    "num_workers": 0,
                    "tensorboard": False,
                },
                nproc=1,
                workdir=str(root / "runs"),
            )
    print(
        f"corpus: {kinds}; classifier held-out AUC {metrics['auc']}, precision {metrics['precision']}, "
        f"recall {metrics['recall']}"
    )
    print(
        f"{args.tokens} tokens per run = {result['steps']} steps of {result['tokens_per_step']} tokens; "
        f"seeds {result['seeds']}; {time.perf_counter() - started:.0f} s in all"
    )
    print(format_table(result["rows"]))


if __name__ == "__main__":
    main()
