"""`EMA`: an exponential moving average of the weights (fairseq `--ema-decay`, OpenNMT
`average_decay`), kept beside the raw weights.

After every update `ema = decay * ema + (1 - decay) * weights` (in float32, on the weights'
device). With `validate_with_ema` every validation, and so `val/*` metrics and the samples,
uses the EMA weights; the raw weights are swapped back before any checkpoint is written, so
`best.ckpt`/`last.ckpt` hold the raw weights and carry the EMA in this callback's state (a
resumed run continues the same average). `<dirpath>/<filename>` (default `ema.ckpt`) holds
the EMA weights as the model's, written at every validation and at the end of training:
evaluate, translate or test it (`test_ckpt=ema`) like any checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor


class EMA(L.Callback):
    """See the module docstring. `decay` in [0, 1); 0.999 averages over ~1 000 updates."""

    needs_whole_weights = True  # reads or keeps every weight on one process: not fsdp

    def __init__(
        self,
        decay: float = 0.999,
        validate_with_ema: bool = True,
        dirpath: str | None = None,
        filename: str = "ema.ckpt",
    ) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA.decay must lie in [0, 1), got {decay}")
        self.decay, self.validate_with_ema = decay, validate_with_ema
        self.dirpath, self.filename = dirpath, filename
        self.ema: dict[str, Tensor] | None = None
        self.updates = 0
        self._raw: dict[str, Tensor] | None = None
        self._last_step = -1

    @property
    def state_key(self) -> str:
        return self._generate_state_key(decay=self.decay)

    def path(self, trainer: L.Trainer) -> Path:
        directory = self.dirpath or getattr(trainer.checkpoint_callback, "dirpath", None)
        return Path(directory or Path(trainer.default_root_dir) / "checkpoints") / self.filename

    @staticmethod
    def _weights(pl_module: L.LightningModule) -> dict[str, Tensor]:
        return {k: v for k, v in pl_module.state_dict().items() if v.is_floating_point()}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        weights = self._weights(pl_module)
        if self.ema is None:
            self.ema = {k: v.detach().float().clone() for k, v in weights.items()}
        else:  # restored from a checkpoint (on the CPU): follow the weights' device
            self.ema = {k: v.to(weights[k].device) for k, v in self.ema.items()}
        self._last_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        if trainer.global_step == self._last_step or self.ema is None:
            return  # a micro-batch inside an accumulation window: no update yet
        self._last_step = trainer.global_step
        weights = self._weights(pl_module)
        ema = list(self.ema.values())
        current = [weights[k].detach().float() for k in self.ema]
        torch._foreach_lerp_(ema, current, 1.0 - self.decay)
        self.updates += 1

    # -- validation with the EMA weights ------------------------------------------------------
    def _swap_in(self, pl_module: L.LightningModule) -> None:
        if self.ema is None or self._raw is not None:
            return
        self._raw = {k: v.detach().clone() for k, v in self._weights(pl_module).items()}
        pl_module.load_state_dict(self._cast(pl_module), strict=False)

    def _swap_out(self, pl_module: L.LightningModule) -> None:
        if self._raw is not None:
            pl_module.load_state_dict(self._raw, strict=False)
            self._raw = None

    def _cast(self, pl_module: L.LightningModule) -> dict[str, Tensor]:
        assert self.ema is not None
        weights = self._weights(pl_module)
        return {k: v.to(weights[k].dtype) for k, v in self.ema.items()}

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING
        if self.validate_with_ema and fitting and not trainer.sanity_checking:
            self._swap_in(pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # runs before the checkpoint callbacks (Lightning calls those last): they save raw
        self._swap_out(pl_module)
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._write(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, pl_module)

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """`ema.ckpt`: a checkpoint like any other, with the EMA weights as the model's."""
        if self.ema is None:
            return
        self._swap_in(pl_module)
        try:
            trainer.save_checkpoint(self.path(trainer), weights_only=True)
        finally:
            self._swap_out(pl_module)

    # -- resume --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        ema = {k: v.detach().cpu() for k, v in (self.ema or {}).items()}
        return {"ema": ema, "updates": self.updates}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.ema = dict(state_dict["ema"]) or None
        self.updates = state_dict["updates"]
