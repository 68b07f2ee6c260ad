"""`aiayn prepare data=<name> [data.key=value ...]` (also `python -m aiayn.data.prepare`):
build a corpus's data cache (tokenizer, binarized splits, batch plan) and print its report
(conf/prepare.yaml; schema `aiayn.config.PrepareConfig`)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from aiayn.config import CONF_DIR, check_command_line, register
from aiayn.console import set_progress
from aiayn.data.prepare import PrepareConfig, load_manifest, prepare, report
from aiayn.errors import exit_on_error
from aiayn.schema import to_schema

register()


@hydra.main(config_path=str(CONF_DIR), config_name="prepare", version_base="1.3")
@exit_on_error
def command(cfg: DictConfig) -> None:
    config = to_schema(cfg, PrepareConfig)
    set_progress(config.progress)
    path = prepare(config.data)
    print(f"data cache: {path}\n{report(load_manifest(path))}")


def main() -> None:
    exit_on_error(check_command_line)(sys.argv[1:], PrepareConfig)
    command()


if __name__ == "__main__":
    main()
