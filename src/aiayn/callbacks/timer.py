"""`SyncedTimer`: Lightning's `Timer` (what `trainer.max_time` sets), without a collective in
every training step.

Lightning's Timer broadcasts rank 0's stop decision after every step: under DDP a broadcast
whose result the host reads, so every step waits for the device and for every rank. Here the
ranks agree on rank 0's clock at log steps only (`aiayn.training.loggers.sync_step`), after
each validation and at the start of training: rank 0 broadcasts the training seconds elapsed
and its pace (seconds per update since the reading before). Between readings every rank
estimates the clock alike from the last reading, `elapsed_at(done)`, so every rank stops at
the same update and `optim.cooldown` gives every rank the same learning rate
(`TranslationModule._budget_spent`). In one process the clock is read every update and
`elapsed_at` is the clock itself.

The stop is decided at the start of an update's last micro-batch: the update that is to end
past the budget (its end estimated from the pace) is the last. Deciding before the step, not
after it as Lightning's Timer does, lets the step know it is the last one, so the metrics
logged for it are its own (`log_step`). `aiayn.training.run` puts it in the place of the
Timer that `trainer.max_time` gives.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities import rank_zero_info

from aiayn.training.loggers import ends_update, sync_step


class SyncedTimer(Timer):
    """`Timer(duration, interval="step")` whose ranks read rank 0's clock at log steps only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shared = False  # several processes: rank 0's clock, read at sync steps
        self._read_at = 0.0  # training seconds at the last reading
        self._read_step = 0  # updates done at the last reading
        self._pace = 0.0  # seconds per update between the last two readings

    @classmethod
    def replacing(cls, timer: Timer) -> SyncedTimer:
        """A SyncedTimer with `timer`'s budget and verbosity."""
        duration = None if timer._duration is None else timedelta(seconds=timer._duration)
        return cls(duration=duration, interval="step", verbose=timer._verbose)

    def elapsed_at(self, done: int) -> float:
        """Training seconds elapsed when `done` updates are done: in one process the clock
        now; with several, the estimate every rank makes alike from rank 0's last reading."""
        return self._estimate(done) if self._shared else self.time_elapsed()

    def _estimate(self, done: int) -> float:
        return self._read_at + max(0, done - self._read_step) * self._pace

    def budget_share(self, done: int) -> float | None:
        """The share of the time budget used when `done` updates are done (None: no budget)."""
        if not self._duration:
            return None
        return min(1.0, self.elapsed_at(done) / self._duration)

    def _read(self, trainer: L.Trainer, pace: bool = True) -> None:
        """Read the clock (rank 0's, broadcast to every rank) and, with `pace`, the pace since
        the last reading."""
        if self._duration is None:
            return
        elapsed, done = self.time_elapsed(), trainer.global_step
        rate = self._pace
        if pace and done > self._read_step:
            rate = (elapsed - self._read_at) / (done - self._read_step)
        if self._shared:
            elapsed, rate = trainer.strategy.broadcast((elapsed, rate))
        self._read_at, self._read_step, self._pace = elapsed, done, rate

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._shared = trainer.world_size > 1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._read(trainer, pace=False)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._duration is None:
            return
        starts_update = batch_idx % trainer.accumulate_grad_batches == 0
        if starts_update and (not self._shared or sync_step(trainer)):
            self._read(trainer)  # at an update's start
        if not ends_update(trainer, batch_idx):
            return  # not the update's last micro-batch: an update stops whole
        end = self._estimate(trainer.global_step + 1)
        if end >= self._duration:  # the update under way ends past the budget: the last one
            trainer.should_stop = True
            if self._verbose:
                elapsed = timedelta(seconds=int(end))
                rank_zero_info(f"Time limit reached. Elapsed time is {elapsed}. Stopping.")

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        pass  # decided at the step's start (Lightning's Timer broadcasts here every step)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._read(trainer, pace=False)  # the validation's time, not in the pace

    @property
    def state_key(self) -> str:
        return "Timer"  # Lightning's Timer's: checkpoints written with either resume the clock

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "seconds_per_update": self._pace}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._pace = float(state_dict.get("seconds_per_update", 0.0))
