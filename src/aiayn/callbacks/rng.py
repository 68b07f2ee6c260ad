"""`RNGState`: the random number generators travel in checkpoints, so that a resumed run draws
the same dropout masks as an uninterrupted one (each DDP rank its own, on the CPU and on its
GPU)."""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch


class RNGState(L.Callback):
    """Saves `checkpoint["rng_states"]` (torch, python, numpy, and the state of this process's
    GPU; under DDP also every rank's torch and GPU states, `torch_per_rank` and
    `cuda_per_rank`) and restores each rank's own on resume, at the first training batch (after
    the data loaders have drawn their seeds). Added to every run by `aiayn.training.run`."""

    def __init__(self) -> None:
        self._to_restore: dict[str, Any] | None = None

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        states = checkpoint["rng_states"] = get_rng_state()
        if trainer.world_size == 1:
            return
        # this hook runs on every rank (rank 0 writes the file): gather every rank's states,
        # on the module's device (NCCL gathers no CPU tensors)
        gathered = {"torch": states["torch"]}
        if "cuda_device" in states:
            gathered["cuda"] = states["cuda_device"]
        for name, state in gathered.items():
            per_rank = pl_module.all_gather(state.to(pl_module.device, torch.int64))
            states[f"{name}_per_rank"] = per_rank.to("cpu", torch.uint8)

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if "rng_states" not in checkpoint:
            return
        state = dict(checkpoint["rng_states"])
        for name, key in (("torch", "torch"), ("cuda", "cuda_device")):
            per_rank = state.pop(f"{name}_per_rank", None)
            if per_rank is not None and len(per_rank) == trainer.world_size:
                state[key] = per_rank[trainer.global_rank].clone()  # a view segfaults
        self._to_restore = state

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._to_restore is not None:
            set_rng_state(self._to_restore)
            self._to_restore = None


def get_rng_state() -> dict[str, Any]:
    """This process's generator states, in types `torch.load(weights_only=True)` accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
    }
    if torch.cuda.is_available():
        state["cuda_device"] = torch.cuda.get_rng_state()  # this process's GPU (its rank's)
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    numpy = state["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy["name"], keys, numpy["pos"], numpy["has_gauss"], numpy["cached"]))
    if not torch.cuda.is_available():
        return
    if "cuda_device" in state:
        torch.cuda.set_rng_state(state["cuda_device"])
    elif "cuda" in state:  # older checkpoints: every GPU rank 0 saw; this process's, if it was
        device = torch.cuda.current_device()
        if device < len(state["cuda"]):
            torch.cuda.set_rng_state(state["cuda"][device])
