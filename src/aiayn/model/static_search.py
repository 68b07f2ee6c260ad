"""Greedy and beam search of a Transformer on a `StaticKVCache`, each step one function of
tensors updated in place, with no read of the device: on a GPU captured once as a CUDA graph
(`torch.cuda.CUDAGraph`), the decoder, the search's bookkeeping and the cache's reorder
launched as one (`replayed`); elsewhere run eagerly, the same code. The batch keeps its size
to the end (a finished sentence's rows go on, ignored); the device is read every
`SHRINK_EVERY` steps (has every sentence ended?) and once at the end. `generate` calls these
for `DecodeConfig.cuda_graphs`; they return what its shrinking searches return
(`tests/model/test_generate.py`).

Shapes: ``B`` sentences, ``k`` beams, ``N = B * k`` rows (sentence ``b``'s beams are rows
``b * k .. b * k + k - 1``), ``steps`` the longest output allowed, ``V`` the vocabulary.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.model.cache import StaticKVCache
from aiayn.model.search import (
    SHRINK_EVERY,
    Hypothesis,
    length_penalty,
    next_logprobs,
    one_each,
)
from aiayn.model.transformer import Transformer


def greedy_search(
    model: Transformer,
    cache: StaticKVCache,
    max_lens: list[int],
    alpha: float,
    forced: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """The most likely token a step for ``B`` sentences, each stopping at EOS or its
    ``max_lens`` entry; ``forced (B, P)`` prefix ids (-1 past each row's)."""
    B, steps, device = len(max_lens), max(max_lens), cache.position.device
    bos_id, eos_id = model.config.bos_id, model.config.eos_id
    position, limit = cache.position, torch.tensor(max_lens, device=device)
    token = torch.empty(B, 1, dtype=torch.long, device=device)
    score = torch.empty(B, device=device)
    length = torch.empty(B, dtype=torch.long, device=device)  # scored tokens (incl. EOS)
    out = torch.empty(B, steps, dtype=torch.long, device=device)
    ended = torch.empty(B, dtype=torch.bool, device=device)

    def reset() -> None:
        for tensor in (position, score, length, ended):
            tensor.zero_()
        token.fill_(bos_id)
        out.fill_(eos_id)

    def step() -> None:
        logprobs = next_logprobs(model.decode_step(token, cache), forced, position)
        best, pick = logprobs.max(dim=-1, keepdim=True)
        score.add_(best[:, 0].masked_fill(ended, 0.0))
        length.add_((~ended).long())
        out.index_copy_(1, position.view(1), pick.masked_fill(ended[:, None], eos_id))
        ended.logical_or_((pick[:, 0] == eos_id) | (position + 1 >= limit))
        token.copy_(pick)
        cache.advance()

    _search(step, reset, steps, ended)
    return one_each(out, length, score, eos_id, alpha)


def beam_search(
    model: Transformer,
    cache: StaticKVCache,
    max_lens: list[int],
    k: int,
    nbest: int,
    alpha: float,
    forced: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """`generate`'s beam search (its module docstring) on a cache of ``N = B * k`` rows;
    ``forced (N, P)``. Finished hypotheses are collected on the device (`_Finished`)."""
    B, steps, device = len(max_lens), max(max_lens), cache.position.device
    bos_id, eos_id = model.config.bos_id, model.config.eos_id
    position, limit = cache.position, torch.tensor(max_lens, device=device)
    first_row = torch.arange(B, device=device)[:, None] * k
    rank = torch.arange(2 * k, device=device)
    history = torch.empty(B * k, steps + 1, dtype=torch.long, device=device)  # BOS + tokens
    token = torch.empty(B * k, 1, dtype=torch.long, device=device)
    scores = torch.empty(B, k, device=device)
    done = torch.empty(B, dtype=torch.bool, device=device)
    finished = _Finished(B, 2 * k, steps, device)  # up to k - 1 by EOS, then k at the limit

    def reset() -> None:
        for tensor in (position, done, scores):
            tensor.zero_()
        scores[:, 1:] = float("-inf")  # all beams start equal: expand only the first
        history.fill_(bos_id)
        token.fill_(bos_id)
        finished.reset()

    def step() -> None:
        logprobs = next_logprobs(model.decode_step(token, cache), forced, position)  # (N, V)
        V = logprobs.size(-1)
        candidates = (scores.view(-1, 1) + logprobs).view(B, k * V)
        top_scores, top_index = candidates.topk(2 * k, dim=-1)  # (B, 2k), best first
        top_beam, top_token = top_index // V, top_index % V
        is_eos = top_token == eos_id
        # EOS among the k best candidates finishes a hypothesis, while its sentence has room
        hits = is_eos[:, :k] & torch.isfinite(top_scores[:, :k]) & ~done[:, None]
        before_eos = history[first_row + top_beam[:, :k], 1:]  # (B, k, steps)
        finished.add(hits, top_scores[:, :k], before_eos, position, position, room=k)
        # the k best candidates not ending with EOS go on (at least k of the 2k are not EOS)
        keep = (is_eos.long() * (2 * k) + rank).argsort(dim=-1)[:, :k]
        scores.copy_(top_scores.gather(1, keep))
        rows = (first_row + top_beam.gather(1, keep)).view(-1)
        history.copy_(history.index_select(0, rows))
        history.index_copy_(1, (position + 1).view(1), top_token.gather(1, keep).view(-1, 1))
        done.logical_or_(finished.count >= k)
        # the length limit: a sentence with room left finishes with its alive beams
        at_limit = ~done & (position + 1 >= limit)
        alive = at_limit[:, None] & (scores != float("-inf"))
        tokens = history[:, 1:].view(B, k, steps)
        finished.add(alive, scores, tokens, position + 1, position, room=2 * k)
        done.logical_or_(at_limit)
        cache.reorder(rows, cross=False)
        token.copy_(history.index_select(1, (position + 1).view(1)))
        cache.advance()

    _search(step, reset, steps, done)
    return finished.hypotheses(nbest, alpha)


def _search(step: Callable[[], None], reset: Callable[[], None], steps: int, done: Tensor) -> None:
    """Run `step` (`replayed`) from the state `reset` makes, up to `steps` times, stopping at
    the first look (every `SHRINK_EVERY` steps) where every entry of ``done`` is True."""
    reset()
    run = replayed(step, reset, done.device)
    for i in range(steps):
        run()
        if (i + 1) % SHRINK_EVERY == 0 and bool(done.all()):
            return


class _Finished:
    """Beam search's finished hypotheses of ``B`` sentences on the device, ``slots`` each, in
    the order found: raw score, tokens and length, and the step whose penalty divides the
    score (``length_penalty(step + 1)``, as `generate`'s beam search)."""

    def __init__(self, B: int, slots: int, steps: int, device: torch.device) -> None:
        self.count = torch.empty(B, dtype=torch.long, device=device)
        self.slots = slots  # one more column, `slots`, takes the writes of rows that add nothing
        self.score = torch.empty(B, slots + 1, device=device)
        self.length = torch.empty(B, slots + 1, dtype=torch.long, device=device)
        self.step = torch.empty(B, slots + 1, dtype=torch.long, device=device)
        self.tokens = torch.empty(B, slots + 1, steps, dtype=torch.long, device=device)
        self.reset()

    def reset(self) -> None:
        for tensor in (self.count, self.score, self.length, self.step, self.tokens):
            tensor.zero_()

    def add(
        self, take: Tensor, score: Tensor, tokens: Tensor, length: Tensor, step: Tensor, room: int
    ) -> None:
        """Add, in column order, the hypotheses where ``take (B, n)``: raw ``score (B, n)``,
        ``tokens (B, n, steps)`` of which the first ``length`` count, found at ``step`` (0-d
        tensors), while their sentence holds fewer than ``room``."""
        slot = self.count[:, None] + take.long().cumsum(dim=1) - 1
        take = take & (slot < room)
        slot = torch.where(take, slot, self.slots)
        self.score.scatter_(1, slot, score)
        self.length.scatter_(1, slot, length.expand_as(slot))
        self.step.scatter_(1, slot, step.expand_as(slot))
        self.tokens.scatter_(1, slot[..., None].expand_as(tokens), tokens)
        self.count.add_(take.sum(dim=1))

    def hypotheses(self, nbest: int, alpha: float) -> list[list[Hypothesis]]:
        """Per sentence its ``nbest`` best, sorted as `generate`'s beam search sorts them
        (stable, best first)."""
        results = []
        rows = zip(
            self.count.tolist(),
            self.score.tolist(),
            self.length.tolist(),
            self.step.tolist(),
            self.tokens.tolist(),
            strict=True,
        )
        for count, scores, lengths, steps, tokens in rows:
            hyps = [
                Hypothesis(tokens[j][: lengths[j]], scores[j] / length_penalty(steps[j] + 1, alpha))
                for j in range(count)
            ]
            results.append(sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest])
        return results


def replayed(
    step: Callable[[], None], reset: Callable[[], None], device: torch.device
) -> Callable[[], None]:
    """`step` (no arguments; tensors of `device` changed in place; no read of the device) as a
    function to call once a step: on a GPU one CUDA graph of it, captured after a warm-up call
    on a side stream, elsewhere `step` itself. The warm-up changes the state, so `reset`
    restores it afterwards. Where the capture fails, `step` runs eagerly, with a warning
    naming why (`decode.cuda_graphs=false` silences it)."""
    if device.type != "cuda":
        return step
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # kernels chosen and workspaces made outside the capture
            step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    except RuntimeError as error:  # an operator that cannot be captured, on this torch
        warnings.warn(
            f"decoding without CUDA graphs: capturing the search's step failed ({error}); "
            "decode.cuda_graphs=false silences this",
            RuntimeWarning,
            stacklevel=3,
        )
        reset()
        return step
    reset()
    return graph.replay
