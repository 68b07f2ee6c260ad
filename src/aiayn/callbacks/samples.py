"""`SampleTranslations`: a few validation translations on the console, in the run directory
(`samples.jsonl`) and in W&B."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from rich.console import Console
from rich.table import Table

from aiayn.errors import replace_text

COLUMNS = ("step", "source", "reference", "hypothesis")  # of the W&B table


class SampleTranslations(L.Callback):
    """After each validation, show the first `num_samples` (source, reference, hypothesis)
    rows: a Rich table on the console, a line `{"step": N, "samples": [...]}` of `path` (the
    run's own record, when given) and a `wandb.Table` (`val/samples`) when W&B logs the run.
    Hypotheses are what `validation_step` returned; texts come from the datamodule."""

    def __init__(self, console: bool = True, num_samples: int = 8, path: str | None = None) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        self.console, self.num_samples = console, num_samples
        self.path = Path(path) if path else None
        self.samples: list[dict[str, str]] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.samples = []

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        wanted = self.num_samples - len(self.samples)
        hypotheses = (outputs or {}).get("hypotheses")
        if wanted <= 0 or not hypotheses:
            return
        datamodule = trainer.datamodule
        sources, references = datamodule.sources("val"), datamodule.references("val")
        for i, hypothesis in list(zip(batch.ids.tolist(), hypotheses, strict=True))[:wanted]:
            self.samples.append(
                {"source": sources[i], "reference": references[i], "hypothesis": hypothesis}
            )

    @rank_zero_only
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.samples or trainer.sanity_checking:
            return
        if self.console:
            table = Table(title=f"val samples (step {trainer.global_step})", show_lines=True)
            for column in ("source", "reference", "hypothesis"):
                table.add_column(column, overflow="fold")
            for s in self.samples:
                table.add_row(s["source"], s["reference"], s["hypothesis"])
            Console(stderr=True).print(table)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as file:
                record = {"step": trainer.global_step, "samples": self.samples}
                file.write(json.dumps(record, ensure_ascii=False) + "\n")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                _log_table(logger, trainer.global_step, self.samples)

    def continue_after(self, step: int, loggers: list[WandbLogger]) -> None:
        """A resumed run: drop the records of validations after update `step` (a killed run
        wrote them; the resumed run validates there again) and log the rest to `loggers`."""
        if self.path is None or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line cut by the kill
                continue
            if record["step"] <= step:
                kept.append(record)
        replace_text(self.path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
        for record in kept:
            for logger in loggers:
                _log_table(logger, record["step"], record["samples"])


def _log_table(logger: WandbLogger, step: int, samples: list[dict[str, str]]) -> None:
    rows = [[step, s["source"], s["reference"], s["hypothesis"]] for s in samples]
    logger.log_table(key="val/samples", columns=list(COLUMNS), data=rows, step=step)
