"""Assemble and register the config tree: every command's schema, stored in Hydra's
ConfigStore by `register()` (the entry points call it) as the first entry of that command's
defaults list, so `conf/` files list only what they change and an unknown key or a value of
the wrong type is refused by its dotted name while composing; and the `aiayn_*` resolvers the
YAML files use (run directories, resume, gradient accumulation).

Each schema lives beside its command: `TrainConfig` in training/config.py, `EvalConfig`,
`TranslateConfig` and `VisualizeConfig` in inference/config.py, `ExportConfig` in
export/config.py, `PrepareConfig` in data/prepare.py; each group's beside the code it
configures (`ModelConfig` in model/, `DataConfig` in data/, `DecodeConfig` in
model/generate.py, `OptimConfig` in training/schedules.py). `to_schema` (aiayn.schema) builds
them; their `__post_init__` checks values and the rules that span groups, before any data is
read or model built. The names stay importable from here.
"""

from __future__ import annotations

import datetime
import functools
import os
from pathlib import Path
from typing import Any

from omegaconf import ListConfig, OmegaConf

from aiayn import launchers
from aiayn.data.prepare import PrepareConfig
from aiayn.errors import CLAIMED_RUN_DIRS, ConfigError, exit_in_hydra
from aiayn.export.config import EXPORT_FORMATS, ExportConfig
from aiayn.inference.config import (
    EVAL_MODES,
    DecodingJobConfig,
    EvalConfig,
    TranslateConfig,
    VisualizeConfig,
)
from aiayn.launchers import external_launch
from aiayn.schema import (
    SCHEMA_KEYS,
    DecodeOverrides,
    PathsConfig,
    check_override_keys,
    plain,
    to_schema,
)
from aiayn.training.config import OPTIMIZABLE, TEST_CKPTS, TrainConfig, check_trainer_kwargs
from aiayn.training.sweep_resume import attempted_before

__all__ = [
    "CONF_DIR",
    "EVAL_MODES",
    "EXPORT_FORMATS",
    "OPTIMIZABLE",
    "SCHEMAS",
    "SCHEMA_KEYS",
    "TEST_CKPTS",
    "DecodeOverrides",
    "DecodingJobConfig",
    "EvalConfig",
    "ExportConfig",
    "PathsConfig",
    "PrepareConfig",
    "TrainConfig",
    "TranslateConfig",
    "VisualizeConfig",
    "check_trainer_kwargs",
    "plain",
    "register",
    "to_schema",
]

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

SCHEMAS = {
    "train_schema": TrainConfig,
    "eval_schema": EvalConfig,
    "translate_schema": TranslateConfig,
    "visualize_schema": VisualizeConfig,
    "prepare_schema": PrepareConfig,
    "export_schema": ExportConfig,
}


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
        if launch is None:
            CLAIMED_RUN_DIRS.append(_CLAIMED[key])
    return _CLAIMED[key]


def sweep_dir(resume: str | None, default: str) -> str:
    """Hydra's `sweep.dir`: the multirun `resume_sweep` names (aiayn.training.sweep_resume),
    else a new directory claimed from `default` (`new_run_dir`)."""
    return str(resume) if resume else new_run_dir(default)


def _claim_dir(base: Path) -> str:
    """`base`, or `base_<n>` where that exists: created here, so that no other command takes
    it. One line and exit 1 where it cannot be created (Hydra resolves this for its own
    directories, where an exception would be a traceback)."""
    claimed: list[str] = []
    exit_in_hydra(lambda: claimed.append(_create_new(base)))
    return claimed[0]


def _create_new(base: Path) -> str:
    candidate, attempt = base, 0
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                candidate.mkdir()
                return str(candidate)
            except FileExistsError:
                attempt += 1
                candidate = base.with_name(f"{base.name}_{attempt}")
    except OSError as error:
        raise ConfigError(
            f"cannot create the run directory {candidate} ({error.strerror or error}): set "
            "paths.log_dir (or AIAYN_LOG_DIR) to a directory you can write"
        ) from None


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


def resume_output_subdir(
    ckpt_path: str | None,
    train: bool = True,
    resume_sweep: str | None = None,
    job_dir: str | None = None,
) -> str | None:
    """Hydra's `output_subdir` (where it saves config.yaml and overrides.yaml): `.hydra`, or
    for a resumed run `.hydra/resume-<time>`, so that resuming never rewrites the original
    run's record (the files its README commands reuse); the same for a job of a resumed
    sweep (`resume_sweep`) whose directory `job_dir` holds an earlier attempt. One name per
    run or job in a process. None (no record) on the other ranks of a `torchrun`/`srun`
    launch: rank 0 writes the run's."""
    launch = external_launch()
    if launch is not None and launch.rank != 0:
        return None
    key = f"{ckpt_path}|{job_dir if resume_sweep else ''}"
    if key not in _RESUME_SUBDIRS:
        resumed = _resumed_run(ckpt_path, train) is not None
        if resumed or attempted_before(job_dir, resume_sweep):
            stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
            _RESUME_SUBDIRS[key] = f".hydra/resume-{stamp}"
        else:
            _RESUME_SUBDIRS[key] = ".hydra"
    return _RESUME_SUBDIRS[key]


def accumulate_for(
    tokens_per_update: int, max_tokens: int, devices: Any, num_nodes: int = 1
) -> int:
    """Gradient-accumulation steps so that max_tokens x devices x num_nodes x accumulation is
    about `tokens_per_update` (the paper: ~25 000 per side), whatever the device count."""
    return max(1, round(tokens_per_update / (max_tokens * process_count(devices, num_nodes))))


def share_for(tokens_per_update: int, devices: Any, num_nodes: int = 1) -> int:
    """Tokens per process and micro-batch so that one micro-batch on every process makes an
    update of `tokens_per_update` (the largest micro-batch, the fastest step, where memory
    allows): 25 000 on one GPU, 3 125 on each of 8."""
    return max(1, tokens_per_update // process_count(devices, num_nodes))


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
    OmegaConf.register_new_resolver("aiayn_sweep_dir", sweep_dir, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("aiayn_output_subdir", resume_output_subdir, replace=True)
    OmegaConf.register_new_resolver("aiayn_accumulate", accumulate_for, replace=True)
    OmegaConf.register_new_resolver("aiayn_share", share_for, replace=True)
    OmegaConf.register_new_resolver("aiayn_processes", process_count, replace=True)
    OmegaConf.register_new_resolver("aiayn_log_file", launchers.log_file, replace=True)


def check_command_line(overrides: list[str], schema: type) -> None:
    """`check_override_keys` over a command's `key=value` arguments, the config groups of
    `conf/` being choices, not keys."""
    groups = {path.name for path in CONF_DIR.iterdir() if path.is_dir()}
    check_override_keys(overrides, schema, groups)
