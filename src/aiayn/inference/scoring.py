"""Scoring given pairs (fairseq `--score-reference`): the model's negative log-likelihood of
each reference translation given its source, teacher-forced, as training computes it
(`x + <eos>` in, `<bos> + y` fed, `y + <eos>` scored); `evaluate.py mode=score`."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.data.dataset import collate
from aiayn.inference.translator import Translator
from aiayn.model.ensemble import Ensemble


def _logprobs(model: torch.nn.Module, src: Tensor, tgt_in: Tensor) -> Tensor:
    """``(B, T, V)`` log-probabilities of right-padded ``tgt_in`` (as `collate` pads); an
    ensemble's are the log of its members' mean."""
    members = model.members if isinstance(model, Ensemble) else [model]
    logprobs = [m(src, tgt_in, tgt_right_padded=True).float().log_softmax(-1) for m in members]
    if len(logprobs) == 1:  # no (N, B, T, V) stack and logsumexp copies for one model
        return logprobs[0]
    return torch.logsumexp(torch.stack(logprobs), dim=0) - math.log(len(logprobs))


@torch.inference_mode()
def score_pairs(
    translator: Translator,
    sources: list[str],
    references: list[str],
    batch_size: int,
    advance: Callable[[int], None] | None = None,
) -> list[tuple[int, float]]:
    """(scored target tokens, incl. the EOS; summed NLL in nats) of each pair, in order.
    Sources and references longer than the model's positions are truncated; `advance(n)` is
    called after each batch of n pairs."""
    limit = translator.max_src_tokens
    src = [row[:limit] for row in translator.tokenizers.encode(sources, "src")]
    tgt = [row[:limit] for row in translator.tokenizers.encode(references, "tgt")]
    order = sorted(range(len(src)), key=lambda i: (len(src[i]), len(tgt[i])))
    out: list[tuple[int, float]] = [(0, 0.0)] * len(src)
    model, device = translator.model, translator.device
    pad = model.config.pad_id
    for start in range(0, len(order), batch_size):
        batch = collate([(i, src[i], tgt[i]) for i in order[start : start + batch_size]])
        logprobs = _logprobs(model, batch.src.to(device), batch.tgt_in.to(device))
        target = batch.tgt_out.to(device)
        nll = -logprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        keep = target.ne(pad)
        sums, counts = (nll * keep).sum(dim=1).tolist(), keep.sum(dim=1).tolist()
        for i, total, count in zip(batch.ids.tolist(), sums, counts, strict=True):
            out[i] = (int(count), float(total))
        if advance is not None:
            advance(len(counts))
    return out
