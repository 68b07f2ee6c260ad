"""The paper's training loss: label-smoothed cross-entropy over the non-padding targets.

With `kernels=torch`: torch's fused ``F.cross_entropy(label_smoothing=)`` over the whole
logits. With the CPU kernels (`kernels=cpu`, the CPU's `auto`) and on CUDA with `kernels=gpu`
(the GPU's `auto`): `aiayn.kernels.loss`, which never builds the log-probabilities and, for
training, fuses the output layer into the loss a block of rows at a time, so that the float32
logits of the batch (N x V) never exist. They give the same loss and gradients
(`tests/training/test_projected_loss.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.kernels.loss import (
    blocked_projected_loss,
    fused_label_smoothed_loss,
    product_dtype,
)
from aiayn.kernels.policy import cpu_kernels
from aiayn.model.embedding import OutputProjection

__all__ = [
    "label_smoothed_loss",
    "product_dtype",
    "projected_label_smoothed_loss",
    "torch_label_smoothed_loss",
]


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
    logits, target = logits.reshape(-1, vocab), target.reshape(-1)
    if logits.device.type != "cpu" or not cpu_kernels():
        return torch_label_smoothed_loss(logits, target, epsilon, pad_id)
    return fused_label_smoothed_loss(logits, target, epsilon, pad_id)


def torch_label_smoothed_loss(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int = 0
) -> tuple[Tensor, Tensor]:
    """`label_smoothed_loss` by torch's own fused ``F.cross_entropy(label_smoothing=)`` (what
    GPUs and ``kernels=torch`` run): ``logits (N, V)``, ``target (N,)``. The NLL (for the
    perplexity) is a second cross-entropy without gradients."""
    loss = F.cross_entropy(logits, target, ignore_index=pad_id, label_smoothing=epsilon)
    with torch.no_grad():
        nll = F.cross_entropy(logits, target, ignore_index=pad_id)
    return loss, nll


def projected_label_smoothed_loss(
    features: Tensor,
    output: OutputProjection,
    target: Tensor,
    epsilon: float,
    pad_id: int = 0,
    rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``label_smoothed_loss(output(features), target, epsilon, pad_id)``, with the output
    layer fused into the loss: ``features (B, T, D)`` (the decoder's, before ``output``),
    ``target (B, T)``.

    Where `product_dtype` allows (the CPU kernels; CUDA under `kernels=gpu`), the logits are
    built a block of rows at a time (``rows`` rows; None: `BLOCK_ROWS`, a block small enough
    to stay in the CPU's cache, or on CUDA `GPU_BLOCKS` blocks of the batch, a number that
    does not depend on its size, for `torch.compile`) and reduced at once to the loss; in a pass
    that takes gradients, the gradients of the features, the output matrix and its bias are
    computed in the same loop from the block's softmax, so the batch's logits and their
    gradient, two arrays of N x V, never exist. The loop's products are the same three as
    autograd's (logits, features' and matrix's gradients), in the dtype autocast would give
    them (bf16 under bf16-mixed); the softmax, the loss, each block's gradient of the logits
    (rounded to the products' dtype only as a whole, as autocast rounds it) and the sums of the
    matrix's gradient are in float32 (float64 for float64). Backward only scales the saved
    gradients (the saved pass cannot be differentiated twice). Elsewhere: the logits whole,
    then `label_smoothed_loss`.
    """
    x = output.proj(features) if output.proj is not None else features
    dtype = product_dtype(x, output.weight)
    if dtype is None:
        return label_smoothed_loss(output(features), target, epsilon, pad_id)
    return blocked_projected_loss(x, output, target, epsilon, pad_id, rows, dtype)
