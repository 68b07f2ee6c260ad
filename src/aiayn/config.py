"""Typed schemas for the Hydra config tree and the checks that span several groups.

Each command's schema (`TrainConfig`, `EvalConfig`, `TranslateConfig`, `VisualizeConfig`,
`PrepareConfig`) is stored in Hydra's ConfigStore by `register()` (the entry points call it)
and is the first entry of that command's defaults list, so `conf/` group files list only what
they change, and an unknown key or a value of the wrong type is rejected by its dotted name
while composing. `to_schema` then builds the dataclasses, whose `__post_init__` checks values
and the rules that span groups, before any data is read or model built. Each group's schema
lives next to the code it configures (`ModelConfig` in model/, `DataConfig` in data/,
`DecodeConfig` in model/generate.py, `OptimConfig` in training/schedules.py).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aiayn.data.config import ROLES, DataConfig
from aiayn.data.special import BOS, EOS, PAD
from aiayn.errors import ConfigError
from aiayn.model.config import ModelConfig
from aiayn.model.generate import DecodeConfig
from aiayn.training.schedules import OptimConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

T = TypeVar("T")

TEST_CKPTS = ("best", "last", "averaged")

# nested schemas name fields by class; users type them under these keys
SCHEMA_KEYS = {
    "TokenizerConfig": "data.tokenizer",
    "DataConfig": "data",
    "ModelConfig": "model",
    "DecodeConfig": "decode",
}


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
    # decode keys for validation only, on top of `decode` (e.g. {strategy: greedy}: cheap BLEU
    # while training, beam for the test split and in the checkpoint's settings)
    val_decode: dict[str, Any] = field(default_factory=dict)
    num_samples: int = 8  # sample translations shown per validation (console, W&B)
    # which checkpoint the test split scores after training: best (val/bleu), last, or
    # averaged (needs callbacks=[...,average])
    test_ckpt: str = "best"

    def __post_init__(self) -> None:
        if self.model.share_embeddings == "all" and not self.data.tokenizer.joint:
            raise ConfigError(
                "model.share_embeddings='all' needs one joint vocabulary, but "
                "data.tokenizer.joint=false; set data.tokenizer.joint=true or "
                "model.share_embeddings=decoder"
            )
        for key, fixed in (("pad_id", PAD), ("bos_id", BOS), ("eos_id", EOS)):
            if getattr(self.model, key) != fixed:
                raise ConfigError(
                    f"model.{key} must be {fixed}: the tokenizer fixes the special ids "
                    "(aiayn.data.special)"
                )
        if self.data.max_len + 2 > self.model.max_positions:
            raise ConfigError(
                f"data.max_len={self.data.max_len} (+ <bos>/<eos>) exceeds "
                f"model.max_positions={self.model.max_positions}; lower data.max_len or raise "
                "model.max_positions"
            )
        if self.num_samples < 0:
            raise ConfigError(f"num_samples must be >= 0, got {self.num_samples}")
        if self.test_ckpt not in TEST_CKPTS:
            raise ConfigError(f"test_ckpt must be one of {TEST_CKPTS}, got {self.test_ckpt!r}")
        if self.test_ckpt == "averaged" and "average" not in self.callbacks:
            raise ConfigError(
                "test_ckpt=averaged needs the averaging callback: add "
                "'callbacks=[default,average]' or set test_ckpt=best"
            )
        try:
            self.decode.updated(self.val_decode)
        except ValueError as error:
            raise ConfigError(str(error).replace("DecodeConfig.", "val_decode.")) from None
        check_trainer_kwargs(self.trainer)
        if self.ckpt_path is not None and not Path(self.ckpt_path).is_file():
            raise ConfigError(f"ckpt_path={self.ckpt_path!r} is not a file; give a .ckpt to resume")


def _check_inference(ckpt_path: str | None, batch_size: int, on_long: str) -> None:
    """The checks `translate` and `evaluate` share; ConfigError names the key."""
    if not ckpt_path:
        raise ConfigError(
            "ckpt_path is required: ckpt_path=logs/train/runs/<ts>/checkpoints/best.ckpt"
        )
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size}")
    from aiayn.inference.translator import ON_LONG

    if on_long not in ON_LONG:
        raise ConfigError(f"on_long must be one of {ON_LONG}, got {on_long!r}")


@dataclass
class TranslateConfig:
    """Everything `python translate.py` reads (conf/translate.yaml)."""

    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    input: str = "-"  # a text file, or '-' for standard input
    output: str = "-"  # a text file, or '-' for standard output
    decode: dict[str, Any] = field(default_factory=dict)  # on top of the checkpoint's
    tokenizer: Optional[str] = None  # noqa: UP045 (default: the checkpoint's own)
    batch_size: int = 32  # lines per batch (1 when reading a terminal)
    on_long: str = "truncate"
    device: str = "auto"  # 'auto' (cuda if available, else cpu), 'cpu', 'cuda:1', ...
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "translate"

    def __post_init__(self) -> None:
        _check_inference(self.ckpt_path, self.batch_size, self.on_long)


@dataclass
class EvalConfig:
    """Everything `python evaluate.py` reads (conf/eval.yaml)."""

    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    data: Optional[DataConfig] = None  # noqa: UP045 (None: the checkpoint's run's data)
    decode: dict[str, Any] = field(default_factory=dict)  # on top of the checkpoint's
    split: str = "test"
    tok_bleu: bool = False
    batch_size: int = 64
    on_long: str = "truncate"
    device: str = "auto"
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "eval"

    def __post_init__(self) -> None:
        _check_inference(self.ckpt_path, self.batch_size, self.on_long)
        if self.split not in ROLES:
            raise ConfigError(f"split must be one of {ROLES}, got {self.split!r}")


@dataclass
class VisualizeConfig:
    """Everything `python -m aiayn.visualize` reads (conf/visualize.yaml)."""

    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    sentence: Optional[str] = None  # noqa: UP045
    target: Optional[str] = None  # noqa: UP045 (None: the model's own translation)
    output_dir: str = "attention"
    decode: dict[str, Any] = field(default_factory=dict)  # on top of the checkpoint's
    device: str = "cpu"
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "visualize"

    def __post_init__(self) -> None:
        if not self.ckpt_path or not self.sentence:
            raise ConfigError(
                'ckpt_path and sentence are required: ckpt_path=<ckpt> sentence="..."'
            )


@dataclass
class PrepareConfig:
    """Everything `python -m aiayn.data.prepare` reads (conf/prepare.yaml)."""

    data: DataConfig = field(default_factory=DataConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "prepare"


SCHEMAS = {
    "train_schema": TrainConfig,
    "eval_schema": EvalConfig,
    "translate_schema": TranslateConfig,
    "visualize_schema": VisualizeConfig,
    "prepare_schema": PrepareConfig,
}


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
    """Merge `cfg` onto the dataclass `schema` and build it; errors name the dotted key.

    `cfg` is merged as plain containers (interpolations kept), so that a key the schema lacks
    is rejected also when it was forced in with `+key=value`."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=False)  # type: ignore[assignment]
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


def register() -> None:
    """Store the command schemas in Hydra's ConfigStore and register the `aiayn_run_dir`
    resolver; every entry point (and test composing configs) calls this first."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        store.store(name=name, node=schema)
    OmegaConf.register_new_resolver("aiayn_run_dir", resume_run_dir, replace=True)


def plain(obj: Any) -> Any:
    """A dataclass config as plain dicts/lists (for hyper-parameters and loggers)."""
    return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)
