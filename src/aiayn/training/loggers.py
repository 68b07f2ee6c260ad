"""Loggers that continue the run they resume."""

from __future__ import annotations

import csv
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as _CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


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

    def forget_after(self, step: int) -> None:
        """Drop the rows of an existing `metrics.csv` logged after update `step`: a run killed
        after its last checkpoint logged them, and the resumed run logs those updates again
        (so the history equals an uninterrupted run's)."""
        path = Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE
        if not path.is_file():
            return
        rows = list(csv.reader(path.read_text().splitlines()))
        if not rows or "step" not in rows[0]:
            return
        column = rows[0].index("step")
        kept = [rows[0]] + [r for r in rows[1:] if not r[column] or float(r[column]) <= step]
        if len(kept) < len(rows):
            tmp = path.with_name(f".{path.name}.tmp")
            with open(tmp, "w", newline="") as file:
                csv.writer(file).writerows(kept)
            tmp.replace(path)
