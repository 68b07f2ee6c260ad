"""`CPUDropout` (what `aiayn.kernels.accelerate` makes of ``nn.Dropout``): CPU masks from
random integers, two elements a draw.

torch's CPU dropout draws its mask with ``bernoulli_``, which runs serially, element by
element. ``int32.random_()`` draws 31 uniform bits several times faster (``benchmarks/
kernels.py``), and each draw here serves two elements:
its low 16 bits and its high 15 bits, each compared with its own threshold, keep an element
with probability ``1 - q / 2**15``, ``q = round(p * 2**15)``: the rate is ``p`` to within
2**-16 (0.1 is 0.100006), and what is kept is scaled by ``2**15 / (2**15 - q)``, so that the
expected output is exactly the input. The mask is kept as bools for the backward pass (1 byte
an element, where torch keeps 4-byte float noise).

The masks come from the same generator as torch's (the default CPU generator, which
``seed_everything`` seeds), so runs stay reproducible, but from another stream: for one seed
they differ from ``F.dropout``'s. GPUs (torch's fused kernel), ``torch.compile`` (inductor
draws its own masks), tensor subclasses and a ``p`` that rounds to ``2**15 / 2**15``
(``p >= 1 - 2**-16``) take ``F.dropout``. ``benchmarks/kernels.py`` times it against torch's,
one training update included.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.kernels.policy import cpu_kernels

HALF = 2**15  # a draw's high half is uniform in [0, HALF); its low half, as int16, in [-HALF, HALF)
LOW_HALF_FIRST = sys.byteorder == "little"  # the order of an int32's two int16 halves in memory


def keep_mask(shape: Sequence[int], p: float) -> Tensor:
    """Bools of ``shape``, each True with probability ``1 - round(p * 2**15) / 2**15``,
    independently: two elements from each 31-bit draw of the default CPU generator."""
    n = math.prod(shape)
    q = round(p * HALF)
    draws = torch.empty((n + 1) // 2, dtype=torch.int32).random_()  # uniform in [0, 2**31)
    low, high = 2 * q - HALF, q  # P(low half >= low) = P(high half >= high) = 1 - q / HALF
    thresholds = torch.tensor([low, high] if LOW_HALF_FIRST else [high, low], dtype=torch.int16)
    keep = draws.view(torch.int16).view(-1, 2) >= thresholds
    return keep.view(-1)[:n].view(shape)


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
    cpu = x.device.type == "cpu" and type(x) is Tensor and cpu_kernels()
    q = round(p * HALF)
    if not cpu or q >= HALF or torch.compiler.is_compiling():  # inductor draws its own
        return F.dropout(x, p, training)
    return _Keep.apply(x, keep_mask(x.shape, p), HALF / (HALF - q))  # 1 / the kept share


class CPUDropout(nn.Dropout):
    """``nn.Dropout`` (same arguments, no state) through `dropout`."""

    def forward(self, input: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(input)
        return dropout(input, self.p, self.training)
