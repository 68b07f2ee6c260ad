"""Attention heatmaps: one PNG per attention kind and layer, one panel per head.

    python -m aiayn.visualize ckpt_path=<ckpt> sentence="A man rides a bike." output_dir=attn
        [target="..."] [+decode.beam_size=8] [device=cpu]

writes `encoder_self_layer{i}.png`, `decoder_self_layer{i}.png`, `decoder_cross_layer{i}.png`
(i from 1). The target side is the model's own translation (checkpoint decode settings, or
`decode` keys on top) unless `target` forces one. Rows are queries, columns keys: encoder rows
are source pieces (+ `<eos>`); decoder rows are the token predicted at that position (output
pieces + `<eos>`), decoder self-attention columns are its inputs (`<bos>` + output pieces).

`AttentionMaps` (conf/callbacks/attention.yaml) renders the same maps for one fixed
validation sentence after each validation (rank 0) and logs them to W&B as images when a
WandbLogger is attached, else saves the PNGs under `<output_dir>/step<N>/`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from matplotlib.figure import Figure
from omegaconf import OmegaConf
from torch import Tensor

from aiayn.config import ConfigError, to_schema
from aiayn.data.dataset import collate_sources
from aiayn.data.special import BOS, EOS_TOKEN
from aiayn.lit_module import TranslationModule
from aiayn.model import DecodeConfig, generate
from aiayn.translation import TranslationError, decode_config, load_checkpoint

KINDS = ("encoder_self", "decoder_self", "decoder_cross")


@dataclass
class AttentionExample:
    """One sentence's attention: `maps[kind][layer]` is (H, queries, keys) on the CPU."""

    src: list[str]  # source pieces + <eos>
    tgt_in: list[str]  # <bos> + output pieces
    tgt_out: list[str]  # output pieces + <eos>
    maps: dict[str, list[Tensor]]

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of `kind`."""
        return {
            "encoder_self": (self.src, self.src),
            "decoder_self": (self.tgt_out, self.tgt_in),
            "decoder_cross": (self.tgt_out, self.src),
        }[kind]


@torch.no_grad()
def attention_example(
    module: TranslationModule,
    sentence: str,
    decode: DecodeConfig | None = None,
    target: str | None = None,
) -> AttentionExample:
    """Attention maps of `module` for `sentence` and its translation (or `target`)."""
    tokenizers = module.tokenizers
    if tokenizers is None:
        raise TranslationError("the module has no tokenizer; load it with load_checkpoint")
    ids = tokenizers.encode([sentence], side="src")[0][: module.model_config.max_positions - 1]
    src = collate_sources([ids])[0].to(module.device)
    if target is None:
        out = generate(module.model, src, decode or module.decode_config)[0][0].tokens
    else:
        out = tokenizers.encode([target], side="tgt")[0]
    out = out[: module.model_config.max_positions - 1]
    tgt_in = torch.tensor([[BOS, *out]], device=module.device)
    maps = module.model.attention_maps(src, tgt_in)
    pieces_out = [tokenizers.tgt.id_to_token(i) for i in out]
    return AttentionExample(
        src=[tokenizers.src.id_to_token(i) for i in ids] + [EOS_TOKEN],
        tgt_in=[tokenizers.tgt.id_to_token(BOS), *pieces_out],
        tgt_out=[*pieces_out, EOS_TOKEN],
        maps={kind: [m[0].float().cpu() for m in layers] for kind, layers in maps.items()},
    )


def plot_heads(weights: Tensor, rows: list[str], cols: list[str], title: str) -> Figure:
    """A figure of `weights (H, len(rows), len(cols))`: one heatmap per head (0..1 scale),
    up to 4 panels per row, tick labels the token pieces."""
    heads = weights.size(0)
    ncols = min(heads, 4)
    nrows = math.ceil(heads / ncols)
    cell = 0.22  # inches per token
    width = min(2.0 + cell * len(cols), 8.0)
    height = min(1.5 + cell * len(rows), 8.0)
    fig = Figure(figsize=(width * ncols, height * nrows + 0.6))
    for h in range(heads):
        ax = fig.add_subplot(nrows, ncols, h + 1)
        ax.imshow(weights[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {h + 1}", fontsize=9)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=6)
        ax.set_yticks(range(len(rows)), rows, fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def figures(example: AttentionExample) -> dict[str, Figure]:
    """'<kind>_layer<i>' (i from 1) -> its figure, for every kind and layer."""
    out = {}
    for kind in KINDS:
        rows, cols = example.axes(kind)
        for layer, weights in enumerate(example.maps[kind], start=1):
            name = f"{kind}_layer{layer}"
            out[name] = plot_heads(weights, rows, cols, f"{kind.replace('_', ' ')}, layer {layer}")
    return out


def save_pngs(example: AttentionExample, output_dir: str | Path) -> list[Path]:
    """Write one PNG per kind and layer into output_dir; returns the paths."""
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures(example).items():
        path = directory / f"{name}.png"
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths


class AttentionMaps(L.Callback):
    """After each validation (rank 0): the attention maps of validation sentence `index`,
    logged as W&B images (`attention/<kind>_layer<i>`) or saved to `output_dir/step<N>/`."""

    def __init__(self, output_dir: str, index: int = 0, split: str = "val") -> None:
        self.output_dir, self.index, self.split = Path(output_dir), index, split

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or getattr(pl_module, "tokenizers", None) is None:
            return
        assert isinstance(pl_module, TranslationModule)
        sentence = trainer.datamodule.sources(self.split)[self.index]
        was_training = pl_module.training
        pl_module.eval()
        example = attention_example(pl_module, sentence)
        pl_module.train(was_training)
        step = trainer.global_step
        wandb = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if not wandb:
            save_pngs(example, self.output_dir / f"step{step}")
            return
        for name, fig in figures(example).items():
            for logger in wandb:
                logger.log_image(key=f"attention/{name}", images=[fig], step=step)


@dataclass
class VisualizeConfig:
    """`python -m aiayn.visualize key=value ...`"""

    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    sentence: Optional[str] = None  # noqa: UP045
    target: Optional[str] = None  # noqa: UP045
    output_dir: str = "attention"
    decode: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not self.ckpt_path or not self.sentence:
            raise ConfigError(
                'ckpt_path and sentence are required: ckpt_path=<ckpt> sentence="..."'
            )


def main(argv: list[str] | None = None) -> None:
    try:
        config = to_schema(OmegaConf.from_cli(argv), VisualizeConfig)
        module = load_checkpoint(config.ckpt_path, config.device)  # type: ignore[arg-type]
        decode = decode_config(module.decode_config, config.decode)
        example = attention_example(module, config.sentence, decode, config.target)  # type: ignore[arg-type]
    except (ConfigError, TranslationError) as error:
        sys.exit(f"error: {error}")
    paths = save_pngs(example, config.output_dir)
    print(f"{len(paths)} heatmaps in {config.output_dir}: {' '.join(p.name for p in paths)}")


if __name__ == "__main__":
    main()
