"""Sharded data parallel (`trainer=fsdp`): PyTorch's FSDP2 (`fully_shard`) under Lightning's
`ModelParallelStrategy`.

Each process keeps 1/N of every weight, gradient and Adam moment; a layer's weights are
gathered for its forward and backward and freed after. Checkpoints and the averaging
callback's snapshots hold whole weights (Lightning's `lightning_module_state_dict`). The units
are the encoder and decoder layers, then the whole model (embeddings, output layer, final
norms; tied weights stay in one unit). Decoding calls more than `forward` (the encoder, the
cache of the cross-attention keys, one step at a time), so validation and test gather every
weight for their duration (`gathered`), as DDP holds them all the time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from aiayn.model.layers import DecoderLayer, EncoderLayer


def shard(model: nn.Module, mesh: DeviceMesh, precision: str = "32-true") -> None:
    """Apply `fully_shard` over the data-parallel dimension of `mesh` to each layer, then to
    the model (once: Lightning calls `configure_model` for every fit and test). Under
    `bf16-mixed` (`precision`, Lightning's) the weights are gathered and computed in bfloat16
    and the gradients reduced in float32 (`mixed_precision`)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(model, FSDPModule):
        return
    data_parallel = mesh["data_parallel"]
    policy = mixed_precision(precision)
    layers = [m for m in model.modules() if isinstance(m, (EncoderLayer, DecoderLayer))]
    for layer in layers:
        fully_shard(layer, mesh=data_parallel, mp_policy=policy)
    fully_shard(model, mesh=data_parallel, mp_policy=policy)
    local = sum(p.to_local().numel() for p in model.parameters())
    rank_zero_info(
        f"fsdp: {len(layers) + 1} units sharded over {data_parallel.size()} processes; "
        f"this one holds {local:,} of {sum(p.numel() for p in model.parameters()):,} weights"
    )


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's policy for Lightning's `precision`: bfloat16 weights in the all-gathers and the
    products, float32 gradient reductions and optimizer state, for bf16-mixed (half the
    traffic of gathering float32); torch's default (the weights' own dtype) otherwise."""
    if str(precision).startswith("bf16-mixed"):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


@contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """Every weight of a sharded `model` whole, on every process, inside the block (a model
    that is not sharded is left as it is)."""
    from torch.distributed.fsdp import FSDPModule

    units = [module for module in model.modules() if isinstance(module, FSDPModule)]
    layers = [unit for unit in units if unit is not model]  # the root keeps its own setting
    for unit in units:
        unit.unshard()
    for layer in layers:
        layer.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
        for layer in layers:
            layer.set_reshard_after_forward(True, recurse=False)
