"""The LSTM baseline (`arch='rnn'`) against a step-by-step reference, and the invariants every
model keeps: no future leakage, padding invariance, cached = full decoding, the closed-form
parameter count, finite bf16, decoding and ensembles."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from model_helpers import PAD, random_tokens, tiny_config
from torch import Tensor, nn

from aiayn.model import (
    AttentionLSTM,
    DecodeConfig,
    ModelConfig,
    build_model,
    generate,
    parameter_summary,
)
from aiayn.model.ensemble import Ensemble

VARIANTS = [
    {},
    {"num_encoder_layers": 1, "num_decoder_layers": 3, "share_embeddings": "none"},
    {"share_embeddings": "decoder", "output_bias": True, "scale_embeddings": False},
    {"d_embed": 8, "embedding_proj_bias": True},
]
VARIANT_IDS = ["shared", "1-3-layers-untied", "decoder-tied-bias", "factorized"]


def rnn_model(seed: int = 0, **overrides: Any) -> AttentionLSTM:
    torch.manual_seed(seed)
    model = build_model(tiny_config(arch="rnn", **overrides))
    assert isinstance(model, AttentionLSTM)
    with torch.no_grad():  # non-zero biases everywhere, so that a dropped bias shows
        for name, p in model.named_parameters():
            if "bias" in name:
                p.uniform_(-0.3, 0.3)
    return model.eval()


def reference_logits(model: AttentionLSTM, src: Tensor, tgt_in: Tensor) -> Tensor:
    """The model's equations one sentence and one time step at a time, with LSTM cells that
    hold copies of its weights: no packing, no batching, no fused sequence kernels."""
    cfg, d = model.config, model.config.d_model

    def cells(lstm: nn.LSTM, suffix: str, hidden: int, layers: int) -> list[nn.LSTMCell]:
        out = []
        for layer in range(layers):
            cell = nn.LSTMCell(d, hidden)
            for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(cell, kind).data.copy_(getattr(lstm, f"{kind}_l{layer}{suffix}"))
            out.append(cell)
        return out

    enc_layers, dec_layers = cfg.num_encoder_layers, cfg.num_decoder_layers
    forward = cells(model.encoder, "", d // 2, enc_layers)
    backward = cells(model.encoder, "_reverse", d // 2, enc_layers)
    decoder = cells(model.decoder, "", d, dec_layers)
    rows = []
    for b in range(src.size(0)):
        n = int((src[b] != PAD).sum())
        x = list(model.src_embed(src[b : b + 1, :n])[0])
        for layer in range(enc_layers):  # each layer reads both directions of the one below

            def run(cell: nn.LSTMCell, inputs: list[Tensor]) -> list[Tensor]:
                h, c, outs = torch.zeros(1, d // 2), torch.zeros(1, d // 2), []
                for v in inputs:
                    h, c = cell(v[None], (h, c))
                    outs.append(h[0])
                return outs

            fwd = run(forward[layer], x)
            bwd = run(backward[layer], x[::-1])[::-1]
            x = [torch.cat([f, r]) for f, r in zip(fwd, bwd, strict=True)]
        memory = torch.stack(x)  # (n, d)
        init = torch.tanh(model.bridge(memory.mean(0))).view(dec_layers, d)
        state = [(init[i][None], torch.zeros(1, d)) for i in range(dec_layers)]
        logits = []
        for token in tgt_in[b]:
            v = model.tgt_embed(token.view(1, 1))[0]  # (1, d)
            for i, cell in enumerate(decoder):
                state[i] = cell(v, state[i])
                v = state[i][0]
            weights = (model.attn_key(memory) @ v[0]).softmax(0)
            context = weights @ memory
            attentional = torch.tanh(model.attn_out(torch.cat([context, v[0]])))
            logits.append(model.output(attentional[None])[0])
        rows.append(torch.stack(logits))
    return torch.stack(rows)


@pytest.mark.parametrize("overrides", VARIANTS, ids=VARIANT_IDS)
def test_matches_a_step_by_step_reference(overrides: dict) -> None:
    model = rnn_model(**overrides)
    src = random_tokens(3, 7, 23, seed=1)
    src[1, 4:] = PAD
    src[2, 1:] = PAD  # a one-token source
    tgt = random_tokens(3, 5, 23, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(
            model(src, tgt), reference_logits(model, src, tgt), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("overrides", VARIANTS, ids=VARIANT_IDS)
def test_no_future_leakage(overrides: dict) -> None:
    model = rnn_model(**overrides)
    src, tgt = random_tokens(2, 6, 23, seed=3), random_tokens(2, 8, 23, seed=4)
    with torch.no_grad():
        base = model(src, tgt)
        for t in range(7):
            changed = tgt.clone()
            changed[:, t + 1 :] = random_tokens(2, 7 - t, 23, seed=10 + t)
            logits = model(src, changed)
            torch.testing.assert_close(logits[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=0)
            assert not torch.allclose(logits[:, t + 1 :], base[:, t + 1 :], atol=1e-3)


@pytest.mark.parametrize("overrides", VARIANTS, ids=VARIANT_IDS)
def test_padding_invariance(overrides: dict) -> None:
    model = rnn_model(**overrides)
    src, tgt = random_tokens(3, 9, 23, seed=5), random_tokens(3, 7, 23, seed=6)
    src[0, 5:] = PAD
    tgt[0, 4:] = PAD
    with torch.no_grad():
        batch = model(src, tgt)[0, :4]
        alone = model(src[:1, :5], tgt[:1, :4])[0]
        explicit = model(src, tgt, src_mask=src != PAD, tgt_mask=tgt != PAD)[0, :4]
        memory = model.encode(src)
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, alone, atol=1e-5, rtol=1e-5)
    assert torch.equal(memory[0, 5:], torch.zeros_like(memory[0, 5:]))  # packed: no state


def test_left_padding_is_refused_with_a_clear_message() -> None:
    model = rnn_model()
    src = random_tokens(2, 5, 23)
    src[0, 0] = PAD
    with pytest.raises(ValueError, match="right-padded sources"):
        model(src, random_tokens(2, 3, 23))


@pytest.mark.parametrize("overrides", VARIANTS, ids=VARIANT_IDS)
def test_cached_decoding_equals_full_pass(overrides: dict) -> None:
    model = rnn_model(**overrides)
    src = random_tokens(3, 6, 23, seed=7)
    src[2, 3:] = PAD
    tgt = random_tokens(3, 9, 23, seed=8)
    src_mask = src != PAD
    with torch.no_grad():
        full = model(src, tgt)
        memory = model.encode(src, src_mask)
        cache = model.init_cache(memory, src_mask)
        steps = [model.decode_step(tgt[:, t : t + 1], cache) for t in range(4)]
        steps.append(model.decode_step(tgt[:, 4:], cache))  # several tokens at once
        assert cache.length == 9
        index = torch.tensor([2, 0, 0, 1])  # then beam-style reordering
        cache.reorder(index)
        more = random_tokens(4, 2, 23, seed=9)
        reordered = model.decode_step(more, cache)
        expected = model(src[index], torch.cat([tgt[index], more], dim=1))[:, 9:]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reordered, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="batch size"):
        model.decode_step(tgt[:2, :1], cache)


def rnn_closed_form(cfg: ModelConfig) -> int:
    """LSTM layers 4H(in + H) + 8H (two bias vectors); the rest as the module docstring says."""
    d, e, h = cfg.d_model, cfg.d_embed, cfg.d_model // 2
    encoder = cfg.num_encoder_layers * 2 * (4 * h * (d + h) + 8 * h)  # in = d on every layer
    decoder = cfg.num_decoder_layers * (4 * d * (d + d) + 8 * d)
    bridge = d * cfg.num_decoder_layers * d + cfg.num_decoder_layers * d
    attention = d * d + 2 * d * d  # W_a, W_c
    width = e or d

    def token(vocab: int) -> int:
        return vocab * width + ((width * d + (d if cfg.embedding_proj_bias else 0)) if e else 0)

    embeddings = token(cfg.src_vocab_size)
    if cfg.share_embeddings != "all":
        embeddings += token(cfg.tgt_vocab_size)
    output = d * width if e and cfg.factorized_output else 0
    if cfg.share_embeddings == "none":
        output += cfg.tgt_vocab_size * (width if cfg.factorized_output else d)
    bias = cfg.tgt_vocab_size if cfg.output_bias else 0
    return encoder + decoder + bridge + attention + embeddings + output + bias


@pytest.mark.parametrize(
    "overrides", [*VARIANTS, {"tgt_vocab_size": 31, "share_embeddings": "none"}]
)
def test_parameter_count_closed_form(overrides: dict) -> None:
    cfg = tiny_config(arch="rnn", **overrides)
    assert parameter_summary(build_model(cfg))["total"] == rnn_closed_form(cfg)


def test_the_preset_matches_the_cpu_recipe_s_transformer_by_parameter_count() -> None:
    """conf/model/rnn.yaml (and ablation=rnn) at experiment=multi30k_cpu's 8k shared vocabulary
    against that recipe's Transformer: within 1%."""
    vocab = {"src_vocab_size": 8000, "tgt_vocab_size": 8000}
    rnn = ModelConfig(arch="rnn", d_model=372, num_encoder_layers=2, num_decoder_layers=2, **vocab)
    transformer = ModelConfig(
        d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=3, num_decoder_layers=3, **vocab
    )
    with torch.device("meta"):
        ours = parameter_summary(build_model(rnn))["total"]
        theirs = parameter_summary(build_model(transformer))["total"]
    assert ours == rnn_closed_form(rnn) == 7_555_320
    assert abs(ours - theirs) / theirs < 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finite_with_all_padding_rows_and_gradients(dtype: torch.dtype) -> None:
    model = rnn_model().to(dtype).train()
    src, tgt = random_tokens(3, 12, 23, seed=13), random_tokens(3, 10, 23, seed=14)
    src[1] = PAD  # an all-padding source row
    src[2, 4:] = PAD
    tgt[2] = PAD
    logits = model(src, tgt)
    assert logits.dtype == dtype and torch.isfinite(logits).all()
    logits.float().logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_bfloat16_close_to_float32() -> None:
    model = rnn_model()
    src, tgt = random_tokens(2, 12, 23, seed=15), random_tokens(2, 10, 23, seed=16)
    src[0, 8:] = PAD
    with torch.no_grad():
        full = model(src, tgt)
        half = model.to(torch.bfloat16)(src, tgt).float()
    assert (half - full).abs().max() < 0.1 * full.abs().max()


def test_attention_maps_are_the_decoder_s_distribution_over_real_source_tokens() -> None:
    model = rnn_model()
    src, tgt = random_tokens(2, 6, 23, seed=17), random_tokens(2, 4, 23, seed=18)
    src[1, 3:] = PAD
    with torch.no_grad():
        maps = model.attention_maps(src, tgt)
    assert maps["encoder_self"] == [] and maps["decoder_self"] == []
    (cross,) = maps["decoder_cross"]
    assert cross.shape == (2, 1, 4, 6)
    torch.testing.assert_close(cross.sum(-1), torch.ones(2, 1, 4))
    assert torch.equal(cross[1, :, :, 3:], torch.zeros(1, 4, 3))


def test_greedy_beam_sampling_and_ensembles_decode_the_lstm() -> None:
    """beam=1 is greedy; a beam hypothesis' score is its teacher-forced log-probability; an
    ensemble of an LSTM and a Transformer decodes."""
    model = rnn_model()
    src = random_tokens(3, 6, 23, seed=19)
    src[1, 2:] = PAD
    greedy = generate(model, src, DecodeConfig(max_len_b=6))
    beam1 = generate(model, src, DecodeConfig(strategy="beam", beam_size=1, max_len_b=6))
    assert [h[0].tokens for h in greedy] == [h[0].tokens for h in beam1]
    config = DecodeConfig(strategy="beam", beam_size=3, length_penalty=0.0, max_len_b=6)
    beam = generate(model, src, config)
    cfg = model.config
    for row, hyps in enumerate(beam):
        out = hyps[0].tokens
        ended = len(out) < int((src[row] != PAD).sum()) + 6  # by EOS, not the length limit
        target = torch.tensor([[cfg.bos_id, *out, *([cfg.eos_id] if ended else [])]])
        with torch.no_grad():
            logprobs = model(src[row : row + 1], target[:, :-1]).log_softmax(-1)
        expected = logprobs[0].gather(1, target[0, 1:, None]).sum()
        assert hyps[0].score == pytest.approx(float(expected), abs=1e-4)
    torch.manual_seed(1)
    transformer = build_model(tiny_config()).eval()
    mixed = Ensemble([model, transformer])  # its next-token distribution: the members' mean
    bos = torch.full((3, 1), cfg.bos_id)
    with torch.no_grad():
        cache = mixed.init_cache(mixed.encode(src, src != PAD), src != PAD)
        step = mixed.decode_step(bos, cache)[:, -1]
        probs = [m(src, bos)[:, -1].float().softmax(-1) for m in (model, transformer)]
    torch.testing.assert_close(step, torch.stack(probs).mean(0).log(), atol=1e-5, rtol=1e-5)
    alone = generate(Ensemble([model]), src, DecodeConfig(max_len_b=6))
    assert [h[0].tokens for h in alone] == [h[0].tokens for h in greedy]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"arch": "lstm"}, "arch='lstm' is unknown"),
        ({"arch": "rnn", "d_model": 15, "num_heads": 1}, "must be even"),
        ({"arch": "rnn", "norm_first": True}, "norm_first=True is a Transformer setting"),
        ({"arch": "rnn", "positional": "learned"}, "positional='learned' is a Transformer"),
        ({"arch": "rnn", "head_dim": 4}, "head_dim=4 is a Transformer setting"),
    ],
)
def test_config_refuses_what_the_lstm_does_not_have(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_rnn_width_need_not_divide_by_heads() -> None:
    assert tiny_config(arch="rnn", d_model=18, num_heads=4).d_model == 18
