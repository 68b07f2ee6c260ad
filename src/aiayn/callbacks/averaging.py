"""`AverageCheckpoints`: the mean of the last N weight snapshots, written at the end of
training (the paper averages the last 5 (base) or 20 (big) checkpoints).

Snapshots are kept in CPU memory (N x the model's size) by the process of rank 0 alone (it
writes the file; under DDP every rank holds the same weights) and are not saved in checkpoints:
after a resume only the new ones count.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from aiayn.inference.averaging import average_state_dicts
from aiayn.inference.checkpoint import read_checkpoint, save_atomically


class AverageCheckpoints(L.Callback):
    """Average the last `last` weight snapshots into `<dirpath>/<filename>` at train end.

    A snapshot is taken after each validation (`every_n_steps=None`) or every `every_n_steps`
    optimizer steps, and of the final weights; one per step. The file is written with
    `trainer.save_checkpoint(weights_only=True)`, so it carries the hyper-parameters and the
    tokenizer like any checkpoint, plus `averaged_from` (the snapshots' steps).
    """

    needs_whole_weights = True  # reads or keeps every weight on one process: not fsdp

    def __init__(
        self,
        dirpath: str | None = None,
        last: int = 5,
        every_n_steps: int | None = None,
        filename: str = "averaged.ckpt",
    ) -> None:
        if last < 1:
            raise ValueError(f"AverageCheckpoints.last must be >= 1, got {last}")
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"AverageCheckpoints.every_n_steps must be >= 1, got {every_n_steps}")
        self.dirpath, self.every_n_steps, self.filename = dirpath, every_n_steps, filename
        self.snapshots: deque[tuple[int, dict[str, Tensor]]] = deque(maxlen=last)

    def _snapshot(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or (self.snapshots and self.snapshots[-1][0] == step):
            return
        state = {k: v.detach().to("cpu", copy=True) for k, v in pl_module.state_dict().items()}
        self.snapshots.append((step, state))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING
        if self.every_n_steps is None and fitting and not trainer.sanity_checking:
            self._snapshot(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            self._snapshot(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._snapshot(trainer, pl_module)
        path = self.path(trainer)
        if not trainer.is_global_zero:  # saving is collective: the others take part, rank 0 writes
            trainer.save_checkpoint(path, weights_only=True)
            return
        current = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        pl_module.load_state_dict(average_state_dicts([s for _, s in self.snapshots]))
        trainer.save_checkpoint(path, weights_only=True)
        pl_module.load_state_dict(current)
        checkpoint = read_checkpoint(path)  # marked, so that `--last N` never counts it
        checkpoint["averaged_from"] = [f"step {step}" for step, _ in self.snapshots]
        save_atomically(checkpoint, path)

    def path(self, trainer: L.Trainer) -> Path:
        """`dirpath/filename`; dirpath defaults to the ModelCheckpoint's, else
        `<default_root_dir>/checkpoints`."""
        directory = self.dirpath or getattr(trainer.checkpoint_callback, "dirpath", None)
        return Path(directory or Path(trainer.default_root_dir) / "checkpoints") / self.filename
