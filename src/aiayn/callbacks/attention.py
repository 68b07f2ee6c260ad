"""`AttentionMaps`: attention heatmaps of one validation sentence after each validation."""

from __future__ import annotations

import shutil
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from aiayn.inference.attention import attention_example, save_pngs


class AttentionMaps(L.Callback):
    """After each validation (rank 0): the attention maps of validation sentence `index`,
    saved to `output_dir/step<N>/<kind>_layer<i>.png` (the run's own record) and logged as W&B
    images (`attention/<kind>_layer<i>`) when W&B logs the run."""

    needs_whole_weights = True  # reads or keeps every weight on one process: not fsdp

    def __init__(self, output_dir: str, index: int = 0, split: str = "val") -> None:
        self.output_dir, self.index, self.split = Path(output_dir), index, split

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        sentence = trainer.datamodule.sources(self.split)[self.index]
        was_training = pl_module.training
        pl_module.eval()
        example = attention_example(pl_module.translator, sentence)
        pl_module.train(was_training)
        step = trainer.global_step
        pngs = save_pngs(example, self.output_dir / f"step{step}", run_owned=True)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                _log_images(logger, step, pngs)

    def continue_after(self, step: int, loggers: list[WandbLogger]) -> None:
        """A resumed run: remove the maps of validations after update `step` (a killed run
        drew them; the resumed run validates there again) and log the rest to `loggers`."""
        if not self.output_dir.is_dir():
            return
        drawn = sorted(
            (int(d.name.removeprefix("step")), d)
            for d in self.output_dir.glob("step*")
            if d.name.removeprefix("step").isdigit()
        )
        for drawn_at, directory in drawn:
            if drawn_at > step:
                shutil.rmtree(directory)
                continue
            for logger in loggers:
                _log_images(logger, drawn_at, sorted(directory.glob("*.png")))


def _log_images(logger: WandbLogger, step: int, pngs: list[Path]) -> None:
    for png in pngs:
        logger.log_image(key=f"attention/{png.stem}", images=[str(png)], step=step)
