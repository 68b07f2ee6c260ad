"""Multi-head attention (self and cross) on ``F.scaled_dot_product_attention``.

Shapes: ``B`` batch, ``H`` heads, ``Tq``/``Tk`` query/key lengths, ``Dh = d_model / H``.
Masks follow ``aiayn.model.masks`` (bool, True = may attend). Passing a list as ``weights``
switches to the explicit path, which computes the same output and appends the per-head
attention probabilities ``(B, H, Tq, Tk)`` (before dropout) to that list.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.cache import LayerCache
from aiayn.model.masks import causal_mask


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    weights: list[Tensor] | None = None,
) -> Tensor:
    """``q (B, H, Tq, Dh)``, ``k, v (B, H, Tk, Dh)``, ``mask`` bool broadcastable to
    ``(B, H, Tq, Tk)`` -> ``(B, H, Tq, Dh)``. ``is_causal`` (only with ``mask=None``) is
    top-left aligned like SDPA's. With ``weights`` a list: explicit path, probabilities appended.
    """
    if weights is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )
    if is_causal:
        mask = causal_mask(q.size(-2), k.size(-2), device=q.device)
    scores = (q @ k.transpose(-2, -1)).float() * q.size(-1) ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1).to(q.dtype)
    weights.append(probs)
    return F.dropout(probs, dropout_p) @ v


class _Heads(nn.Module):
    """Shared helpers: split ``(B, T, n*D)`` into ``n`` tensors ``(B, H, T, Dh)`` and merge back."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.out_proj = nn.Linear(d_model, d_model)

    def split(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """``(B, T, n*D)`` -> ``n`` views ``(B, H, T, Dh)``."""
        B, T, _ = x.shape
        return x.view(B, T, n, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def merge(self, y: Tensor) -> Tensor:
        """``(B, H, T, Dh)`` -> ``out_proj`` of ``(B, T, D)``."""
        B, _, T, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(B, T, -1))

    def dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    def _xavier_chunks(self, weight: Tensor) -> None:
        """Xavier-uniform each ``(D, D)`` block of a fused projection, as separate layers."""
        with torch.no_grad():
            for chunk in weight.split(weight.size(1), dim=0):
                nn.init.xavier_uniform_(chunk)


class MultiHeadSelfAttention(_Heads):
    """``x (B, T, D)`` -> ``(B, T, D)``; one fused ``qkv_proj``. With a ``LayerCache`` the new
    keys/values are appended to the cached ones and ``x`` holds only the new positions."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, num_heads, dropout)
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)

    def reset_parameters(self) -> None:
        self._xavier_chunks(self.qkv_proj.weight)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        cache: LayerCache | None = None,
        weights: list[Tensor] | None = None,
    ) -> Tensor:
        q, k, v = self.split(self.qkv_proj(x), 3)
        if cache is not None:
            k, v = cache.append(k, v)
        return self.merge(attend(q, k, v, mask, is_causal, self.dropout_p(), weights))


class MultiHeadCrossAttention(_Heads):
    """``x (B, T, D)`` attends ``memory (B, S, D)`` -> ``(B, T, D)``. The memory's keys/values
    come from ``project_memory`` (computed once per source and kept in a ``LayerCache``)."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, num_heads, dropout)
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)

    def reset_parameters(self) -> None:
        self._xavier_chunks(self.kv_proj.weight)

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """``memory (B, S, D)`` -> keys, values ``(B, H, S, Dh)``."""
        k, v = self.split(self.kv_proj(memory), 2)
        return k, v

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        mask: Tensor | None = None,
        cache: LayerCache | None = None,
        weights: list[Tensor] | None = None,
    ) -> Tensor:
        (q,) = self.split(self.q_proj(x), 1)
        if cache is not None:
            k, v = cache.cross_k, cache.cross_v
        else:
            if memory is None:
                raise ValueError("cross-attention needs memory when no cache is given")
            k, v = self.project_memory(memory)
        return self.merge(attend(q, k, v, mask, False, self.dropout_p(), weights))
