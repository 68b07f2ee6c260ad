"""`aiayn.nn.Transformer`: torch.nn.Transformer's interface over aiayn's stacks, equal to
torch.nn.Transformer itself (its default final norms included) with copied weights, for
every kind of mask torch takes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aiayn import nn as aiayn_nn


def pair(norm_first: bool = False, batch_first: bool = False, activation: str = "relu", bias=True):
    torch.manual_seed(0)
    kwargs = dict(
        d_model=16,
        nhead=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=24,
        activation=activation,
        batch_first=batch_first,
        norm_first=norm_first,
        bias=bias,
    )
    ref = nn.Transformer(**kwargs).eval()
    ref.encoder.use_nested_tensor = False
    with torch.no_grad():  # trained-like norms and biases, so a misplaced or missing one shows
        for module in ref.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
        for name, parameter in ref.named_parameters():
            if "bias" in name:
                parameter.uniform_(-0.3, 0.3)
    ours = aiayn_nn.Transformer(**kwargs).copy_from(ref).eval()
    return ref, ours


def inputs(batch_first: bool):
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randn(3, 7, 16, generator=g), torch.randn(3, 5, 16, generator=g)
    return (src, tgt) if batch_first else (src.transpose(0, 1), tgt.transpose(0, 1))


def masks(kind: str):
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    src_pad = torch.zeros(3, 7, dtype=torch.bool)
    src_pad[1, 5:] = True
    tgt_pad = torch.zeros(3, 5, dtype=torch.bool)
    tgt_pad[2, 4:] = True
    if kind == "none":
        return {}
    if kind == "causal float":
        return {"tgt_mask": causal}
    if kind == "causal flag":
        return {"tgt_mask": causal, "tgt_is_causal": True}
    if kind == "bool and padding":
        return {
            "tgt_mask": causal.isinf(),
            "src_key_padding_mask": src_pad,
            "memory_key_padding_mask": src_pad,
            "tgt_key_padding_mask": tgt_pad,
        }
    g = torch.Generator().manual_seed(2)  # per-head float masks and a memory mask
    return {
        "src_mask": torch.randn(3 * 4, 7, 7, generator=g),
        "memory_mask": torch.randn(5, 7, generator=g),
        "tgt_mask": causal,
    }


@pytest.mark.parametrize(
    "kind", ["none", "causal float", "causal flag", "bool and padding", "per-head float"]
)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq-first", "batch-first"])
def test_equals_torch_nn_transformer(kind, norm_first, batch_first):
    ref, ours = pair(norm_first, batch_first)
    src, tgt = inputs(batch_first)
    # torch's inference fast path returns NaN for per-head float masks (batch-first,
    # post-norm); its regular path is the reference
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            expected, got = ref(src, tgt, **masks(kind)), ours(src, tgt, **masks(kind))
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    assert torch.isfinite(got).all()
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_bias_false_equals_torchs_and_has_no_bias_anywhere_in_the_stacks(norm_first):
    """`bias=False`, torch's switch for every Linear and LayerNorm of the stacks, the same in
    both: no parameter named bias in ours, as many parameters as torch's, equal outputs with
    copied weights."""
    ref, ours = pair(norm_first, batch_first=True, bias=False)
    assert not [n for n, _ in ours.named_parameters() if "bias" in n]
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    src, tgt = inputs(batch_first=True)
    with torch.no_grad():
        kwargs = masks("bool and padding")
        expected, got = ref(src, tgt, **kwargs), ours(src, tgt, **kwargs)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_is_causal_without_a_mask_builds_it():
    _, ours = pair()
    src, tgt = inputs(False)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    with torch.no_grad():
        torch.testing.assert_close(
            ours(src, tgt, tgt_is_causal=True), ours(src, tgt, tgt_mask=causal)
        )


def test_trains_like_torch_one_step():
    """Dropout off, one SGD step on both: the same weights after (gradients agree)."""
    torch.manual_seed(0)
    one_layer = dict(d_model=16, nhead=4, num_encoder_layers=1, num_decoder_layers=1)
    one_layer |= dict(dim_feedforward=24, dropout=0.0)
    ref = nn.Transformer(**one_layer)
    ours = aiayn_nn.Transformer(**one_layer)
    ours.copy_from(ref)
    src, tgt = inputs(False)
    for model in (ref, ours):
        model(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5)).pow(
            2
        ).mean().backward()
    torch.testing.assert_close(
        ours.encoder.layers[0].ff.linear1.weight.grad,
        ref.encoder.layers[0].linear1.weight.grad,
        rtol=1e-4,
        atol=1e-6,
    )


def test_unsupported_arguments_are_named():
    with pytest.raises(ValueError, match="custom_encoder"):
        aiayn_nn.Transformer(custom_encoder=nn.Identity())
    with pytest.raises(ValueError, match="layer_norm_eps=1e-06"):
        aiayn_nn.Transformer(layer_norm_eps=1e-6)
