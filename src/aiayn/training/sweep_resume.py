"""Resumable sweeps: `python train.py -m <the sweep's overrides> resume_sweep=<multirun dir>`.

Hydra's multirun starts every job again. With `resume_sweep`, the relaunch writes into the
given multirun directory and each job, known by its overrides (Hydra's job number is its
place in the grid):

- a job that finished (its `metrics.json` says so, `aiayn.records`) is kept: not run
  again, its metrics returned to the sweeper;
- a job that was stopped resumes exactly from its `checkpoints/last.ckpt` (as
  `ckpt_path=` does: same run directory, history cut back to the checkpoint, W&B history
  replayed into the job's new W&B run, in the sweep's W&B group);
- a job stopped before its first checkpoint starts again, the files of its first attempt
  moved into `<job>/interrupted-<time>/`; a job never started runs.

The relaunch must be the same sweep: before any job runs, `ResumeSweep` (a Hydra callback)
compares its grid and its shared config with the multirun's `multirun.yaml`, and each job
compares its composed config with its first attempt's `.hydra/config.yaml`; a difference is
refused, naming it. Each resumed job's Hydra record goes to `.hydra/resume-<time>/`, so
`.hydra/` keeps the first attempt's (the sweep report reads it).
"""

from __future__ import annotations

import datetime
import logging
import shutil
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from aiayn.errors import ConfigError, exit_in_hydra
from aiayn.records import finished, read_metrics

log = logging.getLogger(__name__)

KEY = "resume_sweep"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
SHOWN = 5  # differences named in an error


def job_overrides(config: DictConfig) -> list[tuple[str, ...]]:
    """The jobs of a multirun's config (`multirun.yaml`, or the one being launched), each as
    its overrides, in Hydra's job order: what Hydra's basic sweeper expands from
    `hydra.sweeper.params` and the command line (`resume_sweep` left out)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += [o for o in config.hydra.overrides.task if not _is_resume(o)]
    parsed = OverridesParser.create().parse_overrides(arguments)
    (jobs,) = BasicSweeper.split_arguments(parsed, None)
    return [tuple(job) for job in jobs]


def _is_resume(override: str) -> bool:
    return override.lstrip("+~").split("=", 1)[0] == KEY


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """`key: old -> new` for each dotted key whose value differs (unresolved values: an
    interpolation is compared as written); `resume_sweep` and `ckpt_path` left out."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            if not prefix and key in (KEY, "ckpt_path", "hydra"):
                continue
            missing = "(not set)"
            out += config_differences(
                old.get(key, missing), new.get(key, missing), f"{prefix}{key}."
            )
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def _named(differences: list[str]) -> str:
    more = len(differences) - SHOWN
    return "; ".join(differences[:SHOWN]) + (f"; and {more} more" if more > 0 else "")


def check_relaunch(directory: Path, config: DictConfig) -> None:
    """Refuse `resume_sweep=<directory>` unless `config` (the multirun being launched) is the
    sweep that ran there: the same jobs in the same order, the same shared config."""
    saved = directory / "multirun.yaml"
    if not saved.is_file():
        raise ConfigError(
            f"{KEY}={directory}: not a multirun directory (no multirun.yaml); give the "
            "directory a `python train.py -m ...` sweep printed as its sweep output dir"
        )
    target = OmegaConf.select(config, "hydra.sweeper._target_")
    if target != BASIC_SWEEPER:
        raise ConfigError(
            f"{KEY} resumes grids of Hydra's basic sweeper, and this launch uses {target}: "
            "an Optuna search resumes through its study's storage "
            "(hydra.sweeper.storage, hydra.sweeper.study_name)"
        )
    try:
        previous = OmegaConf.load(saved)
        before = job_overrides(previous)
    except Exception as error:  # YAML, OmegaConf or Hydra's override grammar
        raise ConfigError(
            f"{KEY}={directory}: its multirun.yaml cannot be read ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}), so this launch cannot be "
            "checked against the sweep that ran there; restore the file, or start a new "
            f"sweep without {KEY}"
        ) from None
    now = job_overrides(config)
    if before != now:
        changed = [f"{len(before)} jobs -> {len(now)}"] if len(before) != len(now) else []
        changed += [
            f"job {i}: {' '.join(a)} -> {' '.join(b)}"
            for i, (a, b) in enumerate(zip(before, now, strict=False))
            if a != b
        ]
        raise ConfigError(
            f"{KEY}={directory}: this launch is another grid than the sweep there "
            f"({_named(changed)}); relaunch with the sweep's own overrides (its "
            "multirun.yaml, hydra.overrides.task) or start a new sweep without "
            f"{KEY}"
        )
    plain = OmegaConf.to_container  # unresolved: interpolations compare as written
    differences = config_differences(plain(previous), plain(config))
    if differences:
        raise ConfigError(
            f"{KEY}={directory}: the recipe changed since the sweep started "
            f"({_named(differences)}); resume with the config files as they were, or start "
            f"a new sweep without {KEY}"
        )


class ResumeSweep(Callback):
    """Hydra callback (conf/hydra/default.yaml): checks a `resume_sweep` relaunch before
    any job runs (`check_relaunch`); an error is one line and exit status 1."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        directory = OmegaConf.select(config, KEY, default=None)
        if not directory:
            return
        exit_in_hydra(lambda: check_relaunch(Path(directory), config))
        log.info("%s: resuming the sweep in %s", KEY, directory)


def attempted_before(job_dir: str | None, resume: str | None) -> bool:
    """Whether `job_dir` holds an earlier attempt of this job of a resumed sweep."""
    return bool(resume and job_dir and (Path(job_dir) / ".hydra" / "config.yaml").is_file())


def resume_job(cfg: DictConfig) -> dict[str, Any] | None:
    """In a `resume_sweep` relaunch, what this job does: returns the metrics of a job that
    finished (the caller keeps them and runs nothing), else None after setting `ckpt_path`
    to the job's `last.ckpt` when it has one (the caller resumes the run)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not cfg.get(KEY):
        return None
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.MULTIRUN:
        raise ConfigError(
            f"{KEY} relaunches a multirun: add -m (--multirun) and the sweep's overrides"
        )
    job = Path(hydra.runtime.output_dir)
    if not str(hydra.output_subdir).startswith(".hydra/resume-"):
        return None  # a job the first attempt never started
    _check_same_job(job, cfg, list(hydra.overrides.task))
    metrics = read_metrics(job)
    if finished(metrics):
        log.info("job %s finished in an earlier attempt: kept (%s)", hydra.job.num, job)
        return metrics
    last = job / "checkpoints" / "last.ckpt"
    if last.is_file():
        (job / "FAILED").unlink(missing_ok=True)
        log.info("job %s stopped: resuming from %s", hydra.job.num, last)
        with open_dict(cfg):
            cfg.ckpt_path = str(last)
        return None
    _set_aside(job)
    return None


def _check_same_job(job: Path, cfg: DictConfig, overrides: list[str]) -> None:
    """Refuse a job whose overrides or composed config differ from its first attempt's."""
    first = job / ".hydra"
    before = [str(o) for o in OmegaConf.load(first / "overrides.yaml") if not _is_resume(str(o))]
    now = [o for o in overrides if not _is_resume(o)]
    if before != now:
        raise ConfigError(
            f"{job} ran with the overrides {' '.join(before)}, and this launch gives its job "
            f"{' '.join(now)}: relaunch the sweep with its own overrides"
        )
    saved = OmegaConf.to_container(OmegaConf.load(first / "config.yaml"))
    differences = config_differences(saved, OmegaConf.to_container(cfg))
    if differences:
        raise ConfigError(
            f"{job}: its config changed since the job first ran ({_named(differences)}); "
            f"resume with the config files as they were, or start a new sweep without {KEY}"
        )


def _set_aside(job: Path) -> None:
    """A job stopped before its first checkpoint starts again: the files of its first
    attempt (logs, CSV rows) go into `interrupted-<time>/`, where they cannot mix with the
    new attempt's."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    aside = job / f"interrupted-{stamp}"
    moved = [
        p for p in job.iterdir() if p.name != ".hydra" and not p.name.startswith("interrupted-")
    ]
    moved = [p for p in moved if p.suffix != ".log"]  # the running job's log file is open
    if not moved:
        return
    aside.mkdir()
    for path in moved:
        shutil.move(str(path), aside / path.name)
    log.info("job %s stopped before its first checkpoint: starting again", job.name)


BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def jobs_not_run() -> str:
    """Which jobs of the running multirun come after this one (Hydra's basic sweeper runs
    them in order), and how to relaunch the sweep; "" where the jobs do not run one after
    another in this process (submitit's, each a job of its own, whose stop is one failed
    job)."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    if OmegaConf.select(hydra, "launcher._target_") != BASIC_LAUNCHER:
        return ""
    number = int(hydra.job.num)
    try:
        sweep = OmegaConf.load(Path(hydra.sweep.dir) / "multirun.yaml")  # the whole grid
        if OmegaConf.select(sweep, "hydra.sweeper._target_") != BASIC_SWEEPER:
            raise ValueError("not a grid")
        total = len(job_overrides(sweep))
        rest = f"jobs {number + 1} to {total - 1} of 0 to {total - 1}"
        rest = rest if number + 1 < total else ""
    except Exception:  # another sweeper (Optuna), whose trials are no list known ahead
        rest = f"the jobs after job {number}"
    did_not_run = f"{rest} did not run; " if rest else ""
    return (
        f"the sweep stopped in job {number}; {did_not_run}relaunch it with its overrides and "
        f"resume_sweep={hydra.sweep.dir}: the stopped job resumes from its last.ckpt and the "
        "others run"
    )
