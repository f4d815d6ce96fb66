"""The GPT-NeoX-style decoder: shapes, causality, rotary's relative positions, tying, presets, FLOPs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from training.model import (
    GPT,
    PRESETS,
    Attention,
    ModelConfig,
    apply_rotary,
    count_params,
    flops_per_token,
    model_config_from_preset,
    rotary_tables,
)


def small(**kw) -> ModelConfig:
    base = dict(vocab_size=97, n_layer=2, n_head=4, d_model=32, max_seq_len=24)
    return ModelConfig(**{**base, **kw})


def test_forward_shapes_and_loss() -> None:
    torch.manual_seed(0)
    model = GPT(small())
    tokens = torch.randint(0, 97, (3, 16))
    assert model(tokens).shape == (3, 16, 97)
    loss = model(tokens, torch.randint(0, 97, (3, 16)))
    assert loss.shape == () and loss.dtype == torch.float32
    # At init the output is near uniform: the loss on random targets is close to ln(vocab).
    assert abs(loss.item() - torch.log(torch.tensor(97.0)).item()) < 0.5


@pytest.mark.parametrize("parallel", [True, False])
def test_causal_future_tokens_do_not_change_past_logits(parallel: bool) -> None:
    torch.manual_seed(1)
    model = GPT(small(parallel_residual=parallel)).eval()
    tokens = torch.randint(0, 97, (2, 20))
    changed = tokens.clone()
    changed[:, 12:] = (changed[:, 12:] + 5) % 97
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=1e-5)
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-3


def test_rotary_scores_depend_only_on_relative_position() -> None:
    cfg = small(rotary_pct=1.0)
    cos, sin = rotary_tables(cfg)
    torch.manual_seed(2)
    q, k = torch.randn(cfg.head_dim), torch.randn(cfg.head_dim)

    def score(m: int, n: int) -> torch.Tensor:
        qm = apply_rotary(q.view(1, 1, 1, -1), cos[m : m + 1], sin[m : m + 1], cfg.rotary_dim)
        kn = apply_rotary(k.view(1, 1, 1, -1), cos[n : n + 1], sin[n : n + 1], cfg.rotary_dim)
        return (qm * kn).sum()

    torch.testing.assert_close(score(7, 3), score(17, 13), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(score(7, 3), score(7, 5))


def test_partial_rotary_leaves_the_rest_untouched() -> None:
    cfg = small(rotary_pct=0.25)
    cos, sin = rotary_tables(cfg)
    x = torch.randn(1, 1, 5, cfg.head_dim)
    y = apply_rotary(x, cos[:5], sin[:5], cfg.rotary_dim)
    torch.testing.assert_close(y[..., cfg.rotary_dim :], x[..., cfg.rotary_dim :])
    assert not torch.allclose(y[..., : cfg.rotary_dim], x[..., : cfg.rotary_dim])


def test_attention_is_causal_rotary_softmax_attention() -> None:
    """The project's Attention module against the formula written out from its own weights: q/k/v split per
    head, rotary on q and k, causal softmax(q k^T / sqrt(d)), heads merged, output projection."""
    torch.manual_seed(3)
    cfg = small(rotary_pct=0.5)
    attn = Attention(cfg).eval()
    cos, sin = rotary_tables(cfg)
    x = torch.randn(2, 9, cfg.d_model)
    b, t, h, hd = 2, 9, cfg.n_head, cfg.head_dim
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).split(cfg.d_model, dim=-1)
    q, k, v = (z.reshape(b, t, h, hd).transpose(1, 2) for z in (q, k, v))
    q, k = (apply_rotary(z, cos[:t], sin[:t], cfg.rotary_dim) for z in (q, k))
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    weights = ((q @ k.transpose(-1, -2)) / hd**0.5).masked_fill(~mask, float("-inf")).softmax(-1)
    manual = (weights @ v).transpose(1, 2).reshape(b, t, cfg.d_model) @ attn.out.weight.T + attn.out.bias
    with torch.no_grad():
        out = attn(x, cos, sin)
        torch.testing.assert_close(out, manual, rtol=1e-5, atol=1e-5)
        # causal: changing the last position changes no earlier output
        later = x.clone()
        later[:, -1] += 1.0
        torch.testing.assert_close(attn(later, cos, sin)[:, :-1], out[:, :-1])


def test_tied_and_untied_embeddings() -> None:
    tied, untied = GPT(small(tie_embeddings=True)), GPT(small(tie_embeddings=False))
    assert tied.lm_head.weight is tied.embed.weight
    assert untied.lm_head.weight is not untied.embed.weight
    assert untied.num_params() - tied.num_params() == 97 * 32
    assert tied.num_params() == count_params(tied.cfg)
    assert untied.num_params() == count_params(untied.cfg)


def test_parallel_and_sequential_residual_differ() -> None:
    torch.manual_seed(4)
    par = GPT(small(parallel_residual=True))
    seq = GPT(small(parallel_residual=False))
    seq.load_state_dict(par.state_dict())
    tokens = torch.randint(0, 97, (1, 10))
    assert not torch.allclose(par(tokens), seq(tokens))


def test_too_long_input_is_refused() -> None:
    with pytest.raises(ValueError, match="max_seq_len"):
        GPT(small())(torch.zeros(1, 25, dtype=torch.long))


def test_generate_is_seeded_and_greedy_is_deterministic() -> None:
    torch.manual_seed(5)
    model = GPT(small()).eval()
    prompt = torch.tensor([[1, 2, 3]])
    greedy = model.generate(prompt, 30, temperature=0)  # longer than max_seq_len: the context is cropped
    assert greedy.shape == (1, 33) and torch.equal(greedy, model.generate(prompt, 30, temperature=0))
    a = model.generate(prompt, 8, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(7))
    b = model.generate(prompt, 8, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_presets_have_their_nominal_sizes() -> None:
    expected = {"125m": 125e6, "350m": 355e6, "760m": 760e6, "1.3b": 1.3e9}
    for name, target in expected.items():
        n = count_params(PRESETS[name](50257))
        assert abs(n - target) / target < 0.03, (name, n)
    tiny = count_params(PRESETS["tiny"](8192))
    assert 1e6 < tiny < 10e6


def test_preset_overrides_and_validation() -> None:
    cfg = model_config_from_preset(
        "tiny", vocab_size=512, max_seq_len=64, overrides={"tie_embeddings": False}
    )
    assert cfg.tie_embeddings is False and cfg.max_seq_len == 64 and cfg.vocab_size == 512
    with pytest.raises(ValueError, match="preset must be one of"):
        model_config_from_preset("7b", vocab_size=512, max_seq_len=64)
    with pytest.raises(ValueError, match="unknown field"):
        model_config_from_preset("tiny", vocab_size=512, max_seq_len=64, overrides={"layers": 3})
    with pytest.raises(ValueError, match=r"divisible by model\.n_head"):
        replace(cfg, d_model=100, n_head=3)


def test_flops_per_token_is_about_six_times_params() -> None:
    cfg = PRESETS["125m"](50257)
    flops = flops_per_token(cfg, 2048)
    six_n = 6 * count_params(cfg)
    # the attention term (12 L d T) adds about 12% at 2k context for this shape
    assert 1.0 < flops / six_n < 1.4
    assert flops_per_token(cfg, 4096) > flops


def documents(lengths: list[int], eos: int, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    """Documents of random non-EOS tokens, each ending in EOS (the last one cut short, as a window cuts it)."""
    g = torch.Generator().manual_seed(seed)
    docs = [torch.cat([torch.randint(1, vocab, (n,), generator=g), torch.tensor([eos])]) for n in lengths]
    docs[-1] = docs[-1][:-1]
    return docs


@pytest.mark.parametrize("parallel", [True, False])
def test_document_attention_equals_running_each_document_alone(parallel: bool) -> None:
    torch.manual_seed(5)
    cfg = small(max_seq_len=128, init_std=0.3, rotary_pct=0.5, parallel_residual=parallel)
    docs = documents([20, 1, 45, 0, 30], eos=0, vocab=cfg.vocab_size)
    window = torch.cat(docs)[None]
    masked = GPT(replace(cfg, attention="document", eos_id=0)).eval()
    causal = GPT(cfg).eval()
    causal.load_state_dict(masked.state_dict())
    with torch.no_grad():
        packed, start = masked(window), 0
        assert packed.abs().max() > 2.0
        for doc in docs:
            alone = causal(doc[None])  # the plain causal model on the document by itself
            assert (packed[0, start : start + len(doc)] - alone[0]).abs().max().item() <= 1e-5
            start += len(doc)
        # the causal model lets later documents see earlier ones: the mask is what changes them
        assert (causal(window)[0, 30:] - packed[0, 30:]).abs().max() > 1e-2


def test_document_layout_masks_across_eos_and_restarts_positions() -> None:
    from training.model import document_layout

    mask, positions = document_layout(torch.tensor([[5, 0, 3, 4, 0, 0, 7]]), eos_id=0)
    assert positions.tolist() == [[0, 1, 0, 1, 2, 0, 0]]
    seen = mask[0, 0].int().tolist()
    assert seen[1] == [1, 1, 0, 0, 0, 0, 0]  # the EOS sees its own document
    assert seen[4] == [0, 0, 1, 1, 1, 0, 0]
    assert seen[5] == [0, 0, 0, 0, 0, 1, 0]  # an empty document: the EOS alone
    assert seen[6] == [0, 0, 0, 0, 0, 0, 1]


def test_document_attention_needs_the_eos_id() -> None:
    with pytest.raises(ValueError, match=r"model\.eos_id"):
        small(attention="document")
    with pytest.raises(ValueError, match=r"model\.attention"):
        small(attention="sliding")


def train_losses(
    checkpointing: bool, attention: str = "causal"
) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(11)
    cfg = small(max_seq_len=64, attention=attention, eos_id=0 if attention == "document" else None)
    model = GPT(cfg, activation_checkpointing=checkpointing).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, cfg.vocab_size, (4, 8, 33), generator=torch.Generator().manual_seed(2))
    losses = []
    for step in range(4):
        tokens = data[step]
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


@pytest.mark.parametrize("attention", ["causal", "document"])
def test_activation_checkpointing_trains_to_the_same_losses_and_weights(attention: str) -> None:
    plain, plain_state = train_losses(False, attention)
    recomputed, recomputed_state = train_losses(True, attention)
    assert recomputed == plain  # bit for bit: the recomputed forward is the same arithmetic
    assert all(torch.equal(plain_state[k], recomputed_state[k]) for k in plain_state)


def test_activation_checkpointing_keeps_fewer_tensors_for_backward() -> None:
    """The saved-tensor hooks count what autograd keeps: with checkpointing only each block's inputs."""
    cfg = small(n_layer=4, max_seq_len=64)
    tokens = torch.randint(0, cfg.vocab_size, (2, 64))

    def saved_elements(checkpointing: bool) -> int:
        model = GPT(cfg, activation_checkpointing=checkpointing).train()
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            total += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(tokens, tokens).backward()
        return total

    assert saved_elements(True) < saved_elements(False) / 2
