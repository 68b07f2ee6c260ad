"""The CPU kernels of the training loss (`kernels=cpu`; `aiayn.training.loss` chooses them).

`fused_label_smoothed_loss` never materialises the log-probabilities: the forward pass reduces
the logits to three numbers per token (log-sum-exp, gold logit, mean logit), and the backward
pass writes the gradient, softmax - smoothed target, into one buffer. Autograd over
`log_softmax` + `gather` + `mean` would keep a float32 copy of the whole batch's
log-probabilities and build three more of that size in backward.

`blocked_projected_loss` goes further for training: it takes the decoder's features and the
output layer, builds the logits a block of rows at a time, and computes the loss and the
gradients of the features and the output matrix in the same loop, so that neither the
batch's logits nor their gradient is ever whole (as Liger Kernel's and Apple's Cut
Cross-Entropy do on GPUs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from aiayn.kernels.policy import cpu_kernels
from aiayn.model.embedding import OutputProjection


def _at_least_float32(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


CHUNK_ELEMENTS = 1 << 20  # logits per block of rows in `_logsumexp_rows` (4 MiB in float32)


def _logsumexp_rows(logits: Tensor) -> Tensor:
    """``logits (N, V)`` -> log-sum-exp of each row ``(N,)``, at least float32, a block of rows
    at a time: ``torch.logsumexp`` builds two temporaries of its input's size (its shifted and
    exponentiated copies), which for a whole batch's logits leave the cache, and at the
    paper's batch and vocabulary would be two buffers of gigabytes (the blocked form is the
    faster one in `benchmarks/kernels.py`; `benchmarks/RESULTS.md`)."""
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


def fused_label_smoothed_loss(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """(mean label-smoothed loss, mean NLL) of ``logits (N, V)`` against ``target (N,)``
    without the log-probabilities (see the module's docstring)."""
    return _LabelSmoothedCE.apply(logits, target, epsilon, pad_id)


BLOCK_ROWS = 256  # rows of logits per block in `projected_label_smoothed_loss`


class _ProjectedLabelSmoothedCE(torch.autograd.Function):
    """(loss, nll) of ``logits = x @ weight.T + bias`` against ``target (N,)``, the logits built
    ``rows`` at a time and never whole, their products in ``dtype`` and their softmax in at
    least float32; with ``grads`` the forward pass also computes the gradients of the loss (for
    an upstream gradient of 1, in the inputs' dtypes), which backward scales."""

    @staticmethod
    @torch.autocast("cpu", enabled=False)  # the products' dtype is explicit (CPU only)
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        epsilon: float,
        pad_id: int,
        rows: int,
        grads: bool,
        dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        """``x (N, D)``, ``weight (V, D)``, ``bias (V,)``, ``target (N,)``."""
        (n, _), vocab = x.shape, weight.size(0)
        soft = torch.promote_types(dtype, torch.float32)  # the softmax's and the sums' dtype
        keep = target.ne(pad_id)
        share = keep.to(soft) / keep.sum().clamp(min=1)  # (N,) each row's weight in the mean
        x_p, w_p = x.to(dtype), weight.to(dtype)
        b_p = bias.to(dtype) if bias is not None else None
        gold, gold_log_prob = x.new_empty(n, dtype=soft), x.new_empty(n, dtype=soft)
        if grads:
            grad_x = torch.empty_like(x)
            grad_w = torch.zeros(weight.shape, dtype=soft, device=x.device)
            grad_b = torch.zeros_like(bias, dtype=soft) if bias is not None else None
        products = x.new_empty(min(rows, n), vocab, dtype=dtype)
        block = products if soft == dtype else torch.empty_like(products, dtype=soft)
        for start in range(0, n, rows):
            rows_here = slice(start, start + rows)
            xb, tb = x_p[rows_here], target[rows_here].unsqueeze(-1)
            size = xb.size(0)
            if b_p is None:
                logits = torch.mm(xb, w_p.t(), out=products[:size])
            else:
                logits = torch.addmm(b_p, xb, w_p.t(), out=products[:size])
            logits = block[:size].copy_(logits) if soft != dtype else logits
            gold[rows_here] = logits.gather(-1, tb).squeeze(-1)
            # in place: one fused pass, where logsumexp would build two temporaries
            log_probs = torch.log_softmax(logits, -1, out=logits)
            gold_log_prob[rows_here] = log_probs.gather(-1, tb).squeeze(-1)
            if not grads:
                continue
            # d loss / d logits = share * (softmax - ε / V - (1 - ε) onehot(target)), formed here
            # in float32 (or float64), before any rounding to the products' dtype
            row_share = share[rows_here].unsqueeze(-1)
            grad = log_probs.exp_().sub_(epsilon / vocab)
            grad.scatter_add_(-1, tb, grad.new_full((size, 1), epsilon - 1)).mul_(row_share)
            if grad_b is not None:
                grad_b.add_(grad.sum(0))
            grad_p = products[:size].copy_(grad) if soft != dtype else grad
            if grad_x.dtype == dtype:
                torch.mm(grad_p, w_p, out=grad_x[rows_here])
            else:  # a bfloat16 product into float32 features' gradient
                grad_x[rows_here] = grad_p @ w_p
            if soft == dtype:
                grad_w.addmm_(grad_p.t(), xb)
            else:  # bfloat16 products, summed in float32 block by block
                grad_w.add_(grad_p.t() @ xb)
        # the mean logit of a row is linear in x: x @ mean(weight) + mean(bias)
        mean = x.to(soft) @ weight.to(soft).mean(0)
        if bias is not None:
            mean += bias.to(soft).mean()
        lse = gold - gold_log_prob  # log-sum-exp of each row's logits
        nll = -(gold_log_prob * share).sum()
        smooth = ((lse - mean) * share).sum()
        ctx.mark_non_differentiable(nll)
        if grads:
            saved = [grad_x, grad_w.to(weight.dtype)]
            if grad_b is not None:
                saved.append(grad_b.to(bias.dtype))
            ctx.save_for_backward(*saved)
        return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: Tensor, grad_nll: Tensor | None) -> tuple:
        grad_x, grad_w, *grad_b = (g * grad_loss for g in ctx.saved_tensors)
        bias = grad_b[0] if grad_b else None
        return grad_x, grad_w, bias, None, None, None, None, None, None


def product_dtype(x: Tensor, weight: Tensor) -> torch.dtype | None:
    """The dtype in which `projected_label_smoothed_loss` takes its blocked path for features
    ``x`` and output matrix ``weight``, or None where it builds the logits whole. On the CPU,
    for plain tensors (weights that FSDP holds sharded, as DTensor, build them whole): under
    bf16 autocast (bf16-mixed) bfloat16, the features and the matrix each float32 or bfloat16;
    otherwise the dtype of both, float32, float64 or bfloat16 (bf16 weights). GPUs and float16
    build them whole (measured on CPUs only)."""
    if not (
        cpu_kernels()
        and x.device.type == "cpu"
        and type(x) is torch.Tensor
        and type(weight) in (torch.Tensor, nn.Parameter)
        and x.numel() > 0
    ):
        return None
    castable = (torch.float32, torch.bfloat16)
    if torch.is_autocast_enabled("cpu") and x.dtype in castable and weight.dtype in castable:
        dtype = torch.get_autocast_dtype("cpu")
        return dtype if dtype == torch.bfloat16 else None
    if x.dtype != weight.dtype:
        return None
    return x.dtype if x.dtype in (torch.float32, torch.float64, torch.bfloat16) else None


def blocked_projected_loss(
    x: Tensor,
    output: OutputProjection,
    target: Tensor,
    epsilon: float,
    pad_id: int,
    rows: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """(loss, nll) of ``output``'s logits of ``x (B, T, D)`` (after its projection, if any)
    against ``target (B, T)``, ``rows`` rows at a time with the products in ``dtype`` (what
    `product_dtype` gave); in a pass that takes gradients, they are computed in the loop."""
    grads = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, output.weight, output.bias)
    )
    return _ProjectedLabelSmoothedCE.apply(
        x.reshape(-1, x.size(-1)),
        output.weight,
        output.bias,
        target.reshape(-1),
        epsilon,
        pad_id,
        rows,
        grads,
        dtype,
    )
