"""The kernels of the training loss (`kernels=cpu` on the CPU, `kernels=gpu` on CUDA;
`aiayn.training.loss` chooses them).

`fused_label_smoothed_loss` never materialises the log-probabilities: the forward pass reduces
the logits to three numbers per token (log-sum-exp, gold logit, mean logit), and the backward
pass writes the gradient, softmax - smoothed target, into one buffer. Autograd over
`log_softmax` + `gather` + `mean` would keep a float32 copy of the whole batch's
log-probabilities and build three more of that size in backward.

`blocked_projected_loss` goes further for training: it takes the decoder's features and the
output layer, builds the logits a block of rows at a time, and computes the loss and the
gradients of the features and the output matrix in the same loop, so that neither the
batch's logits nor their gradient is ever whole (as Liger Kernel's and Apple's Cut
Cross-Entropy do on GPUs). It is plain PyTorch (``torch.mm``/``addmm``, cuBLAS on a GPU), the
path of the CPU kernels and of CUDA tensors under `kernels=gpu`; with a constant number of
blocks on CUDA (`GPU_BLOCKS`) it traces into one graph for `torch.compile`, whatever the batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from aiayn.kernels.policy import cpu_kernels, gpu_kernels
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


BLOCK_ROWS = 256  # CPU: rows of logits per block in `projected_label_smoothed_loss`
GPU_BLOCKS = 8  # CUDA: blocks per batch, a constant so that a compiled step keeps one graph
GPU_DEVICES = ("cuda",)  # the devices whose tensors `kernels=gpu` gives the blocked loss


class _ProjectedLabelSmoothedCE(torch.autograd.Function):
    """(loss, nll) of ``logits = x @ weight.T + bias`` against ``target (N,)``, the logits built
    a block of rows at a time (``blocks`` blocks, `Tensor.tensor_split`'s) and never whole,
    their products in ``dtype`` and their softmax in at least float32; with ``grads`` the
    forward pass also computes the gradients of the loss summed over the kept rows (in the
    inputs' dtypes, each row's gradient of the logits within [-1, 1], so that float16
    products neither underflow nor overflow), which backward scales by the upstream gradient
    over the number of kept rows (a GradScaler's scale included)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        epsilon: float,
        pad_id: int,
        blocks: int,
        grads: bool,
        dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        """``x (N, D)``, ``weight (V, D)``, ``bias (V,)``, ``target (N,)``."""
        with torch.autocast(x.device.type, enabled=False):  # the products' dtype is explicit
            vocab = weight.size(0)
            soft = torch.promote_types(dtype, torch.float32)  # the softmax's and the sums' dtype
            keep = target.ne(pad_id)
            ntokens = keep.sum().clamp(min=1)
            x_p, w_p = x.to(dtype), weight.to(dtype)
            b_p = bias.to(dtype) if bias is not None else None
            x_blocks, t_blocks = x_p.tensor_split(blocks), target.tensor_split(blocks)
            k_blocks = keep.tensor_split(blocks)
            golds, gold_log_probs, grad_xs = [], [], []
            if grads:
                grad_w = torch.zeros(weight.shape, dtype=soft, device=x.device)
                grad_b = torch.zeros_like(bias, dtype=soft) if bias is not None else None
            # one buffer for every block's products (the first block is the largest)
            products = x.new_empty(x_blocks[0].size(0), vocab, dtype=dtype)
            block = products if soft == dtype else torch.empty_like(products, dtype=soft)
            for xb, tb, kb in zip(x_blocks, t_blocks, k_blocks, strict=True):
                tb, size = tb.unsqueeze(-1), xb.size(0)
                if b_p is None:
                    logits = torch.mm(xb, w_p.t(), out=products[:size])
                else:
                    logits = torch.addmm(b_p, xb, w_p.t(), out=products[:size])
                logits = block[:size].copy_(logits) if soft != dtype else logits
                golds.append(logits.gather(-1, tb).squeeze(-1))
                # in place: one fused pass, where logsumexp would build two temporaries
                log_probs = torch.log_softmax(logits, -1, out=logits)
                gold_log_probs.append(log_probs.gather(-1, tb).squeeze(-1))
                if not grads:
                    continue
                # d summed loss / d logits = kept * (softmax - ε / V - (1 - ε) onehot(target)):
                # the softmax and the one-hot part formed here in float32 (or float64), before
                # any rounding to the products' dtype; the kept rows (masks on the features and
                # the features' gradient) and the constant ε / V (whose products are a sum of
                # the matrix's rows and of the kept features) are applied to the small (N, D)
                # and (V, D) products instead, which saves two passes over the block
                grad = log_probs.exp_()
                grad.scatter_add_(-1, tb, grad.new_full((size, 1), epsilon - 1))
                kept = kb.unsqueeze(-1)
                if grad_b is not None:
                    grad_b.add_(kb.to(soft) @ grad)
                grad_p = products[:size].copy_(grad) if soft != dtype else grad
                grad_xs.append(grad_p @ w_p)
                if soft == dtype:
                    grad_w.addmm_(grad_p.t(), xb * kept)
                else:  # bfloat16 or float16 products, summed in float32 block by block
                    grad_w.add_(grad_p.t() @ (xb * kept))
            gold, gold_log_prob = torch.cat(golds), torch.cat(gold_log_probs)
            # the mean logit of a row is linear in x: x @ mean(weight) + mean(bias)
            mean = x.to(soft) @ weight.to(soft).mean(0)
            if bias is not None:
                mean += bias.to(soft).mean()
            lse = gold - gold_log_prob  # log-sum-exp of each row's logits
            share = keep.to(soft) / ntokens  # (N,) each row's weight in the mean
            nll = -(gold_log_prob * share).sum()
            smooth = ((lse - mean) * share).sum()
            ctx.mark_non_differentiable(nll)
            if grads:
                uniform = epsilon / vocab
                grad_x = (torch.cat(grad_xs).to(soft) - uniform * weight.to(soft).sum(0)) * (
                    keep.unsqueeze(-1)
                )
                grad_w -= uniform * (keep.to(soft) @ x.to(soft))  # each row of the matrix
                saved = [ntokens, grad_x.to(x.dtype), grad_w.to(weight.dtype)]
                if grad_b is not None:
                    grad_b -= uniform * keep.sum().to(soft)
                    saved.append(grad_b.to(bias.dtype))
                ctx.save_for_backward(*saved)
            return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: Tensor, grad_nll: Tensor | None) -> tuple:
        ntokens, *summed = ctx.saved_tensors
        scale = grad_loss / ntokens
        grad_x, grad_w, *grad_b = (g * scale.to(g.dtype) for g in summed)
        bias = grad_b[0] if grad_b else None
        return grad_x, grad_w, bias, None, None, None, None, None, None


def product_dtype(x: Tensor, weight: Tensor) -> torch.dtype | None:
    """The dtype in which `projected_label_smoothed_loss` takes its blocked path for features
    ``x`` and output matrix ``weight``, or None where it builds the logits whole: for plain
    tensors (weights that FSDP holds sharded, as DTensor, build them whole) on the CPU under
    ``kernels=cpu`` and on CUDA under ``kernels=gpu`` (the GPU's ``auto``). Under autocast
    the autocast dtype (bfloat16; CUDA's float16 too: the blocked gradients stay within
    float16's range), the features and the matrix each float32 or bfloat16; otherwise the
    dtype of both, float32, float64 or bfloat16 (CUDA: float16 too). ``kernels=torch`` builds
    them whole everywhere (``F.cross_entropy``)."""
    device = x.device.type
    allowed = (device == "cpu" and cpu_kernels()) or (device in GPU_DEVICES and gpu_kernels())
    if not (
        allowed
        and type(x) is torch.Tensor
        and type(weight) in (torch.Tensor, nn.Parameter)
        and x.numel() > 0
    ):
        return None
    gpu = device in GPU_DEVICES and gpu_kernels()
    halves = (torch.bfloat16, torch.float16) if gpu else (torch.bfloat16,)
    castable = (torch.float32, *halves)
    if torch.is_autocast_enabled(device) and x.dtype in castable and weight.dtype in castable:
        dtype = torch.get_autocast_dtype(device)
        return dtype if dtype in halves else None
    if x.dtype != weight.dtype:
        return None
    return x.dtype if x.dtype in (torch.float32, torch.float64, *halves) else None


def blocked_projected_loss(
    x: Tensor,
    output: OutputProjection,
    target: Tensor,
    epsilon: float,
    pad_id: int,
    rows: int | None,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """(loss, nll) of ``output``'s logits of ``x (B, T, D)`` (after its projection, if any)
    against ``target (B, T)``, a block of ``rows`` rows at a time (None: `BLOCK_ROWS` on the
    CPU, `GPU_BLOCKS` blocks of the batch on CUDA) with the products in ``dtype`` (what
    `product_dtype` gave); in a pass that takes gradients, they are computed in the loop."""
    grads = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, output.weight, output.bias)
    )
    x, target = x.reshape(-1, x.size(-1)), target.reshape(-1)
    if rows is None and gpu_kernels():
        # rows of padding up to a multiple of the blocks: equal blocks, whatever the batch,
        # so that a compiled step keeps one graph for every batch shape
        blocks, short = GPU_BLOCKS, -x.size(0) % GPU_BLOCKS
        x, target = F.pad(x, (0, 0, 0, short)), F.pad(target, (0, short), value=pad_id)
    else:  # the CPU runs eagerly: the batch's rows are known here
        blocks = max(1, -(-x.size(0) // (rows or BLOCK_ROWS)))
    return _ProjectedLabelSmoothedCE.apply(
        x, output.weight, output.bias, target, epsilon, pad_id, blocks, grads, dtype
    )
