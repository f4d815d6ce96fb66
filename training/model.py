"""A GPT-NeoX-style decoder: rotary embeddings, pre-LayerNorm, optional parallel attention+MLP, SDPA.

Kept in one file (nanoGPT style) so the whole network reads top to bottom. Presets are plain functions; the
vocabulary always comes from the manifest's tokenizer, so a preset takes ``vocab_size`` as an argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    vocab_size: int
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int = 0  # 0 = 4 * d_model
    max_seq_len: int = 2048
    rotary_pct: float = 0.25  # GPT-NeoX rotates a quarter of each head's dimensions
    rotary_base: float = 10000.0
    parallel_residual: bool = True  # GPT-NeoX / GPT-J: x + attn(ln1(x)) + mlp(ln2(x))
    # Tied like GPT-3, whose sizes the presets are named after (125m counts a tied head); GPT-NeoX/Pythia
    # untie (Pythia-160m is the 125m shape untied): set tie_embeddings: false in the config's model overrides.
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    init_std: float = 0.02
    # "document": no token attends across an EOS (``eos_id``) inside a packed window; "causal": GPT-NeoX's.
    attention: Literal["causal", "document"] = "causal"
    eos_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0; got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})"
            )
        if self.d_ff < 0:
            raise ValueError(f"model.d_ff must be >= 0 (0 means 4 * d_model); got {self.d_ff}")
        if not 0.0 <= self.rotary_pct <= 1.0:
            raise ValueError(f"model.rotary_pct must be in [0, 1]; got {self.rotary_pct}")
        if self.rotary_dim % 2:
            raise ValueError(
                f"model.rotary_pct gives an odd rotary dimension {self.rotary_dim}; pick one giving an even one"
            )
        if self.attention not in ("causal", "document"):
            raise ValueError(f"model.attention must be 'causal' or 'document'; got {self.attention!r}")
        if self.attention == "document" and self.eos_id is None:
            raise ValueError("model.attention 'document' needs model.eos_id, the id that ends a document")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def ffn_dim(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rotary_pct)


# ---------------------------------------------------------------- presets (sizes of GPT-3 / Pythia)
def tiny(vocab_size: int, max_seq_len: int = 256) -> ModelConfig:
    """About 3M parameters at an 8k vocabulary: trains on two CPU cores in a couple of minutes."""
    return ModelConfig(vocab_size=vocab_size, n_layer=4, n_head=4, d_model=192, max_seq_len=max_seq_len)


def gpt_125m(vocab_size: int, max_seq_len: int = 2048) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, n_layer=12, n_head=12, d_model=768, max_seq_len=max_seq_len)


def gpt_350m(vocab_size: int, max_seq_len: int = 2048) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, n_layer=24, n_head=16, d_model=1024, max_seq_len=max_seq_len)


def gpt_760m(vocab_size: int, max_seq_len: int = 2048) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, n_layer=24, n_head=16, d_model=1536, max_seq_len=max_seq_len)


def gpt_1_3b(vocab_size: int, max_seq_len: int = 2048) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, n_layer=24, n_head=16, d_model=2048, max_seq_len=max_seq_len)


PRESETS: dict[str, Callable[..., ModelConfig]] = {
    "tiny": tiny,
    "125m": gpt_125m,
    "350m": gpt_350m,
    "760m": gpt_760m,
    "1.3b": gpt_1_3b,
}


def model_config_from_preset(
    preset: str, *, vocab_size: int, max_seq_len: int, overrides: dict | None = None
) -> ModelConfig:
    """The preset's config for this vocabulary and context, with ``overrides`` (field -> value) applied."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {preset!r}")
    cfg = PRESETS[preset](vocab_size, max_seq_len)
    unknown = sorted(set(overrides or {}) - set(ModelConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"model overrides name unknown field(s) {unknown}")
    return replace(cfg, **(overrides or {}))


def count_params(cfg: ModelConfig) -> int:
    """Parameters of ``GPT(cfg)`` without building it (presets up to 1.3b are checked without allocating)."""
    d, f = cfg.d_model, cfg.ffn_dim
    per_layer = (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 2 * (2 * d)
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return cfg.vocab_size * d + cfg.n_layer * per_layer + 2 * d + head


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), the PaLM appendix-B formula: 6 N + 12 L d T.

    N counts every weight that takes part in a matmul (so the LM head is counted even when tied; the input
    embedding lookup is not), the second term is attention's score and value products at context T.
    """
    d, layers = cfg.d_model, cfg.n_layer
    per_layer = 4 * d * d + 2 * d * cfg.ffn_dim  # qkv + out projection, MLP up + down
    matmul_params = layers * per_layer + d * cfg.vocab_size
    return 6.0 * matmul_params + 12.0 * layers * d * seq_len


# ---------------------------------------------------------------- modules
def rotary_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (
        cfg.rotary_base ** (torch.arange(0, cfg.rotary_dim, 2, dtype=torch.float32) / cfg.rotary_dim)
    )
    t = torch.arange(cfg.max_seq_len, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # NeoX layout: rotate halves, not interleaved pairs
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` dims of each head; x is (B, H, T, Dh), cos/sin are (T, rotary_dim)."""
    if rotary_dim == 0:
        return x
    rot, keep = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    rot = rot * cos.to(x.dtype) + rotated_half * sin.to(x.dtype)
    return torch.cat([rot, keep], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``cos``/``sin``: the tables by position (T_max, rotary_dim), or per token (B, 1, T, rotary_dim);
        ``mask``: (B, 1, T, T) booleans, True where a query may attend (None: plain causal)."""
        b, t, d = x.shape
        h, hd = self.cfg.n_head, self.cfg.head_dim
        q, k, v = self.qkv(x).view(b, t, 3, h, hd).permute(2, 0, 3, 1, 4)  # each (B, H, T, Dh)
        if cos.dim() == 2:
            cos, sin = cos[:t], sin[:t]
        q = apply_rotary(q, cos, sin, self.cfg.rotary_dim)
        k = apply_rotary(k, cos, sin, self.cfg.rotary_dim)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.down = nn.Linear(cfg.ffn_dim, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.parallel = cfg.parallel_residual
        self.ln_attn = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.ln_mlp = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.parallel:
            return x + self.attn(self.ln_attn(x), cos, sin, mask) + self.mlp(self.ln_mlp(x))
        x = x + self.attn(self.ln_attn(x), cos, sin, mask)
        return x + self.mlp(self.ln_mlp(x))


def document_layout(tokens: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Document masking of a packed window: ``(mask, positions)``.

    ``mask`` (B, 1, T, T): query i may see key j when j <= i and both lie in one document; a token belongs
    to the document its nearest EOS at or after it ends, so an EOS still sees its own document and the token
    after it starts afresh. ``positions`` (B, T): each token's offset from its document's first token in the
    window. Positions restart so that a document inside a window is computed exactly as that document alone
    (its rotary angles are the ones it would get from position 0); rotary scores depend only on the offset
    between query and key, so this changes only float rounding, which grows with the absolute position.
    """
    is_eos = (tokens == eos_id).to(torch.int64)
    doc = torch.cumsum(is_eos, dim=1) - is_eos  # EOSes strictly before each token
    t = tokens.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
    mask = ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]
    index = torch.arange(t, device=tokens.device).expand_as(tokens)
    starts = torch.where(doc != torch.nn.functional.pad(doc, (1, 0), value=-1)[:, :-1], index, 0)
    return mask, index - torch.cummax(starts, dim=1).values


class GPT(nn.Module):
    """``forward(tokens, targets=None)``: logits (B, T, V), or the mean cross-entropy when targets are given.

    ``activation_checkpointing``: keep only each block's input during training's forward and recompute the
    block in backward (torch's non-reentrant checkpoint): activation memory per layer falls from every
    intermediate to one (B, T, d) tensor, for about a third more compute. Not part of the config: a checkpoint
    trained with it is the same model."""

    def __init__(self, cfg: ModelConfig, *, activation_checkpointing: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_final = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rotary_tables(cfg)
        # Not persistent: derived from the config, so checkpoints stay free of them.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream keeps its variance flat.
        for name, param in self.named_parameters():
            if name.endswith(("attn.out.weight", "mlp.down.weight")):
                nn.init.normal_(param, std=cfg.init_std / math.sqrt(2 * cfg.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.cfg.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # a tied weight is one parameter, counted once

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.shape[1] > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence of {tokens.shape[1]} tokens exceeds max_seq_len {self.cfg.max_seq_len}"
            )
        x = self.embed(tokens)
        cos: torch.Tensor = self.rope_cos  # type: ignore[assignment]  # a registered buffer
        sin: torch.Tensor = self.rope_sin  # type: ignore[assignment]
        mask = None
        if self.cfg.attention == "document" and self.cfg.eos_id is not None:
            mask, positions = document_layout(tokens, self.cfg.eos_id)
            cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:
                x = checkpoint(block, x, cos, sin, mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, mask)
        logits = self.lm_head(self.ln_final(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1).long())

    @torch.no_grad()
    def generate(
        self,
        tokens: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        stop_token: int | None = None,
    ) -> torch.Tensor:
        """Sample continuations of ``tokens`` (B, T); temperature 0 is greedy. No KV cache: demo-sized use."""
        for _ in range(max_new_tokens):
            context = tokens[:, -self.cfg.max_seq_len :]
            logits = self(context)[:, -1, :].float()
            if temperature <= 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = torch.softmax(logits, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            tokens = torch.cat([tokens, nxt], dim=1)
            if stop_token is not None and bool((nxt == stop_token).all()):
                break
        return tokens
