"""The ablation recipe with a measured outcome: does filtering make a better small model, by eval loss and by
downstream tasks, with honest intervals?

The corpus (generated from real text on the machine, the bundled sample corpus): 600 English documents of
Debian documentation (~200 words each) and, by default, as many low-quality documents again, in six kinds a web
crawl
holds: keyword lists, navigation-menu pages, license boilerplate with a changed copyright line, duplicated pages
(exact copies and copies with a few words changed), scrambled text (a page's words shuffled) and garbled text
(a page with a third of its words swapped for other words of the corpus, as poor machine translation reads).
Evaluation: 50 held-out documentation documents the corpus does not contain (loss), and two tasks built from
other held-out documentation (180 items each): ``cloze`` (multiple choice: which of four six-word endings follows a passage; the distractors
are the same words scrambled, or the ending of another passage) and ``lambada`` (the last word of a passage).

The classifier is trained as the README's recipe says, on a reference set that is not the evaluation text:
other Debian manuals (maint-guide, debian-faq, doc-debian) as positives against a random sample of the corpus.
Variants: ``base`` (no filters: quality rules, boilerplate and dedup off), ``rules`` (Gopher's quality rules,
boilerplate lines, exact and near dedup), ``rules_clf`` (the same plus the classifier keeping ``--keep``).

Each trains the tiny preset on one CPU rank for ``--tokens`` tokens with ``--seeds`` seeds and the base's
tokenizer; the table gives every metric with its intervals and each difference to the base with a paired one.
``--out DIR`` keeps the generated files and prints the ``pileworks ablate`` command that reruns the comparison.
Run: ``.venv/bin/python tests/bench/bench_ablation.py [--tokens 65536] [--seeds 3] [--keep 0.7] [--out DIR]``.
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


def _english(name: str) -> list[str]:
    """The file's English documents (the sample's manuals hold translations after the English text)."""
    return [d for d in _docs(name, 10_000) if " the " in d and " and " in d]


def _splits() -> dict[str, list[str]]:
    """Disjoint English documentation: the corpus's, the evaluation text, the task passages."""
    ref, dev = _english("debian-reference"), _english("developers-reference")
    return {"corpus": ref[:280] + dev[:320], "eval": ref[280:330], "tasks": ref[330:] + dev[320:]}


def _word_list(rng: random.Random, vocab: list[str]) -> str:
    return ", ".join(rng.choice(vocab) for _ in range(rng.randint(120, 220)))


def _menu(rng: random.Random) -> str:
    lines = [" | ".join(rng.sample(MENU, rng.randint(4, 8))) for _ in range(rng.randint(15, 30))]
    return "\n".join([*lines, f"Copyright {rng.randint(2000, 2025)} Example Corp. All rights reserved."])


def _license(rng: random.Random, texts: list[str]) -> str:
    text = " ".join(rng.sample(texts, 3))
    who = rng.choice(["Example Corp", "ACME Inc", "J. Random Hacker", "The Authors"])
    return f"Copyright (C) {rng.randint(1990, 2025)} {who}. " + text


def _scrambled(rng: random.Random, text: str) -> str:
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


def _garbled(rng: random.Random, text: str, vocab: list[str]) -> str:
    return " ".join(rng.choice(vocab) if rng.random() < 0.33 else w for w in text.split())


def _duplicate(rng: random.Random, text: str) -> str:
    if rng.random() < 0.5:
        return text  # an exact copy
    words = text.split()
    for _ in range(3):  # a near copy: a few words changed, as a mirrored page with another date and name
        words[rng.randrange(len(words))] = rng.choice(["2024", "mirror", "copy", "archive", "updated"])
    return " ".join(words)


JUNK_KINDS = ("keywords", "menu", "license", "duplicate", "scrambled", "garbled")


def junk_document(kind: str, rng: random.Random, good: list[str], vocab: list[str], lic: list[str]) -> str:
    if kind == "keywords":
        return _word_list(rng, vocab)
    if kind == "menu":
        return _menu(rng)
    if kind == "license":
        return _license(rng, lic)
    if kind == "duplicate":
        return _duplicate(rng, rng.choice(good))
    if kind == "scrambled":
        return _scrambled(rng, rng.choice(good))
    return _garbled(rng, rng.choice(good), vocab)


def write_corpus(folder: Path, junk_share: float, seed: int = 0) -> dict[str, int]:
    """The corpus as one jsonl file; returns its documents by kind."""
    rng = random.Random(seed)
    good = _splits()["corpus"]
    vocab = sorted({w.strip(".,;:()").lower() for t in good for w in t.split() if w.isalpha()})
    lic = license_texts(400)
    n_junk = round(len(good) * junk_share / (1 - junk_share))
    kinds = [JUNK_KINDS[i % len(JUNK_KINDS)] for i in range(n_junk)]
    rows = [{"text": t} for t in good] + [{"text": junk_document(k, rng, good, vocab, lic)} for k in kinds]
    rng.shuffle(rows)
    folder.mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return {"documentation": len(good)} | {k: kinds.count(k) for k in JUNK_KINDS}


def write_tasks(folder: Path, seed: int = 0) -> dict[str, Path]:
    """``cloze`` (multiple choice) and ``lambada`` (completion) from held-out documentation (windows the corpus
    and the evaluation text do not hold)."""
    rng = random.Random(seed)
    plain = [p for p in _splits()["tasks"] if max(map(len, p.split())) <= 20]  # no URLs, paths or hashes
    passages = plain[:200]
    cloze, lambada = [], []
    for i, text in enumerate(passages):
        words = text.split()[:30]
        ending = " ".join(words[-6:])
        other = " ".join(passages[(i + 1) % len(passages)].split()[24:30])
        choices = [ending, _scrambled(rng, ending), _scrambled(rng, ending), other]
        order = list(range(4))
        rng.shuffle(order)
        query = " ".join(words[:-6])
        cloze.append({"query": query, "choices": [choices[j] for j in order], "gold": order.index(0)})
        lambada.append({"text": " ".join(text.split()[100:130])})  # another part of the passage
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"cloze": folder / "cloze.jsonl", "lambada": folder / "lambada.jsonl"}
    for name, rows in (("cloze", cloze), ("lambada", lambada)):
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


BASE_OVERRIDES = {
    "name": "ablation-bench",
    "clean.quality.enabled": False,
    "clean.boilerplate.enabled": False,
    "dedup.exact.enabled": False,
    "dedup.near.enabled": False,
    "tokenize.vocab_size": 2000,
    "shard.valid_fraction": 0.02,
}
TRAIN_OVERRIDES = {
    "seq_len": 128,
    "micro_batch_size": 4,
    "eval_batches": 1,
    "num_workers": 0,
    "tensorboard": False,
}
RULES = "clean.quality.enabled=true,clean.boilerplate.enabled=true,dedup.exact.enabled=true,dedup.near.enabled=true"


def prepare(root: Path, junk_share: float) -> dict:
    """Corpus, evaluation text, task files and the classifier under ``root``."""
    kinds = write_corpus(root / "corpus", junk_share)
    held_out = _splits()["eval"]  # documentation the corpus does not hold
    (root / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in held_out))
    tasks = write_tasks(root / "tasks")
    corpus_texts = [json.loads(line)["text"] for line in (root / "corpus" / "corpus.jsonl").open()]
    reference = _docs("maint-guide", 400) + _docs("debian-faq", 400) + _docs("doc-debian", 200)
    metrics = train_classifier(
        reference, corpus_texts, root / "q.bin", ClassifierTrainConfig(negative_sample=len(reference))
    )
    return {"kinds": kinds, "tasks": tasks, "classifier": metrics}


def cli_command(root: Path, args: argparse.Namespace, variants: list[str]) -> str:
    """The ``pileworks ablate`` command that reruns this comparison on the files under ``root``."""
    parts = ["pileworks ablate", f"--input {root / 'corpus'}", f"--output {root / 'store'}"]
    parts += [f"--set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in BASE_OVERRIDES.items()]
    parts += [f"--eval {root / 'eval.jsonl'}", f"--task {root / 'tasks/cloze.jsonl'}"]
    parts += [f"--task {root / 'tasks/lambada.jsonl'}", f"--tokens {args.tokens}", f"--seeds {args.seeds}"]
    parts += [f"--variant {v}" for v in variants]
    parts += [
        f"--train-set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in TRAIN_OVERRIDES.items()
    ]
    return " \\\n    ".join(parts)


def run(root: Path, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    prepared = prepare(root, args.junk_share)
    clf = f"clean.classifier.model={root / 'q.bin'},clean.classifier.keep_fraction={args.keep}"
    variants = [f"rules={RULES}", f"rules_clf={RULES},{clf}"]
    with prefect_test_harness():
        result = ablate(
            eval_data=str(root / "eval.jsonl"),
            tokens=args.tokens,
            variants=variants,
            base_overrides=BASE_OVERRIDES,
            inputs=[str(root / "corpus")],
            output=str(root / "store"),
            seeds=args.seeds,
            train_overrides=TRAIN_OVERRIDES,
            nproc=1,
            workdir=str(root / "runs"),
            tasks=[str(p) for p in prepared["tasks"].values()],
        )
    metrics = prepared["classifier"]
    print(f"corpus: {prepared['kinds']}")
    print(
        f"classifier held-out AUC {metrics['auc']}, precision {metrics['precision']}, recall {metrics['recall']}"
    )
    print(f"{time.perf_counter() - started:.0f} s in all")
    print(format_table(result["rows"], result["budget_line"]))
    if args.json:
        Path(args.json).write_text(json.dumps({k: v for k, v in result.items() if k != "markdown"}, indent=1))
    print("\nthe same comparison with the command:\n" + cli_command(root, args, variants))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=65_536)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--keep", type=float, default=0.7)
    ap.add_argument("--junk-share", type=float, default=0.5)
    ap.add_argument("--out", default=None, help="keep the generated files here (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="also write the result as JSON to this file")
    args = ap.parse_args()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=False)
        run(Path(args.out).resolve(), args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp), args)


if __name__ == "__main__":
    main()
