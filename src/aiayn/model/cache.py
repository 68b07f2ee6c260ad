"""Key/value cache for incremental decoding (inference only: use under no_grad/inference_mode).

``Transformer.init_cache(memory, src_mask)`` builds a ``KVCache``: per decoder layer the
cross-attention keys/values of the memory (computed once) and a growing buffer of the
self-attention keys/values (appended per step, capacity doubled when full, so a step costs
O(1) copies). ``reorder(index)`` selects batch rows (beam search; also expands B -> B*k),
copying only the positions filled so far.
"""

from __future__ import annotations

import torch
from torch import Tensor


class LayerCache:
    """One decoder layer's state: ``cross_k, cross_v (B, H, S, Dh)`` and the self-attention
    buffers ``(B, H, capacity, Dh)`` of which the first ``length`` positions are filled."""

    def __init__(self, cross_k: Tensor, cross_v: Tensor) -> None:
        self.cross_k, self.cross_v = cross_k, cross_v
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k, v (B, H, T, Dh)``; return all keys/values so far ``(B, H, length, Dh)``."""
        start, end = self.length, self.length + k.size(2)
        if self.k is None or self.v is None or end > self.k.size(2):
            capacity = max(end, 2 * start, 16)
            new_k = k.new_empty(k.size(0), k.size(1), capacity, k.size(3))
            new_v = v.new_empty(new_k.shape)
            if self.k is not None and self.v is not None:
                new_k[:, :, :start] = self.k[:, :, :start]
                new_v[:, :, :start] = self.v[:, :, :start]
            self.k, self.v = new_k, new_v
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        if self.k is not None and self.v is not None:
            self.k = _select_rows(self.k, index, self.length)
            self.v = _select_rows(self.v, index, self.length)
        if cross:
            self.cross_k = self.cross_k.index_select(0, index)
            self.cross_v = self.cross_v.index_select(0, index)


def _select_rows(buffer: Tensor, index: Tensor, length: int) -> Tensor:
    """Rows ``index (B',)`` of ``buffer (B, H, capacity, Dh)`` -> ``(B', H, capacity, Dh)``:
    only the first ``length`` positions are copied; the spare capacity is allocated, unwritten."""
    out = buffer.new_empty(index.numel(), *buffer.shape[1:])
    torch.index_select(buffer[:, :, :length], 0, index, out=out[:, :, :length])
    return out


class KVCache:
    """Incremental-decoding state of the whole decoder; made by ``Transformer.init_cache``.

    ``length``: positions decoded so far (the next token's position). ``memory_mask``: the
    cross-attention mask ``(B, 1, 1, S)`` (or None: no source padding), kept with the cache so
    that ``reorder`` moves it along with the keys/values.
    """

    def __init__(self, layers: list[LayerCache], memory_mask: Tensor | None) -> None:
        self.layers = layers
        self.memory_mask = memory_mask

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    @property
    def batch_size(self) -> int:
        return self.layers[0].cross_k.size(0)

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        """Keep batch rows ``index (B',)`` (LongTensor, may repeat rows or change B), in place.

        ``cross=False`` skips the memory keys/values and mask, which is correct (and cheaper)
        when every new row ``i`` takes an old row holding the same source, as in beam search
        within a sentence's beams; it requires ``len(index) == batch_size``.
        """
        if not cross and index.numel() != self.batch_size:
            raise ValueError("reorder(cross=False) cannot change the batch size")
        for layer in self.layers:
            layer.reorder(index, cross)
        if cross and self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, index)
