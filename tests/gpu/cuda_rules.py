"""`NoCudaSync`: a test-only callback that sets CUDA's sync debug mode to ``error`` for each
training step that is not a log step (`trainer.log_every_n_steps`), from the batch's start to
its end, so that a step which reads the device or blocks on a copy fails the run (the GPU's
own check of what `tests.gpu_rules` emulates on the CPU)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch


class NoCudaSync(L.Callback):
    def __init__(self, every: int) -> None:
        self.every = every
        self.checked = 0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        # a step from the second on (the first builds the optimizer's state) off the log steps
        step = trainer.global_step + 1
        if trainer.global_step > 0 and step % self.every != 0:
            torch.cuda.set_sync_debug_mode("error")
            self.checked += 1

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        torch.cuda.set_sync_debug_mode("default")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.set_sync_debug_mode("default")
        if trainer.global_step > 2 * self.every and self.checked == 0:
            raise AssertionError("NoCudaSync checked no step")
