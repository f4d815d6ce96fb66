"""Hugging Face export: transformers loads the folder with no remote code and computes our logits."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from pipeline.dataset.manifest import load_manifest
from tests.fixtures.fake_checkpoint import write_fake_checkpoint
from tests.fixtures.tiny_dataset import build_tiny_dataset, make_records
from training.checkpoint import CheckpointError
from training.export_hf import export_hf, neox_qkv_rows
from training.model import GPT, ModelConfig

transformers = pytest.importorskip(
    "transformers", reason="the hf extra (pip install 'pileworks[hf]') is absent"
)
pytest.importorskip("safetensors", reason="the hf extra (pip install 'pileworks[hf]') is absent")

HELD_SENTENCES = [
    "The archive was rebuilt from the mirror after the storm.",
    "Numbers like 1234 and 56.7 sit next to words; so do émigré and 東京.",
    "A short one.",
]
N_DOCS, SEED = 60, 3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    uri = build_tiny_dataset(tmp_path_factory.mktemp("store"), n_docs=N_DOCS, vocab_size=400, seed=SEED)
    return (*load_manifest(uri, None), uri)


def fake_checkpoint(root: Path, dataset, cfg: ModelConfig, **kw) -> tuple[GPT, Path]:
    manifest, store, uri = dataset
    return write_fake_checkpoint(root, manifest, store, uri, cfg, **kw)


def model_config(vocab_size: int, **changes: object) -> ModelConfig:
    # A large init so the logits span several units: a 1e-4 bound then means something.
    base = ModelConfig(vocab_size=vocab_size, n_layer=2, n_head=4, d_model=64, max_seq_len=64, init_std=0.3)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [{}, {"tie_embeddings": False, "parallel_residual": False, "rotary_pct": 0.5}],
    ids=["tied-parallel", "untied-sequential"],
)
def test_exported_model_computes_our_logits(dataset, tmp_path: Path, changes: dict) -> None:
    manifest = dataset[0]
    cfg = model_config(manifest.tokenizer.vocab_size, **changes)
    model, tag_dir = fake_checkpoint(tmp_path / "ckpt", dataset, cfg)
    out = export_hf(tag_dir.parent, tmp_path / "hf")
    assert {p.name for p in out.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "GPTNeoXForCausalLM"
    tok = transformers.AutoTokenizer.from_pretrained(out)
    for sentence in HELD_SENTENCES:
        ids = torch.tensor([tok(sentence)["input_ids"]])
        with torch.no_grad():
            theirs = hf(ids).logits
            ours = model(ids)
        assert ours.abs().max() > 1.0  # not a near-zero comparison
        assert (theirs - ours).abs().max().item() <= 1e-4, sentence
    if cfg.tie_embeddings:
        assert hf.get_output_embeddings().weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()


def test_exported_model_generates_and_stops_at_eos(dataset, tmp_path: Path) -> None:
    manifest = dataset[0]
    model, tag_dir = fake_checkpoint(tmp_path / "ckpt", dataset, model_config(manifest.tokenizer.vocab_size))
    out = export_hf(tag_dir, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    prompt = tok("The archive", return_tensors="pt")
    # what the model takes, and no more: transformers 4.56 (the hf extra's floor) also gave token_type_ids,
    # which generate() refused; 5.x gives none either way, so the file's field is checked too
    assert sorted(prompt) == ["attention_mask", "input_ids"]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["model_input_names"] == tok.model_input_names == ["input_ids", "attention_mask"]
    generated = hf.generate(**prompt, max_new_tokens=8, do_sample=False)
    ours = model.generate(prompt["input_ids"], 8, temperature=0, stop_token=manifest.tokenizer.eos_id)
    assert generated.shape[1] > prompt["input_ids"].shape[1]
    assert generated[0].tolist() == ours[0].tolist()[: generated.shape[1]]
    assert hf.generation_config.eos_token_id == manifest.tokenizer.eos_id


def test_exported_tokenizer_gives_the_shard_ids_with_eos(dataset, tmp_path: Path) -> None:
    manifest, store, _uri = dataset
    _model, tag_dir = fake_checkpoint(tmp_path / "ckpt", dataset, model_config(manifest.tokenizer.vocab_size))
    tok = transformers.AutoTokenizer.from_pretrained(export_hf(tag_dir, tmp_path / "hf"))
    assert tok.eos_token_id == manifest.tokenizer.eos_id and tok.pad_token_id == manifest.tokenizer.pad_id
    texts = {r.id: r.text for r in make_records(N_DOCS, SEED)}
    shard = manifest.split_shards("train")[0]
    tokens = np.frombuffer(store.get_bytes(shard.key), dtype=manifest.dtype)
    docs = pq.read_table(io.BytesIO(store.get_bytes(shard.docs_key))).to_pylist()
    whole = [d for d in docs if d["piece"] == 0 and d["token_start"] + d["tokens"] <= len(tokens)][:10]
    checked = 0
    for doc in whole:
        ids = tokens[doc["token_start"] : doc["token_start"] + doc["tokens"]].tolist()
        if ids[-1] != manifest.tokenizer.eos_id:
            continue  # split at the shard end: its EOS is in the next shard
        assert tok(texts[doc["doc_id"]])["input_ids"] + [tok.eos_token_id] == ids, doc["doc_id"]
        checked += 1
    assert checked >= 3


def test_the_export_command_writes_the_folder(dataset, tmp_path: Path, capsys) -> None:
    """Also for a checkpoint whose dataset predates tokenizer_config.json: the command builds it."""
    from flows.cli.main import main

    manifest = dataset[0]
    cfg = model_config(manifest.tokenizer.vocab_size)
    _model, tag_dir = fake_checkpoint(tmp_path / "ckpt", dataset, cfg, companions=False)
    with pytest.raises(CheckpointError, match=r"carries no tokenizer_config\.json"):
        export_hf(tag_dir, tmp_path / "lib")
    code = main(["export", "--checkpoint", str(tag_dir.parent), "--to", "hf", str(tmp_path / "out")])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["out"] == str(tmp_path / "out") and "model.safetensors" in printed["files"]
    assert transformers.AutoConfig.from_pretrained(tmp_path / "out").model_type == "gpt_neox"
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tok.eos_token_id == manifest.tokenizer.eos_id and tok.model_max_length == cfg.max_seq_len


def test_qkv_rows_are_regrouped_per_head() -> None:
    cfg = ModelConfig(vocab_size=10, n_layer=1, n_head=2, d_model=4)
    rows = torch.arange(12.0)  # q: heads (0,1),(2,3); k: (4,5),(6,7); v: (8,9),(10,11)
    assert neox_qkv_rows(rows, cfg).tolist() == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
