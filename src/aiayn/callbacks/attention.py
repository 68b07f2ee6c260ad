"""`AttentionMaps`: attention heatmaps of one validation sentence after each validation."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from aiayn.inference.attention import attention_example, figures, save_pngs


class AttentionMaps(L.Callback):
    """After each validation (rank 0): the attention maps of validation sentence `index`,
    logged as W&B images (`attention/<kind>_layer<i>`) or saved to `output_dir/step<N>/`."""

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
        wandb = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if not wandb:
            save_pngs(example, self.output_dir / f"step{step}")
            return
        for name, fig in figures(example).items():
            for logger in wandb:
                logger.log_image(key=f"attention/{name}", images=[fig], step=step)
