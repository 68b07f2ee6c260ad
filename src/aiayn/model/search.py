"""What every decoding search shares: the output `Hypothesis`, the GNMT `length_penalty`, the
next-token log-probabilities of a decoder step with a forced prefix (`next_logprobs`), and how
often a search reads the device (`SHRINK_EVERY`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# off the CPU, the steps between two reads of which sentences ended (each read waits for the
# device)
SHRINK_EVERY = 8


@dataclass
class Hypothesis:
    """One output: ``tokens`` without BOS/EOS, length-normalised log-probability ``score``."""

    tokens: list[int]
    score: float


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ``((5 + length) / 6) ** alpha``."""
    return ((5 + length) / 6) ** alpha


def one_each(
    out: Tensor, length: Tensor, score: Tensor, eos_id: int, alpha: float
) -> list[list[Hypothesis]]:
    """A greedy or sampling search's results: per row of ``out (B, steps)`` its first
    ``length (B,)`` tokens (the scored ones: a final EOS counts, and is dropped from the
    tokens), scored ``score (B,)`` over `length_penalty`."""
    results = []
    for tokens, n, s in zip(out.tolist(), length.tolist(), score.tolist(), strict=True):
        tokens = tokens[:n]
        if tokens and tokens[-1] == eos_id:
            tokens = tokens[:-1]
        results.append([Hypothesis(tokens, s / length_penalty(n, alpha))])
    return results


def next_logprobs(logits: Tensor, forced: Tensor | None = None, step: int | Tensor = 0) -> Tensor:
    """The decoder step's ``logits (N, T, V)`` -> float32 log-probabilities of the next token
    ``(N, V)``; a row whose prefix (``forced (N, P)``, -1 = none) reaches ``step`` may only
    take its token. ``step`` is an int, or a 0-d tensor on the device (a `StaticKVCache`'s
    position), read there and not on the host."""
    logprobs = logits[:, -1].float().log_softmax(dim=-1)
    if forced is None:
        return logprobs
    if isinstance(step, Tensor):
        column = step.clamp(max=forced.size(1) - 1).view(1)
        want = forced.index_select(1, column).masked_fill(step >= forced.size(1), -1)
    elif step >= forced.size(1):
        return logprobs
    else:
        want = forced[:, step : step + 1]
    only = torch.full_like(logprobs, float("-inf"))
    only.scatter_(1, want.clamp(min=0), logprobs.gather(1, want.clamp(min=0)))
    return torch.where(want >= 0, only, logprobs)
