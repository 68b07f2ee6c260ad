"""Attention masks, made in this one place.

Convention (everywhere in aiayn): masks are ``torch.bool`` and **True = real token / may
attend**, False = padding / masked out. This is the convention of the bool ``attn_mask`` of
``torch.nn.functional.scaled_dot_product_attention`` (and the *opposite* of
``nn.Transformer``'s ``*_key_padding_mask``).

- key-padding mask: ``(B, L)``, True where the token is real (``tokens != pad_id``).
- causal mask: ``(Tq, Tk)``, True where query ``i`` may see key ``j`` (``j <= offset + i``).
- attention mask: ``(B|1, 1, Tq|1, Tk)``, what the attention modules take; it broadcasts over
  heads. A query row whose keys are all masked (e.g. an all-padding source sentence) is opened
  to every key, so softmax never sees only ``-inf`` and nothing becomes NaN; such rows belong to
  padding and their outputs are ignored.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Key-padding mask of ``tokens (B, L)``: ``(B, L)`` bool, True = real token."""
    return tokens != pad_id


def causal_mask(
    num_queries: int,
    num_keys: int | None = None,
    *,
    offset: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    """``(Tq, Tk)`` bool, True where query ``i`` (at position ``offset + i``) may attend key ``j``.

    ``num_keys`` defaults to ``offset + num_queries`` (the queries are the last positions, as
    with a key/value cache holding ``offset`` earlier steps).
    """
    if num_keys is None:
        num_keys = offset + num_queries
    queries = torch.arange(offset, offset + num_queries, device=device)
    keys = torch.arange(num_keys, device=device)
    return keys[None, :] <= queries[:, None]


def attention_mask(
    key_padding_mask: Tensor | None = None, causal: Tensor | None = None
) -> Tensor | None:
    """Combine a key-padding mask ``(B, Tk)`` and a causal mask ``(Tq, Tk)`` into the bool
    ``attn_mask`` of the attention modules: ``(B|1, 1, Tq|1, Tk)``, or None when both are None.

    Query rows without any visible key are opened to all keys (see the module docstring).
    """
    mask = None
    if key_padding_mask is not None:
        mask = key_padding_mask[:, None, None, :]
    if causal is not None:
        mask = causal[None, None] if mask is None else mask & causal
    if mask is None:
        return None
    return mask | ~mask.any(dim=-1, keepdim=True)
