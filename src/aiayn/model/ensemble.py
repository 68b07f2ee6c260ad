"""`Ensemble`: several models (Transformers, LSTMs or both) decoding as one (fairseq
`--path a.pt:b.pt`, OpenNMT `-model m1 m2`): at each step the next-token distribution is the
mean of the members' probabilities, returned as its log. It offers what `generate` uses of a
model (`config`, `encode`, `init_cache`, `decode_step`), so greedy, beam and sampling decode
an ensemble unchanged.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn

from aiayn.model.build import Cache, Model


class EnsembleCache:
    """One cache per member, reordered together (beam search)."""

    def __init__(self, caches: list[Cache]) -> None:
        self.caches = caches

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        for cache in self.caches:
            cache.reorder(index, cross)

    @property
    def length(self) -> int:
        return self.caches[0].length

    @property
    def batch_size(self) -> int:
        return self.caches[0].batch_size


class Ensemble(nn.Module):
    """The members must share special ids and target vocabulary size (ValueError otherwise);
    `config` is the first member's, with the smallest `max_positions` of all."""

    def __init__(self, models: list[Model]) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        first = models[0].config
        for model in models[1:]:
            for key in ("tgt_vocab_size", "src_vocab_size", "pad_id", "bos_id", "eos_id"):
                if getattr(model.config, key) != getattr(first, key):
                    raise ValueError(
                        f"ensemble members differ in {key} ({getattr(first, key)} vs "
                        f"{getattr(model.config, key)}): they must share one vocabulary"
                    )
        self.members = nn.ModuleList(models)
        self.config = replace(first, max_positions=min(m.config.max_positions for m in models))

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> list[Tensor]:
        """``src (B, S)`` -> each member's memory ``(B, S, D_i)``."""
        return [member.encode(src, src_mask) for member in self.members]

    def init_cache(self, memory: list[Tensor], src_mask: Tensor | None) -> EnsembleCache:
        return EnsembleCache(
            [m.init_cache(mem, src_mask) for m, mem in zip(self.members, memory, strict=True)]
        )

    def decode_step(self, tokens: Tensor, cache: EnsembleCache) -> Tensor:
        """``tokens (N, 1)`` -> log of the mean next-token probability ``(N, 1, V)``."""
        logprobs = [
            member.decode_step(tokens, member_cache)[:, -1:].float().log_softmax(dim=-1)
            for member, member_cache in zip(self.members, cache.caches, strict=True)
        ]
        return torch.logsumexp(torch.stack(logprobs), dim=0) - math.log(len(logprobs))
