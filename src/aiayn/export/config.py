"""The schema of `aiayn export` (`ExportConfig`, conf/export.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from aiayn.errors import ConfigError
from aiayn.export.ctranslate2 import QUANTIZATIONS
from aiayn.schema import PathsConfig


@dataclass
class ExportConfig:
    """Everything `aiayn export` reads (conf/export.yaml)."""

    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    format: str = "ctranslate2"
    output_dir: Optional[str] = None  # noqa: UP045
    quantization: str = "float32"  # int8, int8_float32, int8_float16, float16, bfloat16
    force: bool = False  # replace an existing output_dir
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "export"

    def __post_init__(self) -> None:
        if not self.ckpt_path or not self.output_dir:
            raise ConfigError(
                "ckpt_path and output_dir are required: "
                "python -m aiayn.export ckpt_path=<ckpt> output_dir=<dir>"
            )
        if self.format not in EXPORT_FORMATS:
            raise ConfigError(f"format must be one of {EXPORT_FORMATS}, got {self.format!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(
                f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )


EXPORT_FORMATS = ("ctranslate2",)
