"""Token embeddings, positional encodings and the output projection.

Token embedding of width ``e`` (``d_embed`` or ``d_model``): ``E[tokens] * sqrt(e)``, drawn
from ``N(0, e^-0.5)`` (as fairseq) so the embedded tokens have unit scale and tied logits
``h @ E.T`` have unit scale too. With a factorized embedding (``d_embed`` set) the ``e``-wide
vectors are projected to ``d_model``, and the output side projects ``d_model -> e`` before
the (possibly tied) ``(V, e)`` output matrix. Without ``d_embed`` this is exactly the paper's
``E[tokens] * sqrt(d_model)``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from aiayn.model.config import ModelConfig


class TokenEmbedding(nn.Module):
    """``tokens (B, L)`` -> ``(B, L, d_model)``; ``weight (V, e)`` may be tied elsewhere."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        d_embed: int | None = None,
        scale: bool = True,
        proj_bias: bool = False,
        scale_after_proj: bool = False,
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        width = d_embed if d_embed is not None else d_model
        self.weight = nn.Parameter(torch.empty(vocab_size, width))
        factorized = d_embed is not None
        self.proj = nn.Linear(width, d_model, bias=proj_bias) if factorized else None
        after = scale and factorized and scale_after_proj
        # E * sqrt(e) (then projected), or projected then * sqrt(d_model) (seed 002)
        self.scale = math.sqrt(width) if scale and not after else 1.0
        self.out_scale = math.sqrt(d_model) if after else 1.0
        self.init_std = 1.0 / self.scale if init_std is None else init_std

    def reset_parameters(self) -> None:
        """``N(0, init_std^2)``; by default ``init_std = 1 / scale``: unit-scale embedded
        tokens, scaled or not."""
        nn.init.normal_(self.weight, mean=0.0, std=self.init_std)

    def forward(self, tokens: Tensor) -> Tensor:
        x = F.embedding(tokens, self.weight) * self.scale
        if self.proj is not None:
            x = self.proj(x)
        return x * self.out_scale if self.out_scale != 1.0 else x


def token_embeddings(config: ModelConfig) -> tuple[TokenEmbedding, TokenEmbedding]:
    """The source and target token embeddings a config describes (one module twice with
    ``share_embeddings='all'``)."""
    d, e = config.d_model, config.d_embed
    options = (
        config.scale_embeddings,
        config.embedding_proj_bias,
        config.embedding_scale_after_proj,
        config.embedding_init_std,
    )
    src = TokenEmbedding(config.src_vocab_size, d, e, *options)
    if config.share_embeddings == "all":
        return src, src
    return src, TokenEmbedding(config.tgt_vocab_size, d, e, *options)


def _rows(table: Tensor, length: int, offset: int | Tensor) -> Tensor:
    """Rows ``offset .. offset + length`` of ``table (P, d)`` -> ``(length, d)``; a 0-d tensor
    ``offset`` (a `StaticKVCache`'s position) is read on the device, not the host."""
    if isinstance(offset, Tensor):
        return table.index_select(0, offset + torch.arange(length, device=table.device))
    return table[offset : offset + length]


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed ``PE[pos, 2i] = sin(pos / 10000^(2i/d))``, ``PE[pos, 2i+1] = cos(...)``; any ``d``
    (odd included). ``forward(length, offset) -> (length, d)``."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        position = torch.arange(max_positions, dtype=torch.float64)[:, None]
        inv_freq = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model)
        )
        angles = position * inv_freq  # (P, ceil(d/2))
        pe = torch.empty(max_positions, d_model, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(angles)
        pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
        self.register_buffer("pe", pe.float(), persistent=False)

    def forward(self, length: int, offset: int | Tensor = 0) -> Tensor:
        return _rows(self.pe, length, offset)


class LearnedPositionalEmbedding(nn.Module):
    """A trained ``(max_positions, d)`` table. ``forward(length, offset) -> (length, d)``."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.weight.size(1) ** -0.5)

    def forward(self, length: int, offset: int | Tensor = 0) -> Tensor:
        return _rows(self.weight, length, offset)


class Embedding(nn.Module):
    """``nn.Dropout(TokenEmbedding(tokens) + PE)`` (with ``norm``: ``nn.Dropout(LayerNorm(...))``,
    the LayerNorm with a bias if ``norm_bias``): ``tokens (B, L)`` -> ``(B, L, d_model)``.

    ``offset`` is the position of the first token (the cache's offset when decoding step by
    step): an int, checked against ``max_positions``, or a 0-d tensor on the device (a
    `StaticKVCache`, whose capacity was checked instead).
    """

    def __init__(
        self,
        token: TokenEmbedding,
        d_model: int,
        max_positions: int,
        positional: str = "sinusoidal",
        dropout: float = 0.0,
        norm: bool = False,
        norm_bias: bool = True,
    ) -> None:
        super().__init__()
        self.token = token
        self.norm = nn.LayerNorm(d_model, bias=norm_bias) if norm else None
        if positional == "sinusoidal":
            self.positional: nn.Module = SinusoidalPositionalEncoding(max_positions, d_model)
        elif positional == "learned":
            self.positional = LearnedPositionalEmbedding(max_positions, d_model)
        else:
            raise ValueError(f"positional={positional!r} is unknown; use 'sinusoidal' or 'learned'")
        self.max_positions = max_positions
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: Tensor, offset: int | Tensor = 0) -> Tensor:
        length = tokens.size(1)
        if isinstance(offset, int) and offset + length > self.max_positions:
            raise ValueError(
                f"sequence reaches position {offset + length} but ModelConfig.max_positions="
                f"{self.max_positions}; raise max_positions or shorten the input"
            )
        x = self.token(tokens) + self.positional(length, offset)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class OutputProjection(nn.Module):
    """``(B, T, d_model)`` -> logits ``(B, T, V)``: ``[proj d_model -> e] then @ weight.T``.

    ``weight (V, e)`` is this module's own (``share_embeddings='none'``) or the target token
    embedding's (tied: assign ``output.weight = token.weight``). No bias unless ``bias``
    (fairseq has none; nn.Linear heads do).
    """

    def __init__(
        self, d_model: int, vocab_size: int, d_embed: int | None = None, bias: bool = False
    ) -> None:
        super().__init__()
        width = d_embed if d_embed is not None else d_model
        self.proj = nn.Linear(d_model, width, bias=False) if d_embed is not None else None
        self.weight = nn.Parameter(torch.empty(vocab_size, width))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.weight.size(1) ** -0.5)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.proj is not None:
            x = self.proj(x)
        return F.linear(x, self.weight, self.bias)
