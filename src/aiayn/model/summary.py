"""Parameter counts and FLOPs for the console, the loggers and the benchmarks."""

from __future__ import annotations

from torch import nn

from aiayn.model.config import ModelConfig


def forward_flops(config: ModelConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Floating-point operations (a multiply-add is 2) of one forward pass over a padded
    ``(batch, src_len)`` source and ``(batch, tgt_len)`` target: every matrix product,
    attention's two included, the output projection over the whole vocabulary; elementwise
    work (norms, softmax, activations) and embedding lookups are left out.
    A training step (forward + backward) is ~3x this."""
    d, v = config.d_model, config.tgt_vocab_size
    S, T = src_len, tgt_len
    stacks = (
        _rnn_stacks(config, S, T) if config.arch == "rnn" else _transformer_stacks(config, S, T)
    )
    embed = 0 if config.d_embed is None else (S + 2 * T) * config.d_embed * d  # factor projections
    per_sentence = stacks + T * d * v
    if config.d_embed is not None:
        per_sentence += T * (config.d_embed - d) * v  # the projection onto V is d_embed wide
    return 2 * batch * (per_sentence + embed)


def _transformer_stacks(config: ModelConfig, S: int, T: int) -> int:
    """Multiply-adds of the encoder and decoder layers for one sentence pair."""
    d, f = config.d_model, config.d_ff
    a = config.num_heads * (config.head_dim or d // config.num_heads)  # attention width
    p = a // config.num_heads if config.shared_head_qkv else d  # inputs per projected unit
    encoder = S * (3 * p * a + a * d + 2 * d * f) + 2 * S * S * a
    decoder = T * (3 * p * a + a * d + 2 * d * f) + 2 * T * T * a  # self-attention, FFN
    decoder += T * (p * a + a * d) + S * (2 * p * a) + 2 * T * S * a  # cross: q + out, k/v
    return config.num_encoder_layers * encoder + config.num_decoder_layers * decoder


def _rnn_stacks(config: ModelConfig, S: int, T: int) -> int:
    """The same for the LSTM baseline: its gates (4 per unit, input and recurrent products),
    attention keys W_a, scores and context, W_c, and the bridge to the initial state."""
    d, h = config.d_model, config.d_model // 2
    encoder = S * 2 * 4 * h * (d + h)  # per layer, both directions
    decoder = T * 4 * d * 2 * d
    attention = S * d * d + 2 * T * S * d + T * 2 * d * d
    bridge = d * config.num_decoder_layers * d
    layers = config.num_encoder_layers * encoder + config.num_decoder_layers * decoder
    return layers + attention + bridge


def parameter_summary(model: nn.Module) -> dict[str, int]:
    """``{'total', 'trainable', <each top-level submodule>: count}``.

    Shared (tied) parameters are counted once everywhere: in the totals, and under the first
    submodule (in registration order) that holds them, so the per-module counts add up to
    ``total`` plus any parameters registered directly on ``model``.
    """
    params = list(model.parameters())  # deduplicated by nn.Module
    summary = {
        "total": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }
    seen: set[int] = set()
    for name, child in model.named_children():
        fresh = [p for p in child.parameters() if id(p) not in seen]
        seen.update(id(p) for p in fresh)
        summary[name] = sum(p.numel() for p in fresh)
    return summary


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def format_parameter_summary(summary: dict[str, int]) -> str:
    """A small table: one row per module, then trainable and total."""
    total = max(summary.get("total", 0), 1)
    modules = [k for k in summary if k not in ("total", "trainable")]
    rows = [(k, summary[k]) for k in modules] + [
        ("trainable", summary.get("trainable", 0)),
        ("total", summary.get("total", 0)),
    ]
    width = max(len("module"), *(len(k) for k, _ in rows))
    lines = [f"{'module':<{width}}  {'params':>12}  {'':>7}  {'share':>6}"]
    lines.append("-" * len(lines[0]))
    for i, (name, n) in enumerate(rows):
        if i == len(modules):
            lines.append("-" * len(lines[0]))
        lines.append(f"{name:<{width}}  {n:>12,}  {_human(n):>7}  {100 * n / total:>5.1f}%")
    return "\n".join(lines)
