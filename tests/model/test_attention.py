"""Masks, attention (SDPA vs explicit path, attention maps) and positional encodings."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from model_helpers import PAD, random_tokens, tiny_config, tiny_model

from aiayn.model import attention_mask, capture_attention, causal_mask, padding_mask
from aiayn.model.attention import (
    MultiHeadCrossAttention,
    MultiHeadSelfAttention,
    _Heads,
    attention_probs,
)
from aiayn.model.embedding import SinusoidalPositionalEncoding


def test_masks_convention_true_is_real() -> None:
    tokens = torch.tensor([[5, 6, PAD], [PAD, PAD, PAD]])
    assert padding_mask(tokens, PAD).tolist() == [[True, True, False], [False, False, False]]
    lower = [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(3).tolist() == lower
    assert causal_mask(2, offset=2).tolist() == [[True, True, True, False], [True] * 4]
    mask = attention_mask(padding_mask(tokens, PAD), causal_mask(3))
    assert mask is not None and mask.shape == (2, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert mask[1].all()  # no visible key at all: opened, so softmax cannot produce NaN
    assert attention_mask(None, None) is None


@pytest.mark.parametrize("module", [MultiHeadSelfAttention, MultiHeadCrossAttention])
def test_explicit_path_matches_sdpa(module: type) -> None:
    torch.manual_seed(0)
    attn = module(16, 4).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    keys = 5 if module is MultiHeadSelfAttention else 7
    key_pad = torch.ones(2, keys, dtype=torch.bool)
    key_pad[1, 3:] = False
    causal = causal_mask(5) if module is MultiHeadSelfAttention else None
    mask = attention_mask(key_pad, causal)
    kwargs = {"mask": mask}
    if module is MultiHeadCrossAttention:
        kwargs["memory"] = memory
    fast = attn(x, **kwargs)
    attn.record = recorded = []  # what capture_attention does to every module
    slow = attn(x, **kwargs)
    torch.testing.assert_close(slow, fast, atol=1e-6, rtol=1e-5)
    (probs,) = recorded
    assert probs.shape == (2, 4, 5, keys)
    assert probs[~mask.expand_as(probs)].abs().max() == 0
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 5))


@pytest.mark.parametrize("num_keys", [6, 9])
def test_causal_probs_match_sdpa_is_causal(num_keys: int) -> None:
    q = torch.randn(2, 3, 6, 4)
    k, v = torch.randn(2, 2, 3, num_keys, 4).unbind(0)
    probs = attention_probs(q, k, causal=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(probs @ v, expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(probs[0, 0].triu(1), torch.zeros(6, num_keys))  # top-left aligned
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, 6))


@pytest.mark.parametrize("norm_first", [False, True])
def test_attention_maps(norm_first: bool) -> None:
    model = tiny_model(norm_first=norm_first, num_encoder_layers=3)
    src = random_tokens(2, 6, 23, seed=1)
    tgt = random_tokens(2, 5, 23, seed=2)
    src[1, 4:] = PAD
    tgt[1, 3:] = PAD
    with torch.no_grad():
        logits = model(src, tgt)
        with capture_attention(model) as captured:
            explicit_logits = model(src, tgt)
        maps = model.attention_maps(src, tgt)
    torch.testing.assert_close(explicit_logits, logits, atol=1e-5, rtol=1e-5)
    assert list(maps) == ["encoder_self", "decoder_self", "decoder_cross"]
    assert [len(maps[k]) for k in maps] == [3, 2, 2]
    for name in maps:
        for ours, theirs in zip(maps[name], captured[name], strict=True):
            assert torch.equal(ours, theirs)
    src_real, tgt_real = src != PAD, tgt != PAD
    for name, (tq, tk) in {
        "encoder_self": (6, 6),
        "decoder_self": (5, 5),
        "decoder_cross": (5, 6),
    }.items():
        for probs in maps[name]:
            assert probs.shape == (2, 4, tq, tk)
            if name == "decoder_self":
                # targets are padded on the right: a real position sees real ones under the
                # causal mask alone; padded positions (no loss reads them) may see padding
                visible = causal_mask(5)[None, None].expand_as(probs)
                real_query = tgt_real[:, None, :, None].expand_as(probs)
                assert probs[real_query & ~tgt_real[:, None, None, :]].abs().max() == 0
            else:
                visible = src_real[:, None, None, :].expand_as(probs)
            assert probs[~visible].abs().max() == 0
            torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, tq))
    # layer order: the first encoder map is the first layer's, recomputed by hand
    layer = model.encoder.layers[0]
    with torch.no_grad():
        x = model.src_embed(src)
        x = layer.norm1(x) if norm_first else x
        q, k, _ = layer.self_attn.split(layer.self_attn.qkv_proj(x), 3)
        first = attention_probs(q, k, attention_mask(src_real))
    torch.testing.assert_close(maps["encoder_self"][0], first)
    assert not torch.allclose(maps["encoder_self"][1], first)
    # the maps do not leave state behind: forward still takes the fused path and agrees
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), logits)


def test_capture_attention_restores_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = []

    def counting_sdpa(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_sdpa)
    model = tiny_model()  # 2 + 2 layers: 6 attention calls per forward
    modules = [m for m in model.modules() if isinstance(m, _Heads)]
    assert len(modules) == 6
    src, tgt = random_tokens(2, 6, 23, seed=1), random_tokens(2, 5, 23, seed=2)

    def forward_calls() -> int:
        calls.clear()
        with torch.no_grad():
            model(src, tgt)
        return len(calls)

    assert forward_calls() == 6
    with capture_attention(model) as maps:
        assert all(m.record is not None for m in modules)
        assert forward_calls() == 0  # explicit path everywhere
        assert [len(v) for v in maps.values()] == [2, 2, 2]
    assert all(m.record is None for m in modules)
    assert forward_calls() == 6
    assert [len(v) for v in maps.values()] == [2, 2, 2]  # nothing recorded after the block

    with pytest.raises(RuntimeError, match="inside the block"), capture_attention(model) as maps:
        assert forward_calls() == 0
        raise RuntimeError("inside the block")
    assert all(m.record is None for m in modules)
    assert forward_calls() == 6
    assert [len(v) for v in maps.values()] == [2, 2, 2]


@pytest.mark.parametrize("d_model", [16, 15])
def test_sinusoidal_encoding_formula(d_model: int) -> None:
    pe = SinusoidalPositionalEncoding(50, d_model)(10, offset=3)
    assert pe.shape == (10, d_model)
    for pos in (3, 7, 12):
        for i in range(d_model):
            angle = pos / 10000 ** (2 * (i // 2) / d_model)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert pe[pos - 3, i].item() == pytest.approx(expected, abs=1e-6)


def test_odd_d_model_model_runs() -> None:
    model = tiny_model(d_model=15, num_heads=3)
    logits = model(random_tokens(2, 4, 23), random_tokens(2, 3, 23))
    assert logits.shape == (2, 3, 23) and torch.isfinite(logits).all()


def test_embedding_scale_and_init() -> None:
    model = tiny_model(d_model=64, num_heads=4, src_vocab_size=4000, tgt_vocab_size=4000)
    weight = model.src_embed.token.weight
    assert weight.std().item() == pytest.approx(64**-0.5, rel=0.05)
    tokens = torch.tensor([[7, 9]])
    torch.testing.assert_close(model.src_embed.token(tokens), weight[tokens] * 8.0)
    hidden = torch.nn.functional.layer_norm(torch.randn(4096, 64), (64,))
    assert model.output(hidden).std().item() == pytest.approx(1.0, rel=0.1)  # unit-scale logits
    w = model.encoder.layers[0].ff.linear1.weight
    bound = math.sqrt(6 / (64 + w.size(0)))
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound  # Xavier-uniform
    assert model.encoder.layers[0].ff.linear1.bias.abs().max() == 0


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_embedding_init_std_sets_the_shared_matrix_and_nothing_else(arch: str) -> None:
    """`embedding_init_std` draws the token embeddings, and so the output layer tied to them,
    at that std (Sockeye's Xavier scale here); every other weight is drawn as by default, and
    the embedding is still scaled by sqrt(d_model) in the forward pass."""
    from aiayn.model.build import build_model

    sizes = {"d_model": 64, "num_heads": 4, "src_vocab_size": 4000, "tgt_vocab_size": 4000}
    models = []
    for std in (None, 0.016):
        torch.manual_seed(0)
        models.append(build_model(tiny_config(arch=arch, embedding_init_std=std, **sizes)))
    default, model = models
    embed = model.src_embed.token if arch == "transformer" else model.src_embed
    assert embed.weight.std().item() == pytest.approx(0.016, rel=0.05)
    assert model.output.weight is embed.weight
    tokens = torch.tensor([[7, 9]])
    torch.testing.assert_close(embed(tokens), embed.weight[tokens] * 8.0)
    defaults = dict(default.named_parameters())
    others = [(n, p) for n, p in model.named_parameters() if p is not embed.weight]
    assert len(others) == len(defaults) - 1
    for name, p in others:
        torch.testing.assert_close(p, defaults[name])


@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "float"])
def test_bf16_training_attends_in_float32_on_the_cpu(mask_kind: str) -> None:
    """Under bf16 autocast with gradients, `sdpa` gives the float32 attention of the bf16
    inputs (and its gradients), rounded once to bf16; without gradients it is torch's bf16
    kernel, as before."""
    from aiayn.model.attention import sdpa

    torch.manual_seed(0)
    B, H, T, Dh = 3, 2, 5, 8
    q, k, v = (torch.randn(B, H, T, Dh).bfloat16().requires_grad_() for _ in range(3))
    keys = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] * 4 + [False]])
    mask = {
        "none": None,
        "causal": None,
        "bool": keys[:, None, None, :],
        "float": torch.zeros(B, 1, 1, T).masked_fill(~keys[:, None, None, :], -1e4).bfloat16(),
    }[mask_kind]
    causal = mask_kind == "causal"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = sdpa(q, k, v, mask, 0.0, causal)
    assert y.dtype == torch.bfloat16
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    mask32 = mask.float() if mask is not None and mask.dtype != torch.bool else mask
    ref = torch.nn.functional.scaled_dot_product_attention(
        q32, k32, v32, attn_mask=mask32, is_causal=causal
    )
    assert torch.equal(y, ref.bfloat16())
    grad = torch.randn_like(ref)
    y.backward(grad.bfloat16())
    ref.backward(grad.bfloat16().float())
    for ours, theirs in zip((q, k, v), (q32, k32, v32), strict=True):
        assert ours.grad is not None and theirs.grad is not None
        assert torch.equal(ours.grad, theirs.grad.bfloat16())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal
        )
        assert torch.equal(sdpa(q, k, v, mask, 0.0, causal), plain)
