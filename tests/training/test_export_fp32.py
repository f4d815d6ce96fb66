"""``pileworks export --to fp32``: one safetensors file (no pickle), tied head stored once, loads back exactly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from pipeline.dataset.manifest import load_manifest
from pipeline.errors import CheckpointError
from tests.fixtures.fake_checkpoint import write_fake_checkpoint
from tests.fixtures.tiny_dataset import build_tiny_dataset
from training.generate import export_fp32, load_fp32
from training.model import GPT, ModelConfig

safetensors_torch = pytest.importorskip("safetensors.torch", reason="the hf extra is absent")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    uri = build_tiny_dataset(tmp_path_factory.mktemp("store"), n_docs=30, vocab_size=300, seed=2)
    return (*load_manifest(uri, None), uri)


@pytest.mark.parametrize("tied", [True, False])
def test_fp32_file_holds_each_weight_once_and_loads_back(dataset, tmp_path: Path, tied: bool) -> None:
    manifest, store, uri = dataset
    cfg = ModelConfig(
        vocab_size=manifest.tokenizer.vocab_size, n_layer=2, n_head=2, d_model=32, max_seq_len=32
    )
    cfg = dataclasses.replace(cfg, tie_embeddings=tied)
    model, tag_dir = write_fake_checkpoint(tmp_path / "ckpt", manifest, store, uri, cfg)
    out = export_fp32(tag_dir.parent, tmp_path / "model.safetensors")
    stored = safetensors_torch.load_file(out)
    assert ("lm_head.weight" in stored) is not tied  # tied: stored once, as embed.weight
    assert all(t.dtype == torch.float32 for t in stored.values())
    state, loaded_cfg = load_fp32(out)
    assert loaded_cfg == cfg
    reference = model.state_dict()
    assert state.keys() == reference.keys()
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    again = GPT(loaded_cfg).eval()
    again.load_state_dict(state, strict=True)
    ids = torch.randint(0, cfg.vocab_size, (1, 16))
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))
    if tied:
        assert again.lm_head.weight is again.embed.weight


def test_export_command_writes_fp32(dataset, tmp_path: Path, capsys) -> None:
    from flows.cli.main import main

    manifest, store, uri = dataset
    cfg = ModelConfig(
        vocab_size=manifest.tokenizer.vocab_size, n_layer=1, n_head=2, d_model=16, max_seq_len=32
    )
    _model, tag_dir = write_fake_checkpoint(tmp_path / "ckpt", manifest, store, uri, cfg)
    out = tmp_path / "fp32" / "model.safetensors"
    assert main(["export", "--checkpoint", str(tag_dir.parent), "--to", "fp32", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"format": "fp32", "out": str(out), "bytes": out.stat().st_size}
    assert load_fp32(out)[1] == cfg


def test_a_file_without_our_metadata_is_refused(tmp_path: Path) -> None:
    safetensors_torch.save_file({"x": torch.zeros(2)}, tmp_path / "other.safetensors")
    with pytest.raises(CheckpointError, match="not written by pileworks export --to fp32"):
        load_fp32(tmp_path / "other.safetensors")
