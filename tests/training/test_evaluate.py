"""``evaluate`` (training.evaluate, and flows.train.evaluate's JSONL encoding): token-weighted loss and perplexity on the valid split or a JSONL file, against a direct sum."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from flows.train.evaluate import encode_jsonl
from pipeline.dataset.manifest import load_manifest
from tests.fixtures.fake_checkpoint import write_fake_checkpoint
from tests.fixtures.tiny_dataset import build_tiny_dataset
from training.cache import ShardCache
from training.data import ShardDataset
from training.evaluate import evaluate_checkpoint, stream_windows
from training.model import ModelConfig

SEQ_LEN = 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("eval")
    uri = build_tiny_dataset(root / "store", n_docs=80, vocab_size=400, seed=5)
    manifest, store = load_manifest(uri, None)
    cfg = ModelConfig(
        vocab_size=manifest.tokenizer.vocab_size, n_layer=1, n_head=2, d_model=32, max_seq_len=64
    )
    model, tag_dir = write_fake_checkpoint(root / "ckpt", manifest, store, uri, cfg, seq_len=SEQ_LEN)
    return model, tag_dir, manifest, store, uri


@torch.no_grad()
def direct_loss(model, windows: list[torch.Tensor]) -> float:
    total = sum(float(F.cross_entropy(model(w[None, :-1])[0], w[1:], reduction="sum")) for w in windows)
    return total / sum(len(w) - 1 for w in windows)


def test_valid_split_of_the_checkpoints_own_dataset(checkpoint, tmp_path: Path) -> None:
    model, tag_dir, manifest, store, _uri = checkpoint
    result = evaluate_checkpoint(tag_dir.parent, batch_size=3)
    ds = ShardDataset(manifest, store, SEQ_LEN, "valid", ShardCache(store, tmp_path / "c", 2**30))
    windows = [torch.cat([ds[i]["input_ids"], ds[i]["labels"][-1:]]) for i in range(len(ds))]
    assert result["split"] == "valid" and result["dataset_id"] == manifest.dataset_id
    assert result["samples"] == len(ds) > 1 and result["tokens"] == len(ds) * SEQ_LEN
    assert result["loss"] == pytest.approx(direct_loss(model, windows), rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    assert evaluate_checkpoint(tag_dir, max_samples=1)["samples"] == 1


def test_a_jsonl_file_is_encoded_with_eos_and_windowed_like_training(checkpoint, tmp_path: Path) -> None:
    model, tag_dir, manifest, _store, _uri = checkpoint
    texts = [
        "The archive was rebuilt from the mirror.",
        "Another document, longer: " + "words and more " * 12,
    ]
    path = tmp_path / "held.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokens, documents = encode_jsonl(tag_dir.parent, path)
    result = evaluate_checkpoint(tag_dir, str(path), tokens=tokens, seq_len=16)
    tok = Tokenizer.from_file(str(tag_dir / "tokenizer.json"))
    stream = []
    for text in texts:
        stream += [*tok.encode(text, add_special_tokens=False).ids, manifest.tokenizer.eos_id]
    windows = [torch.tensor(w) for w in stream_windows(torch.tensor(stream).numpy(), 16)]
    assert (
        documents == 2
        and tokens.tolist() == stream
        and result["samples"] == len(windows) == (len(stream) - 1) // 16
    )
    assert result["loss"] == pytest.approx(direct_loss(model, windows), rel=1e-6)


def test_bad_inputs_are_refused_with_the_reason(checkpoint, tmp_path: Path) -> None:
    _model, tag_dir, *_ = checkpoint
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected an object"):
        encode_jsonl(tag_dir, bad)
    other = build_tiny_dataset(tmp_path / "other", n_docs=40, vocab_size=300, seed=9)
    with pytest.raises(ValueError, match="uses another tokenizer"):
        evaluate_checkpoint(tag_dir, other)
