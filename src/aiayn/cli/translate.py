"""`aiayn translate ckpt_path=<ckpt> [input=<file|->] [output=<file|->] [decode=beam]` (also
`python translate.py`): translate lines with a checkpoint or a CTranslate2 export
(conf/translate.yaml; schema `aiayn.config.TranslateConfig`)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from aiayn.config import CONF_DIR, TranslateConfig, check_command_line, register
from aiayn.errors import exit_on_error

register()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="translate")
@exit_on_error
def command(cfg: DictConfig) -> None:
    from aiayn.inference.translate import run

    run(cfg)


def main() -> None:
    exit_on_error(check_command_line)(sys.argv[1:], TranslateConfig)
    command()


if __name__ == "__main__":
    main()
