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

import datetime
import functools
import inspect
import os
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aiayn.data.config import ROLES, DataConfig
from aiayn.data.special import BOS, EOS, PAD
from aiayn.errors import ConfigError
from aiayn.kernels.policy import POLICIES
from aiayn.launchers import external_launch
from aiayn.model.config import ModelConfig
from aiayn.model.generate import DecodeConfig
from aiayn.training.schedules import OptimConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

T = TypeVar("T")

EVAL_MODES = ("translate", "score")
TEST_CKPTS = ("best", "last", "averaged", "ema")
# what a sweeper may optimise: the validation metrics every run logs
OPTIMIZABLE = ("val/bleu", "val/loss", "val/ppl")

# nested schemas name fields by class; users type them under these keys
SCHEMA_KEYS = {
    "TokenizerConfig": "data.tokenizer",
    "DataConfig": "data",
    "ModelConfig": "model",
    "DecodeConfig": "decode",
}


@dataclass
class DecodeOverrides:
    """Decode keys on top of other settings (a checkpoint's, or `decode` for `val_decode`):
    each is None (kept) unless given, so that `decode.nbest=2` and `+decode.nbest=2` both
    override (`DecodeConfig` says what each means and validates the result)."""

    strategy: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    beam_size: Optional[int] = None  # noqa: UP045
    length_penalty: Optional[float] = None  # noqa: UP045
    max_len_a: Optional[float] = None  # noqa: UP045
    max_len_b: Optional[int] = None  # noqa: UP045
    nbest: Optional[int] = None  # noqa: UP045
    top_k: Optional[int] = None  # noqa: UP045
    top_p: Optional[float] = None  # noqa: UP045
    temperature: Optional[float] = None  # noqa: UP045
    seed: Optional[int] = None  # noqa: UP045
    prefix: Optional[str] = None  # noqa: UP045

    def given(self) -> dict[str, Any]:
        """The keys that were set."""
        return {k: v for k, v in asdict(self).items() if v is not None}


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
    # aiayn.kernels: auto (cpu kernels on a CPU run, stock torch on GPUs), torch or cpu
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


def _check_inference(config: TranslateConfig | EvalConfig) -> None:
    """The checks `translate` and `evaluate` share; ConfigError names the key."""
    from aiayn.inference.ct2 import COMPUTE_TYPES, ENGINES, check_threads

    if not config.ckpt_path and not (config.engine == "ctranslate2" and config.ct2_path):
        raise ConfigError(
            "ckpt_path is required: ckpt_path=logs/train/runs/<ts>/checkpoints/best.ckpt "
            "(or engine=ctranslate2 ct2_path=<exported dir>)"
        )
    if config.engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {config.engine!r}")
    if isinstance(config.ckpt_path, (list, tuple)) and (
        not config.ckpt_path or config.engine != "torch" or config.ct2_path
    ):
        raise ConfigError(
            "ckpt_path=[a.ckpt,b.ckpt,...] (an ensemble) needs at least one checkpoint and "
            "decodes with engine=torch"
        )
    if config.ct2_path and config.engine != "ctranslate2":
        raise ConfigError("ct2_path is a CTranslate2 export: add engine=ctranslate2")
    if config.ct2_compute_type not in COMPUTE_TYPES:
        raise ConfigError(
            f"ct2_compute_type must be one of {COMPUTE_TYPES}, got {config.ct2_compute_type!r}"
        )
    check_threads(config.ct2_inter_threads, config.ct2_intra_threads)
    batch_size, on_long = config.batch_size, config.on_long
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size}")
    from aiayn.inference.translator import ON_LONG

    if on_long not in ON_LONG:
        raise ConfigError(f"on_long must be one of {ON_LONG}, got {on_long!r}")


@dataclass
class TranslateConfig:
    """Everything `python translate.py` reads (conf/translate.yaml)."""

    ckpt_path: Any = None  # a checkpoint, or a list of them: an ensemble ([a.ckpt,b.ckpt])
    input: str = "-"  # a text file, or '-' for standard input
    output: str = "-"  # a text file, or '-' for standard output
    decode: DecodeOverrides = field(default_factory=DecodeOverrides)  # on the checkpoint's
    tokenizer: Optional[str] = None  # noqa: UP045 (default: the checkpoint's own)
    batch_size: int = 32  # lines per batch (1 when reading a terminal)
    on_long: str = "truncate"
    device: str = "auto"  # 'auto' (cuda if available, else cpu), 'cpu', 'cuda:1', ...
    # weights for engine=torch: auto (bfloat16 on bf16 GPUs, float16 on older, float32 on CPU)
    dtype: str = "auto"
    engine: str = "torch"  # or 'ctranslate2' (pip install -e ".[export]")
    ct2_path: Optional[str] = None  # noqa: UP045 (default: the checkpoint's cached conversion)
    ct2_compute_type: str = "default"  # 'int8' quantizes on load
    ct2_inter_threads: int = 0  # CTranslate2 replicas (0: one per CPU thread; 1 on a GPU)
    ct2_intra_threads: int = 0  # threads per replica (0: the CPU threads left, often 1)
    # a text file with one target prefix per input line, forced at the start of its output
    prefix_file: Optional[str] = None  # noqa: UP045
    progress: bool = True  # a progress bar on standard error (on a terminal only)
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "translate"

    def __post_init__(self) -> None:
        _check_inference(self)


@dataclass
class EvalConfig:
    """Everything `python evaluate.py` reads (conf/eval.yaml)."""

    ckpt_path: Any = None  # a checkpoint, or a list of them: an ensemble ([a.ckpt,b.ckpt])
    data: Optional[DataConfig] = None  # noqa: UP045 (None: the checkpoint's run's data)
    decode: DecodeOverrides = field(default_factory=DecodeOverrides)  # on the checkpoint's
    split: str = "test"
    # translate: decode and score BLEU; score: the NLL of the references (per sentence)
    mode: str = "translate"
    tok_bleu: bool = False
    batch_size: int = 64
    on_long: str = "truncate"
    device: str = "auto"
    dtype: str = "auto"  # as translate's: auto, float32, bfloat16, float16
    engine: str = "torch"  # or 'ctranslate2' (pip install -e ".[export]")
    ct2_path: Optional[str] = None  # noqa: UP045 (default: the checkpoint's cached conversion)
    ct2_compute_type: str = "default"  # 'int8' quantizes on load
    ct2_inter_threads: int = 0  # CTranslate2 replicas (0: one per CPU thread; 1 on a GPU)
    ct2_intra_threads: int = 0  # threads per replica (0: the CPU threads left, often 1)
    progress: bool = True  # a progress bar on standard error (on a terminal only)
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "eval"

    def __post_init__(self) -> None:
        _check_inference(self)
        if self.split not in ROLES:
            raise ConfigError(f"split must be one of {ROLES}, got {self.split!r}")
        if self.mode not in EVAL_MODES:
            raise ConfigError(f"mode must be one of {EVAL_MODES}, got {self.mode!r}")
        if self.mode == "score" and self.engine != "torch":
            raise ConfigError("mode=score runs the PyTorch model: drop engine=ctranslate2")


@dataclass
class VisualizeConfig:
    """Everything `python -m aiayn.visualize` reads (conf/visualize.yaml)."""

    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    sentence: Optional[str] = None  # noqa: UP045
    target: Optional[str] = None  # noqa: UP045 (None: the model's own translation)
    output_dir: str = "attention"
    decode: DecodeOverrides = field(default_factory=DecodeOverrides)  # on the checkpoint's
    device: str = "cpu"
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "visualize"

    def __post_init__(self) -> None:
        if not self.ckpt_path or not self.sentence:
            raise ConfigError(
                'ckpt_path and sentence are required: ckpt_path=<ckpt> sentence="..."'
            )


@dataclass
class ExportConfig:
    """Everything `python -m aiayn.export` reads (conf/export.yaml)."""

    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    format: str = "ctranslate2"
    output_dir: Optional[str] = None  # noqa: UP045
    quantization: str = "float32"  # int8, int8_float32, int8_float16, float16, bfloat16
    force: bool = False  # replace an existing output_dir
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "export"

    def __post_init__(self) -> None:
        from aiayn.export.ctranslate2 import QUANTIZATIONS

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


@dataclass
class PrepareConfig:
    """Everything `python -m aiayn.data.prepare` reads (conf/prepare.yaml)."""

    data: DataConfig = field(default_factory=DataConfig)
    progress: bool = True  # progress bars (on a terminal only)
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "prepare"


SCHEMAS = {
    "train_schema": TrainConfig,
    "eval_schema": EvalConfig,
    "translate_schema": TranslateConfig,
    "visualize_schema": VisualizeConfig,
    "prepare_schema": PrepareConfig,
    "export_schema": ExportConfig,
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
    hints = typing.get_type_hints(Trainer.__init__)
    for key, value in trainer.items():
        if key in hints and not _accepts(hints[key], value):
            raise ConfigError(
                f"trainer.{key}={value!r}: lightning.Trainer takes "
                f"{_type_name(hints[key])} for {key}"
            )


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


def resume_run_dir(ckpt_path: str | None, default: str, train: bool = True) -> str:
    """The run directory to write to: when training resumes from a checkpoint of an earlier
    run (`<run>/checkpoints/x.ckpt` with `<run>/.hydra/`), that run's; else a new directory
    claimed from `default` (`new_run_dir`; a test-only run, `train=false`, never writes into
    the run it tests)."""
    run = _resumed_run(ckpt_path, train)
    return str(run) if run is not None else new_run_dir(default)


def _resumed_run(ckpt_path: str | None, train: bool) -> Path | None:
    """The earlier run a training run resumes in place: `<run>` of a `<run>/checkpoints/`
    checkpoint beside `<run>/.hydra/`, else None (a new run directory)."""
    if not (ckpt_path and train):
        return None
    checkpoints = Path(ckpt_path).resolve().parent
    run = checkpoints.parent
    return run if checkpoints.name == "checkpoints" and (run / ".hydra").is_dir() else None


_CLAIMED: dict[str, str] = {}


def log_dir(default: str) -> str:
    """Where runs go (`paths.log_dir`): the environment's ``AIAYN_LOG_DIR`` where it is set and
    not empty, else ``default`` (``<root_dir>/logs``)."""
    return os.environ.get("AIAYN_LOG_DIR") or default


def new_run_dir(path: str) -> str:
    """`path`, else `path_1`, `path_2`, ...: the first of them this process creates. mkdir
    is atomic, so two runs started in the same second (their timestamps equal) get two
    directories instead of sharing one; within a process the same `path` gives the same
    answer (Hydra may resolve its run directory more than once). The ranks of a `torchrun` or
    `srun` launch all get the one rank 0 claims (`aiayn.launchers`)."""
    key = os.path.abspath(path)  # a relative `path` names another directory after a chdir
    if key not in _CLAIMED:
        launch = external_launch()
        claim = functools.partial(_claim_dir, Path(path))
        _CLAIMED[key] = launch.share_run_dir(claim, Path(path).parent) if launch else claim()
    return _CLAIMED[key]


def _claim_dir(base: Path) -> str:
    base.parent.mkdir(parents=True, exist_ok=True)
    candidate, attempt = base, 0
    while True:
        try:
            candidate.mkdir()
            return str(candidate)
        except FileExistsError:
            attempt += 1
            candidate = base.with_name(f"{base.name}_{attempt}")


def check_edits_of_unset_group(overrides: list[str], group: str, why: str) -> None:
    """Refuse `group.key=value` when the command line picks no `group=<option>` and the
    command's config leaves `group` unset (null), before Hydra composes anything (Hydra would
    stop with an internal assertion); `why` says where the settings come from instead."""
    chosen = any(arg.lstrip("+~").startswith(f"{group}=") for arg in overrides)
    for arg in overrides:
        key = arg.lstrip("+~").split("=", 1)[0]
        if key.startswith(f"{group}.") and not chosen:
            raise ConfigError(
                f"{arg}: no {group} config is chosen on this command line ({why}); "
                f"pick one to edit it, e.g. {group}=<option> {arg.lstrip('+')}"
            )


_RESUME_SUBDIRS: dict[str, str] = {}


def resume_output_subdir(ckpt_path: str | None, train: bool = True) -> str | None:
    """Hydra's `output_subdir` (where it saves config.yaml and overrides.yaml): `.hydra`, or
    for a resumed run `.hydra/resume-<time>`, so that resuming never rewrites the original
    run's record (the files its README commands reuse). One name per process. None (no
    record) on the other ranks of a `torchrun`/`srun` launch: rank 0 writes the run's."""
    launch = external_launch()
    if launch is not None and launch.rank != 0:
        return None
    if _resumed_run(ckpt_path, train) is None:
        return ".hydra"
    if ckpt_path not in _RESUME_SUBDIRS:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        _RESUME_SUBDIRS[ckpt_path] = f".hydra/resume-{stamp}"
    return _RESUME_SUBDIRS[ckpt_path]


def accumulate_for(
    tokens_per_update: int, max_tokens: int, devices: Any, num_nodes: int = 1
) -> int:
    """Gradient-accumulation steps so that max_tokens x devices x num_nodes x accumulation is
    about `tokens_per_update` (the paper: ~25 000 per side), whatever the device count."""
    return max(1, round(tokens_per_update / (max_tokens * process_count(devices, num_nodes))))


def process_count(devices: Any, num_nodes: int = 1) -> int:
    """The training processes (world size) of `trainer.devices` x `trainer.num_nodes`.

    `devices` is Lightning's `trainer.devices`: a count, a list of device ids, or 'auto'/-1
    (all visible GPUs, or one process on CPU)."""
    if isinstance(devices, int) and devices > 0:
        count = devices
    elif isinstance(devices, (list, tuple, ListConfig)):
        count = len(devices)
    elif isinstance(devices, str) and devices.isdigit() and int(devices) > 0:
        count = int(devices)
    else:
        import torch

        count = max(torch.cuda.device_count(), 1)
    return count * num_nodes


def register() -> None:
    """Store the command schemas in Hydra's ConfigStore and register the `aiayn_*` resolvers;
    every entry point (and test composing configs) calls this first."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        store.store(name=name, node=schema)
    OmegaConf.register_new_resolver("aiayn_log_dir", log_dir, replace=True)
    OmegaConf.register_new_resolver("aiayn_run_dir", resume_run_dir, replace=True)
    # cached in the config, so that a job process that resolves its sweep directory again
    # (submitit pickles each job's config) gets the one the launcher claimed
    OmegaConf.register_new_resolver("aiayn_new_dir", new_run_dir, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("aiayn_output_subdir", resume_output_subdir, replace=True)
    OmegaConf.register_new_resolver("aiayn_accumulate", accumulate_for, replace=True)
    OmegaConf.register_new_resolver("aiayn_processes", process_count, replace=True)


def plain(obj: Any) -> Any:
    """A dataclass config as plain dicts/lists (for hyper-parameters and loggers)."""
    return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)
