"""Which kernels a process runs: ``torch`` (stock PyTorch: ``F.linear``, ``F.dropout``,
``F.cross_entropy``; what GPUs run) or ``cpu`` (aiayn's CPU kernels where they apply: oneDNN
and MKL-packed products (`aiayn.model.linear`), dropout masks from int32 draws
(`aiayn.model.dropout`), the output layer fused into a blocked loss (`aiayn.training.loss`),
and the allocator setting (`aiayn.allocator`)).

One process-wide policy, the run's `kernels` key: ``auto`` is ``cpu`` for a run on the CPU and
``torch`` for a run on a GPU (`resolve`); `TrainConfig.kernels` is recorded resolved in the run
config and `metrics.json`. The CPU kernels only ever take plain CPU tensors, so under either
policy a CUDA tensor runs stock PyTorch; ``torch`` on the CPU runs the GPU's code path there
(what the GPU-contract tests use). The environment variables `AIAYN_ONEDNN`,
`AIAYN_PACK_WEIGHTS` and `AIAYN_KEEP_FREED_MEMORY` fine-tune the ``cpu`` policy.
"""

from __future__ import annotations

POLICIES = ("auto", "torch", "cpu")
_policy = "cpu"  # library use: the CPU kernels for CPU tensors, stock PyTorch for the rest


def resolve(policy: str, on_gpu: bool) -> str:
    """``policy`` with ``auto`` made concrete for a run on a GPU (``on_gpu``) or the CPU."""
    if policy not in POLICIES:
        raise ValueError(f"kernels must be one of {POLICIES}, got {policy!r}")
    if policy == "auto":
        return "torch" if on_gpu else "cpu"
    return policy


def use(policy: str) -> None:
    """Set this process's policy (``torch`` or ``cpu``)."""
    global _policy
    _policy = resolve(policy, on_gpu=False)


def policy() -> str:
    return _policy


def cpu_kernels() -> bool:
    """Whether aiayn's CPU kernels may take CPU tensors in this process."""
    return _policy == "cpu"
