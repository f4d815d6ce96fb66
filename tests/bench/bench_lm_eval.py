"""Our task scores against lm-evaluation-harness's on the same checkpoint and task files, offline.

A tiny model is trained in-process for a few hundred steps on the tiny dataset's text (so its log-likelihoods
are not flat), saved as a checkpoint, scored by ``training.downstream`` and exported to Hugging Face; then
lm-evaluation-harness (``pip install lm-eval==0.4.13``, a benchmark-only dependency) scores the exported folder
with local task YAMLs over the same JSONL files: a multiple-choice task (``query``/``choices``/``gold``), a
LAMBADA-style ``{"text"}`` task split as its ``lambada`` task splits, and a ``{"context", "continuation"}`` one.
Nothing is downloaded (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``). Prints the largest absolute difference per
metric (aggregate and per item; perplexity relative); exits 1 when one exceeds 1e-4. lm-evaluation-harness's
``hf`` model also needs ``accelerate``. Run:
``.venv/bin/python tests/bench/bench_lm_eval.py [--items 60] [--steps 300]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from pipeline.dataset.manifest import load_manifest
from tests.fixtures.fake_checkpoint import write_fake_checkpoint
from tests.fixtures.tiny_dataset import build_tiny_dataset, make_text
from training.downstream import score_checkpoint
from training.export_hf import export_hf
from training.model import GPT, ModelConfig
from training.tasks import read_tasks

TOLERANCE = 1e-4
YAML_MC = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: query
doc_to_choice: choices
doc_to_target: gold
metric_list:
  - metric: acc
  - metric: acc_norm
"""
YAML_LAMBADA = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
YAML_PAIR = YAML_LAMBADA.replace(
    "doc_to_text: \"{{{{text.split(' ')[:-1]|join(' ')}}}}\"\ndoc_to_target: \"{{{{' '+text.split(' ')[-1]}}}}\"",
    "doc_to_text: context\ndoc_to_target: continuation",
)


def train_model(cfg: ModelConfig, tok: Tokenizer, eos_id: int, steps: int) -> GPT:
    """The tiny model on the tiny dataset's kind of text, a few hundred AdamW steps on windows of 48 tokens."""
    rng = random.Random(0)
    stream: list[int] = []
    for _ in range(600):
        stream += [*tok.encode(make_text(rng), add_special_tokens=False).ids, eos_id]
    data = torch.tensor(stream)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 49, (16,))
        x = torch.stack([data[s : s + 49] for s in starts])
        loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"trained {steps} steps, last loss {float(loss):.3f}")
    return model.eval()


def write_tasks(folder: Path, items: int) -> dict[str, Path]:
    """Three task files from held-out text of the same kind (another seed)."""
    rng = random.Random(7)
    sentences = [s.strip() for _ in range(items * 3) for s in make_text(rng).split(".") if len(s.split()) > 4]
    mc, lam, pair = [], [], []
    for i in range(items):
        words = sentences[i].split(" ")
        cut = len(words) // 2
        n = len(words) - cut  # distractors as long as the right ending: other sentences' last n words
        others = [" ".join(sentences[(i + k * 7 + 1) % len(sentences)].split(" ")[-n:]) for k in range(3)]
        choices = [" ".join(words[cut:]), *others]
        rng.shuffle(choices)
        mc.append(
            {"query": " ".join(words[:cut]), "choices": choices, "gold": choices.index(" ".join(words[cut:]))}
        )
        lam.append({"text": sentences[items + i]})
        w = sentences[2 * items + i].split(" ")
        pair.append({"context": " ".join(w[:-2]) + " ", "continuation": " ".join(w[-2:])})
    paths = {}
    for name, rows in (("bench_mc", mc), ("bench_lambada", lam), ("bench_pair", pair)):
        paths[name] = folder / f"{name}.jsonl"
        paths[name].write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
        )
    for name, template in (("bench_mc", YAML_MC), ("bench_lambada", YAML_LAMBADA), ("bench_pair", YAML_PAIR)):
        (folder / f"{name}.yaml").write_text(template.format(name=name, path=paths[name]), encoding="utf-8")
    return paths


def run_lm_eval(hf_dir: Path, task_dir: Path, names: list[str]) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model="hf",
        model_args=f"pretrained={hf_dir},dtype=float32",
        tasks=names,
        task_manager=TaskManager(include_path=str(task_dir)),
        batch_size=8,
        device="cpu",
        log_samples=True,
    )


def lm_eval_item_lls(samples: list[dict]) -> list[list[float]]:
    """Per document (in doc order): the log-likelihood of each request, as lm-evaluation-harness logged them."""
    by_doc = sorted(samples, key=lambda s: s["doc_id"])
    return [[float(r[0][0]) for r in s["resps"]] for s in by_doc]


def compare(ours: dict, theirs: dict) -> dict[str, float]:
    """The largest absolute difference per metric, aggregate and per item."""
    diffs: dict[str, float] = {}
    res, samples = theirs["results"], theirs["samples"]
    mc, lls = ours["bench_mc"], lm_eval_item_lls(samples["bench_mc"])
    diffs["mc acc"] = abs(mc["acc"] - res["bench_mc"]["acc,none"])
    diffs["mc acc_norm"] = abs(mc["acc_norm"] - res["bench_mc"]["acc_norm,none"])
    probs = [
        float(np.exp(item[gold] - np.logaddexp.reduce(item)))
        for item, gold in zip(lls, golds(mc), strict=True)
    ]
    diffs["mc prob (per item)"] = float(np.max(np.abs(np.array(probs) - mc["per_item"]["prob"])))
    for name in ("bench_lambada", "bench_pair"):
        item_lls = np.array([x[0] for x in lm_eval_item_lls(samples[name])])
        diffs[f"{name} loglik (per item)"] = float(
            np.max(np.abs(item_lls - ours[name]["per_item"]["loglik"]))
        )
        diffs[f"{name} acc"] = abs(ours[name]["acc"] - res[name]["acc,none"])
        ppl = res[name]["perplexity,none"]  # exp of a mean: compared relative to its size
        diffs[f"{name} perplexity (relative)"] = abs(ours[name]["perplexity"] - ppl) / ppl
    return diffs


def golds(mc_scores: dict) -> list[int]:
    return [json.loads(line)["gold"] for line in Path(mc_scores["file"]).read_text().splitlines() if line]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=60)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        uri = build_tiny_dataset(root / "store", n_docs=100, vocab_size=800, seed=1)
        manifest, store = load_manifest(uri, None)
        tok = Tokenizer.from_str(store.get_bytes(manifest.tokenizer.key).decode("utf-8"))
        cfg = ModelConfig(
            vocab_size=manifest.tokenizer.vocab_size, n_layer=2, n_head=4, d_model=96, max_seq_len=128
        )
        model = train_model(cfg, tok, manifest.tokenizer.eos_id, args.steps)
        _, tag = write_fake_checkpoint(root / "ckpt", manifest, store, uri, cfg, state=model.state_dict())
        (root / "tasks").mkdir()
        paths = write_tasks(root / "tasks", args.items)
        ours = score_checkpoint(tag, read_tasks([f"{n}={p}" for n, p in paths.items()]))
        hf_dir = export_hf(tag, root / "hf")
        theirs = run_lm_eval(hf_dir, root / "tasks", list(paths))
        diffs = compare(ours, theirs)
    for name, task in ours.items():
        shown = {k: round(v, 4) for k, v in task.items() if k in ("acc", "acc_norm", "prob", "perplexity")}
        print(f"ours  {name}: {shown}")
    for name, res in theirs["results"].items():
        print(f"lm-eval {name}: { {k: round(v, 4) for k, v in res.items() if isinstance(v, float)} }")
    print(f"max abs difference per metric ({args.items} items per task; tolerance {TOLERANCE}):")
    for name, diff in diffs.items():
        print(f"  {name:36s} {diff:.2e}")
    print(f"{time.perf_counter() - started:.0f} s in all")
    return 0 if max(diffs.values()) <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
