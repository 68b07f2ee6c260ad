"""`run(cfg)`: what `python train.py` does, as a library function.

Validate the composed config, prepare the data (tokenizer + binarized cache), build the
module, trainer, loggers and callbacks, fit, test the checkpoint `test_ckpt` names (best,
last or averaged), and write `metrics.json` into the run directory.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar, Timer
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf, open_dict

from aiayn import kernels
from aiayn.callbacks import (
    EMA,
    AverageCheckpoints,
    LastCheckpoint,
    PeerWatch,
    RNGState,
    SigtermAtLogSteps,
    SyncedTimer,
    Throughput,
)
from aiayn.callbacks.peers import peer_gone
from aiayn.callbacks.throughput import peak_rss_mib
from aiayn.config import CONF_DIR, process_count
from aiayn.console import closing_summary, set_progress, tidy_library_output
from aiayn.data.datamodule import TranslationDataModule
from aiayn.data.sampler import mid_epoch_world_size
from aiayn.data.tokenizer import Tokenizers
from aiayn.errors import ConfigError, StoppedError, writing
from aiayn.inference.checkpoint import model_weights, read_checkpoint
from aiayn.kernels.allocator import keep_freed_memory
from aiayn.kernels.compiled import resolve_compile
from aiayn.launchers import external_launch, started_by_lightning
from aiayn.model import ModelConfig
from aiayn.model.summary import format_parameter_summary, forward_flops, parameter_summary
from aiayn.ownership import check_writers
from aiayn.schema import command_line_settings, plain, to_schema
from aiayn.training import devices
from aiayn.training.checkpoint_io import AtomicCheckpointIO
from aiayn.training.config import TrainConfig
from aiayn.training.loggers import CSVLogger, replay
from aiayn.training.module import TranslationModule
from aiayn.training.sweep_resume import jobs_not_run

log = logging.getLogger(__name__)

# environment variables that override the CPU kernels' defaults (recorded in metrics.json):
# aiayn's own, and the capacities of oneDNN's primitive cache and of the one PyTorch's ideep
# layer keeps on top, which bound the memory that products of ever new shapes hold
# (docs/recipes.md)
KERNEL_ENV = ("AIAYN_ONEDNN", "AIAYN_PACK_WEIGHTS", "AIAYN_KEEP_FREED_MEMORY")
KERNEL_ENV += ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def validate(cfg: DictConfig) -> TrainConfig:
    """The typed config, with every check that needs no data: schemas, cross-group rules and,
    when resuming, that the checkpoint was trained with the same model and optimizer."""
    config = to_schema(cfg, TrainConfig)
    _check_callbacks(config)
    check_writers(cfg, Path(config.paths.output_dir), resuming=bool(config.ckpt_path))
    if config.ckpt_path:
        _check_resume(config)
    if config.init_from:
        _init_weights(config)  # read and checked before any work
    trainer = config.trainer
    trainer["precision"] = devices.resolve_precision(trainer.get("precision", "auto"), trainer)
    on_gpu = not devices.on_cpu(trainer)
    config.kernels = kernels.resolve(config.kernels, on_gpu=on_gpu)
    device_type = "cuda" if devices.on_cuda(trainer) else "cpu" if not on_gpu else "other"
    config.compile = resolve_compile(config.compile, device_type, config.model.arch)
    with open_dict(cfg):  # the run config (loggers, W&B) records what was resolved
        cfg.trainer.precision, cfg.kernels = trainer["precision"], config.kernels
        cfg.compile = config.compile
    recipe = config.cpu_recipe
    if recipe and not (CONF_DIR / "experiment" / f"{recipe}.yaml").is_file():
        raise ConfigError(f"cpu_recipe={recipe}: there is no conf/experiment/{recipe}.yaml")
    devices.check_accelerator(trainer, recipe)
    devices.check(trainer, config.model.arch)
    devices.check_strategy(trainer)
    _check_multirun_launch(trainer)
    return config


def _check_multirun_launch(trainer: dict[str, Any]) -> None:
    """Refuse a multirun job of several processes that Lightning's own launcher would start:
    it restarts this command (`-m` and the whole sweep included) in each extra process, so each
    would run the sweep again, in directories of its own (issue 49). A job whose processes a
    cluster launcher started (srun under `hydra/launcher=slurm_gpu`, torchrun) is one
    process of that launch and goes on."""
    if not _in_multirun():
        return
    processes = process_count(trainer.get("devices", "auto"), trainer.get("num_nodes", 1))
    if processes <= 1 or external_launch() is not None:
        return
    raise ConfigError(
        f"a multirun (-m) job of {processes} processes under Lightning's own launcher: "
        "Lightning restarts this command in each extra process, which would run the whole "
        "sweep again; run each job on one device (trainer.devices=1), or let the sweep's "
        "launcher start every process: hydra/launcher=slurm_gpu (srun per job), or torchrun "
        "per job without -m"
    )


def _init_weights(config: TrainConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The Transformer weights and tokenizer state of `config.init_from`, after checking that
    its model config is this run's (vocabulary sizes come with its tokenizer)."""
    saved = read_checkpoint(config.init_from)  # type: ignore[arg-type]
    model = (saved.get("hyper_parameters") or {}).get("model")
    if model is None or not saved.get("tokenizers"):
        raise ConfigError(
            f"init_from={config.init_from}: not a checkpoint written by `python train.py` "
            "(no model hyper-parameters or no tokenizer)"
        )
    for key, value in plain(config.model).items():
        if key in ("src_vocab_size", "tgt_vocab_size"):
            continue
        if model.get(key, value) != value:
            raise ConfigError(
                f"init_from={config.init_from} has model.{key}={model[key]!r}, this run "
                f"model.{key}={value!r}: set model.{key}={model[key]!r} (the weights must fit)"
            )
    return model_weights(saved), saved["tokenizers"]


def build_trainer(config: TrainConfig, resumed_step: int | None = None) -> L.Trainer:
    """Trainer, callbacks and loggers from their configs (bad arguments fail here, before any
    data is read), plus what every run has: RNG state in checkpoints, throughput, atomic
    checkpoint writes, no collective in a training step between log steps beyond the
    gradients' (a SIGTERM is agreed on and `trainer.max_time`'s clock read at log steps), and
    a watch for dead ranks."""
    callbacks = [_instantiate(f"callbacks.{k}", c) for k, c in config.callbacks.items() if c]
    last = next((c.path for c in callbacks if isinstance(c, LastCheckpoint)), None)
    callbacks += [RNGState(), Throughput(), SigtermAtLogSteps()]
    callbacks += [PeerWatch(config.peer_silence_s, last)]
    show_progress = config.trainer.get("enable_progress_bar", True)
    set_progress(show_progress)  # data preparation's bars too
    if not show_progress:  # so the flag alone turns it off
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    loggers = [
        _instantiate(f"logger.{k}", c, **_sweep_group(c), **_purge_after(c, resumed_step))
        for k, c in config.logger.items()
        if c
    ]
    trainer = _instantiate(
        "trainer",
        config.trainer,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[AtomicCheckpointIO()],
    )
    for i, callback in enumerate(trainer.callbacks):  # trainer.max_time's, or one configured
        if type(callback) is Timer and callback._interval == "step":
            trainer.callbacks[i] = SyncedTimer.replacing(callback)
    return trainer


def _purge_after(node: dict[str, Any], resumed_step: int | None) -> dict[str, int]:
    """A resumed run's TensorBoard writer hides the events a killed run logged after the
    checkpoint's update (`SummaryWriter(purge_step=...)`), as the CSV and W&B histories drop
    them."""
    if resumed_step is None or not str(node.get("_target_", "")).endswith("TensorBoardLogger"):
        return {}
    return {"purge_step": resumed_step + 1}


def _sweep_group(node: dict[str, Any]) -> dict[str, str]:
    """In a multirun, a W&B logger without a group joins the group named after the multirun
    directory, so the project page shows the sweep as one table."""
    from hydra.core.hydra_config import HydraConfig

    if not str(node.get("_target_", "")).endswith("WandbLogger") or node.get("group"):
        return {}
    if not _in_multirun():
        return {}
    return {"group": Path(HydraConfig.get().sweep.dir).name}


def _in_multirun() -> bool:
    """Whether this process runs a job of a Hydra multirun."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.initialized() and getattr(HydraConfig.get().mode, "name", "") == "MULTIRUN"


def build(config: TrainConfig) -> tuple[TranslationDataModule, TranslationModule]:
    """Prepare the data and build the module (vocabulary sizes from the tokenizer)."""
    L.seed_everything(config.seed, workers=True)
    weights = None
    if config.init_from:
        weights, tokenizer_state = _init_weights(config)
        directory = Path(config.paths.output_dir) / "init_tokenizer"
        Tokenizers.from_state(tokenizer_state).save(directory)
        tokenizer = replace(config.data.tokenizer, path=str(directory))
        data = replace(config.data, tokenizer=tokenizer)
    else:
        data = config.data
    datamodule = TranslationDataModule(data, seed=config.seed)
    datamodule.prepare_data()
    if config.ckpt_path:
        _check_resumed_tokenizer(config.ckpt_path, datamodule.tokenizers)
    model_config = replace(
        config.model,
        src_vocab_size=datamodule.src_vocab_size,
        tgt_vocab_size=datamodule.tgt_vocab_size,
    )
    module = TranslationModule(
        model=plain(model_config),
        optim=plain(config.optim),
        decode=plain(config.decode),
        val_bleu=config.val_bleu,
        num_samples=config.num_samples,
        val_decode=config.val_decode.given(),
        compile=config.compile,
    )
    module.tokenizers = datamodule.tokenizers
    if weights is not None:
        module.model.load_state_dict(weights)  # shapes checked: same config and vocabulary
    return datamodule, module


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train (and test) as configured; returns the metrics also written to metrics.json."""
    start = time.perf_counter()
    tidy_library_output()
    config = validate(cfg)
    kernels.use(config.kernels)
    if config.kernels == "cpu":
        keep_freed_memory()  # each step's tensors reuse freed memory (aiayn.kernels.allocator)
    if devices.on_cuda(config.trainer):
        devices.use_gpu_settings()
    resumed = config.train and config.ckpt_path  # training continues from this checkpoint
    resumed_step = int(read_checkpoint(resumed)["global_step"]) if resumed else None
    trainer = build_trainer(config, resumed_step)
    loggers = trainer.loggers
    output_dir = Path(config.paths.output_dir)
    failed = True
    try:
        datamodule, module = build(config)
        summary = parameter_summary(module.model)
        _log_run_info(trainer, cfg, summary, module.model_config, datamodule, output_dir)
        metrics: dict[str, Any] = {}
        if config.train:
            _check_validation_interval(trainer, datamodule)
            if resumed_step is not None:  # every check passed: the run's history continues
                _continue_history(trainer, resumed_step)
            with _ends_in_one_line(trainer, output_dir, "training"):
                trainer.fit(module, datamodule=datamodule, ckpt_path=config.ckpt_path)
            metrics["fit"] = _floats(trainer.callback_metrics)
            throughput = next(c for c in trainer.callbacks if isinstance(c, Throughput))
            rate = throughput.mean_rate(trainer.world_size)
            if rate is not None:
                metrics["train_tokens_per_sec"] = rate
                target_rate = throughput.mean_rate(trainer.world_size, target_only=True)
                metrics["train_target_tokens_per_sec"] = target_rate
                # the count behind it, this attempt's (benchmarks/peers' one clock): exact in
                # one process; with several, this rank's times their number, as the rate is
                metrics["train_target_tokens"] = throughput.target_tokens * trainer.world_size
            metrics["updates"] = trainer.global_step
            # train/mfu's denominator (aiayn.kernels.machine.mfu_peak): a GPU's datasheet peak,
            # else the one measured here; the peak measured at fit start beside it
            peak = throughput.peak
            metrics["mfu_peak_tflops"] = peak.flops / 1e12 if peak else None
            metrics["mfu_peak_source"] = peak.source if peak else None
            measured = peak.measured if peak else None
            metrics["matmul_peak_gflops"] = measured / 1e9 if measured else None
        if config.test:  # the best checkpoint of this run, or the one given when not training
            checkpoint = _test_checkpoint(trainer, config) if config.train else config.ckpt_path
            if isinstance(trainer.strategy, ModelParallelStrategy):
                # a test loads weights only: without this, Lightning's ModelParallelStrategy
                # looks for the fit's optimizer states in the checkpoint (an average has none)
                trainer.strategy.optimizers = []
            with _ends_in_one_line(trainer, output_dir, "testing"):
                results = trainer.test(module, datamodule=datamodule, ckpt_path=checkpoint)
            metrics["test"] = results[0] if results else {}
            metrics["test_checkpoint"] = checkpoint
        metrics.update(_checkpoint_info(trainer), parameters=summary, run_dir=str(output_dir))
        metrics["resumed_from"] = config.ckpt_path
        metrics["precision"] = config.trainer["precision"]
        metrics["kernels"] = config.kernels
        metrics["compile"] = config.compile
        metrics["kernel_overrides"] = {k: v for k, v in os.environ.items() if k in KERNEL_ENV}
        metrics["wall_clock_min"] = (time.perf_counter() - start) / 60  # this process
        metrics["peak_rss_mib"] = peak_rss_mib()  # this process: training and test
        metrics["finished"] = True  # a stopped run's metrics.json says false (`_stopped`)
        _write_metrics(output_dir / "metrics.json", metrics)
        _print_result(metrics)
        failed = False
        return metrics
    finally:
        _finish_wandb(loggers, failed)


def _instantiate(key: str, node: Any, **kwargs: Any) -> Any:
    try:
        return instantiate(node, **kwargs)
    except Exception as err:  # hydra wraps the target's own error; show it with the key
        cause = err.__cause__ or err
        raise ConfigError(f"{key}: {type(cause).__name__}: {cause}") from None


def _check_resume(config: TrainConfig) -> None:
    saved = read_checkpoint(config.ckpt_path)
    if config.train and ("averaged_from" in saved or "optimizer_states" not in saved):
        what = "an average of checkpoints" if "averaged_from" in saved else "weights only"
        raise ConfigError(
            f"ckpt_path={config.ckpt_path} is {what}, without the optimizer and data position "
            f"a run resumes from: resume from the run's last.ckpt, or start a new run from "
            f"these weights with init_from={config.ckpt_path}"
        )
    _check_world_size(config, saved)
    hparams = saved.get("hyper_parameters", {})
    current = {"model": plain(config.model), "optim": plain(config.optim)}
    for group, values in current.items():
        for key, value in values.items():
            if key in ("src_vocab_size", "tgt_vocab_size"):  # set from the tokenizer
                continue
            old = hparams.get(group, {}).get(key, value)
            if old != value:
                raise ConfigError(
                    f"ckpt_path={config.ckpt_path} was trained with {group}.{key}={old!r}, "
                    f"this run has {group}.{key}={value!r}: resume with the overrides of the "
                    "original run (its .hydra/overrides.yaml) plus ckpt_path"
                )


def _check_world_size(config: TrainConfig, saved: dict[str, Any]) -> None:
    """A run stopped mid-epoch resumes with as many processes as it had: each process's data
    position is a place in its own shard (launchers may change, the count may not)."""
    state = saved.get(TranslationDataModule.__qualname__, {}).get("train_sampler", {})
    old = mid_epoch_world_size(state)
    trainer = config.trainer
    launch = external_launch()
    new = (
        launch.world_size
        if launch
        else process_count(trainer.get("devices", "auto"), trainer.get("num_nodes", 1))
    )
    if old is not None and old != new:
        raise ConfigError(
            f"ckpt_path={config.ckpt_path} stopped in the middle of an epoch of a {old}-process "
            f"run, and this run starts {new} (trainer.devices x trainer.num_nodes): its data "
            f"position is per process, so resume with {old} processes, or resume from a "
            "checkpoint written at an epoch end, or start from its weights alone with "
            "init_from=<ckpt>"
        )


@rank_zero_only
def _continue_history(trainer: L.Trainer, step: int) -> None:
    """A resumed run's history continues from its checkpoint's update `step`: the CSV rows a
    killed run logged after it are dropped, and the new W&B run starts with the rows before
    it (from the CSV history; without a CSV logger it starts at `step`, and says so); the
    callbacks that keep records in the run directory (sample translations, attention maps)
    do the same with theirs."""
    rows = None
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            rows = logger.forget_after(step)
    wandb = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
    if wandb and rows is None:
        log.warning(
            "this W&B run starts at update %d: the history before it is in the earlier "
            "attempt's W&B run (a resumed run replays it from csv/metrics.csv, which this run "
            "does not have)",
            step,
        )
    for logger in wandb:
        replay(logger, rows or [])
    for callback in trainer.callbacks:  # the records callbacks keep in the run directory
        if hasattr(callback, "continue_after"):
            callback.continue_after(step, wandb)


def _check_resumed_tokenizer(ckpt_path: str, tokenizers: Tokenizers) -> None:
    """A run resumes with the tokenizer it was trained with (before anything is written)."""
    saved = read_checkpoint(ckpt_path).get("tokenizers")
    if saved and Tokenizers.from_state(saved).state() != tokenizers.state():
        raise ConfigError(
            f"ckpt_path={ckpt_path} was trained with another tokenizer than the data settings "
            "give now (data.tokenizer.* or the corpus differ): resume with the original run's "
            "overrides (its .hydra/overrides.yaml) plus ckpt_path"
        )


def _needs_whole_weights(target: str) -> bool:
    """Whether the callback class `target` declares `needs_whole_weights` (a target that does
    not import is left to instantiation, which names it)."""
    try:
        return bool(getattr(get_class(target), "needs_whole_weights", False))
    except Exception:  # hydra raises several types for a bad _target_
        return False


def _check_callbacks(config: TrainConfig) -> None:
    for group in ("callbacks", "logger"):
        for key, node in getattr(config, group).items():
            if node and "_target_" not in node:
                raise ConfigError(
                    f"{group}.{key} sets {sorted(node)} but names no class (_target_): its "
                    f"group option is not selected; add it ({group}=[...,{key}]) or drop "
                    f"the keys ({group}.{key}=null)"
                )
    strategy = config.trainer.get("strategy")
    sharded = isinstance(strategy, dict) and "ModelParallel" in str(strategy.get("_target_"))
    for key, node in config.callbacks.items():
        target = str((node or {}).get("_target_", ""))
        if sharded and _needs_whole_weights(target):
            raise ConfigError(
                f"callbacks.{key} ({target}) reads or keeps the whole weights on one process, "
                "which trainer=fsdp does not give it yet; drop it (callbacks=default, and "
                "test_ckpt=best if it was ema), or train with trainer=ddp"
            )
    if config.val_bleu:
        return
    for key, node in config.callbacks.items():
        if (node or {}).get("monitor") == "val/bleu":
            raise ConfigError(
                f"val_bleu=false, but callbacks.{key}.monitor=val/bleu; set "
                f"callbacks.{key}.monitor=val/loss callbacks.{key}.mode=min"
            )


@rank_zero_only
def _log_run_info(
    trainer: L.Trainer,
    cfg: DictConfig,
    summary: dict[str, int],
    model_config: ModelConfig,
    datamodule: TranslationDataModule,
    output_dir: Path,
) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    datamodule.tokenizers.save(output_dir)
    log.info("parameters:\n%s", format_parameter_summary(summary))
    per_token = forward_flops(model_config, 1, 32, 32) / 32 / 1e6
    log.info(
        "%.1f MFLOP forward, %.1f MFLOP per training step, per target token (32-token "
        "sentences on both sides)",
        per_token,
        3 * per_token,
    )
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for logger in trainer.loggers:
        # the command-line overrides as top-level keys: a sweep's jobs side by side
        swept = command_line_settings() or {}
        logger.log_hyperparams({**swept, "config": resolved, "parameters": summary})
        if isinstance(logger, WandbLogger):
            for name, summary_kind in (("val/bleu", "max"), ("val/ppl", "min")):
                logger.experiment.define_metric(
                    name, step_metric="trainer/global_step", summary=summary_kind
                )
            logger.experiment.summary.update({f"parameters/{k}": v for k, v in summary.items()})


def _best_callback(trainer: L.Trainer) -> ModelCheckpoint | None:
    return next((c for c in trainer.checkpoint_callbacks if c.monitor is not None), None)


def _test_checkpoint(trainer: L.Trainer, config: TrainConfig) -> str | None:
    """The checkpoint `test_ckpt` names: best (by the monitored metric), last, averaged or
    ema."""
    kinds = {"averaged": AverageCheckpoints, "ema": EMA}
    if config.test_ckpt in kinds:
        writer = next(c for c in trainer.callbacks if isinstance(c, kinds[config.test_ckpt]))
        return str(writer.path(trainer))
    if config.test_ckpt == "last":
        return _last_checkpoint(trainer)
    return _best_checkpoint(trainer)


def _last_checkpoint(trainer: L.Trainer) -> str | None:
    last = next((c for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint)), None)
    return str(last.path) if last and last.path.is_file() else None


def objective(metrics: dict[str, Any], name: str) -> float | None:
    """The value a Hydra sweeper optimises: metric `name`'s best validation value when it is
    the checkpoint monitor, else its last logged value; None when it was never logged."""
    best = metrics.get("best", {})
    value = best[name] if name in best else metrics.get("fit", {}).get(name)
    return None if value is None or not math.isfinite(value) else float(value)


def _best_checkpoint(trainer: L.Trainer) -> str | None:
    callback = _best_callback(trainer)
    return (callback.best_model_path or None) if callback else None


def _checkpoint_info(trainer: L.Trainer) -> dict[str, Any]:
    info: dict[str, Any] = {"best_checkpoint": _best_checkpoint(trainer), "best": {}}
    callback = _best_callback(trainer)
    if callback is not None and callback.best_model_score is not None:
        info["best"] = {callback.monitor: float(callback.best_model_score)}
    info["last_checkpoint"] = _last_checkpoint(trainer)
    return info


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float (NaN, inf) as None: metrics.json stays strict
    JSON, which `NaN` is not."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@contextmanager
def _ends_in_one_line(trainer: L.Trainer, output_dir: Path, stage: str) -> Iterator[None]:
    """`stage` ("training" or "testing") ended by a signal or by a dead peer becomes one
    line: SIGTERM (a preemption, `scancel`) or SIGINT (Ctrl-C) a `StoppedError` saying where
    the run stopped and how to resume (`_stopped`); a collective that failed because a DDP
    peer died (killed, out of memory, its node lost) the dead rank named
    (`aiayn.callbacks.PeerWatch`)."""
    try:
        yield
    except SystemExit as stop:  # how Lightning ends a fit or test on SIGTERM or Ctrl-C
        name = _stop_signal(trainer, stop)
        if name is None:
            raise
        raise _stopped(trainer, output_dir, name, stage) from None
    except RuntimeError as error:
        seen = peer_gone(error)
        watch = next((c for c in trainer.callbacks if isinstance(c, PeerWatch)), None)
        if trainer.world_size == 1 or seen is None or watch is None:
            raise
        raise watch.error(seen) from None


def _check_validation_interval(trainer: L.Trainer, datamodule: TranslationDataModule) -> None:
    """ConfigError, before fitting, for an integer `trainer.val_check_interval` beyond the
    batches an epoch holds while `trainer.check_val_every_n_epoch` counts epochs: Lightning
    raised it as a traceback once fitting began."""
    interval = trainer.val_check_interval
    if not isinstance(interval, int) or trainer.check_val_every_n_epoch is None:
        return
    batches = datamodule.train_batches(trainer.world_size)
    limit = trainer.limit_train_batches
    if isinstance(limit, int):
        batches = min(batches, limit)
    elif limit is not None:
        batches = int(batches * limit)
    if interval > batches:
        ranks = f" on each of its {trainer.world_size} ranks" if trainer.world_size > 1 else ""
        raise ConfigError(
            f"trainer.val_check_interval={interval} is more than the {batches} training batches "
            f"of an epoch{ranks}: give at most {batches}, a fraction of an epoch "
            "(trainer.val_check_interval=0.5), or trainer.check_val_every_n_epoch=null to count "
            "batches across epochs"
        )


def _stop_signal(trainer: L.Trainer, stop: SystemExit) -> str | None:
    """The signal behind Lightning's SystemExit: SIGTERM (its SIGTERMException) or SIGINT
    (after a KeyboardInterrupt it interrupts the trainer and exits 1), else None."""
    if isinstance(stop, SIGTERMException):
        return "SIGTERM"
    if stop.code == 1 and isinstance(stop.__context__, KeyboardInterrupt):
        return "SIGINT"  # Lightning exits while it handles the KeyboardInterrupt
    return None


def _stopped(trainer: L.Trainer, output_dir: Path, name: str, stage: str) -> StoppedError:
    """The error of a run a signal stopped, after writing what it has: `metrics.json`
    marked unfinished (`finished: false`, where and why it stopped, the checkpoint to resume
    from). On SIGTERM `LastCheckpoint` has written the update it stopped at. Rank 0 reads
    and says it; the other ranks end quietly."""
    last = _last_checkpoint(trainer)
    step, saved = trainer.global_step, None
    if last is not None and trainer.is_global_zero:
        saved = int(read_checkpoint(last)["global_step"])
    metrics = {
        "finished": False,
        "stopped_by": name,
        "stopped_while": stage,
        "updates": step,
        "last_checkpoint": last if saved is not None else None,
        "last_checkpoint_update": saved,
        "run_dir": str(output_dir),
    }
    _write_metrics(output_dir / "metrics.json", metrics)
    where = f"{name} stopped the run while {stage}, at update {step}"
    if stage == "testing":
        how = "the training finished; test it with evaluate.py ckpt_path=<its checkpoint>"
    elif saved is None:
        how = "no checkpoint was written yet: start it again"
    else:
        how = f"resume with ckpt_path={last} (update {saved})"
    error = StoppedError(f"{where}; {how}", 128 + getattr(signal, name))
    error.quiet = trainer.global_rank != 0  # one line for the run: rank 0's
    if started_by_lightning():  # exit 0: Lightning's launcher kills rank 0 on a non-zero one
        error.exit_code = 0
    if _in_multirun():
        error.ends_sweep = jobs_not_run()
    return error


@rank_zero_only
def _write_metrics(path: Path, metrics: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    plain_floats = json.loads(json.dumps(metrics, default=float))  # tensors, numpy -> float
    text = json.dumps(strict_json(plain_floats), indent=2, allow_nan=False) + "\n"
    try:
        with writing(path, len(text.encode())):
            tmp.write_text(text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


@rank_zero_only
def _print_result(metrics: dict[str, Any]) -> None:
    print(closing_summary(metrics), flush=True)


def _finish_wandb(loggers: list[Logger], failed: bool) -> None:
    """One W&B run per job, always finished (also when the job failed), so multirun jobs
    that share a process never log into each other's run."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            logger.experiment.finish(exit_code=1 if failed else 0)
