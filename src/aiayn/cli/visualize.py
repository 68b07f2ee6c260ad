"""`python -m aiayn.visualize ckpt_path=<ckpt> sentence="A man rides a bike." output_dir=attn
[target="..."] [decode=beam] [decode.beam_size=8] [device=cpu]` (conf/visualize.yaml).

Writes `encoder_self_layer{i}.png`, `decoder_self_layer{i}.png`, `decoder_cross_layer{i}.png`
(i from 1). The target side is the model's own translation (the checkpoint's decode
settings, with `decode` keys on top) unless `target` forces one.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from aiayn.config import CONF_DIR, check_command_line, register
from aiayn.errors import exit_on_error
from aiayn.inference.attention import attention_example, save_pngs
from aiayn.inference.checkpoint import load_checkpoint
from aiayn.inference.config import VisualizeConfig
from aiayn.outputs import check_output_dir
from aiayn.schema import to_schema


def run(cfg: DictConfig | dict) -> list:
    """Write the heatmaps; returns their paths."""
    config = to_schema(cfg, VisualizeConfig)
    check_output_dir(config.output_dir, "output_dir")
    translator = load_checkpoint(config.ckpt_path, config.device)  # type: ignore[arg-type]
    translator = translator.with_settings(config.decode.given())
    example = attention_example(translator, config.sentence, config.target)  # type: ignore[arg-type]
    paths = save_pngs(example, config.output_dir)
    print(f"{len(paths)} heatmaps in {config.output_dir}: {' '.join(p.name for p in paths)}")
    return paths


register()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="visualize")
@exit_on_error
def command(cfg: DictConfig) -> None:
    run(cfg)


def main() -> None:
    exit_on_error(check_command_line)(sys.argv[1:], VisualizeConfig)
    command()


if __name__ == "__main__":
    main()
