"""Multi-head attention (self and cross) on ``F.scaled_dot_product_attention``.

Shapes: ``B`` batch, ``H`` heads, ``Tq``/``Tk`` query/key lengths, ``Dh`` the head width
(``d_model / H`` unless ``head_dim`` sets it: Table 3 row (B)); ``A = H * Dh`` the attention
width, which then may differ from ``d_model``.
Masks follow ``aiayn.model.masks`` (bool, True = may attend).

``with capture_attention(model) as maps:`` switches every attention module of a
``Transformer`` to the explicit path, which computes the same output and records the per-head
attention probabilities ``(B, H, Tq, Tk)`` (before dropout) into ``maps``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.cache import LayerCache
from aiayn.model.masks import causal_mask


def attention_probs(
    q: Tensor, k: Tensor, mask: Tensor | None = None, causal: bool = False
) -> Tensor:
    """``softmax(q k^T / sqrt(Dh))``: ``q (B, H, Tq, Dh)``, ``k (B, H, Tk, Dh)``, ``mask`` bool
    (True = attend) or float (added), broadcastable to ``(B, H, Tq, Tk)`` ->
    ``(B, H, Tq, Tk)``. ``causal`` (only with ``mask=None``) is top-left aligned like SDPA's
    ``is_causal``."""
    if causal:
        mask = causal_mask(q.size(-2), k.size(-2), device=q.device)
    scores = (q @ k.transpose(-2, -1)).float() * q.size(-1) ** -0.5
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:  # additive (aiayn.nn.Transformer's float masks)
        scores = scores + mask.float()
    return scores.softmax(dim=-1).to(q.dtype)


def sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, causal: bool
) -> Tensor:
    """``F.scaled_dot_product_attention`` (``q (B, H, Tq, Dh)``, ``k, v (B, H, Tk, Dh)`` ->
    ``(B, H, Tq, Dh)``), except that on the CPU a bfloat16 pass that takes gradients (bf16-mixed
    training) attends in float32 and returns the inputs' dtype: torch's CPU flash-attention
    backward is several times slower in bf16 than in float32, even on CPUs with native bf16
    (``benchmarks/kernels.py``), which made a tiny model's bf16-mixed update slower than its
    float32 one. Inference keeps the bf16 kernels, whose forward pass is the faster one."""
    grads = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if not (q.dtype == torch.bfloat16 and grads and q.device.type == "cpu"):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal
        )
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.float()
    with torch.autocast("cpu", enabled=False):  # autocast would cast the inputs back down
        y = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=mask, dropout_p=dropout_p, is_causal=causal
        )
    return y.to(q.dtype)


class SharedHeadProjection(nn.Module):
    """``n`` projections, each one ``(Dh, Dh)`` matrix (no bias) shared by the heads and applied
    to each head's ``Dh`` slice of the input (seed 001's attention): ``(B, T, H*Dh)`` ->
    ``(B, T, n*H*Dh)``, laid out as a fused ``nn.Linear(D, n*A)`` output (``n``, head, Dh).
    ``dense()`` is the equivalent block-diagonal ``(n*A, D)`` Linear weight."""

    def __init__(self, num_heads: int, head_dim: int, n: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.weight = nn.Parameter(torch.empty(n, head_dim, head_dim))
        self.bias = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for matrix in self.weight:
            nn.init.xavier_uniform_(matrix)

    def forward(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        heads = x.view(B, T, self.num_heads, -1)
        return torch.einsum("bthe,nfe->btnhf", heads, self.weight).reshape(B, T, -1)

    def dense(self) -> Tensor:
        return torch.cat([torch.block_diag(*[w] * self.num_heads) for w in self.weight])


def _projection(d_model: int, heads: _Heads, n: int, shared: bool, bias: bool) -> nn.Module:
    """``n`` fused projections ``D -> A``: a Linear (with a bias if ``bias``), or per-head
    shared matrices (never a bias)."""
    if shared:
        return SharedHeadProjection(heads.num_heads, heads.head_dim, n)
    return nn.Linear(d_model, n * heads.width, bias=bias)


class _Heads(nn.Module):
    """Base of both attention modules: split ``(B, T, n*D)`` into ``n`` tensors
    ``(B, H, T, Dh)``, attend (SDPA, or the explicit path that records), merge.

    ``record``: None (SDPA fast path) or, inside ``capture_attention``, the list that the
    explicit path appends its probabilities to. ``bias``: whether the projections (the output
    one and the Q/K/V Linears) have biases.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float,
        head_dim: int | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if head_dim is None and d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = head_dim or d_model // num_heads
        self.width = num_heads * self.head_dim  # A
        self.dropout = dropout
        self.out_proj = nn.Linear(self.width, d_model, bias=bias)
        self.record: list[Tensor] | None = None

    def split(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """``(B, T, n*A)`` -> ``n`` views ``(B, H, T, Dh)``."""
        B, T, _ = x.shape
        return x.view(B, T, n, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """``q (B, H, Tq, Dh)``, ``k, v (B, H, Tk, Dh)`` -> ``out_proj`` of ``(B, Tq, D)``."""
        p = self.dropout if self.training else 0.0
        if self.record is None:
            y = sdpa(q, k, v, mask, p, causal)
        else:
            probs = attention_probs(q, k, mask, causal)
            self.record.append(probs)
            y = F.dropout(probs, p) @ v
        B, _, T, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(B, T, -1))

    def _xavier_chunks(self, projection: nn.Module) -> None:
        """Xavier-uniform each ``(A, D)`` block of a fused projection, as separate layers."""
        if isinstance(projection, SharedHeadProjection):
            return  # its own reset_parameters (in the model's list of self-initialising modules)
        weight = projection.weight
        with torch.no_grad():
            for chunk in weight.split(self.width, dim=0):
                nn.init.xavier_uniform_(chunk)


class MultiHeadSelfAttention(_Heads):
    """``x (B, T, D)`` -> ``(B, T, D)``; one fused ``qkv_proj``. With a ``LayerCache`` the new
    keys/values are appended to the cached ones and ``x`` holds only the new positions."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        head_dim: int | None = None,
        shared_heads: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__(d_model, num_heads, dropout, head_dim, bias)
        self.qkv_proj = _projection(d_model, self, 3, shared_heads, bias)

    def reset_parameters(self) -> None:
        self._xavier_chunks(self.qkv_proj)

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """``mask (B|1, 1, T|1, T_total)`` or ``causal`` (top-left aligned, without a mask)."""
        q, k, v = self.split(self.qkv_proj(x), 3)
        if cache is not None:
            k, v = cache.append(k, v)
        return self.attend(q, k, v, mask, causal)


class MultiHeadCrossAttention(_Heads):
    """``x (B, T, D)`` attends ``memory (B, S, D)`` -> ``(B, T, D)``. The memory's keys/values
    come from ``project_memory`` (computed once per source and kept in a ``LayerCache``)."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        head_dim: int | None = None,
        shared_heads: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__(d_model, num_heads, dropout, head_dim, bias)
        self.q_proj = _projection(d_model, self, 1, shared_heads, bias)
        self.kv_proj = _projection(d_model, self, 2, shared_heads, bias)

    def reset_parameters(self) -> None:
        self._xavier_chunks(self.kv_proj)

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """``memory (B, S, D)`` -> keys, values ``(B, H, S, Dh)``."""
        k, v = self.split(self.kv_proj(memory), 2)
        return k, v

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """``mask (B|1, 1, 1, S)``; with a ``cache`` its keys/values replace ``memory``."""
        (q,) = self.split(self.q_proj(x), 1)
        if cache is not None:
            k, v = cache.cross_k, cache.cross_v
        elif memory is not None:
            k, v = self.project_memory(memory)
        else:
            raise ValueError("cross-attention needs memory when no cache is given")
        return self.attend(q, k, v, mask, False)


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Record the attention probabilities of every attention module of ``model``.

    Yields ``{'encoder_self': [...], 'decoder_self': [...], 'decoder_cross': [...]}``, filled
    while the block runs: each module appends its ``(B, H, Tq, Tk)`` probabilities (before
    dropout) on each call, so one forward pass gives one map per layer, in layer order. The
    modules take the explicit path inside the block (same outputs, slower) and are back on the
    SDPA fast path, recording nothing, when it exits (also when it raises).
    """
    modules = {
        "encoder_self": [layer.self_attn for layer in model.encoder.layers],
        "decoder_self": [layer.self_attn for layer in model.decoder.layers],
        "decoder_cross": [layer.cross_attn for layer in model.decoder.layers],
    }
    maps: dict[str, list[Tensor]] = {name: [] for name in modules}
    try:
        for name, group in modules.items():
            for module in group:
                module.record = maps[name]
        yield maps
    finally:
        for group in modules.values():
            for module in group:
                module.record = None
