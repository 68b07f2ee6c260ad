"""The paper's training loss: label-smoothed cross-entropy over the non-padding targets.

`label_smoothed_loss` never materialises the log-probabilities: the forward pass reduces the
logits to three numbers per token (log-sum-exp, gold logit, mean logit), and the backward pass
writes the gradient, softmax - smoothed target, into one buffer. Autograd over
`log_softmax` + `gather` + `mean` would keep a float32 copy of the whole batch's
log-probabilities and build three more of that size in backward; at a vocabulary of 8 000
that is most of a small model's step outside the matrix products.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _at_least_float32(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


CHUNK_ELEMENTS = 1 << 20  # logits per block of rows in `_logsumexp_rows` (4 MiB in float32)


def _logsumexp_rows(logits: Tensor) -> Tensor:
    """``logits (N, V)`` -> log-sum-exp of each row ``(N,)``, at least float32, a block of rows
    at a time: ``torch.logsumexp`` builds two temporaries of its input's size (its shifted and
    exponentiated copies), which for a whole batch's logits leave the cache (1536 x 8000: 7-10 ms
    whole, 4.5-5 ms in blocks on a 2-core Sapphire Rapids Xeon; ``benchmarks/kernels.py``) and
    at the paper's batch and vocabulary (25k x 37k) would be two 3.7 GB buffers."""
    rows = max(1, CHUNK_ELEMENTS // max(1, logits.size(-1)))
    return torch.cat([_at_least_float32(block).logsumexp(-1) for block in logits.split(rows)])


class _LabelSmoothedCE(torch.autograd.Function):
    """(loss, nll) of `logits (N, V)` against `target (N,)`; rows at `pad_id` do not count."""

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, epsilon: float, pad_id: int
    ) -> tuple[Tensor, Tensor]:
        lse = _logsumexp_rows(logits)
        gold = _at_least_float32(logits.gather(-1, target.unsqueeze(-1)).squeeze(-1))
        mean = logits.mean(dim=-1, dtype=lse.dtype)
        keep = target.ne(pad_id)
        ntokens = keep.sum().clamp(min=1)
        nll = ((lse - gold) * keep).sum() / ntokens
        smooth = ((lse - mean) * keep).sum() / ntokens
        ctx.save_for_backward(logits, target, lse, keep, ntokens)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, grad_nll: Tensor | None) -> tuple:
        logits, target, lse, keep, ntokens = ctx.saved_tensors
        epsilon, vocab = ctx.epsilon, logits.size(-1)
        # d loss / d logits = softmax - (1 - ε) onehot(target) - ε / V, per kept row / ntokens
        grad = _at_least_float32(logits).sub(lse.unsqueeze(-1)).exp_()
        grad.sub_(epsilon / vocab)
        grad.scatter_add_(-1, target.unsqueeze(-1), grad.new_full((grad.size(0), 1), epsilon - 1))
        grad.mul_((keep * (grad_loss / ntokens)).unsqueeze(-1))
        return grad.to(logits.dtype), None, None, None


def label_smoothed_loss(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int = 0
) -> tuple[Tensor, Tensor]:
    """Mean label-smoothed loss and mean NLL (detached) over the non-padding targets of one
    batch.

    (The mean is per batch: with gradient accumulation or DDP the update averages the batch
    means, where fairseq normalises by the tokens of the whole update.)

    logits (B, T, V), target (B, T) with `pad_id` where there is no token. The smoothed target
    puts 1 - ε on the gold token and ε spread uniformly over the vocabulary (as torch and the
    paper): loss = (1 - ε) · NLL + ε · mean over the vocabulary of -log p.
    """
    vocab = logits.size(-1)
    return _LabelSmoothedCE.apply(logits.reshape(-1, vocab), target.reshape(-1), epsilon, pad_id)
