"""`aiayn prepare data=<name> [data.key=value ...]` (also `python -m aiayn.data.prepare`):
build a corpus's data cache (tokenizer, binarized splits, batch plan) and print its report
(conf/prepare.yaml; schema `aiayn.config.PrepareConfig`)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from aiayn.config import CONF_DIR, register
from aiayn.console import set_progress
from aiayn.data.prepare import PrepareConfig, load_manifest, prepare, report
from aiayn.errors import exit_on_error
from aiayn.schema import to_schema

register()


@hydra.main(config_path=str(CONF_DIR), config_name="prepare", version_base="1.3")
@exit_on_error
def main(cfg: DictConfig) -> None:
    config = to_schema(cfg, PrepareConfig)
    set_progress(config.progress)
    path = prepare(config.data)
    print(f"data cache: {path}\n{report(load_manifest(path))}")


if __name__ == "__main__":
    main()
