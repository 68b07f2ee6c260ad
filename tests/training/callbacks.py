"""Test-only callbacks, injected through the config (`+callbacks.x._target_=...`)."""

import os
import signal

import lightning as L


class KillAtStep(L.Callback):
    """SIGKILL the process when the update after `step` is about to start, i.e. after
    everything step `step` wrote (its validation and checkpoints) is on disk."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class FailAtStep(L.Callback):
    """Raise inside training at `step`, to test what a failing job leaves behind."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"FailAtStep: injected failure at step {self.step}")
