"""The schema of `aiayn train` (`TrainConfig`, conf/train.yaml and its groups): each group's
own schema lives beside the code it configures (`DataConfig`, `ModelConfig`, `OptimConfig`,
`DecodeConfig`); this module holds the run-level keys, the rules that span groups, and the
check of `trainer.*` against `lightning.Trainer`."""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from aiayn.data.config import DataConfig
from aiayn.data.special import BOS, EOS, PAD
from aiayn.errors import ConfigError
from aiayn.kernels.policy import POLICIES
from aiayn.model.config import ModelConfig
from aiayn.model.generate import DecodeConfig
from aiayn.schema import DecodeOverrides, PathsConfig, did_you_mean
from aiayn.training.schedules import OptimConfig

TEST_CKPTS = ("best", "last", "averaged", "ema")
# what a sweeper may optimise: the validation metrics every run logs
OPTIMIZABLE = ("val/bleu", "val/loss", "val/ppl")


@dataclass
class TrainConfig:
    """Everything `aiayn train` reads (conf/train.yaml and its groups)."""

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
    # torch.compile the training step (aiayn.kernels.compiled): null = where it wins (GPUs)
    compile: Optional[bool] = None  # noqa: UP045
    # aiayn.kernels: auto (cpu on a CPU run, gpu on GPUs), torch (stock everywhere), cpu or gpu
    kernels: str = "auto"
    val_bleu: bool = True
    # decode keys for validation only, on top of `decode` (e.g. {strategy: greedy}: cheap BLEU
    # while training, beam for the test split and in the checkpoint's settings)
    val_decode: DecodeOverrides = field(default_factory=DecodeOverrides)
    num_samples: int = 8  # sample translations shown per validation (console, W&B)
    # which checkpoint the test split scores after training: best (val/bleu), last,
    # averaged (needs callbacks=[...,average]) or ema (needs callbacks=[...,ema])
    test_ckpt: str = "best"
    # the value `python train.py` returns to Hydra sweepers (hparams_search=optuna): a metric
    # the run logs, its best validation value when it is the checkpoint monitor, else its last
    optimized_metric: str = "val/bleu"
    # fine-tune: a new run starting from this checkpoint's weights and tokenizer, with a fresh
    # optimizer, schedule and data position (fairseq --restore-file --reset-optimizer)
    init_from: Optional[str] = None  # noqa: UP045
    # a multirun to relaunch (`-m` with its overrides): finished jobs kept, stopped ones
    # resumed from their last.ckpt, the rest run (aiayn.training.sweep_resume)
    resume_sweep: Optional[str] = None  # noqa: UP045
    # several processes: a rank not heard from for this long ends the run with one line naming
    # it (aiayn.callbacks.PeerWatch; NCCL itself would wait for its 30-minute timeout)
    peer_silence_s: float = 30.0
    # a recipe sized for a GPU names the experiment to use on a CPU instead (multi30k_gpu:
    # multi30k_cpu): run on a CPU, it is refused, or with trainer=cpu warned, in one line
    cpu_recipe: Optional[str] = None  # noqa: UP045

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
        if not self.peer_silence_s > 0:
            raise ConfigError(f"peer_silence_s must be > 0 seconds, got {self.peer_silence_s}")
        if self.optimized_metric not in OPTIMIZABLE:
            raise ConfigError(
                f"optimized_metric={self.optimized_metric!r} is not a metric the run logs; use "
                f"one of {OPTIMIZABLE}"
            )
        if self.test_ckpt not in TEST_CKPTS:
            raise ConfigError(f"test_ckpt must be one of {TEST_CKPTS}, got {self.test_ckpt!r}")
        for name, key in (("averaged", "average"), ("ema", "ema")):
            if self.test_ckpt == name and key not in self.callbacks:
                raise ConfigError(
                    f"test_ckpt={name} needs the {key} callback: add "
                    f"'callbacks=[default,{key}]' or set test_ckpt=best"
                )
        try:
            self.decode.updated(self.val_decode.given())
        except ValueError as error:
            raise ConfigError(str(error).replace("DecodeConfig.", "val_decode.")) from None
        check_trainer_kwargs(self.trainer)
        nothing = [k for k in NO_TRAINING_AT_ZERO if self.trainer.get(k) in (0, 0.0)]
        if self.train and nothing:
            raise ConfigError(
                f"trainer.{nothing[0]}=0 trains nothing, and the test would score an untrained "
                "model; give it a budget, or test a checkpoint with train=false ckpt_path=<ckpt>"
            )
        # Lightning: -1 is no limit (max_epochs=None is 1 000 epochs)
        limits = (self.trainer.get(key, -1) for key in ("max_steps", "max_epochs"))
        budget = any(limit != -1 for limit in limits) or self.trainer.get("max_time")
        if self.optim.cooldown > 0 and not budget:
            raise ConfigError(
                f"optim.cooldown={self.optim.cooldown} decays the rate to zero at the end of the "
                "training budget, but there is none: set trainer.max_steps, trainer.max_epochs or "
                "trainer.max_time, or optim.cooldown=0"
            )
        if self.kernels not in POLICIES:
            raise ConfigError(f"kernels must be one of {POLICIES}, got {self.kernels!r}")
        if self.ckpt_path is not None and not Path(self.ckpt_path).is_file():
            raise ConfigError(f"ckpt_path={self.ckpt_path!r} is not a file; give a .ckpt to resume")
        if self.init_from is not None and self.ckpt_path is not None:
            raise ConfigError(
                "ckpt_path resumes a run, init_from starts a new one from a checkpoint's "
                "weights: give one of them"
            )
        if self.init_from is not None and not Path(self.init_from).is_file():
            raise ConfigError(f"init_from={self.init_from!r} is not a file; give a .ckpt")
        if self.init_from is not None and self.data.tokenizer.path is not None:
            raise ConfigError(
                "init_from uses the checkpoint's tokenizer (its vocabulary is the model's): "
                "drop data.tokenizer.path"
            )


# trainer keys Lightning divides by (a 0 was a ZeroDivisionError mid-run), and what they mean
POSITIVE_TRAINER_KEYS = {
    "accumulate_grad_batches": "batches an update",
    "val_check_interval": "batches, or the fraction of an epoch, between validations",
    "check_val_every_n_epoch": "epochs between validations; null: validate by val_check_interval",
}


# trainer keys whose 0 means no training at all
NO_TRAINING_AT_ZERO = ("max_epochs", "max_steps", "limit_train_batches")


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
        hint = did_you_mean(f"trainer.{unknown[0]}", sorted(accepted))
        raise ConfigError(
            f"trainer.{unknown[0]} is not an argument of lightning.Trainer "
            f"(unknown: {', '.join(unknown)}){hint}; `aiayn train --cfg job` shows the keys"
        )
    hints = typing.get_type_hints(Trainer.__init__)
    for key, value in trainer.items():
        if key in hints and not _accepts(hints[key], value):
            raise ConfigError(
                f"trainer.{key}={value!r}: lightning.Trainer takes "
                f"{_type_name(hints[key])} for {key}"
            )
    for key, why in POSITIVE_TRAINER_KEYS.items():
        value = trainer.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and not value > 0:
            raise ConfigError(f"trainer.{key}={value!r} must be > 0 ({why})")


def _accepts(annotation: Any, value: Any) -> bool:
    """Whether `value` can be `annotation` (a Union, Literal, generic or plain class); a
    `_target_` node (an object built later) and what cannot be checked pass."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(value, dict) and "_target_" in value:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(arm, value) for arm in args)
    if origin is typing.Literal:  # a value of the literals' types: "auto" is resolved later
        return any(type(value) is type(arg) for arg in args)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    target = origin or annotation
    return not isinstance(target, type) or isinstance(value, target)


def _type_name(annotation: Any) -> str:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arm) for arm in args)
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(repr(arg) for arg in args)
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))
