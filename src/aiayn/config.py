"""Typed schemas for the Hydra config tree and the checks that span several groups.

`conf/` holds YAML only; every composed config is merged onto these dataclasses, so an
unknown key or a value of the wrong type is rejected with its full dotted name before any
data is read or model built. Each group's schema lives next to the code it configures
(`ModelConfig` in model/, `DataConfig` in data/, `DecodeConfig` in model/generate.py,
`OptimConfig` in optim.py); this module assembles them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aiayn.data.config import DataConfig
from aiayn.data.special import PAD
from aiayn.model.config import ModelConfig
from aiayn.model.generate import DecodeConfig
from aiayn.optim import OptimConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

T = TypeVar("T")

# nested schemas name fields by class; users type them under these keys
SCHEMA_KEYS = {
    "TokenizerConfig": "data.tokenizer",
    "DataConfig": "data",
    "ModelConfig": "model",
    "DecodeConfig": "decode",
}


class ConfigError(ValueError):
    """A composed config that cannot run; the message names the key and what to do."""


@dataclass
class PathsConfig:
    root_dir: str = "."
    log_dir: str = "logs"
    output_dir: str = "."


@dataclass
class TrainConfig:
    """Everything `python train.py` reads (conf/train.yaml and its groups)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    trainer: dict[str, Any] = field(default_factory=dict)
    logger: dict[str, Any] = field(default_factory=dict)
    callbacks: dict[str, Any] = field(default_factory=dict)
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "train"
    tags: list[str] = field(default_factory=list)
    seed: int = 1234
    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    train: bool = True
    test: bool = True
    compile: bool = False
    val_bleu: bool = True
    num_samples: int = 8  # sample translations shown per validation (console, W&B)

    def __post_init__(self) -> None:
        if self.model.share_embeddings == "all" and not self.data.tokenizer.joint:
            raise ConfigError(
                "model.share_embeddings='all' needs one joint vocabulary, but "
                "data.tokenizer.joint=false; set data.tokenizer.joint=true or "
                "model.share_embeddings=decoder"
            )
        if self.model.pad_id != PAD:
            raise ConfigError(f"model.pad_id must be {PAD} (the tokenizer's <pad> id)")
        if self.data.max_len + 2 > self.model.max_positions:
            raise ConfigError(
                f"data.max_len={self.data.max_len} (+ <bos>/<eos>) exceeds "
                f"model.max_positions={self.model.max_positions}; lower data.max_len or raise "
                "model.max_positions"
            )
        if self.num_samples < 0:
            raise ConfigError(f"num_samples must be >= 0, got {self.num_samples}")
        check_trainer_kwargs(self.trainer)
        if self.ckpt_path is not None and not Path(self.ckpt_path).is_file():
            raise ConfigError(f"ckpt_path={self.ckpt_path!r} is not a file; give a .ckpt to resume")


def check_trainer_kwargs(trainer: dict[str, Any]) -> None:
    """Reject `trainer.*` keys that `lightning.Trainer` does not take, before any work."""
    from lightning import Trainer

    owned = {"callbacks": "callbacks", "logger": "logger", "plugins": "(built in)"}
    for key in set(trainer) & set(owned):
        raise ConfigError(
            f"trainer.{key} is set by the run, not the trainer config; use the "
            f"{owned[key]} group instead"
        )
    accepted = set(inspect.signature(Trainer.__init__).parameters) - {"self"}
    unknown = sorted(set(trainer) - accepted - {"_target_"})
    if unknown:
        raise ConfigError(
            f"trainer.{unknown[0]} is not an argument of lightning.Trainer "
            f"(unknown: {', '.join(unknown)}); see `python train.py --cfg job` for the keys"
        )


def to_schema(cfg: DictConfig | dict, schema: type[T]) -> T:
    """Merge `cfg` onto the dataclass `schema` and build it; errors name the dotted key."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        reason = str(err).splitlines()[0]
        raise ConfigError(f"config key {key!r}: {reason}") from None
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        message = str(err)
        for cls, key in SCHEMA_KEYS.items():  # name the key as the user types it
            message = message.replace(f"{cls}.", f"{key}.")
        raise ConfigError(message) from None


def resume_run_dir(ckpt_path: str | None, default: str) -> str:
    """The run directory to write to: the one holding `ckpt_path` when it is a checkpoint of
    an earlier run (`<run>/checkpoints/x.ckpt` with `<run>/.hydra/`), else `default`."""
    if ckpt_path:
        run = Path(ckpt_path).resolve().parent.parent
        if Path(ckpt_path).resolve().parent.name == "checkpoints" and (run / ".hydra").is_dir():
            return str(run)
    return default


OmegaConf.register_new_resolver("aiayn_run_dir", resume_run_dir, replace=True)


def plain(obj: Any) -> Any:
    """A dataclass config as plain dicts/lists (for hyper-parameters and loggers)."""
    return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)
