"""Attention heatmaps: one figure per attention kind and layer, one panel per head.

Used by `python -m aiayn.visualize` (aiayn.cli.visualize) and the `AttentionMaps` callback.
Rows are queries, columns keys: encoder rows are source pieces (+ `<eos>`); decoder rows are
the token predicted at that position (output pieces + `<eos>`), decoder self-attention
columns are its inputs (`<bos>` + output pieces).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

from aiayn.data.dataset import collate_sources
from aiayn.data.special import EOS_TOKEN
from aiayn.errors import OutputError
from aiayn.inference.translator import Translator
from aiayn.outputs import check_output

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
    translator: Translator, sentence: str, target: str | None = None
) -> AttentionExample:
    """Attention maps of `translator`'s model for `sentence` and its translation (decoded with
    the translator's settings), or for `target` when given."""
    tokenizers, model = translator.tokenizers, translator.model
    limit = translator.max_src_tokens
    ids = tokenizers.encode([sentence], side="src")[0][:limit]
    src = collate_sources([ids])[0]
    if target is None:
        out = translator.generate(src)[0][0].tokens
    else:
        out = tokenizers.encode([target], side="tgt")[0]
    out = out[:limit]
    bos = model.config.bos_id
    tgt_in = torch.tensor([[bos, *out]], device=translator.device)
    maps = model.attention_maps(src.to(translator.device), tgt_in)
    pieces_out = [tokenizers.tgt.id_to_token(i) for i in out]
    return AttentionExample(
        src=[tokenizers.src.id_to_token(i) for i in ids] + [EOS_TOKEN],
        tgt_in=[tokenizers.tgt.id_to_token(bos), *pieces_out],
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


MARKER = ".aiayn-visualize"  # in a directory save_pngs wrote: its PNGs may be replaced


def save_pngs(
    example: AttentionExample, output_dir: str | Path, run_owned: bool = False
) -> list[Path]:
    """Write one PNG per kind and layer into output_dir; returns the paths. An existing PNG
    of the same name is replaced only where an earlier `save_pngs` wrote that directory (its
    `MARKER`), or where `run_owned` (a run's own `attention/step<N>/`, which a resumed attempt
    draws again): a user's file of that name is refused, before any is written."""
    directory = Path(output_dir)
    drawn = figures(example)
    paths = [directory / f"{name}.png" for name in drawn]
    ours = run_owned or (directory / MARKER).is_file()
    for path in paths:
        check_output(path, "output_dir's heatmap")
        if path.exists() and not ours:
            raise OutputError(
                f"output_dir's heatmap {path} exists and aiayn visualize did not write it: "
                "nothing was written; choose a new output_dir"
            )
    directory.mkdir(parents=True, exist_ok=True)
    if not run_owned:
        (directory / MARKER).touch()
    for path, fig in zip(paths, drawn.values(), strict=True):
        fig.savefig(path, dpi=100)
    return paths
