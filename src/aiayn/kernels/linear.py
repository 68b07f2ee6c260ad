"""`CPULinear` and `CPUOutputProjection` (what `aiayn.kernels.accelerate` makes of
``nn.Linear`` and the output layer): float32 CPU products on oneDNN instead of MKL, or on
MKL-packed weights while decoding.

torch sends CPU matrix products (``F.linear``, ``@``) to MKL, which on AMD CPUs takes its AVX2
code path even where the CPU has AVX-512. oneDNN (which torch also ships) uses AVX-512 there
and is much faster at float32 accuracy; on AMD CPUs with AVX2 only, MKL is as fast or faster.
So by default (`use_onednn`) oneDNN takes the products on AMD CPUs with AVX-512 and MKL keeps
them elsewhere (Intel's MKL uses its own AVX-512 and AMX); ``AIAYN_ONEDNN=1`` or ``0`` forces
the choice. One layer prefers oneDNN on every AMD CPU (`DECODE_ONEDNN`): the output
projection while decoding (`OutputProjection`), a few rows times the whole vocabulary, where
AMD's MKL path is slow even on CPUs where it is fast otherwise; on Intel CPUs MKL is as fast
there or faster, so it keeps MKL; ``0`` overrides that too. The measurements behind each
choice: ``benchmarks/kernels.py`` and ``benchmarks/machine.py``, recorded in
``benchmarks/RESULTS.md``.
Where oneDNN is on, ``linear`` sends float32 CPU products to it
(``torch.ops.mkldnn._linear_pointwise``, in the forward pass and for both products of the
backward pass) and everything else to ``F.linear``: GPUs, other dtypes and autocast
(bf16-mixed), ``torch.compile`` (inductor picks its own kernels), tensor subclasses such as
FSDP's DTensor, and empty inputs; torch's ``torch.backends.mkldnn.flags(enabled=False)``
sends everything to ``F.linear`` too.

Decoding reuses every weight at each step, a few rows at a time, so inside
``packed_weights(model)`` the float32 products run on weights that MKL packed once into its own
blocked layout (``cblas_sgemm_pack``/``cblas_sgemm_compute`` through ``torch.ops.mkl``, as
CTranslate2 does), instead of re-blocking a piece of each weight in every product.
`Translator.decoding` holds it over evaluate.py's and translate.py's batches; a lone
`generate` call does not pack, since packing inside one call gained nothing reliable on 32
sentences and lost on one; products of fewer than `PACKED_MIN_ROWS` rows take the weights.
Packing pays on Intel CPUs, more at 32 rows than at 128 (``benchmarks/kernels.py``). It
is on for Intel CPUs (`use_packing`); ``AIAYN_PACK_WEIGHTS=1`` or ``0`` forces it on for any
CPU (where its packed products then take precedence over oneDNN's) or off. Passes that take
gradients, ``torch.compile``, ``torch.backends.mkldnn.flags(enabled=False)`` and whatever
``F.linear`` takes above never use the packed copies.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.kernels.machine import cpu_flags, cpu_vendor, onednn_product
from aiayn.kernels.policy import cpu_kernels
from aiayn.model.embedding import OutputProjection


def use_onednn(setting: str | None, vendor: str, flags: list[str]) -> bool:
    """Whether float32 CPU products go to oneDNN: ``setting`` (AIAYN_ONEDNN) "1" yes, "0" no;
    unset or "auto": on AMD CPUs with AVX-512, where MKL runs its AVX2 code at half the speed."""
    if setting not in (None, "", "auto", "0", "1"):
        warnings.warn(
            f"AIAYN_ONEDNN={setting!r} is not 1 (oneDNN), 0 (MKL) or auto: using auto",
            stacklevel=2,
        )
    elif setting in ("0", "1"):
        return setting == "1"
    return vendor == "AuthenticAMD" and "avx512f" in flags


SETTING = os.environ.get("AIAYN_ONEDNN")
VENDOR = cpu_vendor()
ENABLED = torch.backends.mkldnn.is_available() and use_onednn(
    SETTING, VENDOR, cpu_flags()
)  # and torch's own switch, `torch.backends.mkldnn.flags(enabled=False)`, is read at each call
MKL_FORCED = SETTING == "0"  # then a layer's own preference (`linear(onednn=True)`) yields too


MKL_PACKING = (  # whether this torch can pack weights (the packed copy is a oneDNN tensor)
    torch.backends.mkl.is_available()
    and torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkl, "_mkl_linear")
)


def use_packing(setting: str | None, vendor: str) -> bool:
    """Whether `packed_weights` packs: ``setting`` (AIAYN_PACK_WEIGHTS) "1" yes, "0" no; unset
    or "auto": on Intel CPUs (where it was measured); never where torch cannot
    (`MKL_PACKING`)."""
    if setting not in (None, "", "auto", "0", "1"):
        warnings.warn(
            f"AIAYN_PACK_WEIGHTS={setting!r} is not 1 (pack), 0 (do not) or auto: using auto",
            stacklevel=2,
        )
        setting = None
    if setting in ("0", "1"):
        return MKL_PACKING and setting == "1"
    return MKL_PACKING and vendor == "GenuineIntel"


PACKING = use_packing(os.environ.get("AIAYN_PACK_WEIGHTS"), VENDOR)
PACK_ROWS = 64  # a sizing hint MKL packs for; the packed weight serves any row count
# fewer rows than this take the weights themselves: packing gains nothing there, and a decode
# of one sentence ran slower on packed weights (``benchmarks/kernels.py``)
PACKED_MIN_ROWS = 4


def decode_on_onednn(vendor: str) -> bool:
    """Whether `OutputProjection` decodes (no gradients) on oneDNN: on AMD CPUs, where MKL is
    slow at a step's few rows x the whole vocabulary (see the module docstring)."""
    return vendor == "AuthenticAMD"


DECODE_ONEDNN = decode_on_onednn(VENDOR)


class _OneDNNLinear(torch.autograd.Function):
    """``x (M, K)``, ``weight (N, K)``, ``bias (N,)`` -> ``(M, N)``: 2-D, so that the output is
    no view and takes in-place operations."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_product(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if torch.is_grad_enabled():  # create_graph: oneDNN's op has no derivative, torch's has
            grad_x = grad @ weight if ctx.needs_input_grad[0] else None
            grad_w = grad.t() @ x if ctx.needs_input_grad[1] else None
        else:
            if ctx.needs_input_grad[0]:  # grad @ weight
                grad_x = onednn_product(grad, weight.t())
            if ctx.needs_input_grad[1]:  # grad.T @ x, (N, K); oneDNN is fastest writing N < K
                N, K = weight.shape
                if N > K:
                    grad_w = onednn_product(x.t(), grad.t()).t().contiguous()
                else:
                    grad_w = onednn_product(grad.t(), x.t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(dim=0)
        return grad_x, grad_w, grad_b


class Packed(NamedTuple):
    """A weight as MKL packed it (`pack`), and what identifies the weight it was packed from:
    the tensor, its memory and its version counter (which in-place changes move)."""

    tensor: Tensor
    weight_id: int
    data_ptr: int
    version: int

    def of(self, weight: Tensor) -> bool:
        """Whether this is still a copy of ``weight``: not of another tensor, not from before
        an in-place change. Writes through ``weight.data`` and fused optimizers' updates move
        no version counter, so the weights must not change while copies are held."""
        return (self.weight_id, self.data_ptr, self.version) == _identity(weight)


def _identity(weight: Tensor) -> tuple[int, int, int]:
    # an inference tensor has no version counter (only inference-mode code may change it)
    version = -1 if weight.is_inference() else weight._version
    return id(weight), weight.data_ptr(), version


def _plain_float32_cpu(t: Tensor) -> bool:
    """A float32 CPU tensor or parameter, no subclass (such as FSDP's DTensor)."""
    plain = type(t) in (torch.Tensor, nn.Parameter)
    return plain and t.device.type == "cpu" and t.dtype == torch.float32 and cpu_kernels()


def _float32_cpu(x: Tensor, weight: Tensor) -> bool:
    return (
        _plain_float32_cpu(x)
        and _plain_float32_cpu(weight)
        and x.numel() > 0
        and not torch.is_autocast_enabled("cpu")
    )


def _onednn(x: Tensor, weight: Tensor, prefer: bool | None) -> bool:
    return (
        not torch.compiler.is_compiling()  # first: under compile the rest is moot
        and (ENABLED if prefer is None else prefer and not MKL_FORCED)
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and _float32_cpu(x, weight)
    )


def pack(weight: Tensor) -> Packed | None:
    """``weight (N, K)`` packed by MKL for products ``x (M, K) @ weight.T`` with any M; None
    for what `linear` would not run on it (not a 2-D float32 CPU tensor, or no MKL)."""
    if not (MKL_PACKING and weight.dim() == 2 and _plain_float32_cpu(weight)):
        return None
    with torch.no_grad():
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), PACK_ROWS)
    return Packed(packed, *_identity(weight))


def packed_product(x: Tensor, packed: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x (M, K) @ weight (N, K).T + bias (N,)`` -> ``(M, N)`` on MKL's ``packed`` copy of
    ``weight``. torch's op takes the packed copy only where its last argument equals M (the
    row count it was packed for, else it falls back to ``F.linear``); MKL's packed weight
    serves any M, as CTranslate2 uses it, so M is passed."""
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, x.size(0))


class PackableMixin:
    """A module whose ``weight`` (and ``bias``) `packed_weights` may pack into ``packed``."""

    weight: Tensor
    packed: Packed | None = None


@contextmanager
def packed_weights(model: object) -> Iterator[None]:
    """Inside the block, inference products of ``model``'s `Linear` and output layers run on
    MKL-packed copies of their weights (see the module docstring), where `PACKING` is on; the
    copies take memory of their own and are dropped on exit. Entered again
    inside itself, it packs nothing anew. A copy no longer `Packed.of` its weight is not used.
    Anything but an ``nn.Module`` (a stand-in that `generate` decodes) has nothing to pack."""
    modules = model.modules() if PACKING and isinstance(model, nn.Module) else ()
    fresh = [m for m in modules if isinstance(m, PackableMixin) and m.packed is None]
    for module in fresh:
        module.packed = pack(module.weight)
    try:
        yield
    finally:
        for module in fresh:
            module.packed = None


def _grads(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    return torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )


def _use_packed(x: Tensor, weight: Tensor, bias: Tensor | None, packed: Packed) -> bool:
    """Cheapest and most often decisive first (this runs for every product of a decode step);
    ``packed.of(weight)`` stands for the weight's own checks, made when it was packed."""
    return (
        not torch.compiler.is_compiling()  # before anything dynamo would have to trace
        and x.numel() >= PACKED_MIN_ROWS * x.size(-1)
        and x.dtype == torch.float32
        and x.is_cpu
        and type(x) is torch.Tensor
        and not torch.is_autocast_enabled("cpu")
        and not _grads(x, weight, bias)
        and torch.backends.mkldnn.enabled
        and packed.of(weight)
    )


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    onednn: bool | None = None,
    packed: Packed | None = None,
) -> Tensor:
    """``F.linear``: ``x (..., K)``, ``weight (N, K)``, ``bias (N,)`` -> ``(..., N)``; without
    gradients on ``packed`` (`pack`'s copy of ``weight``) where given; else float32 CPU
    products on oneDNN where this CPU's default (`ENABLED`) says so, or where ``onednn`` is
    True unless ``AIAYN_ONEDNN=0`` (False: never; see the module docstring)."""
    if packed is not None and _use_packed(x, weight, bias, packed):
        out = packed_product(x.reshape(-1, x.size(-1)), packed.tensor, weight, bias)
        return out.view(*x.shape[:-1], -1)
    if not _onednn(x, weight, onednn):
        return F.linear(x, weight, bias)
    grads = _grads(x, weight, bias)
    x2 = x.reshape(-1, x.size(-1))
    out = _OneDNNLinear.apply(x2, weight, bias) if grads else onednn_product(x2, weight, bias)
    return out.view(*x.shape[:-1], -1)


class CPULinear(PackableMixin, nn.Linear):
    """``nn.Linear`` (same parameters and state dict) computed by `linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, packed=self.packed)


class CPUOutputProjection(PackableMixin, OutputProjection):
    """`OutputProjection` (same parameters) computed by `linear`; while decoding (no
    gradients) on an AMD CPU on oneDNN (`DECODE_ONEDNN`): a decoder step's few rows times the
    whole vocabulary is slow on AMD's MKL path."""

    def forward(self, x: Tensor) -> Tensor:
        if self.proj is not None:
            x = self.proj(x)
        onednn = True if not torch.is_grad_enabled() and DECODE_ONEDNN else None
        return linear(x, self.weight, self.bias, onednn=onednn, packed=self.packed)
