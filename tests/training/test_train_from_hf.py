"""Two real ranks over gloo continuing a "released" GPT-NeoX model (made locally with transformers): the run
starts from its weights, resumes bit for bit like any other run, and its export computes transformers' loss.

The runs also train with document attention and activation checkpointing: neither may change exactness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.dataset.manifest import load_manifest
from tests.fixtures.released_model import write_released_model
from tests.fixtures.tiny_dataset import build_tiny_dataset
from tests.training.test_train_distributed import BASE, RUN_TIMEOUT_S, losses
from training.checkpoint import tag_for_step
from training.generate import load_model
from training.launch import run_local

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
transformers = pytest.importorskip("transformers", reason="the hf extra is absent")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="the hf extra is absent")

STEPS = 6
FROM_HF = {
    **{
        k: v for k, v in BASE.items() if k not in ("preset", "model")
    },  # the folder's config.json is the model
    "max_steps": STEPS,
    "checkpoint_interval": 3,
    "eval_interval": 3,
    "lr": 1e-3,
    "attention": "document",
    "activation_checkpointing": True,
}


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    uri = build_tiny_dataset(tmp_path_factory.mktemp("tiny-store"))
    manifest, store = load_manifest(uri, None)
    tk = manifest.tokenizer
    folder = tmp_path_factory.mktemp("pythia-like")
    write_released_model(
        folder, store.get_bytes(tk.key), vocab_size=tk.vocab_size + 8, eos_id=tk.eos_id, pad_id=tk.pad_id
    )
    return uri, folder


def run(uri: str, folder: Path, out: Path, **kw) -> None:
    lines: list[str] = []
    overrides = {**FROM_HF, "init_from": str(folder), "output_dir": str(out)}
    code = run_local(uri, None, 2, overrides=overrides, on_line=lines.append, timeout_s=RUN_TIMEOUT_S, **kw)
    assert code == 0, "\n".join(lines[-40:])
    assert any(f"init from {folder}" in line for line in lines)


def test_training_from_a_released_model_resumes_exactly_and_exports_transformers_loss(
    setting: tuple[str, Path], tmp_path: Path
) -> None:
    uri, folder = setting
    run(uri, folder, tmp_path / "whole")
    reference = losses(tmp_path / "whole")
    assert sorted(reference) == list(range(1, STEPS + 1))
    run(uri, folder, tmp_path / "resumed", stop_at_step=3)
    run(uri, folder, tmp_path / "resumed")
    assert losses(tmp_path / "resumed") == reference  # every step, bit for bit

    model, record, _tag = load_model(tmp_path / "whole" / "checkpoints")
    assert record["step"] == STEPS and record["model_config"]["attention"] == "document"
    assert record["train_config"]["init_from"] == str(folder)
    from training.export_hf import export_hf

    out = export_hf(tmp_path / "whole" / "checkpoints" / tag_for_step(STEPS), tmp_path / "hf")
    original = safetensors_torch.load_file(folder / "model.safetensors")
    exported = safetensors_torch.load_file(out / "model.safetensors")
    assert exported.keys() == original.keys()
    assert not torch.equal(exported["embed_out.weight"], original["embed_out.weight"])  # it trained
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok("the archive was rebuilt from the mirror after the storm")["input_ids"]])
    with torch.no_grad():  # one document: document attention computes what causal attention does
        theirs = hf(ids, labels=ids).loss.item()
        ours = model(ids[:, :-1], ids[:, 1:]).item()
    assert abs(theirs - ours) <= 1e-5 * max(1.0, abs(ours)), (theirs, ours)
    assert json.loads((out / "config.json").read_text())["vocab_size"] == model.cfg.vocab_size


def test_zero_steps_from_a_released_model_exports_its_weights_unchanged(
    setting: tuple[str, Path], tmp_path: Path
) -> None:
    uri, folder = setting
    run(uri, folder, tmp_path / "zero", stop_at_step=0)
    assert losses(tmp_path / "zero") == {}  # no step trained
    from training.export_hf import export_hf

    out = export_hf(tmp_path / "zero" / "checkpoints" / tag_for_step(0), tmp_path / "hf")
    original = safetensors_torch.load_file(folder / "model.safetensors")
    exported = safetensors_torch.load_file(out / "model.safetensors")
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name  # bit for bit, through the trainer and DeepSpeed
