"""Key/value cache for incremental decoding (inference only: use under no_grad/inference_mode).

``Transformer.init_cache(memory, src_mask)`` builds a ``KVCache``: per decoder layer the
cross-attention keys/values of the memory (computed once) and a growing buffer of the
self-attention keys/values (appended per step, capacity doubled when full, so a step costs
O(1) copies). ``reorder(index)`` selects batch rows (beam search; also expands B -> B*k),
copying only the positions filled so far.

``Transformer.init_cache(memory, src_mask, capacity=n)`` builds a ``StaticKVCache`` instead:
buffers of ``n`` positions allocated once, a batch that never changes size, and the position
of the next token held on the device, so that every step runs the same kernels on the same
memory (what a CUDA graph replays: `aiayn.model.static_search`). Its ``reorder`` copies rows in
place; ``advance()`` moves to the next position.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.model.masks import causal_mask


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


class StaticLayerCache:
    """One decoder layer's state in a ``StaticKVCache``: ``cross_k, cross_v (N, H, S, Dh)``
    and self-attention buffers ``k, v (N, H, capacity, Dh)`` (views of the cache's stacked
    buffers), written at ``position`` (a 0-d long tensor shared by the layers); the keys past
    it are masked (``StaticKVCache.self_mask``)."""

    def __init__(
        self, cross_k: Tensor, cross_v: Tensor, k: Tensor, v: Tensor, position: Tensor
    ) -> None:
        self.cross_k, self.cross_v = cross_k.contiguous(), cross_v.contiguous()
        self.k, self.v = k, v
        self.position = position

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k, v (N, H, 1, Dh)`` at ``position``; return the whole buffers."""
        self.k.index_copy_(2, self.position.view(1), k)
        self.v.index_copy_(2, self.position.view(1), v)
        return self.k, self.v


class StaticKVCache:
    """Incremental-decoding state in fixed buffers (module docstring); made by
    ``Transformer.init_cache(..., capacity=n)``. ``position``: the next token's position, a
    0-d long tensor on the device (``offset``); ``memory_mask (N, 1, 1, S)`` or None. The
    layers' self-attention keys and values are two stacked buffers ``(L, N, H, capacity,
    Dh)``, so that a reorder is two copies whatever the depth."""

    def __init__(
        self, cross: list[tuple[Tensor, Tensor]], memory_mask: Tensor | None, capacity: int
    ) -> None:
        N, H, _, Dh = cross[0][0].shape
        like = cross[0][0]
        self.position = torch.zeros((), dtype=torch.long, device=like.device)
        self.k = like.new_zeros(len(cross), N, H, capacity, Dh)
        self.v = like.new_zeros(self.k.shape)
        self.layers = [
            StaticLayerCache(ck, cv, self.k[i], self.v[i], self.position)
            for i, (ck, cv) in enumerate(cross)
        ]
        self.memory_mask = (
            None if memory_mask is None else memory_mask.clone()
        )  # reordered in place
        self.capacity = capacity
        self._positions = torch.arange(capacity, device=like.device)

    @property
    def offset(self) -> Tensor:
        return self.position

    @property
    def batch_size(self) -> int:
        return self.layers[0].cross_k.size(0)

    def self_mask(self, length: int) -> Tensor:
        """The keys a new token may see, ``(1, 1, 1, capacity)``: those up to its position
        (one token a step)."""
        if length != 1:
            raise ValueError(f"a StaticKVCache takes one token a step, got {length}")
        return (self._positions <= self.position)[None, None, None]

    def advance(self) -> None:
        """The next step writes the next position."""
        self.position.add_(1)

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        """Rows ``index (N,)`` in place (the batch keeps its size); ``cross`` as in
        ``KVCache.reorder``."""
        if index.numel() != self.batch_size:
            raise ValueError("a StaticKVCache keeps its batch size: reorder with N rows")
        buffers = [(self.k, 1), (self.v, 1)]
        if cross:
            buffers += [(t, 0) for layer in self.layers for t in (layer.cross_k, layer.cross_v)]
            if self.memory_mask is not None:
                buffers.append((self.memory_mask, 0))
        for buffer, dim in buffers:
            buffer.copy_(buffer.index_select(dim, index))


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
    def offset(self) -> int:
        """The next token's position (``length``)."""
        return self.length

    @property
    def batch_size(self) -> int:
        return self.layers[0].cross_k.size(0)

    def self_mask(self, length: int) -> Tensor | None:
        """The self-attention mask of ``length`` new tokens ``(1, 1, length, offset +
        length)``: None for one token, which sees every cached position."""
        if length == 1:
            return None
        return causal_mask(length, offset=self.length, device=self.layers[0].cross_k.device)[
            None, None
        ]

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
