"""Start training from a Hugging Face ``GPTNeoXForCausalLM`` folder (Pythia, GPT-NeoX and their descendants).

The inverse of :mod:`training.export_hf`: ``config.json`` becomes our :class:`ModelConfig` (or is refused, in
one line naming the field, where our model cannot compute the same function), the weights are renamed and the
fused qkv rows regrouped from GPT-NeoX's ``[heads, (q, k, v), head_dim]`` to our ``[q | k | v]``. Weights are
read weights-only: safetensors, or ``torch.load(weights_only=True)`` for ``pytorch_model.bin``; sharded folders
(``*.index.json``) too. The folder is local or on any store (``s3://``, ``gs://``, ``az://``); nothing is ever
fetched from a hub.

The dataset must be tokenized with the model's tokenizer: :func:`tokenizer_differences` compares the
dataset's ``tokenizer.json`` and special ids with the folder's and says what differs.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.storage import ObjectStore, S3Options, open_store
from training.model import ModelConfig
from training.safe_load import safe_load

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # each may be sharded behind <name>.index.json
# Buffers older GPT-NeoX saves carry beside the weights; derived from the config, so not weights of ours.
DERIVED_SUFFIXES = ("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq")
LAYER_NAMES = {  # ours -> GPT-NeoX's, per layer (query_key_value is regrouped, not only renamed)
    "ln_attn": "input_layernorm",
    "ln_mlp": "post_attention_layernorm",
    "attn.out": "attention.dense",
    "mlp.up": "mlp.dense_h_to_4h",
    "mlp.down": "mlp.dense_4h_to_h",
}


class UnsupportedModelError(ValueError):
    """A Hugging Face config our model cannot represent exactly, or a folder that is not a GPT-NeoX model."""


@dataclass(frozen=True)
class HfModel:
    """What an init folder holds: our config, our state dict, its special ids and its ``tokenizer.json``."""

    config: ModelConfig
    state: dict[str, torch.Tensor]
    eos_id: int | None
    pad_id: int | None
    tokenizer_json: bytes | None


def _refuse(field: str, value: Any, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"init_from config.json: {field} = {value!r}: {why}")


def rotary_settings(hf: dict[str, Any]) -> tuple[float, float]:
    """``(rotary_pct, rotary_base)`` from a released config (``rotary_pct``/``rotary_emb_base``, Pythia's
    files) or a recent transformers one (``rope_parameters``); scaled rotary variants are refused."""
    rope = hf.get("rope_parameters") or {}
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise _refuse("rope_parameters.rope_type", kind, "pileworks' model computes only unscaled rotary")
    if hf.get("rope_scaling"):
        raise _refuse("rope_scaling", hf["rope_scaling"], "pileworks' model computes only unscaled rotary")
    pct = rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    base = rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0))
    return float(pct), float(base)


def model_config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Our config for a ``GPTNeoXConfig`` dict; refuses (naming the field) what ours would compute otherwise."""
    if hf.get("model_type") != "gpt_neox":
        raise _refuse("model_type", hf.get("model_type"), "only GPT-NeoX models (gpt_neox) can be loaded")
    # What our model computes, hence what a config must say (or leave out: these are GPT-NeoX's defaults).
    fixed = {"hidden_act": "gelu", "attention_bias": True, "hidden_dropout": 0.0, "attention_dropout": 0.0}
    for field, wanted in fixed.items():
        value = hf.get(field, wanted)
        if value != wanted:
            raise _refuse(field, value, f"pileworks' model needs {wanted!r}")
    pct, base = rotary_settings(hf)
    try:
        required = ("vocab_size", "num_hidden_layers", "num_attention_heads", "hidden_size")
        vocab, layers, heads, width = (int(hf[name]) for name in required)
    except KeyError as exc:
        raise UnsupportedModelError(f"init_from config.json has no {exc.args[0]}") from exc
    if width % heads:
        raise _refuse("hidden_size", width, f"is not a multiple of num_attention_heads {heads}")
    if int(width // heads * pct) % 2:
        raise _refuse("rotary_pct", pct, f"gives an odd rotary dimension for head size {width // heads}")
    return ModelConfig(
        vocab_size=vocab,
        n_layer=layers,
        n_head=heads,
        d_model=width,
        d_ff=int(hf.get("intermediate_size") or 4 * width),
        max_seq_len=int(hf.get("max_position_embeddings", 2048)),
        rotary_pct=pct,
        rotary_base=base,
        parallel_residual=bool(hf.get("use_parallel_residual", True)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        init_std=float(hf.get("initializer_range", 0.02)),
    )


def our_qkv_rows(tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """GPT-NeoX's ``[heads, 3, head_dim, ...]`` qkv rows in our ``[3, heads, head_dim, ...]`` order."""
    rest = tensor.shape[1:]
    grouped = tensor.reshape(cfg.n_head, 3, cfg.head_dim, *rest).transpose(0, 1)
    return grouped.reshape(3 * cfg.d_model, *rest).contiguous()


def from_neox_state_dict(theirs: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """GPT-NeoX's weights under our names (fp32); refuses missing or unknown weights, naming the first."""
    theirs = {k: v for k, v in theirs.items() if not k.endswith(DERIVED_SUFFIXES)}
    taken: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in theirs:
            raise UnsupportedModelError(f"init_from weights have no {name} (config.json promises it)")
        taken.add(name)
        return theirs[name]

    ours = {
        "embed.weight": take("gpt_neox.embed_in.weight"),
        "ln_final.weight": take("gpt_neox.final_layer_norm.weight"),
        "ln_final.bias": take("gpt_neox.final_layer_norm.bias"),
    }
    for i in range(cfg.n_layer):
        mine, neox = f"blocks.{i}.", f"gpt_neox.layers.{i}."
        for src, dst in LAYER_NAMES.items():
            for kind in ("weight", "bias"):
                ours[f"{mine}{src}.{kind}"] = take(f"{neox}{dst}.{kind}")
        for kind in ("weight", "bias"):
            ours[f"{mine}attn.qkv.{kind}"] = our_qkv_rows(
                take(f"{neox}attention.query_key_value.{kind}"), cfg
            )
    head = "lm_head.weight" if "lm_head.weight" in theirs else "embed_out.weight"  # Pythia: embed_out
    if cfg.tie_embeddings:
        taken.update(n for n in ("embed_out.weight", "lm_head.weight") if n in theirs)  # the same tensor
        ours["lm_head.weight"] = ours["embed.weight"]
    else:
        ours["lm_head.weight"] = take(head)
    unknown = sorted(set(theirs) - taken)
    if unknown:
        raise UnsupportedModelError(
            f"init_from weights hold {len(unknown)} tensor(s) pileworks' model has no place for, e.g. {unknown[0]}"
        )
    return {k: v.detach().to(torch.float32).contiguous() for k, v in ours.items()}


def load_weights(store: ObjectStore) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's weight files, loaded weights-only (sharded folders through their index)."""
    for name in WEIGHT_FILES:
        index = f"{name}.index.json"
        if store.exists(index):
            shards = sorted(set(json.loads(store.get_bytes(index))["weight_map"].values()))
        elif store.exists(name):
            shards = [name]
        else:
            continue
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(_load_file(shard, store.get_bytes(shard)))
        return state
    raise UnsupportedModelError(
        f"{store.uri_of('')} holds no model.safetensors or pytorch_model.bin (nor a sharded index of one)"
    )


def _load_file(name: str, data: bytes) -> dict[str, torch.Tensor]:
    if name.endswith(".safetensors"):
        from safetensors.torch import load as load_safetensors

        return load_safetensors(data)
    blob = safe_load(io.BytesIO(data), map_location="cpu")  # weights-only: a planted payload is refused
    return blob.get("state_dict", blob) if isinstance(blob, dict) else blob


def load_hf_model(uri: str, s3: S3Options | None = None, *, weights: bool = True) -> HfModel:
    """The model of a ``GPTNeoXForCausalLM`` folder (a local path or a store URI: ``file://``, ``s3://``,
    ``gs://``, ``az://``) as ours.

    ``weights=False``: config, special ids and tokenizer only (``state`` empty), for checks before a run."""
    store = open_store(uri, s3)
    if not store.exists(CONFIG_NAME):
        raise UnsupportedModelError(f"init_from {uri} holds no config.json: give a GPTNeoXForCausalLM folder")
    hf = json.loads(store.get_bytes(CONFIG_NAME))
    cfg = model_config_from_hf(hf)
    state = from_neox_state_dict(load_weights(store), cfg) if weights else {}
    tokenizer_json = store.get_bytes(TOKENIZER_NAME) if store.exists(TOKENIZER_NAME) else None
    logger.log(
        logging.INFO if weights else logging.DEBUG,  # the check before a run stays quiet
        "init from %s: GPT-NeoX %d layers x %d, vocab %d",
        uri,
        cfg.n_layer,
        cfg.d_model,
        cfg.vocab_size,
    )
    return HfModel(
        cfg, state, _int_or_none(hf.get("eos_token_id")), _int_or_none(hf.get("pad_token_id")), tokenizer_json
    )


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, list):  # a list of stop ids: the first is the document end
        value = value[0] if value else None
    return None if value is None else int(value)


# ---------------------------------------------------------------- the dataset's tokenizer against the model's
def tokenizer_differences(
    model: HfModel, dataset_tokenizer: bytes, *, vocab_size: int, eos_id: int, pad_id: int | None
) -> list[str]:
    """What differs between the dataset's tokenizer (and its special ids) and the model's; empty if none."""
    if model.tokenizer_json is None:
        return ["the model folder has no tokenizer.json to compare with"]
    found: list[str] = []
    if vocab_size > model.config.vocab_size:
        found.append(f"vocab size {vocab_size} > the model's {model.config.vocab_size}")
    # The build re-serializes a given tokenizer.json (tokenizers' to_str): compare what both parse to.
    model_tok, dataset_tok = _parse(model.tokenizer_json), _parse(dataset_tokenizer)
    if model_tok.to_str() != dataset_tok.to_str():
        vocab = _vocab_differences(
            model_tok.get_vocab(with_added_tokens=True), dataset_tok.get_vocab(with_added_tokens=True)
        )
        found += vocab or _rule_differences(model_tok.to_str(), dataset_tok.to_str())
    if model.eos_id is not None and model.eos_id != eos_id:
        found.append(f"eos id {eos_id} (model: {model.eos_id})")
    if model.pad_id is not None and pad_id is not None and model.pad_id != pad_id:
        found.append(f"pad id {pad_id} (model: {model.pad_id})")
    return found


def _parse(tokenizer_json: bytes) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json.decode("utf-8"))


def _vocab_differences(model: dict[str, int], dataset: dict[str, int]) -> list[str]:
    changed = sorted(t for t in model.keys() & dataset.keys() if model[t] != dataset[t])
    missing, extra = sorted(model.keys() - dataset.keys()), sorted(dataset.keys() - model.keys())
    found = []
    if changed:
        found.append(
            f"{len(changed)} token(s) with other ids, e.g. {changed[0]!r} {dataset[changed[0]]} "
            f"(model: {model[changed[0]]})"
        )
    if missing:
        found.append(f"{len(missing)} model token(s) missing, e.g. {missing[0]!r}")
    if extra:
        found.append(f"{len(extra)} token(s) the model lacks, e.g. {extra[0]!r}")
    return found


def _rule_differences(model: str, dataset: str) -> list[str]:
    """Same vocabulary: the sections that still change which ids a text gets (merges, normalizer, ...)."""
    ours, theirs = json.loads(model), json.loads(dataset)
    keys = ("model", "normalizer", "pre_tokenizer", "added_tokens", "post_processor")
    return [f"{k} differs" for k in keys if ours.get(k) != theirs.get(k)]


def special_token_text(tokenizer_json: bytes, token_id: int | None) -> str | None:
    """The text of an added (special) token by id, as ``tokenize.eos_token`` names it."""
    if token_id is None:
        return None
    for token in json.loads(tokenizer_json).get("added_tokens", []):
        if int(token["id"]) == token_id:
            return str(token["content"])
    return None


def check_dataset_tokenizer(model: HfModel, uri: str, tokenizer: Any, tokenizer_json: bytes) -> None:
    """Refuse, in one line, a dataset (its manifest's ``tokenizer`` info and bytes) tokenized otherwise."""
    found = tokenizer_differences(
        model,
        tokenizer_json,
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
    )
    if found:
        raise ValueError(
            f"the dataset's tokenizer differs from init_from {uri}'s: {'; '.join(found)}; build the corpus with "
            f"tokenize.tokenizer: {uri.rstrip('/')}/{TOKENIZER_NAME} (pileworks run --init-from does)"
        )


def tokenize_overrides(uri: str, s3: S3Options | None = None) -> dict[str, Any]:
    """Corpus config overrides (dotted) that build a dataset with the model's tokenizer and its EOS/pad tokens:
    what ``pileworks run --init-from`` adds, so that training from ``uri`` accepts the dataset."""
    model = load_hf_model(uri, s3, weights=False)
    if model.tokenizer_json is None:
        raise UnsupportedModelError(
            f"init_from {uri} holds no tokenizer.json: the corpus needs the model's tokenizer"
        )
    eos = special_token_text(model.tokenizer_json, model.eos_id)
    if eos is None:
        raise _refuse("eos_token_id", model.eos_id, "names no special token of the folder's tokenizer.json")
    pad = special_token_text(model.tokenizer_json, model.pad_id)
    return {
        "tokenize.tokenizer": f"{uri.rstrip('/')}/{TOKENIZER_NAME}",
        "tokenize.special_tokens": [eos] + ([pad] if pad is not None and pad != eos else []),
        "tokenize.eos_token": eos,
        "tokenize.pad_token": pad,
    }
