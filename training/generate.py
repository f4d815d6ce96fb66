"""Text from a checkpoint: verify it, convert it to a plain fp32 state dict, load the model, generate.

``pileworks sample --checkpoint runs/tiny/checkpoints --prompt "The data"`` samples from the newest complete
checkpoint (or from a tag folder given directly); ``--to-fp32 model.pt`` writes the consolidated fp32 state dict
(DeepSpeed's ``zero_to_fp32``) next to its model config. Every file is verified against the tag's
``COMPLETE.json`` before anything is unpickled.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from pipeline.dataset.manifest import load_manifest
from pipeline.errors import CheckpointError
from pipeline.storage import S3Options
from training.checkpoint import select_resume_tag, verify_tag
from training.model import GPT, ModelConfig
from training.safe_load import safe_load, safe_zero_to_fp32

logger = logging.getLogger(__name__)


def resolve_tag_dir(checkpoint: str | Path) -> Path:
    """A tag folder as given, or the newest verified tag of a checkpoints folder."""
    path = Path(checkpoint)
    if (path / "COMPLETE.json").is_file():
        return path
    tag = select_resume_tag(path)
    if tag is None:
        raise CheckpointError(f"{path} holds no complete checkpoint (no tag with a verifying COMPLETE.json)")
    return path / tag


def fp32_state_dict(tag_dir: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The consolidated fp32 weights of a verified tag and its record (ZeRO 1-3 via zero_to_fp32).

    Every file is unpickled by the weights-only loader (:mod:`training.safe_load`), after the record verified.
    """
    tag_dir = Path(tag_dir)
    record = verify_tag(tag_dir)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if int(record.get("zero_stage", 0)) > 0:
        # zero_to_fp32 prints its progress (and a tqdm bar) on every call: keep the command's output to ours.
        quiet = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())
        with safe_zero_to_fp32() as zero_to_fp32, quiet[0], quiet[1]:
            state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(
                str(tag_dir.parent), tag=tag_dir.name
            )
    else:
        blob = safe_load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu")
        state = {k: v.float() for k, v in blob["module"].items()}
    return state, record


def load_model(checkpoint: str | Path) -> tuple[GPT, dict[str, Any], Path]:
    """The model of a checkpoint in eval mode on CPU, its record, and the tag folder it came from."""
    tag_dir = resolve_tag_dir(checkpoint)
    state, record = fp32_state_dict(tag_dir)
    model = GPT(ModelConfig(**record["model_config"]))
    model.load_state_dict(state, strict=True)
    model.eval()
    return model, record, tag_dir


def convert_to_fp32(checkpoint: str | Path, out_path: str | Path) -> Path:
    """Write the fp32 state dict (loadable with ``torch.load(weights_only=True)``) and ``<out>.config.json``."""
    tag_dir = resolve_tag_dir(checkpoint)
    state, record = fp32_state_dict(tag_dir)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    out.with_suffix(".config.json").write_text(json.dumps(record["model_config"], indent=1), encoding="utf-8")
    return out


FP32_CONFIG_KEY = "pileworks_model_config"  # safetensors metadata: the ModelConfig as JSON
TIED_HEAD = "lm_head.weight"  # a tied head is embed.weight: stored once, tied again on load


def export_fp32(checkpoint: str | Path, out_path: str | Path) -> Path:
    """Write a checkpoint's consolidated fp32 weights as one safetensors file, its model config in the
    metadata; a tied head is stored once (safetensors holds no shared tensors). Every input file is verified
    and unpickled weights-only; the output holds no pickle at all."""
    from safetensors.torch import save_file

    tag_dir = resolve_tag_dir(checkpoint)
    state, record = fp32_state_dict(tag_dir)
    cfg = ModelConfig(**record["model_config"])
    if cfg.tie_embeddings:
        state = {k: v for k, v in state.items() if k != TIED_HEAD}
    metadata = {
        "format": "pt",
        FP32_CONFIG_KEY: json.dumps(record["model_config"], sort_keys=True),
        "step": str(record["step"]),
        "dataset_id": str(record.get("dataset_id")),
    }
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out), metadata=metadata)
    return out


def load_fp32(path: str | Path) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """The state dict (tied head restored) and model config of a file :func:`export_fp32` wrote."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as fh:
        metadata = fh.metadata() or {}
    if FP32_CONFIG_KEY not in metadata:
        raise CheckpointError(
            f"{path} has no {FP32_CONFIG_KEY} metadata: not written by pileworks export --to fp32"
        )
    cfg = ModelConfig(**json.loads(metadata[FP32_CONFIG_KEY]))
    state = load_file(str(path))
    if cfg.tie_embeddings:
        state[TIED_HEAD] = state["embed.weight"]
    return state, cfg


def _tokenizer(tag_dir: Path, manifest_uri: str | None, s3: S3Options | None) -> Any:
    from tokenizers import Tokenizer

    if manifest_uri is None:
        return Tokenizer.from_file(str(tag_dir / "tokenizer.json"))  # verified with the tag
    manifest, store = load_manifest(manifest_uri, s3)
    return Tokenizer.from_str(store.get_bytes(manifest.tokenizer.key).decode("utf-8"))


def generate(
    checkpoint_dir: str | Path,
    prompt: str,
    max_new_tokens: int = 64,
    temperature: float = 0.8,
    top_k: int | None = 50,
    seed: int = 0,
    manifest_uri: str | None = None,
    s3: S3Options | None = None,
) -> str:
    """Prompt + sampled continuation, decoded with the checkpoint's tokenizer (or the manifest's, if given)."""
    model, _record, tag_dir = load_model(checkpoint_dir)
    tokenizer = _tokenizer(tag_dir, manifest_uri, s3)
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids or [0]
    generator = torch.Generator().manual_seed(seed)
    out = model.generate(
        torch.tensor([ids]), max_new_tokens, temperature=temperature, top_k=top_k, generator=generator
    )
    return tokenizer.decode(out[0].tolist(), skip_special_tokens=False)
