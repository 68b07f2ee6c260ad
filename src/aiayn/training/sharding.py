"""Sharded data parallel (`trainer=fsdp`): PyTorch's FSDP2 (`fully_shard`) under Lightning's
`ModelParallelStrategy`.

Each process keeps 1/N of every weight, gradient and Adam moment; a layer's weights are
gathered for its forward and backward and freed after. The units are the encoder and
decoder layers, then the whole model (embeddings, output layer, final norms; tied weights stay
in one unit). Decoding calls more than `forward` (the encoder, the cache of the
cross-attention keys, one step at a time), so validation and test gather every weight for
their duration (`gathered`), as DDP holds them all the time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from aiayn.model.layers import DecoderLayer, EncoderLayer


def shard(model: nn.Module, mesh: DeviceMesh) -> None:
    """Apply `fully_shard` over the data-parallel dimension of `mesh` to each layer, then to
    the model (once: Lightning calls `configure_model` for every fit and test)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(model, FSDPModule):
        return
    data_parallel = mesh["data_parallel"]
    layers = [m for m in model.modules() if isinstance(m, (EncoderLayer, DecoderLayer))]
    for layer in layers:
        fully_shard(layer, mesh=data_parallel)
    fully_shard(model, mesh=data_parallel)
    local = sum(p.to_local().numel() for p in model.parameters())
    rank_zero_info(
        f"fsdp: {len(layers) + 1} units sharded over {data_parallel.size()} processes; "
        f"this one holds {local:,} of {sum(p.numel() for p in model.parameters()):,} weights"
    )


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
