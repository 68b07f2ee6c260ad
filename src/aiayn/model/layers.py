"""Position-wise feed-forward network and the encoder/decoder layers.

Post-norm (paper, ``norm_first=False``): ``x = LayerNorm(x + nn.Dropout(Sublayer(x)))``, or
``x = nn.Dropout(LayerNorm(x + Sublayer(x)))`` with ``dropout_after_norm`` (seed 001).
Pre-norm (``norm_first=True``): ``x = x + nn.Dropout(Sublayer(LayerNorm(x)))``; the stack then
needs a final LayerNorm (in ``Encoder``/``Decoder``). Shapes: ``x (B, T, D)``,
``memory (B, S, D)``; masks as in ``aiayn.model.masks``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.attention import MultiHeadCrossAttention, MultiHeadSelfAttention
from aiayn.model.cache import LayerCache
from aiayn.model.config import ModelConfig

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


def residual(
    x: Tensor,
    sublayer: Callable[[Tensor], Tensor],
    norm: nn.Module,
    dropout: nn.Module,
    norm_first: bool,
    dropout_after_norm: bool = False,
) -> Tensor:
    """One residual sublayer, pre-norm or post-norm (see the module docstring)."""
    if norm_first:
        return x + dropout(sublayer(norm(x)))
    if dropout_after_norm:
        return dropout(norm(x + sublayer(x)))
    return norm(x + dropout(sublayer(x)))


class FeedForward(nn.Module):
    """``linear2(dropout(activation(linear1(x))))``: ``(B, T, D)`` -> ``(B, T, D)`` through
    ``d_ff`` (the inner dropout is ``activation_dropout``, 0 in the paper; both linears have
    biases unless ``bias`` is false)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


def feed_forward(config: ModelConfig) -> FeedForward:
    """A layer's FFN as ``config`` sets it."""
    d, f = config.d_model, config.d_ff
    return FeedForward(d, f, config.activation, config.activation_dropout, config.linear_bias)


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each a residual sublayer."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, h, p = config.d_model, config.num_heads, config.attention_dropout
        shared, bias = config.shared_head_qkv, config.linear_bias
        self.self_attn = MultiHeadSelfAttention(d, h, p, config.head_dim, shared, bias)
        self.ff = feed_forward(config)
        self.norm1 = nn.LayerNorm(d, bias=config.norm_bias)
        self.norm2 = nn.LayerNorm(d, bias=config.norm_bias)
        self.dropout = nn.Dropout(config.dropout)
        self.placement = (config.norm_first, config.dropout_after_norm)  # see `residual`

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """``x (B, S, D)``, ``mask (B|1, 1, 1|S, S)`` -> ``(B, S, D)``."""

        def self_attn(y: Tensor) -> Tensor:
            return self.self_attn(y, mask=mask)

        x = residual(x, self_attn, self.norm1, self.dropout, *self.placement)
        return residual(x, self.ff, self.norm2, self.dropout, *self.placement)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the memory, then FFN."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, h, p = config.d_model, config.num_heads, config.attention_dropout
        shared, bias = config.shared_head_qkv, config.linear_bias
        self.self_attn = MultiHeadSelfAttention(d, h, p, config.head_dim, shared, bias)
        self.cross_attn = MultiHeadCrossAttention(d, h, p, config.head_dim, shared, bias)
        self.ff = feed_forward(config)
        self.norm1 = nn.LayerNorm(d, bias=config.norm_bias)
        self.norm2 = nn.LayerNorm(d, bias=config.norm_bias)
        self.norm3 = nn.LayerNorm(d, bias=config.norm_bias)
        self.dropout = nn.Dropout(config.dropout)
        self.placement = (config.norm_first, config.dropout_after_norm)  # see `residual`

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        self_mask: Tensor | None = None,
        causal: bool = False,
        memory_mask: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """``x (B, T, D)``, ``memory (B, S, D)`` (unused with a cache) -> ``(B, T, D)``.

        ``self_mask (B|1, 1, T, T_total)`` or ``causal``; ``memory_mask (B|1, 1, 1, S)``.
        """

        def self_attn(y: Tensor) -> Tensor:
            return self.self_attn(y, mask=self_mask, causal=causal, cache=cache)

        def cross_attn(y: Tensor) -> Tensor:
            return self.cross_attn(y, memory=memory, mask=memory_mask, cache=cache)

        x = residual(x, self_attn, self.norm1, self.dropout, *self.placement)
        x = residual(x, cross_attn, self.norm2, self.dropout, *self.placement)
        return residual(x, self.ff, self.norm3, self.dropout, *self.placement)
