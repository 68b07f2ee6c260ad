"""Attention heatmaps: one PNG per kind and layer with one panel per head, sane sizes; the
callback saved them at each validation of the fixture run."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from aiayn.cli.visualize import run
from aiayn.inference.attention import KINDS, attention_example, figures
from tests.helpers import CONFIG_ERRORS, cli, compose_config

LAYERS = (1, 2)  # model=tiny: 2 + 2 layers, 4 heads
NAMES = sorted(f"{kind}_layer{i}.png" for kind in KINDS for i in LAYERS)


def _check_pngs(directory) -> None:
    assert sorted(p.name for p in directory.glob("*.png")) == NAMES
    for path in directory.glob("*.png"):
        width, height = Image.open(path).size
        assert 400 <= width <= 4000 and 150 <= height <= 3000, (path.name, width, height)


def test_cli_writes_one_png_per_kind_and_layer(ckpt, tmp_path):
    out = tmp_path / "attn"
    args = [f"ckpt_path={ckpt}", "sentence=The red car washes seven birds.", f"output_dir={out}"]
    result = cli([*args, f"paths.log_dir={tmp_path}"], tmp_path, "aiayn.visualize")
    assert result.returncode == 0, result.stderr
    _check_pngs(out)
    assert "6 heatmaps" in result.stdout


def test_maps_shapes_rows_and_panels(translator):
    example = attention_example(
        translator, "The red car washes seven birds.", target="Das rote Auto."
    )
    assert example.src[-1] == "<eos>" and example.tgt_in[0] == "<bos>"
    assert example.tgt_out[:-1] == example.tgt_in[1:] and example.tgt_out[-1] == "<eos>"
    for kind in KINDS:
        rows, cols = example.axes(kind)
        assert len(example.maps[kind]) == len(LAYERS)
        for weights in example.maps[kind]:
            assert weights.shape == (4, len(rows), len(cols))
            torch.testing.assert_close(weights.sum(-1), torch.ones(4, len(rows)))
    causal = example.maps["decoder_self"][0]
    assert torch.all(causal.triu(diagonal=1) == 0)
    fig = figures(example)["decoder_cross_layer2"]
    assert len(fig.axes) == 4  # one panel per head


def test_callback_saved_pngs_per_validation(run_dir):
    for step in (20, 40):
        _check_pngs(run_dir / "attention" / f"step{step}")


def test_cli_requires_sentence(ckpt, tmp_path):
    with pytest.raises(CONFIG_ERRORS, match="sentence"):
        run(compose_config("visualize", [f"ckpt_path={ckpt}"], tmp_path))


def test_a_users_png_of_a_heatmaps_name_is_kept_and_a_rerun_replaces_its_own(translator, tmp_path):
    """save_pngs replaces the PNGs of a directory it wrote before (its marker), and refuses,
    writing nothing, one where a file of a heatmap's name is someone else's."""
    from aiayn.errors import OutputError
    from aiayn.inference.attention import save_pngs

    example = attention_example(translator, "The red car washes seven birds.")
    ours = tmp_path / "ours"
    first = save_pngs(example, ours)
    (ours / NAMES[0]).write_bytes(b"stale")  # an earlier run's heatmap: replaced
    assert save_pngs(example, ours) == first
    _check_pngs(ours)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / NAMES[0]).write_bytes(b"my picture")
    with pytest.raises(OutputError, match="did not write it: nothing was written"):
        save_pngs(example, theirs)
    assert sorted(p.name for p in theirs.iterdir()) == [NAMES[0]]
    assert (theirs / NAMES[0]).read_bytes() == b"my picture"
