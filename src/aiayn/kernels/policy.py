"""The process's kernel policy: ``torch`` (stock PyTorch throughout, the reference), ``cpu``
(aiayn's CPU kernels where they apply) or ``gpu`` (stock PyTorch modules, and the output layer
fused into the loss a block of rows at a time on CUDA tensors, so that no float32 logits of
the whole batch exist). ``auto`` is ``cpu`` for a run on the CPU and ``gpu`` for a run on a
GPU (`resolve`). The run's `kernels` key sets it (`use`); `aiayn.kernels.accelerate` applies it
to a model, and the loss and the allocator setting read it (`cpu_kernels`, `gpu_kernels`)."""

from __future__ import annotations

POLICIES = ("auto", "torch", "cpu", "gpu")
_policy = "cpu"  # library use: the CPU kernels for CPU tensors, stock PyTorch for the rest


def resolve(policy: str, on_gpu: bool) -> str:
    """``policy`` with ``auto`` made concrete for a run on a GPU (``on_gpu``) or the CPU."""
    if policy not in POLICIES:
        raise ValueError(f"kernels must be one of {POLICIES}, got {policy!r}")
    if policy == "auto":
        return "gpu" if on_gpu else "cpu"
    return policy


def use(policy: str) -> None:
    """Set this process's policy (``torch``, ``cpu`` or ``gpu``)."""
    global _policy
    _policy = resolve(policy, on_gpu=False)


def policy() -> str:
    return _policy


def cpu_kernels() -> bool:
    """Whether aiayn's CPU kernels may take CPU tensors in this process."""
    return _policy == "cpu"


def gpu_kernels() -> bool:
    """Whether aiayn's GPU loss (the blocked output layer) may take CUDA tensors."""
    return _policy == "gpu"
