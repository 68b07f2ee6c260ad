"""`SampleTranslations`: a few validation translations on the console and in W&B."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from rich.console import Console
from rich.table import Table


class SampleTranslations(L.Callback):
    """After each validation, show the first `num_samples` (source, reference, hypothesis)
    rows: a Rich table on the console and a `wandb.Table` (`val/samples`) when W&B logs the
    run. Hypotheses are what `validation_step` returned; texts come from the datamodule."""

    def __init__(self, console: bool = True, num_samples: int = 8) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        self.console, self.num_samples = console, num_samples
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
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_table(
                    key="val/samples",
                    columns=["step", "source", "reference", "hypothesis"],
                    data=[
                        [trainer.global_step, s["source"], s["reference"], s["hypothesis"]]
                        for s in self.samples
                    ],
                    step=trainer.global_step,
                )
