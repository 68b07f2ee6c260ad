"""Parity with the seed notebooks' systems (conf/model/seed000/003/004.yaml): their own
code from ../shared/seeds/, their weights copied into aiayn, the same outputs in eval mode with
non-trivial LayerNorm parameters; and their bugs, which aiayn does not share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_helpers import random_tokens
from omegaconf import OmegaConf
from seeds import copy_attention, copy_linear, linears, randomize_norms, seed_classes

from aiayn.model import ModelConfig, Transformer

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"


def preset(name: str, **overrides) -> ModelConfig:
    """conf/model/<name>.yaml on top of ModelConfig's defaults, with `overrides`."""
    values = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))
    return ModelConfig(**{**values, **overrides})


def _copy_layers(encoder, decoder, encoder_layers, decoder_layers, ff_names) -> None:
    """A seed's layers into aiayn's `encoder`/`decoder` stacks: attention (self, and cross as
    `cross_attn` or `multihead_attn`), the FFN's two Linears (on a `feed_forward` or
    `pos_feed_forward` module, or on the layer itself) and the norms."""
    first, second = ff_names
    pairs = [(dst, src, 2) for dst, src in zip(encoder.layers, encoder_layers, strict=True)]
    pairs += [(dst, src, 3) for dst, src in zip(decoder.layers, decoder_layers, strict=True)]
    for dst, src, norms in pairs:
        copy_attention(dst.self_attn, *linears(src.self_attn))
        if norms == 3:
            cross = getattr(src, "cross_attn", None) or src.multihead_attn
            copy_attention(dst.cross_attn, *linears(cross))
        ff = getattr(src, "feed_forward", None) or getattr(src, "pos_feed_forward", None) or src
        copy_linear(dst.ff.linear1, getattr(ff, first).weight, getattr(ff, first).bias)
        copy_linear(dst.ff.linear2, getattr(ff, second).weight, getattr(ff, second).bias)
        for i in range(1, norms + 1):
            getattr(dst, f"norm{i}").load_state_dict(getattr(src, f"norm{i}").state_dict())


SMALL = {"d_model": 16, "num_heads": 4, "d_ff": 24, "num_encoder_layers": 2}
SMALL |= {"num_decoder_layers": 3, "src_vocab_size": 23, "tgt_vocab_size": 19}


def test_seed003_matches_its_notebook():
    """Seed 003's Transformer (pad-id masks, separate q/k/v/o Linears, sinusoidal PE, scaled
    untied embeddings, a biased output layer), padded sources, in eval mode."""
    seed = seed_classes("003")
    torch.manual_seed(0)
    ref = seed["Transformer"](
        23,
        19,
        d_model=16,
        num_heads=4,
        d_ff=24,
        num_encoder_layers=2,
        num_decoder_layers=3,
        dropout=0.1,
    ).eval()
    randomize_norms(ref)
    config = preset("seed003", **SMALL)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.src_embed.token.weight.copy_(ref.encoder_embedding.weight)
        model.tgt_embed.token.weight.copy_(ref.decoder_embedding.weight)
        copy_linear(model.output, ref.fc_out.weight, ref.fc_out.bias)
        layers = (ref.encoder_layers, ref.decoder_layers)
        _copy_layers(model.encoder, model.decoder, *layers, ("linear1", "linear2"))
    src = random_tokens(3, 9, 23, seed=4)
    src[1, 6:] = 0  # padded sources (pad id 0, as the notebook's masks assume)
    tgt = random_tokens(3, 7, 19, seed=5)  # unpadded targets: see the NaN bug below
    with torch.no_grad():
        expected, ours = ref(src, tgt), model(src, tgt)
    assert (expected - ours).abs().max().item() <= 1e-5


def test_seed003_bug_padded_targets_give_nan_and_aiayn_does_not():
    seed = seed_classes("003")
    torch.manual_seed(0)
    ref = seed["Transformer"](
        23, 19, d_model=16, num_heads=4, d_ff=24, num_encoder_layers=1, num_decoder_layers=2
    ).eval()
    src, tgt = random_tokens(2, 6, 23, seed=4), random_tokens(2, 5, 19, seed=5)
    tgt[0, 3:] = 0
    with torch.no_grad():
        assert torch.isnan(ref(src, tgt)).any()  # the notebook's masks: NaN rows spread
        ours = Transformer(preset("seed003", **SMALL)).eval()(src, tgt)
    assert torch.isfinite(ours).all()


def test_seed004_matches_its_notebook_where_its_missing_causal_mask_does_not_matter():
    """Seed 004 (nn.MultiheadAttention blocks, unscaled embeddings, no dropout, no masks, a
    biased output), unpadded batches: equal outputs for a one-token target (the first
    decoding step, where there is no future to see); its decoder sees future tokens (a bug
    aiayn does not reproduce), so longer targets differ, and only the seed's earlier outputs
    change with the last target token."""
    seed = seed_classes("004")
    torch.manual_seed(0)
    ref = seed["VanillaTransformer"](
        input_size=23, output_size=23, context_size=12, d_model=12, n_head=3, d_ff=48, n_block=2
    ).eval()
    randomize_norms(ref)
    config = preset(
        "seed004",
        d_model=12,
        num_heads=3,
        d_ff=48,
        num_encoder_layers=2,
        num_decoder_layers=2,
        src_vocab_size=23,
        tgt_vocab_size=23,
        max_positions=12,
    )
    model = Transformer(config).eval()
    with torch.no_grad():
        model.src_embed.token.weight.copy_(ref.encoder.embedding.weight)
        model.tgt_embed.token.weight.copy_(ref.decoder.embedding.weight)
        copy_linear(model.output, ref.decoder.out.weight, ref.decoder.out.bias)
        layers = (ref.encoder.blocks, ref.decoder.blocks)
        _copy_layers(model.encoder, model.decoder, *layers, ("W1", "W2"))
    src, tgt = random_tokens(3, 9, 23, seed=4), random_tokens(3, 7, 23, seed=5)
    with torch.no_grad():
        first = ref(src, tgt[:, :1]), model(src, tgt[:, :1])
        expected, ours = ref(src, tgt), model(src, tgt)
    assert (first[0] - first[1]).abs().max().item() <= 1e-5  # nothing to leak: equal
    assert (expected - ours).abs().max().item() > 1e-3  # longer targets: its decoder leaks
    changed = tgt.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 23
    with torch.no_grad():  # aiayn: earlier positions do not see the last token
        assert torch.equal(model(src, changed)[:, :-1], ours[:, :-1])
        assert not torch.allclose(ref(src, changed)[:, :-1], expected[:, :-1])


@pytest.mark.parametrize("name", ["seed003", "seed004"])
def test_seed_presets_build_and_differ_from_the_paper_only_where_they_say(name):
    config = preset(name)
    assert config.output_bias and config.share_embeddings == "none"
    assert config.scale_embeddings == (name == "seed003")


def test_seed000_preset_is_torch_s_stacks_with_learned_positions():
    config, torch_default = preset("seed000"), preset("torch_default")
    assert config.positional == "learned" and torch_default.positional == "sinusoidal"
    assert config.has_final_norm and config.activation_dropout == config.attention_dropout == 0.1


def test_seed000_stacks_match_its_notebook():
    """Seed 000's nn.Transformer-style model (its own layers, bool masks with True = masked,
    final norms) against model=seed000's encoder and decoder stacks, with a causal target
    mask and padded sources and targets, in eval mode."""
    from aiayn.model.masks import attention_mask
    from aiayn.model.transformer import Decoder, Encoder

    seed = seed_classes("000")
    torch.manual_seed(0)
    ref = seed["Transformer"](
        d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=3, dim_feedforward=24
    ).eval()
    randomize_norms(ref)
    config = preset("seed000", **(SMALL | {"tgt_vocab_size": 23}))
    encoder, decoder = Encoder(config).eval(), Decoder(config).eval()
    with torch.no_grad():
        layers = (ref.encoder.layers, ref.decoder.layers)
        _copy_layers(encoder, decoder, *layers, ("linear1", "linear2"))
        encoder.norm.load_state_dict(ref.encoder.norm.state_dict())
        decoder.norm.load_state_dict(ref.decoder.norm.state_dict())
    g = torch.Generator().manual_seed(3)
    src, tgt = torch.randn(3, 7, 16, generator=g), torch.randn(3, 5, 16, generator=g)
    src_pad = torch.zeros(3, 7, dtype=torch.bool)
    src_pad[1, 5:] = True
    tgt_pad = torch.zeros(3, 5, dtype=torch.bool)
    tgt_pad[2, 4:] = True
    future = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)  # True = masked
    with torch.no_grad():
        expected = ref(
            src,
            tgt,
            tgt_mask=future,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        memory = encoder(src, mask=attention_mask(~src_pad))
        ours = decoder(
            tgt,
            memory=memory,
            self_mask=attention_mask(~tgt_pad, ~future),
            memory_mask=attention_mask(~src_pad),
        )
    assert (expected - ours).abs().max().item() <= 1e-5


def test_seed002_embedding_and_attention_match_its_notebook():
    """Seed 002's EmbeddingWithProjection (biased projection, sqrt(d_model) after it, PE,
    LayerNorm, dropout) and TransformerAttention against model=seed002's, in eval mode."""
    from aiayn.model.attention import MultiHeadCrossAttention, MultiHeadSelfAttention

    seed = seed_classes("002")
    torch.manual_seed(0)
    ref = seed["EmbeddingWithProjection"](vocab_size=23, d_embed=8, d_model=16).eval()
    randomize_norms(ref)
    model = Transformer(preset("seed002", **SMALL, d_embed=8)).eval()
    embed = model.src_embed
    with torch.no_grad():
        embed.token.weight.copy_(ref.embedding.weight)
        copy_linear(embed.token.proj, ref.embd_proj.weight, ref.embd_proj.bias)
        embed.norm.load_state_dict(ref.layernorm.state_dict())
    tokens = random_tokens(3, 9, 23, seed=4)
    with torch.no_grad():
        assert (ref(tokens) - embed(tokens)).abs().max().item() <= 1e-5
    assert embed.token.proj.bias is not None and model.output.proj is None  # direct output

    attention = seed["TransformerAttention"](16, 4, dropout=0.1, bias=True).eval()
    g = torch.Generator().manual_seed(6)
    x, memory = torch.randn(3, 5, 16, generator=g), torch.randn(3, 7, 16, generator=g)
    mask = torch.zeros(3, 1, 1, 7)  # additive, as the notebook takes it
    mask[1, :, :, 5:] = float("-inf")
    q, k, v, out = linears_002(attention)
    ours_self = MultiHeadSelfAttention(16, 4).eval()
    ours_cross = MultiHeadCrossAttention(16, 4).eval()
    with torch.no_grad():
        copy_attention(ours_self, q, k, v, out)
        copy_attention(ours_cross, q, k, v, out)
        torch.testing.assert_close(ours_self(x), attention(x), rtol=1e-5, atol=1e-5)
        expected = attention(x, encoder_output=memory, att_mask=mask)
        got = ours_cross(x, memory=memory, mask=mask.isfinite())
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def linears_002(attention):
    parts = [getattr(attention, f"{n}_proj") for n in "qkv"]
    q, k, v = ((p.weight, p.bias) for p in parts)
    return q, k, v, attention.output_proj


def test_seed002_bug_its_full_model_does_not_run_and_aiayn_s_does():
    seed = seed_classes("002")
    with pytest.raises(TypeError):
        seed["Transformer"](
            num_layer=2,
            d_model=16,
            d_embed=8,
            d_ff=24,
            num_head=4,
            src_vocab_size=23,
            tgt_vocab_size=19,
        )
    model = Transformer(preset("seed002", **SMALL, d_embed=8)).eval()
    src, tgt = random_tokens(2, 6, 23, seed=4), random_tokens(2, 5, 19, seed=5)
    with torch.no_grad():
        assert torch.isfinite(model(src, tgt)).all()


# seed 001 does not run as written: its typos fixed, and its one modelling bug (V projected
# with Q's matrix), which aiayn does not reproduce
SEED001_TYPOS = {
    "self.embed_dim / self.embed_dimn_heads": "self.embed_dim / self.n_heads",
    "torch.matmut(": "torch.matmul(",
    ".continguous()": ".contiguous()",
    "nn.LayerNorm(emdeb_dim)": "nn.LayerNorm(embed_dim)",
    "expansion_factor*embed_dim)\n": "expansion_factor*embed_dim),\n",  # missing commas
    "nn.ReLU()\n": "nn.ReLU(),\n",
    "        self.layers = ": "        self.layers = None  # the notebook ends mid-line here",
}
SEED001_V_BUG = {"v = self.query_matrix(value)": "v = self.value_matrix(value)"}


class Scale(torch.nn.Module):
    """A deterministic stand-in for dropout (x 1.7), so that where it sits shows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1.7 * x


def _seed001_block_and_layer(fixes: dict[str, str]):
    """The notebook's EncoderBlock and model=seed001's EncoderLayer with its weights."""
    from aiayn.model.layers import EncoderLayer

    seed = seed_classes("001", fixes)
    torch.manual_seed(0)
    ref = seed["EncoderBlock"](embed_dim=16, n_heads=4, expansion_factor=4)
    randomize_norms(ref)
    with torch.no_grad():  # biases away from zero, so that a dropped one shows
        for name, p in ref.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.3, 0.3)
    layer = EncoderLayer(preset("seed001", d_model=16, num_heads=4, d_ff=64))
    attention = ref.attention
    with torch.no_grad():
        for i, kind in enumerate(("query", "key", "value")):
            layer.self_attn.qkv_proj.weight[i].copy_(getattr(attention, f"{kind}_matrix").weight)
        copy_linear(layer.self_attn.out_proj, attention.out.weight, attention.out.bias)
        ff = ref.feed_forward
        copy_linear(layer.ff.linear1, ff[0].weight, ff[0].bias)
        copy_linear(layer.ff.linear2, ff[2].weight, ff[2].bias)
        layer.norm1.load_state_dict(ref.norm1.state_dict())
        layer.norm2.load_state_dict(ref.norm2.state_dict())
    return ref, layer


def test_seed001_block_matches_its_notebook_in_eval_and_in_its_dropout_placement():
    """Per-head shared bias-free Q/K/V matrices, a biased output Linear, post-norm blocks:
    equal in eval mode; with dropout replaced by a fixed scaling, equal in train mode too
    (dropout after the LayerNorm), and unequal with the paper's placement."""
    ref, layer = _seed001_block_and_layer(SEED001_TYPOS | SEED001_V_BUG)
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1))
    ref.eval(), layer.eval()
    with torch.no_grad():
        assert (ref(x, x, x) - layer(x)).abs().max().item() <= 1e-5
        ref.dropout1, ref.dropout2, layer.dropout = Scale(), Scale(), Scale()
        assert (ref(x, x, x) - layer(x)).abs().max().item() <= 1e-5
        layer.placement = (False, False)  # the paper's: dropout before the residual sum
        assert (ref(x, x, x) - layer(x)).abs().max().item() > 1e-2


def test_seed001_bug_v_uses_q_s_matrix_and_aiayn_does_not():
    ref, layer = _seed001_block_and_layer(SEED001_TYPOS)  # V through Q's matrix, as written
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1))
    ref.eval(), layer.eval()
    with torch.no_grad():
        assert (ref(x, x, x) - layer(x)).abs().max().item() > 1e-2
        layer.self_attn.qkv_proj.weight[2].copy_(layer.self_attn.qkv_proj.weight[0])
        assert (ref(x, x, x) - layer(x)).abs().max().item() <= 1e-5  # only if V copies Q


def test_seed001_preset_sets_its_intent():
    config = preset("seed001")
    assert config.shared_head_qkv and config.dropout_after_norm and not config.norm_first
    assert (config.dropout, config.embedding_dropout) == (0.2, 0.0)
    assert config.d_ff == 4 * config.d_model
