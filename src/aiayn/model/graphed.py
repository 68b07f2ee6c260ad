"""One decoder step of a Transformer on a `StaticKVCache`, as a function of the next tokens:
captured once as a CUDA graph on a GPU (`torch.cuda.CUDAGraph`: the step's hundreds of
kernels launched as one), run eagerly elsewhere. Stock PyTorch; `generate` uses it for
greedy and beam search (`DecodeConfig.cuda_graphs`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.model.cache import StaticKVCache
from aiayn.model.transformer import Transformer


def static_step(model: Transformer, cache: StaticKVCache) -> Callable[[Tensor], Tensor]:
    """``tokens (N, 1)`` -> ``logits (N, 1, V)`` of the next position, then ``cache.advance()``.
    On a GPU the logits are the graph's output buffer, overwritten by the next call: read them
    before it. Where the capture fails, the step runs eagerly, with a warning naming why."""
    if cache.position.device.type == "cuda":
        try:
            return _GraphedStep(model, cache)
        except RuntimeError as error:  # a kernel that cannot be captured, on this torch
            warnings.warn(
                f"decoding without CUDA graphs: capturing the decoder step failed ({error}); "
                "decode.cuda_graphs=false silences this",
                RuntimeWarning,
                stacklevel=2,
            )

    def step(tokens: Tensor) -> Tensor:
        logits = model.decode_step(tokens, cache)
        cache.advance()
        return logits

    return step


class _GraphedStep:
    """`model.decode_step` on `cache`, captured for this batch and capacity. The warm-up and the
    capture write position 0 of the cache, which the first real step writes again."""

    def __init__(self, model: Transformer, cache: StaticKVCache) -> None:
        self.cache = cache
        device = cache.position.device
        self.tokens = torch.zeros(cache.batch_size, 1, dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # picks kernels and makes workspaces outside the capture
            model.decode_step(self.tokens, cache)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = model.decode_step(self.tokens, cache)

    def __call__(self, tokens: Tensor) -> Tensor:
        self.tokens.copy_(tokens)
        self.graph.replay()
        self.cache.advance()
        return self.logits
