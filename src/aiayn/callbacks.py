"""Callbacks and trainer plugins: the `last.ckpt` writer, atomic checkpoint writes, sample
translations for the console and W&B."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_only
from rich.console import Console
from rich.table import Table


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write a checkpoint to `<name>.tmp` beside its target, fsync, then rename over it.

    A process killed mid-write leaves the previous checkpoint intact (rename is atomic on
    POSIX file systems), so `last.ckpt` is always a complete, loadable file.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


class LastCheckpoint(ModelCheckpoint):
    """`<dirpath>/last.ckpt`: after every validation, every `every_n_train_steps` updates
    (when > 0) and at the end of training, whatever the metrics did.

    (Lightning's `save_last` only writes when a top-k checkpoint was written in the same
    step.) Being a ModelCheckpoint, it runs after the other callbacks, so the state it saves
    (best score, early stopping) is final for the step; list it after `model_checkpoint`.
    """

    def __init__(self, dirpath: str, every_n_train_steps: int = 0) -> None:
        super().__init__(dirpath=dirpath, filename="last", monitor=None, save_top_k=0)
        self.every = every_n_train_steps

    @property
    def state_key(self) -> str:
        return self._generate_state_key(kind="last", every=self.every)

    @property
    def path(self) -> Path:
        return Path(self.dirpath) / "last.ckpt"

    def _save(self, trainer: L.Trainer) -> None:
        self._save_checkpoint(trainer, str(self.path))
        for logger in trainer.loggers:  # the logged history reaches disk with the checkpoint
            logger.save()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step  # unchanged on the micro-batches of an accumulation window
        if (
            self.every > 0
            and step > 0
            and step % self.every == 0
            and step != self._last_global_step_saved
        ):
            self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # only validations, step intervals and the end of training write last.ckpt

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_global_step_saved != trainer.global_step:
            self._save(trainer)


class SampleTranslations(L.Callback):
    """After each validation, show the module's sample translations (source, reference,
    hypothesis): a Rich table on the console and a `wandb.Table` when W&B logs the run."""

    def __init__(self, console: bool = True) -> None:
        self.console = console

    @rank_zero_only
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        samples = getattr(pl_module, "samples", [])
        if not samples or trainer.sanity_checking:
            return
        if self.console:
            table = Table(title=f"val samples (step {trainer.global_step})", show_lines=True)
            for column in ("source", "reference", "hypothesis"):
                table.add_column(column, overflow="fold")
            for s in samples:
                table.add_row(s["source"], s["reference"], s["hypothesis"])
            Console(stderr=True).print(table)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_table(
                    key="val/samples",
                    columns=["step", "source", "reference", "hypothesis"],
                    data=[
                        [trainer.global_step, s["source"], s["reference"], s["hypothesis"]]
                        for s in samples
                    ],
                    step=trainer.global_step,
                )
