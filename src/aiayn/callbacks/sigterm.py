"""`SigtermAtLogSteps`: a multi-process run stops on SIGTERM with every rank at the same update,
without a collective in every training step nor one in a signal handler.

Lightning (2.5 and later) handles SIGTERM under DDP with a broadcast of rank 0's flag at the
start of every training step, which it reads (`_TrainingEpochLoop._broadcast_sigterm_tensor`,
Lightning-AI/pytorch-lightning#20825): on GPUs a copy to the device, a broadcast and a read,
so that every step waits for the device and for every rank. Its signal handler broadcasts
too, at whatever point the signal lands; that broadcast pairs with another collective of the
other ranks (a gradient bucket's all-reduce) and the run hangs or fails: on two gloo
processes that both received SIGTERM it ended with "another process died".

Here, under several processes, the signal handler only notes the signal (logs it, and passes
it on to the processes Lightning's own launcher started, as Lightning's does). The ranks
agree on it at log steps (`aiayn.training.loggers.sync_step`: every
`trainer.log_every_n_steps` updates) and after each validation, with one all-reduce of the
flags; where any rank received SIGTERM, every rank sets Lightning's `received_sigterm` and
Lightning stops them all after that same step with `SIGTERMException` (loggers finalised as
failed), as it stops one process. A signal to any one rank stops the run (Lightning's own
broadcast only carried rank 0's), at most one log interval later (Lightning's proposal
`broadcast_sigterm_every_n_steps`, pull request #21640, has the same delay). One process
keeps Lightning's handling. In `trainer.test` of several processes, which has no log steps to
agree at, a SIGTERM is noted and passed on, and the test (minutes) is completed: Lightning's
broadcast in the handler would hang it as in fit. `aiayn.training.run` adds it to every run.
"""

from __future__ import annotations

import logging
from types import FrameType
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.utilities.rank_zero import rank_prefixed_message
from lightning.pytorch.utilities import rank_zero_info

from aiayn.training.loggers import ends_update, sync_step

log = logging.getLogger(__name__)


class SigtermAtLogSteps(L.Callback):
    """Under several processes: SIGTERM noted by the signal handler, agreed at log steps."""

    def __init__(self) -> None:
        self._trainer: L.Trainer | None = None  # while fitting with several processes
        self._received = False  # this process received SIGTERM

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        loop, connector = trainer.fit_loop.epoch_loop, trainer._signal_connector
        lightnings = hasattr(loop, "_broadcast_sigterm_tensor") and hasattr(
            connector, "_sigterm_notifier_fn"
        )
        if stage not in ("fit", "test") or trainer.world_size == 1 or not lightnings:
            return  # one process, or a Lightning that handles SIGTERM otherwise
        self._trainer, self._received = trainer, False
        connector._sigterm_notifier_fn = self._note  # fit and test register it after setup
        if stage == "fit":
            loop._broadcast_sigterm_tensor = _no_broadcast

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage in ("fit", "test") and self._trainer is not None:
            if stage == "fit":
                del trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor  # Lightning's again
            del trainer._signal_connector._sigterm_notifier_fn
            self._trainer = None
            if stage == "test" and self._received:
                done = "SIGTERM during the test: the test was completed first"
                log.info(rank_prefixed_message(done, trainer.local_rank))

    def _note(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: no collective here, the ranks agree at the next log step."""
        trainer = self._trainer
        assert trainer is not None
        log.info(rank_prefixed_message(f"Received SIGTERM: {signum}", trainer.local_rank))
        if not self._received and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)  # the processes it started, as Lightning
        self._received = True

    def _agree(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Whether any rank received SIGTERM (one all-reduce, read): then every rank stops."""
        flag = torch.full((), float(self._received), device=pl_module.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0 and not trainer.received_sigterm:
            trainer._signal_connector.received_sigterm = True  # Lightning stops after the step
            rank_zero_info(f"SIGTERM: every process stops after update {trainer.global_step}")

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # a stop comes after a whole update: checked at an update's last micro-batch
        if self._trainer is not None and ends_update(trainer, batch_idx) and sync_step(trainer):
            self._agree(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._trainer is not None and not trainer.sanity_checking:
            self._agree(trainer, pl_module)


def _no_broadcast() -> None:
    """In the place of Lightning's per-step broadcast of rank 0's SIGTERM flag."""
