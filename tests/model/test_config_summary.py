"""ModelConfig validation, parameter counts (closed form) and the parameter summary."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
import torch
from model_helpers import tiny_config

from aiayn.model import (
    ModelConfig,
    Transformer,
    build_model,
    format_parameter_summary,
    parameter_summary,
)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 30, "num_heads": 4}, "num_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"attention_dropout": 1.5}, "attention_dropout"),
        ({"share_embeddings": "all", "src_vocab_size": 20}, "src_vocab_size"),
        ({"activation": "swish"}, "activation"),
        ({"positional": "rotary"}, "positional"),
        ({"share_embeddings": "encoder"}, "share_embeddings"),
        ({"d_model": 0}, "d_model"),
        ({"num_heads": -1}, "num_heads"),
        ({"num_encoder_layers": 0}, "num_encoder_layers"),
        ({"num_decoder_layers": 0}, "num_decoder_layers"),
        ({"d_ff": 0}, "d_ff"),
        ({"max_positions": 0}, "max_positions"),
        ({"src_vocab_size": 0, "share_embeddings": "none"}, "src_vocab_size"),
        ({"d_embed": 0}, "d_embed"),
        ({"pad_id": 99}, "pad_id"),
        ({"bos_id": 23}, "bos_id"),
        ({"eos_id": -1}, "eos_id"),
        ({"eos_id": 30, "tgt_vocab_size": 31, "share_embeddings": "none"}, "eos_id"),
        ({"bos_id": True}, "bos_id"),
        ({"bos_id": 0}, "bos_id"),
        ({"eos_id": 1}, "eos_id"),
        ({"pad_id": 2}, "pad_id"),
        ({"embedding_proj_bias": True}, "embedding_proj_bias"),
        ({"shared_head_qkv": True, "head_dim": 2}, "shared_head_qkv"),
        ({"dropout_after_norm": True, "norm_first": True}, "dropout_after_norm"),
        ({"arch": "rnn", "shared_head_qkv": True}, "shared_head_qkv"),
        ({"arch": "rnn", "linear_bias": False}, "linear_bias"),
        ({"arch": "rnn", "norm_bias": False}, "norm_bias"),
        ({"embedding_scale_after_proj": True}, "embedding_scale_after_proj"),
        ({"d_embed": 8, "factorized_output": False}, "factorized_output"),
        ({"embedding_dropout": 1.0}, "embedding_dropout"),
        ({"embedding_init_std": 0.0}, "embedding_init_std"),
        ({"embedding_init_std": True}, "embedding_init_std"),
    ],
)
def test_invalid_config_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        tiny_config(**overrides)


def test_special_ids_default_for_configs_saved_without_them() -> None:
    saved = asdict(tiny_config(pad_id=0))
    del saved["bos_id"], saved["eos_id"]  # hyper-parameters of an older checkpoint
    cfg = ModelConfig(**saved)
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (0, 1, 2)
    assert tiny_config(bos_id=5, eos_id=3).bos_id == 5


def closed_form(cfg: ModelConfig) -> int:
    d, f, e = cfg.d_model, cfg.d_ff, cfg.d_embed
    a = cfg.num_heads * cfg.head_dim if cfg.head_dim else d  # attention width
    linear_bias = 1 if cfg.linear_bias else 0
    attention = 4 * d * a + (3 * a + d) * linear_bias  # q, k, v: (a, d) + a; out: (d, a) + d
    if cfg.shared_head_qkv:  # q, k, v: one bias-free (d_k, d_k) matrix each; out as before
        attention = 3 * (d // cfg.num_heads) ** 2 + d * a + d * linear_bias
    ffn = 2 * d * f + (f + d) * linear_bias
    norm = 2 * d if cfg.norm_bias else d
    encoder = cfg.num_encoder_layers * (attention + ffn + 2 * norm)
    decoder = cfg.num_decoder_layers * (2 * attention + ffn + 3 * norm)
    finals = 2 * norm if cfg.has_final_norm else 0
    width = e or d

    def token(vocab: int) -> int:
        proj = (width * d + (d if cfg.embedding_proj_bias else 0)) if e else 0
        return vocab * width + proj

    if cfg.share_embeddings == "all":
        embeddings = token(cfg.src_vocab_size)
    else:
        embeddings = token(cfg.src_vocab_size) + token(cfg.tgt_vocab_size)
    positions = 2 * cfg.max_positions * d if cfg.positional == "learned" else 0
    out_width = width if cfg.factorized_output else d  # direct d_model -> V (seed 002)
    output = (d * width if e and cfg.factorized_output else 0) + (
        cfg.tgt_vocab_size * out_width if cfg.share_embeddings == "none" else 0
    )
    bias = cfg.tgt_vocab_size if cfg.output_bias else 0
    embedding_norms = 2 * norm if cfg.embedding_norm else 0  # one per side
    return encoder + decoder + finals + embeddings + positions + output + bias + embedding_norms


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"share_embeddings": "none", "tgt_vocab_size": 31},
        {"share_embeddings": "decoder", "tgt_vocab_size": 31},
        {"positional": "learned", "norm_first": True},
        {"d_embed": 8},
        {"d_embed": 8, "share_embeddings": "decoder", "tgt_vocab_size": 29},
        {"d_embed": 8, "share_embeddings": "none", "positional": "learned"},
        {"num_heads": 2, "d_ff": 64, "num_encoder_layers": 3, "num_decoder_layers": 1},
        {"head_dim": 4},
        {"head_dim": 12, "num_heads": 3, "share_embeddings": "none"},
        {"final_norm": True, "activation_dropout": 0.1},
        {"shared_head_qkv": True, "dropout_after_norm": True, "num_heads": 2},
        {"final_norm": False, "norm_first": True},
        {"output_bias": True, "scale_embeddings": False, "embedding_dropout": 0.0},
        {"output_bias": True, "share_embeddings": "none", "tgt_vocab_size": 31},
        {"embedding_norm": True, "share_embeddings": "decoder", "tgt_vocab_size": 29},
        {"linear_bias": False},
        {"norm_bias": False, "embedding_norm": True, "norm_first": True},
        {"linear_bias": False, "norm_bias": False, "shared_head_qkv": True},
        {
            "d_embed": 8,
            "embedding_proj_bias": True,
            "embedding_scale_after_proj": True,
            "factorized_output": False,
            "share_embeddings": "none",
        },
    ],
)
def test_parameter_count_closed_form(overrides: dict[str, Any]) -> None:
    cfg = tiny_config(**overrides)
    model = Transformer(cfg)
    summary = parameter_summary(model)
    assert summary["total"] == closed_form(cfg)
    assert summary["trainable"] == summary["total"]
    parts = {k: v for k, v in summary.items() if k not in ("total", "trainable")}
    assert set(parts) == {"src_embed", "tgt_embed", "encoder", "decoder", "output"}
    assert sum(parts.values()) == summary["total"]  # shared matrices counted once


def test_paper_base_size() -> None:
    with torch.device("meta"):  # no memory, no init cost
        model = Transformer(ModelConfig())  # base, shared 37k vocabulary
    total = parameter_summary(model)["total"]
    assert total == closed_form(ModelConfig())
    assert 60_000_000 <= total <= 66_000_000


def test_format_parameter_summary() -> None:
    model = Transformer(tiny_config(share_embeddings="decoder"))
    summary = parameter_summary(model)
    next(model.encoder.parameters()).requires_grad_(False)
    frozen = parameter_summary(model)
    assert frozen["trainable"] < frozen["total"] == summary["total"]
    text = format_parameter_summary(summary)
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["module", "params"]
    for name in ("src_embed", "encoder", "decoder", "output", "trainable", "total"):
        row = next(line for line in lines if line.startswith(name + " "))
        assert f"{summary[name]:,}" in row
    assert "100.0%" in next(line for line in lines if line.startswith("total "))


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"head_dim": 3},
        {"d_embed": 6, "share_embeddings": "none", "tgt_vocab_size": 19},
        {"arch": "rnn", "num_decoder_layers": 3},
        {"shared_head_qkv": True},
    ],
    ids=["plain", "head_dim", "factorized", "rnn", "shared-head-qkv"],
)
def test_forward_flops_equal_torchs_count_of_the_real_forward(overrides: dict[str, Any]) -> None:
    """The closed form against torch's FLOP counter on the real forward pass (matmuls and
    attention, which the math backend runs as counted matmuls; elementwise work is left out
    of both)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from aiayn.model.summary import forward_flops

    config = tiny_config(**overrides)
    model = build_model(config).eval()
    src = torch.randint(4, config.src_vocab_size, (3, 7))
    tgt = torch.randint(4, config.tgt_vocab_size, (3, 5))
    counter = FlopCounterMode(display=False)
    # the math attention backend and, for the LSTM, its unfused kernel (oneDNN's fused LSTM
    # is invisible to the counter): both run their products as counted matmuls
    plain_lstm = torch.backends.mkldnn.flags(enabled=False)
    with counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH), plain_lstm:
        model(src, tgt)
    assert forward_flops(config, 3, 7, 5) == counter.get_total_flops()
