"""The tiktoken fast path: the same byte-level BPE as a ``tokenizers`` model, encoded ~4x faster.

A byte-level BPE trained by ``tokenizers`` stores tokens as strings over GPT-2's byte-to-unicode alphabet and
its merges in priority order. tiktoken wants raw-bytes -> rank, where the rank order decides which pair merges
first. We map every token back to raw bytes and rank merged tokens by their merge's position (single bytes
first), split with the ByteLevel pre-tokenizer's GPT-2 regex, and map special tokens to their ids. tiktoken
ranks *are* the ids it returns, so this only works when a merged token's id order equals its merge order, which
a ``BpeTrainer`` guarantees; anything else is refused with the reason. tiktoken also takes a whole pre-token as
one id when it is in the vocabulary, where ``tokenizers`` applies merges step by step; the two can (rarely)
disagree, which is why callers verify ids on a sample before trusting the fast path (:func:`verify_same_ids`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import tiktoken
from tokenizers import Tokenizer

# The GPT-2 pattern that ``pre_tokenizers.ByteLevel(use_regex=True)`` applies.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class UnsupportedTokenizer(ValueError):
    """The tokenizer is not a plain byte-level BPE that tiktoken can reproduce; the message says why."""


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: printable bytes map to themselves, the rest to 256+n."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[chr(b)] = b
        else:
            mapping[chr(256 + extra)] = b
            extra += 1
    return mapping


def _check_plain_byte_level(spec: dict[str, Any]) -> None:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise UnsupportedTokenizer(f"model is {model.get('type')!r}, not BPE")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise UnsupportedTokenizer(f"BPE model sets {key}={model[key]!r}")
    if model.get("ignore_merges"):
        raise UnsupportedTokenizer("BPE model sets ignore_merges")
    if spec.get("normalizer") is not None:
        raise UnsupportedTokenizer(f"tokenizer has a normalizer ({spec['normalizer'].get('type')})")
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        raise UnsupportedTokenizer(f"pre-tokenizer is not ByteLevel(add_prefix_space=False): {pre}")


def _merged_ranks(vocab: dict[str, int], merges: Sequence[Any], specials: set[int]) -> dict[bytes, int]:
    to_byte = unicode_to_byte()

    def raw(token: str) -> bytes:
        try:
            return bytes(to_byte[c] for c in token)
        except KeyError:
            raise UnsupportedTokenizer(f"token {token!r} is not over the byte-level alphabet") from None

    ranks: dict[bytes, int] = {}
    singles = sorted((tid, tok) for tok, tid in vocab.items() if tid not in specials and len(raw(tok)) == 1)
    if len(singles) != 256:
        raise UnsupportedTokenizer(f"vocabulary has {len(singles)} single-byte tokens, expected all 256")
    for tid, tok in singles:
        ranks[raw(tok)] = tid
    previous = max(tid for tid, _ in singles)
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        merged = left + right
        merged_id = vocab.get(merged)
        if merged_id is None or merged_id <= previous:
            raise UnsupportedTokenizer(f"merge {merge!r} gives id {merged_id}, not in increasing merge order")
        if raw(merged) in ranks:
            raise UnsupportedTokenizer(f"two merges produce the same bytes {raw(merged)!r}")
        ranks[raw(merged)] = merged_id
        previous = merged_id
    return ranks


def tiktoken_from_tokenizer(tokenizer: Tokenizer, name: str = "pileworks-bpe") -> tiktoken.Encoding:
    """Build a tiktoken ``Encoding`` giving the same ids; raises UnsupportedTokenizer when it cannot."""
    spec = json.loads(tokenizer.to_str())
    _check_plain_byte_level(spec)
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    vocab = spec["model"]["vocab"]
    ranks = _merged_ranks(vocab, spec["model"].get("merges", []), set(specials.values()))
    if len(ranks) + len(specials) != tokenizer.get_vocab_size():
        raise UnsupportedTokenizer(
            f"{len(ranks)} ranks + {len(specials)} specials != vocab size "
            f"{tokenizer.get_vocab_size()} (tokens not reachable by a merge)"
        )
    if set(specials.values()) & set(ranks.values()):
        raise UnsupportedTokenizer("a special token shares an id with a byte-level token")
    return tiktoken.Encoding(
        name=name,
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=specials,
        explicit_n_vocab=tokenizer.get_vocab_size(),
    )


def verify_same_ids(
    tokenizer: Tokenizer, encoding: tiktoken.Encoding, texts: Sequence[str], *, allow_special: bool = False
) -> str | None:
    """None when both encoders give identical ids on every text, else a description of the first mismatch.

    ``allow_special``: special-token text is matched (tiktoken's ``allowed_special="all"``), as ``tokenizer``
    does when it has added tokens; otherwise both encode it as ordinary text."""
    reference = tokenizer.encode_batch(list(texts), add_special_tokens=False)
    if allow_special:
        fast = encoding.encode_batch(list(texts), allowed_special="all")
    else:
        fast = encoding.encode_ordinary_batch(list(texts))
    for i, (ref, got) in enumerate(zip(reference, fast, strict=True)):
        if ref.ids != got:
            at = next(
                (j for j, (a, b) in enumerate(zip(ref.ids, got, strict=False)) if a != b),
                min(len(ref.ids), len(got)),
            )
            return f"text {i}: ids differ at position {at} ({ref.ids[at : at + 3]} vs {got[at : at + 3]})"
    return None
