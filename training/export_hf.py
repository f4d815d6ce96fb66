"""Export a checkpoint as a Hugging Face folder that ``transformers`` loads with no remote code.

Our model is GPT-NeoX's architecture exactly (rotary on a fraction of each head in the rotate-halves layout,
pre-LayerNorm, optional parallel residual, exact GELU, biased linears), so it maps onto ``GPTNeoXForCausalLM``
weight for weight. The one real difference is the fused qkv projection: ours lays its output rows out as
``[q | k | v]`` each ``[heads, head_dim]``, GPT-NeoX as ``[heads, (q, k, v), head_dim]``; the rows are permuted.
A tied head is written once (``embed_in``) with ``tie_word_embeddings``: safetensors cannot hold shared tensors.

Output: ``config.json``, ``model.safetensors``, ``generation_config.json``, ``tokenizer.json`` with
``tokenizer_config.json`` and ``special_tokens_map.json`` (eos, pad and bos where the dataset has them).
Needs the ``hf`` extra (``pip install 'pileworks[hf]'``): ``transformers`` for the config classes and
``safetensors``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.dataset.manifest import load_manifest
from pipeline.errors import CheckpointError, PileworksError
from pipeline.storage import S3Options
from training.generate import fp32_state_dict, resolve_tag_dir
from training.model import ModelConfig

logger = logging.getLogger(__name__)

HF_TOKENIZER_NAMES = ("tokenizer_config.json", "special_tokens_map.json")  # Hugging Face's names
HF_EXTRA_HINT = "the Hugging Face export needs the hf extra: pip install 'pileworks[hf]'"


class MissingExtraError(PileworksError, RuntimeError):
    """An optional dependency group (an extra) is not installed."""


def neox_qkv_rows(tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Our ``[3, heads, head_dim, ...]`` qkv rows in GPT-NeoX's ``[heads, 3, head_dim, ...]`` order."""
    rest = tensor.shape[1:]
    grouped = tensor.reshape(3, cfg.n_head, cfg.head_dim, *rest).transpose(0, 1)
    return grouped.reshape(3 * cfg.d_model, *rest).contiguous()


def to_neox_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict under GPT-NeoX's names (``GPTNeoXForCausalLM``); the tied head is left out."""
    out = {
        "gpt_neox.embed_in.weight": state["embed.weight"],
        "gpt_neox.final_layer_norm.weight": state["ln_final.weight"],
        "gpt_neox.final_layer_norm.bias": state["ln_final.bias"],
    }
    names = {
        "ln_attn": "input_layernorm",
        "ln_mlp": "post_attention_layernorm",
        "attn.out": "attention.dense",
        "mlp.up": "mlp.dense_h_to_4h",
        "mlp.down": "mlp.dense_4h_to_h",
    }
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}.", f"gpt_neox.layers.{i}."
        for src, dst in names.items():
            for kind in ("weight", "bias"):
                out[f"{theirs}{dst}.{kind}"] = state[f"{ours}{src}.{kind}"]
        for kind in ("weight", "bias"):
            out[f"{theirs}attention.query_key_value.{kind}"] = neox_qkv_rows(
                state[f"{ours}attn.qkv.{kind}"], cfg
            )
    if not cfg.tie_embeddings:
        out["embed_out.weight"] = state["lm_head.weight"]  # the GPT-NeoX/Pythia name every version loads
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def neox_config_kwargs(cfg: ModelConfig, specials: SpecialIds) -> dict[str, Any]:
    """``GPTNeoXConfig`` arguments for our model config and the tokenizer's special ids."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "intermediate_size": cfg.ffn_dim,
        "hidden_act": "gelu",  # exact erf GELU, as torch.nn.functional.gelu
        "rotary_pct": cfg.rotary_pct,
        "rotary_emb_base": cfg.rotary_base,
        "max_position_embeddings": cfg.max_seq_len,
        "layer_norm_eps": cfg.norm_eps,
        "use_parallel_residual": cfg.parallel_residual,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": True,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "bos_token_id": specials.bos_id,
        "eos_token_id": specials.eos_id,
        "pad_token_id": specials.pad_id,
        "architectures": ["GPTNeoXForCausalLM"],
    }


@dataclass(frozen=True)
class SpecialIds:
    eos_id: int
    pad_id: int | None
    bos_id: int | None


def special_ids(record: dict[str, Any], s3: S3Options | None = None) -> SpecialIds:
    """eos/pad/bos ids of a checkpoint: its record's (written since resume checks), else its manifest's."""
    info = record.get("tokenizer")
    if info is None:
        manifest, _store = load_manifest(record["manifest_uri"], s3)
        tk = manifest.tokenizer
        info = {"eos_id": tk.eos_id, "pad_id": tk.pad_id, "bos_id": tk.bos_id}
    return SpecialIds(int(info["eos_id"]), info.get("pad_id"), info.get("bos_id"))


def tokenizer_companions(
    tag_dir: Path, model_max_length: int, fallback: Mapping[str, bytes] | None
) -> dict[str, bytes]:
    """The dataset's ``tokenizer_config.json`` and ``special_tokens_map.json`` as the checkpoint carries them
    (``fallback`` for a checkpoint of a dataset published before them), with the model's context length."""
    if all((tag_dir / name).is_file() for name in HF_TOKENIZER_NAMES):
        files = {name: (tag_dir / name).read_bytes() for name in HF_TOKENIZER_NAMES}  # verified with the tag
    elif fallback is not None:
        files = dict(fallback)
    else:
        raise CheckpointError(
            f"{tag_dir.name} carries no tokenizer_config.json (its dataset was published before pileworks wrote "
            "one): use `pileworks export`, which builds it from the checkpoint's special token ids"
        )
    config = json.loads(files["tokenizer_config.json"])
    config["model_max_length"] = model_max_length
    # what the model takes: transformers 4.56's fast tokenizer also returns token_type_ids, which generate()
    # refuses (`model(**tok(text))` and `generate(**tok(text))` are how a user calls it); not in the dataset's
    # own file, whose bytes its id hashes
    config["model_input_names"] = ["input_ids", "attention_mask"]
    files["tokenizer_config.json"] = (json.dumps(config, indent=1, sort_keys=True) + "\n").encode("utf-8")
    return files


def export_hf(
    checkpoint: str | Path, out_dir: str | Path, *, tokenizer_files: Mapping[str, bytes] | None = None
) -> Path:
    """Write the newest verified checkpoint of ``checkpoint`` (or that tag folder) as a Hugging Face folder.

    ``tokenizer_files``: the tokenizer companions to use when the checkpoint carries none (see
    :func:`tokenizer_companions`)."""
    try:
        from safetensors.torch import save_file
        from transformers import GenerationConfig, GPTNeoXConfig
    except ImportError as exc:
        raise MissingExtraError(f"{HF_EXTRA_HINT} ({exc})") from exc
    tag_dir = resolve_tag_dir(checkpoint)
    state, record = fp32_state_dict(tag_dir)  # verified against COMPLETE.json, loaded weights-only
    cfg = ModelConfig(**record["model_config"])
    specials = special_ids(record)
    companions = tokenizer_companions(tag_dir, cfg.max_seq_len, tokenizer_files)  # may refuse: before writing
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = GPTNeoXConfig(**neox_config_kwargs(cfg, specials))
    config.save_pretrained(out)
    GenerationConfig(
        bos_token_id=specials.bos_id, eos_token_id=specials.eos_id, pad_token_id=specials.pad_id
    ).save_pretrained(out)
    save_file(to_neox_state_dict(state, cfg), str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer_json = (tag_dir / "tokenizer.json").read_bytes()  # verified with the tag
    (out / "tokenizer.json").write_bytes(tokenizer_json)
    for name, data in companions.items():
        (out / name).write_bytes(data)
    (out / "pileworks_export.json").write_text(
        json.dumps(
            {"checkpoint": str(tag_dir), "step": record["step"], "dataset_id": record.get("dataset_id")},
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    logger.info("exported %s (step %s) to %s as GPTNeoXForCausalLM", tag_dir, record["step"], out)
    return out
