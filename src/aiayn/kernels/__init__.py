"""CPU kernels, applied to a plain model from outside by one call, `accelerate(model, policy)`,
and chosen by one config key, `kernels=auto|torch|cpu` (`policy`).

``cpu`` swaps the class of the model's ``nn.Linear``, ``nn.Dropout`` and output layer for
subclasses with the same parameters and state dict that compute with:
- oneDNN or MKL-packed float32 products (`linear`: `CPULinear`, `CPUOutputProjection`,
  `packed_weights` for decoding);
- dropout masks from int32 draws (`dropout`: `CPUDropout`);
and lets the model drop key masks with no padding (a check that reads the tensor). Outside the
model: the output layer fused into a blocked loss (`aiayn.kernels.loss`) and the allocator
setting (`allocator`) follow the process's policy; `machine` holds the probes of what this
CPU can do. ``torch`` (what GPUs run, and what ``auto`` gives them) leaves the model plain:
``F.linear``, ``F.dropout``, fused SDPA and ``F.cross_entropy``. The CPU kernels take plain
CPU tensors only, so a CUDA tensor runs stock PyTorch under either policy.

`TrainConfig.kernels` is recorded resolved in the run config and `metrics.json`, with the
environment variables that fine-tune the ``cpu`` policy (`AIAYN_ONEDNN`,
`AIAYN_PACK_WEIGHTS`, `AIAYN_KEEP_FREED_MEMORY`).
"""

from __future__ import annotations

from torch import nn

from aiayn.kernels.dropout import CPUDropout
from aiayn.kernels.linear import CPULinear, CPUOutputProjection, packed_weights
from aiayn.kernels.policy import POLICIES, cpu_kernels, policy, resolve, use
from aiayn.model.embedding import OutputProjection

__all__ = ["POLICIES", "accelerate", "cpu_kernels", "packed_weights", "policy", "resolve", "use"]

# torch's module -> the subclass computing it with the CPU kernels
SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: CPULinear,
    nn.Dropout: CPUDropout,
    OutputProjection: CPUOutputProjection,
}


def accelerate(model: nn.Module, kernels: str | None = None) -> nn.Module:
    """Apply the policy `kernels` (default: the process's, `policy()`; ``auto``: ``cpu`` for
    a model on the CPU) to `model`, in place, and return it: under ``cpu`` the modules of
    `SWAPS` compute with the CPU kernels, under ``torch`` with torch's own (undoing an earlier
    ``cpu``). Parameters, buffers and state dict are untouched."""
    device = next(model.parameters(), None)
    on_gpu = device is not None and device.device.type != "cpu"
    cpu = resolve(kernels or policy(), on_gpu) == "cpu"
    for module in model.modules():
        for plain, fast in SWAPS.items():
            if cpu and type(module) is plain:
                module.__class__ = fast
            elif not cpu and type(module) is fast:
                module.__class__ = plain
        if hasattr(module, "drop_unpadded_masks"):
            module.drop_unpadded_masks = cpu
    return model
