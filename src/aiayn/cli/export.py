"""`python -m aiayn.export ckpt_path=<ckpt> output_dir=<dir> [format=ctranslate2]
[quantization=int8] [force=true]` (conf/export.yaml): a CTranslate2 model directory that
`translate.py engine=ctranslate2 ct2_path=<dir>` and `evaluate.py` decode with."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from aiayn.config import CONF_DIR, check_command_line, register
from aiayn.errors import exit_on_error, stopped_by_sigterm
from aiayn.export.config import ExportConfig
from aiayn.export.ctranslate2 import export
from aiayn.schema import to_schema


def run(cfg: DictConfig | dict) -> Path:
    """Convert; returns the directory written."""
    config = to_schema(cfg, ExportConfig)
    with stopped_by_sigterm("the export"):  # its staging directory is removed, not left
        directory = export(config.ckpt_path, config.output_dir, config.quantization, config.force)  # type: ignore[arg-type]
    size = sum(p.stat().st_size for p in directory.iterdir()) / 2**20
    print(f"{config.format} model ({config.quantization}, {size:.1f} MiB) in {directory}")
    return directory


register()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="export")
@exit_on_error
def command(cfg: DictConfig) -> None:
    run(cfg)


def main() -> None:
    exit_on_error(check_command_line)(sys.argv[1:], ExportConfig)
    command()


if __name__ == "__main__":
    main()
