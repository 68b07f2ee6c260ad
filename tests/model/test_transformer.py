"""The Transformer against nn.Transformer, causality, padding, the cache, gradients, NaNs."""

from __future__ import annotations

import pytest
import torch
from model_helpers import PAD, packed_if, random_tokens, tiny_model
from torch import Tensor, nn

from aiayn.model import Transformer

# post-norm (the paper), pre-norm, and torch.nn.Transformer's default (post-norm stacks with
# final norms and dropout on the FFN activation)
STACKS = [
    {"norm_first": False},
    {"norm_first": True},
    {"norm_first": False, "final_norm": True, "activation_dropout": 0.1},
    # the seed notebooks' heads and embeddings: unscaled, no embedding dropout, a biased
    # untied output layer
    {
        "scale_embeddings": False,
        "output_bias": True,
        "share_embeddings": "none",
        "embedding_dropout": 0.0,
    },
    # seed 002's factorized embedding: biased projection scaled after, a LayerNorm on the
    # embedding sum, a direct output layer
    {
        "d_embed": 8,
        "embedding_proj_bias": True,
        "embedding_scale_after_proj": True,
        "embedding_norm": True,
        "factorized_output": False,
        "share_embeddings": "none",
    },
    # seed 001's intent: per-head shared bias-free Q/K/V matrices, dropout after the norms
    {"shared_head_qkv": True, "dropout_after_norm": True, "embedding_dropout": 0.0},
    # no bias in any linear map or LayerNorm of the stacks (torch's and nanoGPT's bias=False)
    {"norm_first": True, "linear_bias": False, "norm_bias": False, "embedding_norm": True},
]
STACK_IDS = [
    "post-norm",
    "pre-norm",
    "torch-default",
    "seed-style",
    "seed002-style",
    "seed001-style",
    "no-bias",
]


def with_head_dims(head_dim: int) -> list:
    """Every stack with the default head width, and with ``head_dim`` where the stack allows
    one (per-head shared Q/K/V needs d_model / num_heads)."""
    cases = []
    for stack, name in zip(STACKS, STACK_IDS, strict=True):
        cases.append(pytest.param(stack, None, id=f"{name}-None"))
        if not stack.get("shared_head_qkv"):
            cases.append(pytest.param(stack, head_dim, id=f"{name}-{head_dim}"))
    return cases


def reference_from(model: Transformer) -> nn.Transformer:
    """An nn.Transformer holding the same weights as ``model``'s encoder/decoder stacks."""
    cfg = model.config
    ref = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.num_heads,
        num_encoder_layers=cfg.num_encoder_layers,
        num_decoder_layers=cfg.num_decoder_layers,
        dim_feedforward=cfg.d_ff,
        dropout=0.0,
        activation=cfg.activation,
        batch_first=True,
        norm_first=cfg.norm_first,
        bias=cfg.linear_bias,
    )
    assert cfg.norm_bias == cfg.linear_bias  # torch's one switch covers both
    ref.encoder.use_nested_tensor = False  # compare dense outputs (no nested-tensor fast path)

    def in_proj_bias(*projections: nn.Linear) -> Tensor | None:
        biases = [p.bias for p in projections]
        return None if biases[0] is None else torch.cat(biases)

    def copy_ff_norms(dst: nn.Module, src: nn.Module, norms: int) -> None:
        dst.linear1.load_state_dict(src.ff.linear1.state_dict())
        dst.linear2.load_state_dict(src.ff.linear2.state_dict())
        for i in range(1, norms + 1):
            getattr(dst, f"norm{i}").load_state_dict(getattr(src, f"norm{i}").state_dict())

    with torch.no_grad():

        def copy_self_attention(dst: nn.MultiheadAttention, src: nn.Module) -> None:
            dst.in_proj_weight.copy_(src.qkv_proj.weight)
            if dst.in_proj_bias is not None:
                dst.in_proj_bias.copy_(in_proj_bias(src.qkv_proj))
            dst.out_proj.load_state_dict(src.out_proj.state_dict())

        for dst, src in zip(ref.encoder.layers, model.encoder.layers, strict=True):
            copy_self_attention(dst.self_attn, src.self_attn)
            copy_ff_norms(dst, src, 2)
        for dst, src in zip(ref.decoder.layers, model.decoder.layers, strict=True):
            copy_self_attention(dst.self_attn, src.self_attn)
            cross = src.cross_attn
            q, kv = cross.q_proj, cross.kv_proj
            dst.multihead_attn.in_proj_weight.copy_(torch.cat([q.weight, kv.weight]))
            if dst.multihead_attn.in_proj_bias is not None:
                dst.multihead_attn.in_proj_bias.copy_(in_proj_bias(q, kv))
            dst.multihead_attn.out_proj.load_state_dict(cross.out_proj.state_dict())
            copy_ff_norms(dst, src, 3)
        if cfg.has_final_norm:
            ref.encoder.norm.load_state_dict(model.encoder.norm.state_dict())
            ref.decoder.norm.load_state_dict(model.decoder.norm.state_dict())
        else:  # nn.Transformer always adds final norms; the post-norm paper model has none
            ref.encoder.norm = nn.Identity()
            ref.decoder.norm = nn.Identity()
    return ref.eval()


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize(("norm_first", "final_norm"), [(False, None), (True, None), (False, True)])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False], ids=["biases", "bias=False"])
def test_matches_torch_transformer(norm_first: bool, final_norm, activation: str, bias) -> None:
    """(False, True): torch.nn.Transformer's default, post-norm stacks with final norms;
    ``bias=False``: no bias in the stacks' linear maps and norms on either side."""
    model = tiny_model(
        norm_first=norm_first,
        final_norm=final_norm,
        activation=activation,
        linear_bias=bias,
        norm_bias=bias,
    )
    with torch.no_grad():  # trained-like norms and biases, so a missing or misplaced one shows
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
            if isinstance(module, (nn.LayerNorm, nn.Linear)) and module.bias is not None:
                module.bias.uniform_(-0.5, 0.5)
    ref = reference_from(model)
    src = random_tokens(3, 7, 23, seed=1)
    tgt = random_tokens(3, 5, 23, seed=2)
    src[1, 5:] = PAD  # padding in both, compared at the real positions
    tgt[2, 3:] = PAD
    with torch.no_grad():
        logits = model(src, tgt)
        causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # torch: True = masked
        hidden = ref(
            model.src_embed(src),
            model.tgt_embed(tgt),
            tgt_mask=causal,
            src_key_padding_mask=src == PAD,
            tgt_key_padding_mask=tgt == PAD,
            memory_key_padding_mask=src == PAD,
            tgt_is_causal=True,
        )
        expected = model.output(hidden)
    real = tgt != PAD
    torch.testing.assert_close(logits[real], expected[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("stack", "head_dim"), with_head_dims(2))  # width 8 != d_model 16
def test_no_future_leakage(stack: dict, head_dim: int | None) -> None:
    model = tiny_model(**stack, head_dim=head_dim)
    src = random_tokens(2, 6, 23, seed=3)
    tgt = random_tokens(2, 8, 23, seed=4)
    with torch.no_grad():
        base = model(src, tgt)
        for t in range(7):
            changed = tgt.clone()
            changed[:, t + 1 :] = random_tokens(2, 7 - t, 23, seed=10 + t)
            assert not torch.equal(changed, tgt)
            logits = model(src, changed)
            torch.testing.assert_close(logits[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=0)
            assert not torch.allclose(logits[:, t + 1 :], base[:, t + 1 :], atol=1e-3)


@pytest.mark.parametrize(("stack", "head_dim"), with_head_dims(2))
def test_padding_invariance(stack: dict, head_dim: int | None) -> None:
    model = tiny_model(**stack, head_dim=head_dim)
    src = random_tokens(3, 9, 23, seed=5)
    tgt = random_tokens(3, 7, 23, seed=6)
    src_len, tgt_len = 5, 4
    src[0, src_len:] = PAD
    tgt[0, tgt_len:] = PAD
    with torch.no_grad():
        batch = model(src, tgt)[0, :tgt_len]
        alone = model(src[:1, :src_len], tgt[:1, :tgt_len])[0]
        explicit = model(src, tgt, src_mask=src != PAD, tgt_mask=tgt != PAD)[0, :tgt_len]
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, alone, atol=1e-5, rtol=1e-5)


def test_a_none_target_mask_is_derived_from_pad_id_unless_right_padding_is_promised() -> None:
    """Left-padded targets without a mask are masked as `tgt_mask=tgt != PAD` would mask them
    (a real token never attends to padding); `tgt_right_padded=True`, which the training path
    passes, takes no target mask and matches for right-padded targets."""
    model = tiny_model()
    src = random_tokens(2, 6, 23, seed=3)
    left = random_tokens(2, 7, 23, seed=4)
    left[0, :3] = PAD
    right = random_tokens(2, 7, 23, seed=4)
    right[0, 4:] = PAD
    with torch.no_grad():
        derived = model(src, left)[0, 3:]
        explicit = model(src, left, tgt_mask=left != PAD)[0, 3:]
        unmasked = model(src, left, tgt_right_padded=True)[0, 3:]
        memory = model.encode(src)
        decoded = model.decode(left, memory, None)[0, 3:]
        fast = model(src, right, tgt_right_padded=True)[0, :4]
        masked = model(src, right)[0, :4]
    torch.testing.assert_close(derived, explicit, atol=1e-6, rtol=0)
    torch.testing.assert_close(decoded, explicit, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unmasked, explicit, atol=1e-3)  # the promise broken: differs
    torch.testing.assert_close(fast, masked, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("stack", "head_dim"), with_head_dims(6))  # width 24 > d_model 16
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("packed", [False, True], ids=["weights", "packed weights"])
def test_cached_decoding_equals_full_pass(
    stack: dict, positional: str, head_dim: int | None, packed: bool
) -> None:
    """The decoding steps on the cache (on MKL-packed weights too, as evaluate.py decodes)
    give the logits of the full pass (on the weights themselves)."""
    model = tiny_model(**stack, positional=positional, head_dim=head_dim)
    src = random_tokens(3, 6, 23, seed=7)
    src[2, 3:] = PAD
    tgt = random_tokens(3, 9, 23, seed=8)
    src_mask = src != PAD
    with torch.no_grad():
        full = model(src, tgt)
    with torch.no_grad(), packed_if(model, packed):
        memory = model.encode(src, src_mask)
        cache = model.init_cache(memory, src_mask)
        assert cache.length == 0
        steps = [model.decode_step(tgt[:, t : t + 1], cache) for t in range(4)]
        assert cache.length == 4
        steps.append(model.decode_step(tgt[:, 4:], cache))  # several tokens at once
        assert cache.length == 9
        teacher_forced = model.decode(tgt, memory, src_mask)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(teacher_forced, full, atol=1e-5, rtol=1e-5)


def test_cache_reorder_selects_batch_rows() -> None:
    """Reordered rows decode on as those rows would, also once the buffers outgrow the
    capacity they had when reordered (a reorder copies only the filled positions)."""
    model = tiny_model()
    src = random_tokens(3, 6, 23, seed=9)
    src[1, 4:] = PAD
    tgt = random_tokens(3, 20, 23, seed=10)
    index = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        expected = model(src[index], tgt[index])
        memory = model.encode(src)
        cache = model.init_cache(memory, src != PAD)
        first = model.decode_step(tgt[:, :2], cache)
        cache.reorder(index)
        rest = model.decode_step(tgt[index, 2:5], cache)
        capacity = cache.layers[0].k.size(2)
        steps = [model.decode_step(tgt[index, t : t + 1], cache) for t in range(5, 20)]
        assert cache.layers[0].k.size(2) > capacity  # grown after the reorder
    torch.testing.assert_close(first[index], expected[:, :2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest, expected[:, 2:5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(steps, 1), expected[:, 5:], atol=1e-5, rtol=1e-5)


def test_decode_step_rejects_a_wrong_batch_size() -> None:
    model = tiny_model()
    src = random_tokens(2, 4, 23)
    with torch.no_grad():
        cache = model.init_cache(model.encode(src), None)
        with pytest.raises(ValueError, match="batch size"):
            model.decode_step(src[:1, :1], cache)
    assert cache.length == 0


def test_decode_src_mask_none_means_no_source_padding() -> None:
    model = tiny_model()
    src = random_tokens(2, 6, 23, seed=17)
    tgt = random_tokens(2, 5, 23, seed=18)
    tgt[1, 3:] = PAD  # the target mask is still derived from pad_id
    with torch.no_grad():
        memory = model.encode(src)
        unmasked = model.decode(tgt, memory, None)
        all_real = model.decode(tgt, memory, torch.ones(2, 6, dtype=torch.bool))
        full = model(src, tgt)
        # with source padding, None is not derived: the padded keys stay visible
        padded = src.clone()
        padded[0, 4:] = PAD
        memory = model.encode(padded)
        masked = model.decode(tgt, memory, padded != PAD)
        not_derived = model.decode(tgt, memory, None)
        padded_full = model(padded, tgt)
        with pytest.raises(TypeError, match="src_mask"):
            model.decode(tgt, memory)  # type: ignore[call-arg]
    torch.testing.assert_close(unmasked, all_real, atol=0, rtol=0)
    torch.testing.assert_close(unmasked, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masked, padded_full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(not_derived[1], masked[1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(not_derived[0], masked[0], atol=1e-3)


@pytest.mark.parametrize(
    "overrides",
    [
        {"share_embeddings": "none"},
        {"share_embeddings": "decoder", "tgt_vocab_size": 19},
        {"share_embeddings": "all", "norm_first": True, "positional": "learned"},
        {"share_embeddings": "decoder", "d_embed": 8, "attention_dropout": 0.1, "dropout": 0.1},
        {"head_dim": 6, "num_heads": 3},
    ],
)
def test_every_parameter_gets_a_gradient(overrides: dict) -> None:
    model = tiny_model(**overrides).train()
    src = random_tokens(2, 6, 23, seed=11)
    tgt = random_tokens(2, 5, model.config.tgt_vocab_size, seed=12)
    model(src, tgt).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("norm_first", "max_positions", "positional"),
    [
        (False, 40, "sinusoidal"),
        (True, 40, "sinusoidal"),
        pytest.param(False, 1024, "sinusoidal", marks=pytest.mark.slow),  # ~3 s each
        pytest.param(True, 1024, "learned", marks=pytest.mark.slow),
    ],
)
def test_finite_up_to_max_positions_and_all_padding_rows(
    dtype: torch.dtype, norm_first: bool, max_positions: int, positional: str
) -> None:
    model = tiny_model(
        norm_first=norm_first, max_positions=max_positions, positional=positional
    ).to(dtype)
    n = model.config.max_positions
    src = random_tokens(3, n, 23, seed=13)
    tgt = random_tokens(3, n, 23, seed=14)
    src[1] = PAD  # an all-padding source row
    src[2, 10:] = PAD
    tgt[1, 1:] = PAD
    tgt[2] = PAD  # and an all-padding target row
    logits = model(src, tgt)
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all()
    with torch.no_grad():
        assert torch.isfinite(model.encode(src)).all()
        maps = model.attention_maps(src, tgt)  # the explicit path softmaxes itself
        assert all(torch.isfinite(m).all() for ms in maps.values() for m in ms)
    logits.float().logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert torch.isfinite(p.grad).all(), name
    with pytest.raises(ValueError, match="max_positions"):
        model(src, torch.cat([tgt, tgt[:, :1]], dim=1))


def test_bfloat16_close_to_float32() -> None:
    model = tiny_model()
    src = random_tokens(2, 12, 23, seed=15)
    tgt = random_tokens(2, 10, 23, seed=16)
    src[0, 8:] = PAD
    with torch.no_grad():
        full = model(src, tgt)
        half = model.to(torch.bfloat16)(src, tgt).float()
    assert (half - full).abs().max() < 0.1 * full.abs().max()


def test_activation_dropout_acts_inside_the_ffn_only_when_training() -> None:
    src, tgt = random_tokens(2, 6, 23, seed=3), random_tokens(2, 5, 23, seed=4)
    for rate, differs in ((0.0, False), (0.5, True)):
        model = tiny_model(activation_dropout=rate).train()  # tiny: block dropout 0
        assert model.encoder.layers[0].ff.dropout.p == rate
        first, second = model(src, tgt), model(src, tgt)
        assert (not torch.equal(first, second)) == differs
        model.eval()
        assert torch.equal(model(src, tgt), model(src, tgt))
