"""The files that make a bare ``tokenizer.json`` a Hugging Face tokenizer folder that knows its special tokens.

``transformers.AutoTokenizer.from_pretrained(folder)`` reads ``tokenizer_config.json`` (the tokenizer class and
the eos/pad/bos tokens) and ``special_tokens_map.json``; without them a ``PreTrainedTokenizerFast`` reports
``eos_token=None``. Both are written deterministically (sorted keys, no dates): they are part of a dataset,
whose id is a content hash.
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Tokenizer

CONFIG_NAME = "tokenizer_config.json"
SPECIAL_MAP_NAME = "special_tokens_map.json"
HF_TOKENIZER_FILES = (CONFIG_NAME, SPECIAL_MAP_NAME)


def _token(tok: Tokenizer, token_id: int | None, role: str) -> str | None:
    if token_id is None:
        return None
    token = tok.id_to_token(token_id)
    if token is None:
        raise ValueError(f"tokenizer has no token with id {token_id} (the {role} id)")
    return token


def special_tokens(
    tokenizer_json: bytes, *, eos_id: int, pad_id: int | None, bos_id: int | None
) -> dict[str, str]:
    """``{"eos_token": ..., "pad_token": ..., "bos_token": ...}`` for the ids that are set."""
    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    roles = {"bos_token": (bos_id, "bos"), "eos_token": (eos_id, "eos"), "pad_token": (pad_id, "pad")}
    named = {name: _token(tok, tid, role) for name, (tid, role) in roles.items()}
    return {name: token for name, token in named.items() if token is not None}


def hf_tokenizer_files(
    tokenizer_json: bytes,
    *,
    eos_id: int,
    pad_id: int | None = None,
    bos_id: int | None = None,
    model_max_length: int | None = None,
) -> dict[str, bytes]:
    """``tokenizer_config.json`` and ``special_tokens_map.json`` for ``tokenizer.json`` (name -> bytes).

    No BOS or EOS is added by the tokenizer itself (pileworks appends EOS to each document when it tokenizes;
    a prompt must not end in EOS), so ``tok(text).input_ids + [tok.eos_token_id]`` is a document's shard ids.
    """
    specials = special_tokens(tokenizer_json, eos_id=eos_id, pad_id=pad_id, bos_id=bos_id)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        **specials,
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    return {
        CONFIG_NAME: (json.dumps(config, indent=1, sort_keys=True) + "\n").encode("utf-8"),
        SPECIAL_MAP_NAME: (json.dumps(specials, indent=1, sort_keys=True) + "\n").encode("utf-8"),
    }
