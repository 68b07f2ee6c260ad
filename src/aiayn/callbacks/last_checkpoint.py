"""`LastCheckpoint`: `<dirpath>/last.ckpt`, the file a run resumes from."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.exceptions import SIGTERMException

from aiayn.training.loggers import ends_update, sync_step

log = logging.getLogger(__name__)


class LastCheckpoint(ModelCheckpoint):
    """`<dirpath>/last.ckpt`: after every validation, every `every_n_train_steps` updates
    (when > 0), every `every_minutes` of training (when > 0; so a kill loses minutes, not an
    epoch) and at the end of training, whatever the metrics did. With `keep_last` N > 0 each
    of those writes is also kept as `step<update>.ckpt` (a hard link where the file system
    allows, else a copy), the newest N of them (e.g. for `python -m aiayn.averaging --last N`).

    Every write is at the end of an update: with gradient accumulation a checkpoint written
    after one of an update's micro-batches would resume with that update's rest only (its
    first micro-batches' gradients are in no checkpoint), so the clock is read where an
    update ends, and a validation that runs between two micro-batches (an integer
    `trainer.val_check_interval` counts batches) is written at the end of its update.

    (Lightning's `save_last` only writes when a top-k checkpoint was written in the same
    step.) Being a ModelCheckpoint, it runs after the other callbacks, so the state it saves
    (best score, early stopping) is final for the step; list it after `model_checkpoint`.
    """

    def __init__(
        self,
        dirpath: str,
        every_n_train_steps: int = 0,
        every_minutes: float = 15.0,
        keep_last: int = 0,
    ) -> None:
        super().__init__(dirpath=dirpath, filename="last", monitor=None, save_top_k=0)
        if every_n_train_steps < 0 or every_minutes < 0 or keep_last < 0:
            raise ValueError(
                "LastCheckpoint.every_n_train_steps, every_minutes and keep_last must be >= 0 "
                f"(0: off), got {every_n_train_steps}, {every_minutes} and {keep_last}"
            )
        self.every, self.every_minutes, self.keep_last = (
            every_n_train_steps,
            every_minutes,
            keep_last,
        )
        self._saved_at = time.monotonic()
        self._in_update = False  # between two micro-batches of one update
        self._after_validation = False  # a validation ran in that update: write at its end

    @property
    def state_key(self) -> str:
        return self._generate_state_key(kind="last", every=self.every)

    @property
    def path(self) -> Path:
        return Path(self.dirpath) / "last.ckpt"

    def _save(self, trainer: L.Trainer) -> None:
        self._saved_at = time.monotonic()
        self._save_checkpoint(trainer, str(self.path))
        if self.keep_last and trainer.is_global_zero:
            self._keep_step_copy(trainer.global_step)
        for logger in trainer.loggers:  # the logged history reaches disk with the checkpoint
            logger.save()

    def _keep_step_copy(self, step: int) -> None:
        """`step<step>.ckpt` beside last.ckpt; only the newest `keep_last` stay."""
        kept = Path(self.dirpath) / f"step{step}.ckpt"
        kept.unlink(missing_ok=True)
        try:
            os.link(self.path, kept)  # last.ckpt is replaced by rename: the link keeps this one
        except OSError:
            shutil.copyfile(self.path, kept)
        ours = (p for p in Path(self.dirpath).glob("step*.ckpt") if _step_number(p) >= 0)
        steps = sorted(ours, key=_step_number)  # step<digits>.ckpt only: others are not ours
        for old in steps[: -self.keep_last]:
            try:
                old.unlink(missing_ok=True)
            except OSError as error:  # kept, not fatal: training goes on, the user is told
                log.warning("keep_last: could not delete %s (%s); it stays", old, error)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._in_update = not ends_update(trainer, batch_idx)
        step = trainer.global_step
        if self._in_update or step == 0 or step == self._last_global_step_saved:
            return
        due = self._after_validation or (self.every > 0 and step % self.every == 0)
        self._after_validation = False
        if self.every_minutes > 0 and self._reads_clock(trainer):
            late = time.monotonic() - self._saved_at >= 60 * self.every_minutes
            due = due or bool(trainer.strategy.broadcast(late))
        if due:
            self._save(trainer)

    @staticmethod
    def _reads_clock(trainer: L.Trainer) -> bool:
        """Every update in one process; under DDP, at log steps (`sync_step`: where Lightning
        reads the device anyway): saving is collective, so every rank follows rank 0's clock,
        which costs a broadcast that waits for the device."""
        return trainer.world_size == 1 or sync_step(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # only validations, step intervals and the end of training write last.ckpt

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if self._in_update:  # the update's last micro-batch writes it
            self._after_validation = True
        else:
            self._save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_global_step_saved != trainer.global_step:
            self._save(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """SIGTERM (a preemption, `scancel`): Lightning stops at the end of an update, every
        rank at the same one (`SigtermAtLogSteps`), so that update is written and a resume
        loses nothing. Not in a validation it stopped halfway, nor on Ctrl-C, which lands
        anywhere (in an optimizer step, on each rank at another point)."""
        stopped = isinstance(exception, SIGTERMException)
        training = trainer.state.stage == RunningStage.TRAINING
        step = trainer.global_step
        if stopped and training and step > 0 and step != self._last_global_step_saved:
            self._save(trainer)


def _step_number(path: Path) -> int:
    digits = path.stem.removeprefix("step")
    return int(digits) if digits.isdigit() else -1
