"""Dropout whose CPU masks come from 31-bit random integers.

torch's CPU dropout draws its mask with ``bernoulli_``, which runs serially at ~5 ns an element.
``int32.random_()`` draws 31 uniform bits an element at ~1.5 ns, and ``bits >= round(p * 2**31)``
keeps an element with probability ``1 - p`` to within 2**-31. On a 2-core Xeon one training
update ran 2-6 % faster for it (``benchmarks/kernels.py``, recorded in
``benchmarks/README.md``). The mask is kept as bools for the backward pass (1 byte an element,
where torch keeps 4-byte float noise).

The masks come from the same generator as torch's (the default CPU generator, which
``seed_everything`` seeds), so runs stay reproducible, but from another stream: for one seed
they differ from ``F.dropout``'s. GPUs (torch's fused kernel), ``torch.compile`` (inductor
draws its own masks), tensor subclasses and ``p = 1`` take ``F.dropout``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class _Keep(torch.autograd.Function):
    """``x * keep * scale`` with ``keep`` a bool mask, saved for the backward pass."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)`` with the CPU mask drawn as described above."""
    if not training or p == 0.0:
        return x
    cpu = x.device.type == "cpu" and type(x) is Tensor
    if not cpu or p >= 1.0 or torch.compiler.is_compiling():  # inductor fuses its own
        return F.dropout(x, p, training)
    bits = torch.empty(x.shape, dtype=torch.int32).random_()  # uniform in [0, 2**31)
    return _Keep.apply(x, bits >= round(p * 2**31), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same arguments, no state) through `dropout`."""

    def forward(self, input: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(input)
        return dropout(input, self.p, self.training)
