"""Downstream task scores (training.tasks, training.downstream): a model trained on a hand-made multiple-choice
task's answers scores above chance and an untrained one at chance; every score equals an independent
computation with transformers on the checkpoint exported to Hugging Face; task files are read and refused."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from pipeline.dataset.manifest import load_manifest
from tests.fixtures.fake_checkpoint import write_fake_checkpoint
from tests.fixtures.tiny_dataset import build_tiny_dataset
from training.downstream import encode_pair, score_checkpoint
from training.model import GPT, ModelConfig
from training.tasks import Request, read_task, read_tasks

COLOURS = ["red", "green", "blue", "amber", "violet", "silver", "orange", "black", "white", "golden"]
N_ITEMS, CHANCE = 48, 0.25


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    uri = build_tiny_dataset(tmp_path_factory.mktemp("store"), n_docs=60, vocab_size=400, seed=4)
    return (*load_manifest(uri, None), uri)


def write_mc_task(path: Path, seed: int = 0) -> list[dict]:
    """Four colours per item, the gold one at random: "Lamp 17 of the hall shines" -> "amber"."""
    rng = random.Random(seed)
    rows = []
    for k in range(N_ITEMS):
        choices = rng.sample(COLOURS, 4)
        rows.append({"query": f"Lamp {k} of the hall shines", "choices": choices, "gold": rng.randrange(4)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def train_on_answers(cfg: ModelConfig, tok: Tokenizer, eos_id: int, rows: list[dict]) -> GPT:
    """A model that has read every item's right answer, many times (a few seconds on a CPU)."""
    torch.manual_seed(0)
    model = GPT(cfg)
    seqs = [[eos_id, *tok.encode(f"{r['query']} {r['choices'][r['gold']]}").ids, eos_id] for r in rows]
    width = max(map(len, seqs))
    x = torch.tensor([s + [eos_id] * (width - len(s)) for s in seqs])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def checkpoint(root: Path, dataset, cfg: ModelConfig, model: GPT | None = None) -> Path:
    manifest, store, uri = dataset
    state = model.state_dict() if model is not None else None
    return write_fake_checkpoint(root, manifest, store, uri, cfg, state=state)[1]


def test_a_model_trained_on_the_answers_beats_chance_and_an_untrained_one_does_not(
    dataset, tmp_path: Path
) -> None:
    manifest, store, _ = dataset
    rows = write_mc_task(tmp_path / "lamps.jsonl")
    tasks = read_tasks([f"lamps={tmp_path / 'lamps.jsonl'}"])
    cfg = ModelConfig(
        vocab_size=manifest.tokenizer.vocab_size, n_layer=2, n_head=4, d_model=64, max_seq_len=64
    )
    tok = Tokenizer.from_str(store.get_bytes(manifest.tokenizer.key).decode())
    trained = train_on_answers(cfg, tok, manifest.tokenizer.eos_id, rows)
    learned = score_checkpoint(checkpoint(tmp_path / "trained", dataset, cfg, trained), tasks)["lamps"]
    untrained = score_checkpoint(checkpoint(tmp_path / "untrained", dataset, cfg), tasks)["lamps"]
    assert learned["kind"] == "multiple_choice" and learned["items"] == N_ITEMS
    for metric in ("acc", "acc_norm", "prob"):
        assert learned[f"{metric}_interval"][0] > CHANCE, (metric, learned)
        low, high = untrained[f"{metric}_interval"]
        assert low <= CHANCE <= high, (metric, untrained)  # at chance: the interval holds 1 in 4
    assert learned["acc"] > 0.8 and len(learned["per_item"]["acc"]) == N_ITEMS


# ---------------------------------------------------------------- against transformers, computed here


def hf_loglik(model, tok, context: str, continuation: str) -> tuple[float, bool]:
    """lm-evaluation-harness's causal-LM log-likelihood, written out with transformers' tokenizer and model."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    cont = whole[len(ctx) :]
    with torch.no_grad():
        logits = model(torch.tensor([whole[:-1]])).logits[0].float()
    lp = F.log_softmax(logits, dim=-1)[len(whole) - 1 - len(cont) :]
    target = torch.tensor(cont)
    return float(lp.gather(-1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all())


def test_scores_equal_an_independent_computation_with_transformers(dataset, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="the hf extra is absent")
    from training.export_hf import export_hf

    manifest = dataset[0]
    cfg = ModelConfig(
        vocab_size=manifest.tokenizer.vocab_size,
        n_layer=2,
        n_head=4,
        d_model=64,
        max_seq_len=64,
        init_std=0.3,
    )
    tag = checkpoint(tmp_path / "ckpt", dataset, cfg)
    hf_dir = export_hf(tag, tmp_path / "hf")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    mc = write_mc_task(tmp_path / "mc.jsonl", seed=1)[:12]
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mc))
    texts = [
        "The model was trained on the shard of data",
        "Attention is all the layer had ",
        "数据集 and 東京 are",
    ]
    (tmp_path / "cloze.jsonl").write_text(
        json.dumps({"context": "The learning rate ", "continuation": "was high"})
        + "\n"
        + "".join(json.dumps({"text": t}) + "\n" for t in texts)
    )
    ours = score_checkpoint(tag, read_tasks([str(tmp_path / "mc.jsonl"), str(tmp_path / "cloze.jsonl")]))
    acc, acc_norm, prob = [], [], []
    for row in mc:
        lls = np.array([hf_loglik(hf_model, hf_tok, row["query"], " " + c)[0] for c in row["choices"]])
        acc.append(np.argmax(lls) == row["gold"])
        acc_norm.append(np.argmax(lls / [len(c) for c in row["choices"]]) == row["gold"])
        prob.append(np.exp(lls[row["gold"]]) / np.exp(lls).sum())
    assert ours["mc"]["acc"] == np.mean(acc) and ours["mc"]["acc_norm"] == np.mean(acc_norm)
    assert ours["mc"]["prob"] == pytest.approx(np.mean(prob), abs=1e-5)
    assert ours["mc"]["per_item"]["prob"] == pytest.approx(prob, abs=1e-5)
    pairs = [("The learning rate ", "was high")] + [
        (t.rpartition(" ")[0], " " + t.rpartition(" ")[2]) for t in texts
    ]
    reference = [hf_loglik(hf_model, hf_tok, c, k) for c, k in pairs]
    cloze = ours["cloze"]
    assert cloze["kind"] == "completion" and cloze["items"] == 4
    assert cloze["per_item"]["loglik"] == pytest.approx([ll for ll, _ in reference], abs=1e-4)
    assert cloze["per_item"]["acc"] == [float(g) for _, g in reference]
    assert cloze["perplexity"] == pytest.approx(np.exp(-np.mean([ll for ll, _ in reference])), rel=1e-4)


def test_a_trailing_space_moves_to_the_continuation_and_the_whole_is_encoded(dataset) -> None:
    manifest, store, _ = dataset
    tok = Tokenizer.from_str(store.get_bytes(manifest.tokenizer.key).decode())
    context, continuation = encode_pair(tok, Request("the model ", "was"), manifest.tokenizer.eos_id)
    whole = tok.encode("the model was", add_special_tokens=False).ids
    assert (
        context + continuation == whole and context == tok.encode("the model", add_special_tokens=False).ids
    )
    eos = manifest.tokenizer.eos_id
    assert encode_pair(tok, Request("", "the"), eos) == (
        [eos],
        tok.encode("the", add_special_tokens=False).ids,
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"query": "q", "choices": ["a"], "gold": 0}', "at least 2 non-empty strings"),
        ('{"query": "q", "choices": ["a", "b"], "gold": 2}', "index of the right choice"),
        ('{"choices": ["a", "b"], "gold": 0}', 'string "query"'),
        ('{"context": "q"}', '"continuation"'),
        ("[1, 2]", "JSON object"),
        ("{nope", "not JSON"),
    ],
)
def test_bad_task_lines_name_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message) as info:
        read_task(path)
    assert "t.jsonl" in str(info.value)


def test_task_names_come_from_the_spec_or_the_file_stem(tmp_path: Path) -> None:
    (tmp_path / "arc.jsonl").write_text('{"query": "q", "choices": ["a", "b"], "label": 1}\n')
    (tmp_path / "lambada.jsonl").write_text('{"text": "a b c"}\n')
    one, two = read_tasks([str(tmp_path / "arc.jsonl"), f"lam={tmp_path / 'lambada.jsonl'}"])
    assert (one.name, one.kind, one.items[0].gold) == ("arc", "multiple_choice", 1)
    assert (two.name, two.kind, two.items[0].continuation) == ("lam", "completion", " c")
    with pytest.raises(ValueError, match="must differ"):
        read_tasks([str(tmp_path / "arc.jsonl"), f"arc={tmp_path / 'lambada.jsonl'}"])


def test_a_continuation_longer_than_the_model_reads_names_the_task_and_item(dataset, tmp_path: Path) -> None:
    manifest = dataset[0]
    cfg = ModelConfig(
        vocab_size=manifest.tokenizer.vocab_size, n_layer=1, n_head=2, d_model=32, max_seq_len=16
    )
    tag = checkpoint(tmp_path / "ckpt", dataset, cfg)
    path = tmp_path / "long.jsonl"
    rows = [{"context": "The data", "continuation": " was"}, {"context": "The", "continuation": " data" * 40}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"task long .* item 2: a continuation of \d+ tokens"):
        score_checkpoint(tag, read_tasks([str(path)]))
