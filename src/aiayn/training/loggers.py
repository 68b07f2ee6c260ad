"""Loggers that continue the run they resume: the CSV history (`csv/metrics.csv`) is the
run's own record, kept and cut back to the checkpoint on resume, and replayed into the new W&B
run a resumed run starts (W&B cannot resume an offline run, nor rewind one without its
server)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as _CSVLogger
from lightning.pytorch.loggers import Logger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from aiayn.errors import replace_text


class CSVLogger(_CSVLogger):
    """Lightning's CSVLogger, except that an existing `metrics.csv` (a resumed run writing into
    its own directory) is kept and appended to instead of deleted."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            path = Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE
            kept = path.read_text() if path.is_file() else ""
            writer = super().experiment  # creating the writer deletes metrics.csv
            if kept:
                path.write_text(kept)
                writer.metrics_keys = next(csv.reader(kept.splitlines()), [])
        return self._experiment

    def forget_after(self, step: int) -> list[dict[str, float]] | None:
        """Drop the rows of an existing `metrics.csv` logged after update `step`: a run killed
        after its last checkpoint logged them, and the resumed run logs those updates again
        (so the history equals an uninterrupted run's). Returns the rows kept, each the
        metrics of one `log_metrics` call (empty cells left out) with its `step`; None when
        there is no history to keep (no metrics.csv)."""
        path = Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE
        if not path.is_file():
            return None
        rows = list(csv.reader(path.read_text().splitlines()))
        if not rows or "step" not in rows[0]:
            return None
        header, column = rows[0], rows[0].index("step")
        whole = [r for r in rows[1:] if len(r) == len(header)]  # a row cut by a kill: dropped
        kept = [header] + [r for r in whole if not r[column] or float(r[column]) <= step]
        if len(kept) < len(rows):
            text = io.StringIO()
            csv.writer(text).writerows(kept)
            replace_text(path, text.getvalue())
        return [{k: float(v) for k, v in zip(header, r, strict=True) if v} for r in kept[1:]]


def replay(logger: Logger, rows: list[dict[str, float]]) -> None:
    """Log `rows` (`forget_after`'s) into `logger` as they were first logged: a resumed run's
    new W&B run starts with the history of the updates before its checkpoint."""
    for row in rows:
        metrics: dict[str, float | int] = dict(row)
        step = metrics.pop("step", None)
        if "epoch" in metrics:  # logged as an int
            metrics["epoch"] = int(metrics["epoch"])
        logger.log_metrics(metrics, None if step is None else int(step))


def log_host(pl_module: L.LightningModule, name: str, value: float, **kwargs: Any) -> None:
    """Log a number known on the host, for this rank only, as a CPU tensor: Lightning would
    copy a float to the module's device (a copy that waits for a GPU) to read it back later."""
    pl_module.log(name, torch.tensor(float(value)), batch_size=1, **kwargs)


def log_step(trainer: L.Trainer) -> bool:
    """Whether the current training step may read the device and communicate: a step whose
    metrics Lightning writes (every `trainer.log_every_n_steps` updates, and the step a stop
    was asked at), or the run's last update (whose metrics are the run's final ones in
    `metrics.json`). Every rank answers alike. Between such steps a training step neither
    reads the device nor communicates beyond the gradients' reduction (issue 48;
    `tests/gpu_rules.py` checks it)."""
    if trainer._logger_connector.should_update_logs:
        return True
    update = trainer.fit_loop.epoch_loop._batches_that_stepped + 1  # the update under way
    if trainer.max_steps is not None and 0 < trainer.max_steps <= update:
        return True
    last_epoch = (
        trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs
    )
    return bool(last_epoch and trainer.is_last_batch)


def ends_update(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether the epoch's batch `batch_idx` is the last micro-batch of its update (with
    `trainer.accumulate_grad_batches`, or the epoch's last batch, which ends a short one):
    where a stop, a time check or a checkpoint may come without splitting an update."""
    last = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
    return last or trainer.is_last_batch


def sync_step(trainer: L.Trainer) -> bool:
    """Whether the checks that wait for the device or for every rank run in the current
    training step (the divergence guard, the time budget, a SIGTERM seen by another rank):
    at log steps (`log_step`), or at every step where `trainer.log_every_n_steps=0` leaves
    no log step to ride on."""
    return trainer.log_every_n_steps == 0 or log_step(trainer)
